"""The node routes beyond the list and the details (spec §7): per-node GPU allocation, the
cluster's allocation and utilization now and over time, one node's GPU, CPU and memory series,
and the workloads on a node now and before.

Figures stored in the Lens tables (allocation, workloads, the cached overview) are read from there;
series are range queries of the cluster's Prometheus in its learned dialect: the exporters' GPU
series by the node label the dialect found, node_exporter's CPU and memory by the label its scrape
gives (`Dialect.nic.node_label`), so a node named only by `instance` is found by its address.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from fastapi import FastAPI
from fastapi.responses import Response

from lens_pipeline.api import queries
from lens_pipeline.api.common import (
    Paging,
    Routes,
    Span,
    TimeRange,
    envelope,
    paged,
    require_cluster,
)
from lens_pipeline.api.prometheus import (
    ClusterSeries,
    Points,
    graph,
    node_matcher,
    ratio,
    summed,
    time_points,
)
from lens_pipeline.vendors import NODE_HOST

GPU_INDEX = "gpu_id"  # the original's label for a GPU's index, whatever the exporter calls it


def cluster_history(series: ClusterSeries, span: TimeRange) -> dict[str, list[dict[str, float]]]:
    """The cluster's allocation rate (GPUs held by a pod, % of the GPUs reported), mean GPU
    utilization and VRAM in use (% of the VRAM), each one series."""
    asked: list[str] = []
    parts: list[tuple[int, int, int, int, int, int]] = []  # indexes into `asked`
    for profile in series.dialect.profiles:
        sum_query, count_query = profile.utilization_sum_queries()
        util = profile.util_metric
        memory = profile.memory_metrics()
        first = len(asked)
        asked += [sum_query, count_query, f"count({util}{{{profile.held}}})", f"count({util})"]
        if memory is not None:
            used, total = memory
            asked += [f"sum({used})", *(f"sum({metric})" for metric in total)]
        parts.append((first, first + 1, first + 2, first + 3, first + 4 if memory else -1, len(asked)))
    answers = series.matrices(asked, span)
    utilization: list = []
    counted: list = []
    held: list = []
    reported: list = []
    used_memory: list = []
    total_memory: list = []
    for sum_at, count_at, held_at, all_at, memory_at, end in parts:
        utilization.append(answers[sum_at])
        counted.append(answers[count_at])
        held.append(answers[held_at])
        reported.append(answers[all_at])
        if memory_at >= 0:
            used_memory.append(answers[memory_at])
            total_memory.extend(answers[memory_at + 1 : end])
    return {
        "allocationRate": time_points(ratio(summed(*held), summed(*reported), 100.0, zero_when_absent=True)),
        "utilization": time_points(ratio(summed(*utilization), summed(*counted))),
        "vramUtilization": time_points(ratio(summed(*used_memory), summed(*total_memory), 100.0)),
    }


def node_gpu_graphs(series: ClusterSeries, node: dict, span: TimeRange) -> tuple[list, Points]:
    """One node's GPUs over the range: each GPU's utilization (labelled `gpu_id`), and the share of
    its GPUs a pod held (%)."""
    asked: list[str] = []
    for profile in series.dialect.profiles:
        matcher = node_matcher(profile.node_label, node["name"], node["address"])
        util = f"{profile.util_metric}{{{matcher}}}"
        asked += [
            f"max by ({profile.gpu_index_label}) ({util})",
            f"count({profile.util_metric}{{{matcher}, {profile.held}}})",
            f"count({util})",
        ]
    answers = series.matrices(asked, span)
    gpus: dict[str, Points] = {}
    held: list = []
    reported: list = []
    for profile, at in zip(series.dialect.profiles, range(0, len(asked), 3), strict=True):
        for item in answers[at]:
            index = item.labels.get(profile.gpu_index_label, "")
            target = gpus.setdefault(index, {})
            target.update({int(t): v for t, v in item.points})
        held.append(answers[at + 1])
        reported.append(answers[at + 2])
    ordered = sorted(
        gpus.items(), key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit() else 0, kv[0])
    )
    per_gpu = [({GPU_INDEX: index}, points) for index, points in ordered]
    return per_gpu, ratio(summed(*held), summed(*reported), 100.0, zero_when_absent=True)


def host_queries(series: ClusterSeries, node: dict) -> tuple[str, str, str]:
    """node_exporter's idle CPU fraction, available and total memory of one node."""
    matcher = node_matcher(series.dialect.nic.node_label, node["name"], node["address"])
    return (NODE_HOST.idle_query(matcher), *NODE_HOST.memory_queries(matcher))


def busy_percent(idle: Points) -> Points:
    return {t: 100.0 * (1.0 - v) for t, v in idle.items()}


def used_percent(available: Points, total: Points) -> Points:
    return {t: 100.0 * (1.0 - a) for t, a in ratio(available, total).items()}


def _last(points: Points) -> float | None:
    return points[max(points)] if points else None


def _instant(samples: Sequence) -> Points:
    """An instant answer as a one-point series (at time 0), for the same arithmetic as ranges."""
    return {0: sum(s.value for s in samples)} if samples else {}


