"""`cluster_overview_cache`: one row per cluster with its node health, idle buckets, allocation
rate, utilization, storage and RDMA figures (spec §1.16, §3), what the read API serves.

Node figures come from the `node` table the collectors keep; utilization, storage and RDMA from a
few grouped Prometheus queries. When Prometheus cannot answer, the node figures still refresh and
the Prometheus figures keep their last stored values (a warning check says so).
"""

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from dagster import MaterializeResult, MetadataValue

from lens_pipeline.collect.overview import (
    NODE_COUNTS,
    RDMA_FIGURES,
    STORAGE_FIGURES,
    juicefs_volumes,
    overview_row,
    readable_nodes,
    storage_figures,
)
from lens_pipeline.defs.collectors.common import ClusterTurn, check, prometheus_check
from lens_pipeline.defs.collectors.gpu_devices import gpu_devices
from lens_pipeline.defs.collectors.gpu_nodes import gpu_nodes
from lens_pipeline.defs.collectors.storage_backends import storage_backends
from lens_pipeline.defs.derived.common import ROWS_READABLE, cluster_view, rows_readable_check
from lens_pipeline.prom.reader import PromError, PromReader
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.overview import (
    kept_figures,
    overview_nodes,
    storage_volumes,
    stored_overview,
    write_overview,
)
from lens_pipeline.store.schema import cluster_overview_cache
from lens_pipeline.vendors import JUICEFS, Dialect


def prometheus_figures(
    prom: PromReader, dialect: Dialect, volumes: list[str], window: str, capacities: Mapping[str, float]
) -> tuple[dict[str, Any], list[str]]:
    """Utilization (0-100), the storage figures of `volumes` and RDMA traffic: one grouped query
    per figure, whatever the number of nodes and volumes. A figure no series measures is unknown
    (None): utilization without GPU series, RDMA without InfiniBand counters, a volume's figure
    without its series. Also the volumes whose capacity is unknown (no quota, and none in the
    registry's `capacities`)."""
    total = count = 0.0
    for profile in dialect.profiles:
        sum_query, count_query = profile.utilization_sum_queries()
        total += sum(s.value for s in prom.vector(sum_query))
        count += sum(s.value for s in prom.vector(count_query))
    queries = JUICEFS.figure_queries(window)
    figures: dict[str, dict[str, float]] = {name: {} for name in queries}
    if volumes:
        for name, query in queries.items():
            figures[name] = {s.labels.get(JUICEFS.volume_label, ""): s.value for s in prom.vector(query)}
    stored, uncapped = juicefs_volumes(volumes, figures, capacities)
    rx, tx = (_sum_or_unknown(prom, query) for query in dialect.nic.traffic_queries(window))
    return {
        "utilization": total / count if count else None,
        **storage_figures(stored),
        "rdma_total_rx": rx,
        "rdma_total_tx": tx,
    }, uncapped


def _sum_or_unknown(prom: PromReader, query: str) -> float | None:
    """The value of a `sum(...)` query, None when it has no series to add up (Prometheus answers
    nothing, not 0)."""
    samples = prom.vector(query)
    return sum(s.value for s in samples) if samples else None


@cluster_view(
    description="One row per cluster (Lens `cluster_overview_cache`): node health and idle buckets, "
    "allocation rate, utilization, storage and RDMA figures, as the read API serves them.",
    table=cluster_overview_cache,
    deps=[gpu_nodes, gpu_devices, storage_backends],
    kinds=frozenset({"prometheus", "sql"}),
    checks={
        **ROWS_READABLE,
        "totals_match_node_table": "Total, healthy and faulty nodes add up to the cluster's readable "
        "`node` rows.",
        "every_healthy_node_in_one_bucket": "Fully idle + partially idle + busy = healthy nodes.",
        "prometheus_fresh": "Prometheus answered this run, every sample readable (else its figures are "
        "the last stored ones; a malformed sample is skipped and counted).",
        "utilization_known": "The cluster's Prometheus has GPU utilization series (else it is NULL).",
        "storage_capacity_known": "Every JuiceFS volume has a capacity (a quota, or one in the registry); "
        "else the total and the usage percentage are NULL.",
    },
)
def cluster_overview_cache(turn: ClusterTurn) -> MaterializeResult:
    started = datetime.now(UTC)
    cluster = turn.cluster
    engine = turn.lens_db.engine()
    with engine.connect() as conn:
        nodes, malformed = readable_nodes(overview_nodes(conn, cluster.name))
        volumes = storage_volumes(conn, cluster.name, JUICEFS.kind)
        previous = stored_overview(conn, cluster.name)

    prom = turn.prometheus_reader()
    mark = turn.malformed_samples_mark()
    asked_before = prom.queries if prom is not None else 0  # the turn's reader: count this part's
    prom_error = "no prometheus_url in the registry" if prom is None else None
    figures: dict[str, Any] | None = None
    uncapped: list[str] = []
    if prom is not None:
        try:
            figures, uncapped = prometheus_figures(
                prom, turn.dialect(), volumes, turn.prometheus.rate_window, cluster.juicefs_capacity_bytes
            )
        except PromError as exc:
            turn.log.warning(f"{exc}; keeping the last stored Prometheus figures")
            prom_error = str(exc)
    if figures is None:
        figures = kept_figures(previous, ("utilization", *STORAGE_FIGURES, *RDMA_FIGURES))
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
            **{
                name: MetadataValue.float(round(float(row[name]), 3))
                for name in ("utilization", "storage_usage_percentage", "rdma_total_rx", "rdma_total_tx")
                if row[name] is not None  # unknown: no point on the plot rather than a false zero
            },
            **{name: MetadataValue.int(int(row[name])) for name in NODE_COUNTS},
            "unknown_figures": ", ".join(sorted(k for k, v in row.items() if v is None)),
            "prometheus_queries": prom.queries - asked_before if prom is not None else 0,
            "duration_seconds": round((datetime.now(UTC) - started).total_seconds(), 3),
        },
        check_results=[
            check(
                "totals_match_node_table",
                row["total_nodes"] == len(nodes) == row["healthy_nodes"] + row["faulty_nodes"],
                node_rows=len(nodes) + len(malformed),
                malformed_node_rows=len(malformed),
                total_nodes=row["total_nodes"],
            ),
            rows_readable_check(turn, malformed),
            check("every_healthy_node_in_one_bucket", buckets == row["healthy_nodes"], bucketed=buckets),
            prometheus_check("prometheus_fresh", turn, mark, prom_error),
            check(
                "utilization_known",
                prom_error is not None or row["utilization"] is not None,
                warn=True,
                **turn.dialect_metadata(),
            ),
            check(
                "storage_capacity_known",
                not uncapped,
                warn=True,
                volumes_without_capacity=uncapped[:20],
                count=len(uncapped),
                fix="set the volume's capacity under juicefs_capacity_bytes in the registry",
            ),
        ],
    )
