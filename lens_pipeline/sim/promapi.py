"""Prometheus as the pipeline sees it for one simulated cluster: the instant query API over the
cluster's exporter samples, and the exporters' text exposition for a real Prometheus to scrape."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from lens_pipeline.sim import promql
from lens_pipeline.sim.wire import SimRequest, SimResponse, json_response

if TYPE_CHECKING:
    from lens_pipeline.sim.fleet import SimCluster

EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_ERROR_TYPES = {400: "bad_data", 422: "execution", 499: "canceled", 503: "unavailable", 504: "timeout"}


def _error(status: int, message: str) -> SimResponse:
    return json_response(
        status, {"status": "error", "errorType": _ERROR_TYPES.get(status, "internal"), "error": message}
    )


def query_series(cluster: SimCluster) -> list[promql.Series]:
    """Exporter samples as stored in Prometheus: `__name__` plus the `job` and `instance` a scrape adds."""
    return cluster.memo("prometheus_series", lambda: _scraped_series(cluster))


def _scraped_series(cluster: SimCluster) -> list[promql.Series]:
    profile = cluster.profile
    nodes: dict[str, str] = {}
    series: list[promql.Series] = []
    for metric, labels, value in cluster.exporter_samples():
        node = labels.get(profile.node_label, "")
        instance = nodes.get(node)
        if instance is None:
            instance = nodes[node] = f"{cluster.node_address(node)}:{profile.exporter_port}"
        series.append(
            ({"__name__": metric, **labels, "job": profile.exporter_job, "instance": instance}, value)
        )
    return series


def _parse_time(text: str | None, default: float) -> float:
    if text is None or text == "":
        return default
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f'invalid parameter "time": cannot parse "{text}" to a valid timestamp') from None


def handle_prometheus(cluster: SimCluster, req: SimRequest, path: str) -> SimResponse:
    """`path` is below `<base>/prometheus`."""
    fault = cluster.fault("prometheus")
    if fault is not None:
        return _error(fault, f"injected fault: the simulator answers every Prometheus call with {fault}")
    if path in ("", "/"):
        return SimResponse(200, b"<html>Prometheus (lens simulator)</html>", content_type="text/html")
    if path in ("/-/healthy", "/-/ready"):
        return SimResponse(200, b"Prometheus Server is Ready.\n", content_type="text/plain")
    if path == "/api/v1/status/buildinfo":
        return json_response(
            200, {"status": "success", "data": {"version": "2.53.0-lens-sim", "revision": "sim"}}
        )
    if path == "/api/v1/label/__name__/values":
        names = sorted(
            {metric for metric, _, _ in cluster.exporter_samples()} | {cluster.profile.util_metric}
        )
        return json_response(200, {"status": "success", "data": names})
    if path == "/api/v1/query":
        if req.method not in ("GET", "POST"):
            return _error(405, f"method {req.method} not allowed")
        return _instant_query(cluster, req)
    return _error(404, f"the simulator's Prometheus does not serve {path}")


def _instant_query(cluster: SimCluster, req: SimRequest) -> SimResponse:
    form = req.form()
    query = (form.get("query") or [""])[-1]
    if not query:
        return _error(400, 'invalid parameter "query": query must not be empty')
    try:
        at = _parse_time((form.get("time") or [None])[-1], cluster.now())
        result = promql.evaluate(query, query_series(cluster))
    except promql.PromQLError as exc:
        return _error(400, f'invalid parameter "query": {exc}')
    except ValueError as exc:
        return _error(400, str(exc))
    timestamp = round(at, 3)
    return json_response(
        200,
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [
                    {"metric": labels, "value": [timestamp, promql.format_value(value)]}
                    for labels, value in result
                ],
            },
        },
    )


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(cluster: SimCluster) -> SimResponse:
    """All exporter series of the cluster in the Prometheus text format (version 0.0.4)."""
    profile = cluster.profile
    helps = {profile.util_metric: profile.util_help}
    families: dict[str, list[str]] = {}
    for metric, labels, value in cluster.exporter_samples():
        rendered = ",".join(f'{name}="{_escape(text)}"' for name, text in labels.items())
        families.setdefault(metric, []).append(f"{metric}{{{rendered}}} {promql.format_value(value)}")
    lines = []
    for metric, samples in families.items():
        lines += [f"# HELP {metric} {helps.get(metric, metric)}", f"# TYPE {metric} gauge", *samples]
    return SimResponse(200, ("\n".join(lines) + "\n").encode("utf-8"), content_type=EXPOSITION_CONTENT_TYPE)