def add_routes(app: FastAPI, ctx: Routes) -> None:

    @app.get(
        "/v1/nodes/gpuAllocation",
        dependencies=ctx.guarded,
        summary="Every GPU node's capacity, allocated GPUs and allocation rate",
    )
    def gpu_allocation(cluster: str | None = None) -> Response:
        name = ctx.resolve(cluster)
        with ctx.engine.connect() as conn:
            rows = queries.node_allocations(conn, name, ctx.prometheus.vendor(name))
            require_cluster(conn, name, len(rows))
        return envelope(
            [
                {
                    "node": name,
                    "vendor": vendor,
                    "capacity": gpus,
                    "allocated": held,
                    "allocationRate": held / gpus,
                }
                for name, gpus, held, vendor in rows
            ]
        )

    @app.get(
        "/v1/nodes/gpuUtilization",
        dependencies=ctx.guarded,
        summary="The cluster's allocation rate and GPU utilization now",
    )
    async def gpu_utilization(cluster: str | None = None) -> Response:
        row = await ctx.overview_row_off_loop(await ctx.resolve_off_loop(cluster))
        return envelope({"allocationRate": row["allocation_rate"], "utilization": row["utilization"]})

    @app.get(
        "/v1/nodes/gpuUtilizationHistory",
        dependencies=ctx.guarded,
        summary="The cluster's allocation rate, GPU utilization and VRAM use over time",
    )
    def gpu_utilization_history(span: Span, cluster: str | None = None) -> Response:
        name = ctx.known(cluster)
        return envelope(cluster_history(ctx.prometheus.for_cluster(name), span))

    @app.get(
        "/v1/nodes/{name}/gpuMetrics",
        dependencies=ctx.guarded,
        summary="A node's GPU utilization (per GPU) and allocation over time",
    )
    def gpu_metrics(name: str, span: Span, cluster: str | None = None) -> Response:
        cluster_name, node = ctx.node(cluster, name)
        series = ctx.prometheus.for_cluster(cluster_name)
        span.bound_answer(node["gpu_count"] or 1)
        per_gpu, allocation = node_gpu_graphs(series, node, span)
        return envelope(
            {"gpu_utilization": graph(per_gpu, "%"), "gpu_allocation_rate": graph([({}, allocation)], "%")}
        )

    @app.get(
        "/v1/nodes/{name}/utilization",
        dependencies=ctx.guarded,
        summary="A node's CPU, memory and GPU utilization now",
    )
    def node_utilization(name: str, cluster: str | None = None) -> Response:
        cluster_name, node = ctx.node(cluster, name)
        series = ctx.prometheus.for_cluster(cluster_name)
        idle, available, total = (_instant(a) for a in series.vectors(host_queries(series, node)))
        return envelope(
            {
                "node_name": node["name"],
                "cpu_utilization": _last(busy_percent(idle)),
                "mem_utilization": _last(used_percent(available, total)),
                "gpu_utilization": node["gpu_utilization"],
                "gpu_allocation": node["gpu_allocation"] or 0,
                "timestamp": int(time.time()),
            }
        )

    @app.get(
        "/v1/nodes/{name}/utilizationHistory",
        dependencies=ctx.guarded,
        summary="A node's CPU, memory and GPU figures over time",
    )
    def node_utilization_history(name: str, span: Span, cluster: str | None = None) -> Response:
        cluster_name, node = ctx.node(cluster, name)
        series = ctx.prometheus.for_cluster(cluster_name)
        span.bound_answer((node["gpu_count"] or 1) + 3)
        idle, available, total = (summed(a) for a in series.matrices(host_queries(series, node), span))
        per_gpu, allocation = node_gpu_graphs(series, node, span)
        return envelope(
            {
                "cpu_utilization": graph([({}, busy_percent(idle))], "%"),
                "mem_utilization": graph([({}, used_percent(available, total))], "%"),
                "gpu_utilization": graph(per_gpu, "%"),
                "gpu_allocation_rate": graph([({}, allocation)], "%"),
            }
        )

    @app.get(
        "/v1/nodes/{name}/workloads",
        dependencies=ctx.guarded,
        summary="The top-level workloads running on a node",
    )
    def node_workloads(name: str, paging: Paging, cluster: str | None = None) -> Response:
        cluster_name, node = ctx.node(cluster, name)
        with ctx.engine.connect() as conn:
            rows, total = queries.node_workloads(conn, cluster_name, node["name"], paging)
        return paged(
            [
                {
                    "kind": r["kind"],
                    "name": r["name"],
                    "namespace": r["namespace"],
                    "uid": r["uid"],
                    "gpu_allocated": r["gpu_allocated"],
                    "gpu_allocated_node": r["gpu_allocated_node"],
                    "node_name": node["name"],
                    "status": "Running",
                }
                for r in rows
            ],
            total,
        )

    @app.get(
        "/v1/nodes/{name}/workloadsHistory",
        dependencies=ctx.guarded,
        summary="The GPU pods that ran on a node, newest first",
    )
    def node_workloads_history(name: str, paging: Paging, cluster: str | None = None) -> Response:
        cluster_name, node = ctx.node(cluster, name)
        with ctx.engine.connect() as conn:
            rows, total = queries.node_pod_history(conn, cluster_name, node["name"], paging)
        return paged(
            [
                {
                    "kind": (r["workload"] or {}).get("kind"),
                    "name": (r["workload"] or {}).get("name"),
                    "namespace": (r["workload"] or {}).get("namespace"),
                    "uid": (r["workload"] or {}).get("uid"),
                    "gpu_allocated": r["gpu_allocated"] or 0,
                    "pod_name": r["name"],
                    "pod_namespace": r["namespace"],
                    "start_time": queries.unix(r["created_at"]),
                    "end_time": queries.unix(r["ended_at"]),
                }
                for r in rows
            ],
            total,
        )
