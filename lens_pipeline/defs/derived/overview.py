"""`cluster_overview_cache`: one row per cluster with its node health, idle buckets, allocation
rate, utilization, storage and RDMA figures (spec §1.16, §3), what the read API serves.

Node figures come from the `node` table the collectors keep; utilization, storage and RDMA from a
few grouped Prometheus queries. When Prometheus cannot answer, the node figures still refresh and
the Prometheus figures keep their last stored values (a warning check says so).
"""

from datetime import UTC, datetime
from typing import Any

from dagster import MaterializeResult, MetadataValue

from lens_pipeline.collect.overview import (
    NODE_COUNTS,
    RDMA_FIGURES,
    STORAGE_FIGURES,
    StorageVolume,
    overview_row,
    storage_figures,
)
from lens_pipeline.defs.collectors.common import ClusterStep, check
from lens_pipeline.defs.collectors.gpu_devices import gpu_devices
from lens_pipeline.defs.collectors.gpu_nodes import gpu_nodes
from lens_pipeline.defs.collectors.storage_backends import storage_backends
from lens_pipeline.defs.derived.common import cluster_view
from lens_pipeline.prom.reader import PromError, PromReader
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.overview import overview_nodes, storage_volumes, stored_overview, write_overview
from lens_pipeline.vendors import INFINIBAND, profiles_for

JUICEFS = "juicefs"
# JuiceFS reports a volume's space and inodes from every mount (averaged: the same figure many
# times) and its FUSE traffic per mount (a rate of each, summed).
JUICEFS_GAUGES = {
    "total_space": "juicefs_total_space",
    "used_space": "juicefs_used_space",
    "total_inodes": "juicefs_total_inodes",
    "used_inodes": "juicefs_used_inodes",
}
JUICEFS_COUNTERS = {
    "read_bandwidth": "juicefs_fuse_read_size_bytes_sum",
    "write_bandwidth": "juicefs_fuse_written_size_bytes_sum",
}


def prometheus_figures(prom: PromReader, vendor: str, volumes: list[str], window: str) -> dict[str, float]:
    """Utilization (0-100), the storage figures of `volumes` and RDMA traffic: one grouped query per
    figure, whatever the number of nodes and volumes."""
    total = count = 0.0
    for profile in profiles_for(vendor):
        sum_query, count_query = profile.utilization_sum_queries()
        total += sum(s.value for s in prom.vector(sum_query))
        count += sum(s.value for s in prom.vector(count_query))
    figures: dict[str, dict[str, float]] = {name: {} for name in (*JUICEFS_GAUGES, *JUICEFS_COUNTERS)}
    queries = {
        **{name: f"avg by (vol_name) ({metric})" for name, metric in JUICEFS_GAUGES.items()},
        **{
            name: f"sum by (vol_name) (rate({metric}[{window}]))" for name, metric in JUICEFS_COUNTERS.items()
        },
    }
    if volumes:
        for name, query in queries.items():
            figures[name] = {s.labels.get("vol_name", ""): s.value for s in prom.vector(query)}
    storage = storage_figures(
        StorageVolume(**{name: figures[name].get(volume, 0.0) for name in figures}) for volume in volumes
    )
    rx_query, tx_query = INFINIBAND.traffic_queries(window)
    rx = sum(s.value for s in prom.vector(rx_query))
    tx = sum(s.value for s in prom.vector(tx_query))
    return {
        "utilization": total / count if count else 0.0,
        **storage,
        "rdma_total_rx": rx,
        "rdma_total_tx": tx,
    }


@cluster_view(
    description="One row per cluster (Lens `cluster_overview_cache`): node health and idle buckets, "
    "allocation rate, utilization, storage and RDMA figures, as the read API serves them.",
    deps=[gpu_nodes, gpu_devices, storage_backends],
    kinds=frozenset({"prometheus", "sql"}),
    checks={
        "totals_match_node_table": "Total, healthy and faulty nodes add up to the cluster's `node` rows.",
        "every_healthy_node_in_one_bucket": "Fully idle + partially idle + busy = healthy nodes.",
        "prometheus_fresh": "Prometheus answered this run (else its figures are the last stored ones).",
    },
)
def cluster_overview_cache(step: ClusterStep) -> MaterializeResult:
    started = datetime.now(UTC)
    cluster = step.cluster
    engine = step.lens_db.engine()
    with engine.connect() as conn:
        nodes = overview_nodes(conn, cluster.name)
        volumes = storage_volumes(conn, cluster.name, JUICEFS)
        previous = stored_overview(conn, cluster.name)

    prom = step.prometheus.reader(cluster)
    prom_error = "no prometheus_url in the registry" if prom is None else None
    figures: dict[str, Any] | None = None
    if prom is not None:
        try:
            figures = prometheus_figures(prom, cluster.vendor, volumes, step.prometheus.rate_window)
        except PromError as exc:
            step.log.warning(f"{exc}; keeping the last stored Prometheus figures")
            prom_error = str(exc)
    if figures is None:
        kept = ("utilization", *STORAGE_FIGURES, *RDMA_FIGURES)
        figures = {name: (previous or {}).get(name, 0.0) for name in kept}
    row = overview_row(
        nodes,
        utilization=figures["utilization"],
        storage={name: figures[name] for name in STORAGE_FIGURES},
        rdma=(figures["rdma_total_rx"], figures["rdma_total_tx"]),
    )
    with write_transaction(engine) as conn:
        write_overview(conn, cluster.name, row, now=datetime.now(UTC))

    buckets = row["fully_idle_nodes"] + row["partially_idle_nodes"] + row["busy_nodes"]
    return MaterializeResult(
        metadata={
            "cluster": cluster.name,
            "allocation_rate": MetadataValue.float(round(float(row["allocation_rate"]), 3)),
            "utilization": MetadataValue.float(round(float(row["utilization"]), 3)),
            **{name: MetadataValue.int(int(row[name])) for name in NODE_COUNTS},
            "storage_usage_percentage": MetadataValue.float(round(float(row["storage_usage_percentage"]), 3)),
            "rdma_total_rx": MetadataValue.float(float(row["rdma_total_rx"])),
            "rdma_total_tx": MetadataValue.float(float(row["rdma_total_tx"])),
            "prometheus_queries": prom.queries if prom is not None else 0,
            "duration_seconds": round((datetime.now(UTC) - started).total_seconds(), 3),
        },
        check_results=[
            check(
                "totals_match_node_table",
                row["total_nodes"] == len(nodes) == row["healthy_nodes"] + row["faulty_nodes"],
                node_rows=len(nodes),
                total_nodes=row["total_nodes"],
            ),
            check("every_healthy_node_in_one_bucket", buckets == row["healthy_nodes"], bucketed=buckets),
            check("prometheus_fresh", prom_error is None, warn=True, error=prom_error or ""),
        ],
    )
