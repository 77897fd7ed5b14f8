"""The SaFE database's statistics (spec §6.1, §6.2), for every cluster (the original skipped the one
named "default", §10.11):

- `safe_node_statistic`: each GPU node's utilization (a copy of Lens `node.gpu_utilization`),
  keyed by (cluster, node_name); a node that leaves is soft-deleted, one that returns is live.
- `safe_workload_statistic`: each running or pending SaFE `Workload`'s average and peak GPU
  utilization over the last three hours, from the hourly workload statistics, keyed by
  (workload_id, statistic_type "3h").
"""

from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from dagster import MaterializeResult

from lens_pipeline.defs.collectors.common import ClusterTurn, check
from lens_pipeline.defs.collectors.gpu_nodes import gpu_nodes
from lens_pipeline.defs.collectors.reporting import sync_metadata
from lens_pipeline.defs.derived.common import cluster_view
from lens_pipeline.defs.derived.statistics import workload_gpu_statistics
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.statistics import (
    ACTIVE,
    active_workloads,
    gpu_node_utilization,
    stored_hours,
    write_node_statistics,
    write_workload_statistics,
)

SAFE_GROUP_VERSION = "amd.com/v1"
SAFE_CLUSTER_LABEL = "primus-safe.cluster.id"
STATISTIC_TYPE = "3h"
WINDOW = timedelta(hours=3)


def percent(value: float | None) -> Decimal | None:
    """A percentage as SaFE's DECIMAL(5,2) holds it; None when unknown or not a percentage (NaN,
    1e6: a broken counter would overflow the column and fail the cluster's whole write)."""
    if value is None or not 0.0 <= value <= 100.0:
        return None
    return Decimal(str(value)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


@cluster_view(
    description="SaFE `node_statistic`: every GPU node's utilization, by (cluster, node_name).",
    deps=[gpu_nodes],
    checks={"one_row_per_gpu_node": "The cluster's live rows are exactly its GPU nodes."},
)
def safe_node_statistic(turn: ClusterTurn) -> MaterializeResult:
    now = datetime.now(UTC)
    cluster = turn.cluster
    with turn.lens_db.engine().connect() as conn:
        nodes = gpu_node_utilization(conn, cluster.name)
    rows = [{"node_name": n["name"], "gpu_utilization": percent(n["gpu_utilization"])} for n in nodes]
    with write_transaction(turn.safe_db.engine()) as conn:
        result = write_node_statistics(conn, cluster.name, rows, now=now)
    live = len(result.inserted) + len(result.updated) + result.unchanged
    return MaterializeResult(
        metadata={"cluster": cluster.name, "dagster/row_count": len(rows), **sync_metadata(result)},
        check_results=[
            check("one_row_per_gpu_node", live == len(nodes), live_rows=live, gpu_nodes=len(nodes))
        ],
    )


@cluster_view(
    description="SaFE `workload_statistic`: each running SaFE Workload's 3-hour average and peak GPU "
    "utilization, by (workload_id, statistic_type).",
    deps=[workload_gpu_statistics],
    checks={"usage_within_bounds": "Every average and peak is a percentage with average <= peak."},
)
def safe_workload_statistic(turn: ClusterTurn) -> MaterializeResult:
    now = datetime.now(UTC)
    cluster = turn.cluster
    since = (now - WINDOW).replace(minute=0, second=0, microsecond=0)
    with turn.lens_db.engine().connect() as conn:
        workloads = [
            w
            for w in active_workloads(conn, cluster.name)
            if w["kind"] == "Workload" and w["group_version"] == SAFE_GROUP_VERSION and w["status"] in ACTIVE
        ]
        hours = stored_hours(conn, cluster.name, since, [w["uid"] for w in workloads])
    by_uid: dict[str, list[dict]] = {}
    for (uid, _hour), row in hours.items():
        by_uid.setdefault(uid, []).append(row)
    rows = []
    for workload in workloads:
        samples = [h for h in by_uid.get(workload["uid"], []) if h["sample_count"]]
        if not samples:
            continue  # no utilization yet: SaFE shows "unknown" (-1), as the original did
        count = sum(h["sample_count"] for h in samples)
        rows.append(
            {
                "workload_id": workload["name"],
                "statistic_type": STATISTIC_TYPE,
                "workload_uid": workload["uid"],
                "cluster": (workload["labels"] or {}).get(SAFE_CLUSTER_LABEL) or cluster.name,
                "workspace": workload["namespace"],
                # Weighted by samples (the original averaged the hourly averages).
                "avg_gpu_usage_3h": percent(sum(h["total_sum"] for h in samples) / count),
                "max_gpu_usage_3h": percent(max(h["max_utilization"] for h in samples)),
                "data_points_count": count,
            }
        )
    with write_transaction(turn.safe_db.engine()) as conn:
        written = write_workload_statistics(conn, rows, now=now)
    bad = [r["workload_id"] for r in rows if not (0 <= r["avg_gpu_usage_3h"] <= r["max_gpu_usage_3h"] <= 100)]
    return MaterializeResult(
        metadata={"cluster": cluster.name, "dagster/row_count": written, "safe_workloads": len(workloads)},
        check_results=[check("usage_within_bounds", not bad, workloads=bad[:50])],
    )
