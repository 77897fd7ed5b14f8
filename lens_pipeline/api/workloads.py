"""The workload routes beyond the list and the details (spec §7): the running workloads' summary,
the tree of a workload named by kind and name, a workload's GPU series, and the namespaces and
kinds there are.

The original's workload series were the exporters' series copied by its telemetry processor
under a `workload_uid` label. Here they are the exporters' own series, which name the pod holding
each GPU: the workload's pods that held GPUs during the range (`workload_pod_reference`,
`pod_resource`) select them, as the workload statistics do. A step of an hour or more is read from
`workload_gpu_hourly_stats` when it has the workload's hours.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated

from fastapi import FastAPI, Query
from fastapi.responses import Response

from lens_pipeline.api import queries
from lens_pipeline.api.common import ApiError, Routes, Span, TimeRange, checked, envelope, require_cluster
from lens_pipeline.api.prometheus import (
    ClusterSeries,
    Points,
    by_node,
    graph,
    node_index,
    pod_matchers,
    ratio,
    summed,
)

LOW_UTILIZATION = 30.0  # percent: a running workload averaging under it is "low" (the original's)
NODE_LABEL = "primus_lens_node_name"  # the original's series label naming the node, kept on the wire
HOUR = 3600
# A range whose workload had more pods than this is refused: its queries would not be few.
MAX_PODS = 3000


def _pods(ctx: Routes, cluster: str, uid: str, span: TimeRange) -> list[dict]:
    with ctx.engine.connect() as conn:
        pods = queries.workload_pods_between(conn, cluster, uid, span.start_time, span.end_time)
    if len(pods) > MAX_PODS:
        raise ApiError(
            400, f"the workload had {len(pods)} pods between start and end, over {MAX_PODS}: narrow the range"
        )
    return pods


def utilization_points(series: ClusterSeries, pods: Sequence[dict], span: TimeRange) -> Points:
    """The mean utilization of the GPUs the pods held, at each step."""
    asked = []
    for profile in series.dialect.profiles:
        for matcher in pod_matchers(
            profile.namespace_label, profile.pod_label, ((p["namespace"], p["name"]) for p in pods)
        ):
            measured = f"{profile.util_metric}{{{matcher}}} >= 0"
            asked += [f"sum({measured})", f"count({measured})"]
    answers = series.matrices(asked, span)
    return ratio(summed(*answers[0::2]), summed(*answers[1::2]))


def hourly_points(rows: Sequence[dict], span: TimeRange) -> Points:
    """Hourly means gathered into the range's steps (weighted by their samples), each at its step's
    start: a step of two hours is the mean of its two hours."""
    sums: dict[int, float] = {}
    weights: dict[int, float] = {}
    for row in rows:
        hour = int(row["stat_hour"].timestamp())
        at = span.start + max(hour - span.start, 0) // span.step * span.step
        weight = float(row["sample_count"] or 0)
        if weight > 0:
            sums[at] = sums.get(at, 0.0) + float(row["avg_utilization"]) * weight
            weights[at] = weights.get(at, 0.0) + weight
    return {t: sums[t] / weights[t] for t in sums}


def workload_graphs(series: ClusterSeries, pods: Sequence[dict], nodes: list, span: TimeRange) -> dict:
    """Per node, the mean GPU utilization, the share of GPU memory in use and the mean power of the
    GPUs the workload's pods held: the original's three graphs."""
    index = node_index(nodes)
    asked: list[str] = []
    plan: list[tuple[str, str, str]] = []  # (figure, numerator or denominator, node label) per query
    pairs = [(p["namespace"], p["name"]) for p in pods]
    for profile in series.dialect.profiles:
        by = f"by ({profile.node_label})"
        memory = profile.memory_metrics()
        power = profile.device_metrics.get("power")
        for matcher in pod_matchers(profile.namespace_label, profile.pod_label, pairs):
            wanted = [
                ("util", "sum", f"sum {by} ({profile.util_metric}{{{matcher}}} >= 0)"),
                ("util", "count", f"count {by} ({profile.util_metric}{{{matcher}}} >= 0)"),
            ]
            if memory is not None:
                used, total = memory
                wanted.append(("memory", "sum", f"sum {by} ({used}{{{matcher}}})"))
                wanted += [("memory", "count", f"sum {by} ({metric}{{{matcher}}})") for metric in total]
            if power is not None:
                wanted += [
                    ("power", "sum", f"sum {by} ({power}{{{matcher}}} >= 0)"),
                    ("power", "count", f"count {by} ({power}{{{matcher}}} >= 0)"),
                ]
            plan += [(figure, part, profile.node_label) for figure, part, _ in wanted]
            asked += [query for *_, query in wanted]
    gathered: dict[tuple[str, str], dict[str, Points]] = {}
    for (figure, part, label), answer in zip(plan, series.matrices(asked, span), strict=True):
        by_node(answer, label, index, gathered.setdefault((figure, part), {}))

    def per_node(figure: str, scale: float) -> list[tuple[dict[str, str], Points]]:
        above, below = gathered.get((figure, "sum"), {}), gathered.get((figure, "count"), {})
        return [
            ({NODE_LABEL: node}, ratio(above.get(node, {}), below[node], scale)) for node in sorted(below)
        ]

    return {
        "GPU Utilization": graph(per_node("util", 1.0), "%", serial=1),
        "GPU Memory Utilization": graph(per_node("memory", 100.0), "%", serial=2),
        "GPU Power": graph(per_node("power", 1.0), "W", serial=3),
    }


def add_routes(app: FastAPI, ctx: Routes) -> None:

    @app.get(
        "/v1/workloads/statistic",
        dependencies=ctx.guarded,
        summary="The running top-level workloads: count, mean GPUs and utilization",
    )
    def workload_statistic(cluster: str | None = None) -> Response:
        name = ctx.resolve(cluster)
        with ctx.engine.connect() as conn:
            summary = queries.workload_summary(conn, name, LOW_UTILIZATION)
            require_cluster(conn, name, summary["running_workloads_count"])
        return envelope(summary)

    def _named(cluster: str | None, kind: str, name: str, namespace: str | None) -> tuple[str, dict]:
        checked(kind, "kind")
        checked(name, "name")
        checked(namespace, "namespace")
        cluster_name = ctx.resolve(cluster)
        with ctx.engine.connect() as conn:
            row = queries.workload_by_name(conn, cluster_name, kind, name, namespace)
        if row is None:
            where = f" in namespace {namespace!r}" if namespace else ""
            raise ApiError(404, f"no {kind} {name!r}{where} in cluster {cluster_name!r}")
        return cluster_name, row

    @app.get(
        "/v1/workloads/hierarchy",
        dependencies=ctx.guarded,
        summary="The tree of a workload named by kind and name",
    )
    def hierarchy_by_name(
        kind: Annotated[str, Query(min_length=1)],
        name: Annotated[str, Query(min_length=1)],
        namespace: str | None = None,
        cluster: str | None = None,
    ) -> Response:
        cluster_name, row = _named(cluster, kind, name, namespace)
        with ctx.engine.connect() as conn:
            return envelope(queries.workload_tree(conn, cluster_name, row["uid"]))

    @app.get(
        "/v1/workloads/gpuUtilizationHistory",
        dependencies=ctx.guarded,
        summary="A workload's mean GPU utilization over time, the workload named by kind and name",
    )
    def utilization_history(
        kind: Annotated[str, Query(min_length=1)],
        name: Annotated[str, Query(min_length=1)],
        span: Span,
        namespace: str | None = None,
        cluster: str | None = None,
    ) -> Response:
        cluster_name, row = _named(cluster, kind, name, namespace)
        points: Points | None = None
        if span.step >= HOUR:
            first_hour = datetime.fromtimestamp(span.start - span.start % HOUR, UTC)
            with ctx.engine.connect() as conn:
                rows = queries.workload_hours(conn, cluster_name, row["uid"], first_hour, span.end_time)
            points = hourly_points(rows, span) if rows else None
        if points is None:
            pods = _pods(ctx, cluster_name, row["uid"], span)
            points = utilization_points(ctx.prometheus.for_cluster(cluster_name), pods, span) if pods else {}
        return envelope(graph([({}, points)], "%"))

    @app.get(
        "/v1/workloads/{uid}/metrics",
        dependencies=ctx.guarded,
        summary="A workload's GPU utilization, memory and power per node",
    )
    def workload_metrics(uid: str, span: Span, cluster: str | None = None) -> Response:
        cluster_name, _ = ctx.workload(cluster, uid)
        pods = _pods(ctx, cluster_name, uid, span)
        span.bound_answer(3 * max(len({p["node_name"] for p in pods}), 1))
        with ctx.engine.connect() as conn:
            nodes = queries.node_addresses(conn, cluster_name)
        return envelope(workload_graphs(ctx.prometheus.for_cluster(cluster_name), pods, nodes, span))

    @app.get(
        "/v1/workloadMetadata",
        dependencies=ctx.guarded,
        summary="The workloads' namespaces, and the kinds of the top-level ones",
    )
    def workload_metadata(cluster: str | None = None) -> Response:
        name = ctx.resolve(cluster)
        with ctx.engine.connect() as conn:
            namespaces, kinds = queries.workload_metadata(conn, name)
            require_cluster(conn, name, len(namespaces) + len(kinds))
        return envelope({"namespaces": namespaces, "kinds": kinds})
