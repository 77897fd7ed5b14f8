"""Cluster-wide routes beyond the overview: the GPU heatmap (spec §3) from the cluster's
Prometheus, and the storage figures (`/v1/storage/stat`) from the cached overview."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from lens_pipeline.api import queries
from lens_pipeline.api.common import Routes, envelope
from lens_pipeline.api.prometheus import ClusterSeries, any_of, node_index, quoted
from lens_pipeline.collect.nodes import NodeIndex
from lens_pipeline.collect.overview import api_overview
from lens_pipeline.vendors import VendorProfile

TOP_NODES = 5  # the original's k
STORAGE_FIELDS = (
    "total_space",
    "used_space",
    "usage_percentage",
    "total_inodes",
    "used_inodes",
    "inodes_usage_percentage",
    "read_bandwidth",
    "write_bandwidth",
)


@dataclass(frozen=True)
class Heatmap:
    """One of the original's three heatmaps: which figure, and how the UI draws it."""

    key: str
    figure: str  # a `device_metrics` figure, or "utilization"
    serial: int
    unit: str
    y_max: float
    y_min: float

    def metric(self, profile: VendorProfile) -> str | None:
        return (
            profile.util_metric if self.figure == "utilization" else profile.device_metrics.get(self.figure)
        )


HEATMAPS = (
    Heatmap("power", "power", 2, "W", 850, 0),
    Heatmap("temperature", "temperature", 3, "\u2103", 110, 20),
    Heatmap("utilization", "utilization", 1, "%", 100, 0),
)


def heatmap_items(series: ClusterSeries, heatmap: Heatmap, nodes: NodeIndex) -> list[dict]:
    """The GPUs of the `TOP_NODES` nodes whose mean of the figure is highest: two instant queries
    per vendor (the nodes, then their GPUs), NaN left out as the collectors leave it out."""
    ranked: list[tuple[float, str, VendorProfile]] = []
    for profile in series.dialect.profiles:
        metric = heatmap.metric(profile)
        if metric is None:
            continue
        query = f"topk({TOP_NODES}, avg by ({profile.node_label}) ({metric} >= 0))"
        for sample in series.vector(query):
            ranked.append((sample.value, sample.labels.get(profile.node_label, ""), profile))
    ranked.sort(key=lambda r: (-r[0], r[1]))
    chosen: dict[str, tuple[VendorProfile, list[str]]] = {}
    for _, label_value, profile in ranked[:TOP_NODES]:
        chosen.setdefault(profile.name, (profile, []))[1].append(label_value)
    items: list[dict[str, Any]] = []
    for profile, values in chosen.values():
        metric = heatmap.metric(profile)
        by = f"{profile.node_label}, {profile.gpu_index_label}"
        selector = f"{profile.node_label}=~{quoted(any_of(values))}"
        for sample in series.vector(f"max by ({by}) ({metric}{{{selector}}} >= 0)"):
            index = sample.labels.get(profile.gpu_index_label, "")
            value = sample.labels.get(profile.node_label, "")
            items.append(
                {
                    "node_name": nodes.resolve(value) or value,
                    "gpu_id": int(index) if index.isdigit() else index,
                    "value": sample.value,
                }
            )
    order = {nodes.resolve(v) or v: i for i, (_, v, _) in enumerate(ranked[:TOP_NODES])}
    items.sort(
        key=lambda i: (
            order.get(str(i["node_name"]), len(order)),
            (0, i["gpu_id"], "") if isinstance(i["gpu_id"], int) else (1, 0, str(i["gpu_id"])),
        )
    )
    return items


def add_routes(app: FastAPI, ctx: Routes) -> None:

    @app.get(
        "/v1/clusters/gpuHeatmap",
        dependencies=ctx.guarded,
        summary="Power, temperature and utilization of the GPUs of the 5 hottest nodes (spec §3)",
    )
    def gpu_heatmap(cluster: str | None = None) -> Response:
        name = ctx.known(cluster)
        with ctx.engine.connect() as conn:
            nodes = queries.node_addresses(conn, name)
        series = ctx.prometheus.for_cluster(name)
        index = node_index(nodes)
        data = {}
        for heatmap in HEATMAPS:
            items = heatmap_items(series, heatmap, index)
            # "Data" capitalised, as the original's struct without a JSON tag wrote it (spec §10.12).
            data[heatmap.key] = {
                "serial": heatmap.serial,
                "unit": heatmap.unit,
                "yaxis_max": heatmap.y_max,
                "yaxis_min": heatmap.y_min,
                "Data": items,
            }
        return envelope(data)

    @app.get(
        "/v1/storage/stat",
        dependencies=ctx.guarded,
        summary="The cluster's storage figures (JuiceFS volumes), from the overview",
    )
    async def storage_stat(cluster: str | None = None) -> Response:
        name = await ctx.resolve_off_loop(cluster)
        row = await ctx.cached_overview_off_loop(name)
        if row is None:
            await run_in_threadpool(ctx.known, name)  # a 404 for a cluster the database does not know
            # Not measured yet (the overview asset has not run): unknown, not zero.
            return envelope(dict.fromkeys(STORAGE_FIELDS))
        overview = api_overview(row)
        return envelope({field: overview[field] for field in STORAGE_FIELDS})
