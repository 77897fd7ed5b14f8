"""Prometheus as the pipeline sees it for one simulated cluster: the instant query API over the
cluster's exporter samples, and the exporters' text exposition for a real Prometheus to scrape."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING

from lens_pipeline.sim import exporters, promql
from lens_pipeline.sim.dialects import ExporterDialect, relabel
from lens_pipeline.sim.wire import SimRequest, SimResponse, json_response

if TYPE_CHECKING:
    from lens_pipeline.sim.fleet import SimCluster

EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_ERROR_TYPES = {400: "bad_data", 422: "execution", 499: "canceled", 503: "unavailable", 504: "timeout"}


def _error(status: int, message: str) -> SimResponse:
    return json_response(
        status, {"status": "error", "errorType": _ERROR_TYPES.get(status, "internal"), "error": message}
    )


def query_series(
    cluster: SimCluster, metrics: Collection[str] | None = None, at: float | None = None
) -> list[promql.Series]:
    """Every scraped series as Prometheus stores it: `__name__`, the target's `job` and `instance`,
    and `node` for per-node targets (the label `write_prometheus_config` gives them), and each
    target's `up`; now, or at the past time `at` for a cluster keeping history. Series of
    targets with counters are made anew (counters move with time); the others are cached. With
    `metrics`, only the series of those metric names (what a query's selectors can match)."""
    targets = exporters.scrape(cluster, metrics, at)

    def build() -> dict[str, list[promql.Series]]:
        return _by_name(
            _series(cluster, {t: v for t, v in targets.items() if t.job not in exporters.COUNTING_JOBS})
            + _series(cluster, {t: [("up", {}, 1.0)] for t in targets})
        )

    history = cluster.history
    if at is None or history is None:
        steady = cluster.memo("prometheus_series", build)
    else:
        steady = history.memo(("series", history.state_key(at)), build)
    counting = _series(cluster, {t: v for t, v in targets.items() if t.job in exporters.COUNTING_JOBS})
    return _pick(steady, metrics) + counting


def counter_series(cluster: SimCluster, metrics: Collection[str] | None = None) -> list[promql.Series]:
    """The counters among `query_series` with their per-second rates as values, for `rate()`."""
    rates = cluster.memo(
        "prometheus_rates", lambda: _by_name(_series(cluster, exporters.counter_rates(cluster)))
    )
    return _pick(rates, metrics)


def _by_name(series: list[promql.Series]) -> dict[str, list[promql.Series]]:
    grouped: dict[str, list[promql.Series]] = {}
    for item in series:
        grouped.setdefault(item[0]["__name__"], []).append(item)
    return grouped


def _pick(by_name: dict[str, list[promql.Series]], metrics: Collection[str] | None) -> list[promql.Series]:
    names = by_name if metrics is None else metrics
    return [item for name in names for item in by_name.get(name, ())]


def _evaluate(cluster: SimCluster, query: str, at: float | None = None) -> list[promql.Series]:
    # A selector names its metric: hand the evaluator only those series, not all of the cluster's.
    metrics = promql.metric_names(promql.parse(query))
    return promql.evaluate(query, query_series(cluster, metrics, at), counter_series(cluster, metrics))


def _evaluate_steps(
    cluster: SimCluster, query: str, times: list[float]
) -> dict[tuple, list[tuple[float, float]]]:
    """A range query as Prometheus answers it: the query at each step, for a cluster keeping history
    as the cluster was then (no point after now, as no sample exists yet); without history every
    step sees the current samples. Points by series."""
    history = cluster.history
    now = cluster.now()
    if history is None:
        at_now = _evaluate(cluster, query)
        return {tuple(sorted(labels.items())): [(t, value) for t in times] for labels, value in at_now}
    metrics = promql.metric_names(promql.parse(query))
    moving = metrics is None or bool(set(metrics) & exporters.COUNTERS)
    series: dict[tuple, list[tuple[float, float]]] = {}
    results: dict[int, list[promql.Series]] = {}
    for t in times:
        if t > now:
            break
        key = history.state_key(t)
        # Between two changes the answer is the same (counters excepted: they move with time).
        if moving or key not in results:
            results[key] = _evaluate(cluster, query, t)
        result = results[key]
        for labels, value in result:
            series.setdefault(tuple(sorted(labels.items())), []).append((t, value))
    return series


def listed_series(cluster: SimCluster, metrics: Collection[str] | None = None) -> list[promql.Series]:
    """The series whose names the metadata endpoints list: those of `query_series` and, as a
    Prometheus remembers for its lookback window, those its exporters wrote in the dialect they
    spoke minutes ago (`ExporterDialect.lingering`), which no instant query sees any more."""
    current = query_series(cluster, metrics)
    before = cluster.dialect.lingering
    if before is None:
        return current
    return current + _series(cluster, exporters.scrape(cluster, metrics), before)


def _series(
    cluster: SimCluster,
    targets: dict[exporters.Target, list[exporters.Sample]],
    dialect: ExporterDialect | None = None,
) -> list[promql.Series]:
    """The targets' samples as Prometheus stores them: the exporter's names in the cluster's
    dialect (or `dialect`), the target's labels added (`exported_*` where they clash, as under
    honor_labels: false), empty labels dropped."""
    series: list[promql.Series] = []
    for target, samples in targets.items():
        extra = {
            **exporters.target_labels(cluster, target, dialect),
            "job": target.job,
            "instance": target.instance,
        }
        for metric, labels, value in exporters.exposed(cluster, target, samples, dialect):
            stored = relabel(labels, extra)
            stored["__name__"] = metric
            series.append((stored, value))
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
        names = sorted({labels["__name__"] for labels, _ in listed_series(cluster)})
        return json_response(200, {"status": "success", "data": names})
    if path == "/api/v1/labels":
        return _label_names(cluster, req)
    if path == "/api/v1/query_range":
        return _range_query(cluster, req)
    if path == "/api/v1/query":
        if req.method not in ("GET", "POST"):
            return _error(405, f"method {req.method} not allowed")
        return _instant_query(cluster, req)
    return _error(404, f"the simulator's Prometheus does not serve {path}")


def _label_names(cluster: SimCluster, req: SimRequest) -> SimResponse:
    """`/api/v1/labels`: the label names of the series the `match[]` selectors match (all series
    without one), lingering ones included. The simulator keeps no history, so `start` and `end`
    change nothing."""
    selectors = req.form().get("match[]") or []
    try:
        parsed = [promql.parse(s) for s in selectors]
    except promql.PromQLError as exc:
        return _error(400, f'invalid parameter "match[]": {exc}')
    metrics: set[str] | None = None
    if parsed and all(promql.metric_names(p) is not None for p in parsed):
        metrics = {m for p in parsed for m in promql.metric_names(p) or ()}
    series = listed_series(cluster, metrics)
    matched = (
        [labels for p in parsed for labels, _ in p.evaluate(series)] if parsed else [s for s, _ in series]
    )
    return json_response(
        200, {"status": "success", "data": sorted({k for labels in matched for k in labels})}
    )


def _instant_query(cluster: SimCluster, req: SimRequest) -> SimResponse:
    form = req.form()
    query = (form.get("query") or [""])[-1]
    if not query:
        return _error(400, 'invalid parameter "query": query must not be empty')
    try:
        asked = (form.get("time") or [None])[-1]
        at = _parse_time(asked, cluster.now())
        result = _evaluate(cluster, query, at if asked else None)
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


def _range_query(cluster: SimCluster, req: SimRequest) -> SimResponse:
    """Every step of the range as the cluster was then (`_evaluate_steps`)."""
    form = req.form()
    query = (form.get("query") or [""])[-1]
    try:
        start = _parse_time((form.get("start") or [None])[-1], cluster.now())
        end = _parse_time((form.get("end") or [None])[-1], cluster.now())
        step = float((form.get("step") or ["60"])[-1])
        if not query or step <= 0 or end < start or (end - start) / step > 11_000:
            raise ValueError("query_range needs a query, 0 < step, start <= end and at most 11,000 points")
        times = [round(start + i * step, 3) for i in range(int((end - start) // step) + 1)]
        result = _evaluate_steps(cluster, query, times)
    except promql.PromQLError as exc:
        return _error(400, f'invalid parameter "query": {exc}')
    except ValueError as exc:
        return _error(400, str(exc))
    return json_response(
        200,
        {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [
                    {"metric": dict(labels), "values": [[t, promql.format_value(v)] for t, v in points]}
                    for labels, points in sorted(result.items())
                ],
            },
        },
    )


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(cluster: SimCluster, path: str = "/metrics") -> SimResponse:
    """A target's samples in the Prometheus text format (version 0.0.4); `/metrics` alone answers
    with every GPU exporter target of the cluster at once (for a quick look, not for scraping)."""
    targets = exporters.scrape(cluster)
    if path == "/metrics":
        chosen = [t for t in targets if t.job == cluster.profile.exporter_job]
    else:
        chosen = [t for t in targets if t.path == path]
        if not chosen:
            return SimResponse(404, f"no exporter target at {path}\n".encode(), content_type="text/plain")
    known = exporters.families(cluster.profile, cluster.dialect.metric_prefix)
    families: dict[str, tuple[exporters.Family, list[str]]] = {}
    for target in chosen:
        for metric, labels, value in exporters.exposed(cluster, target, targets[target]):
            family = known.get(metric) or exporters.Family(metric, "untyped", metric)
            rendered = ",".join(f'{name}="{_escape(text)}"' for name, text in labels.items())
            families.setdefault(family.name, (family, []))[1].append(
                f"{metric}{{{rendered}}} {promql.format_value(value)}"
            )
    lines = []
    for family, samples in families.values():
        lines += [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {family.type}", *samples]
    return SimResponse(200, ("\n".join(lines) + "\n").encode("utf-8"), content_type=EXPOSITION_CONTENT_TYPE)
