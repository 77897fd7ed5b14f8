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
from typing import Any

from dagster import MaterializeResult

from lens_pipeline.collect.problems import MalformedObject, Problem
from lens_pipeline.collect.stored import stored_count, stored_figure, stored_mapping, stored_text
from lens_pipeline.defs.collectors.common import ClusterTurn, check
from lens_pipeline.defs.collectors.gpu_nodes import gpu_nodes
from lens_pipeline.defs.collectors.reporting import sync_metadata
from lens_pipeline.defs.derived.common import ROWS_READABLE, cluster_view, rows_readable_check
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
    checks={**ROWS_READABLE, "one_row_per_gpu_node": "The cluster's live rows are exactly its GPU nodes."},
)
def safe_node_statistic(turn: ClusterTurn) -> MaterializeResult:
    now = datetime.now(UTC)
    cluster = turn.cluster
    with turn.lens_db.engine().connect() as conn:
        nodes = gpu_node_utilization(conn, cluster.name)
    rows, malformed = [], []
    for node in nodes:
        try:
            utilization = percent(stored_figure(node, "gpu_utilization", 0.0, 100.0))
        except MalformedObject as exc:
            # Still a GPU node: its row stays, its utilization unknown (DECIMAL(5,2) holds no other).
            malformed.append(Problem("node", str(node["name"]), str(exc)))
            utilization = None
        rows.append({"node_name": node["name"], "gpu_utilization": utilization})
    with write_transaction(turn.safe_db.engine()) as conn:
        result = write_node_statistics(conn, cluster.name, rows, now=now)
    live = len(result.inserted) + len(result.updated) + result.unchanged
    return MaterializeResult(
        metadata={"cluster": cluster.name, "dagster/row_count": len(rows), **sync_metadata(result)},
        check_results=[
            check("one_row_per_gpu_node", live == len(nodes), live_rows=live, gpu_nodes=len(nodes)),
            rows_readable_check(turn, malformed),
        ],
    )


def safe_workload_row(
    workload: dict[str, Any], hours: list[dict[str, Any]], cluster: str
) -> dict[str, Any] | None:
    """A SaFE Workload's 3-hour figures from its hourly rows; None while it has no utilization yet
    (SaFE shows "unknown", -1, as the original did)."""
    samples = [(stored_count(h, "sample_count"), h) for h in hours]
    samples = [(n, h) for n, h in samples if n]
    if not samples:
        return None
    count = sum(n for n, _ in samples)
    total = sum(stored_figure(h, "total_sum", 0.0) or 0.0 for _, h in samples)
    peaks = [stored_figure(h, "max_utilization") for _, h in samples]
    if None in peaks:
        raise MalformedObject("max_utilization should be a number: the hour has samples")
    peak = max(p for p in peaks if p is not None)
    return {
        "workload_id": stored_text(workload, "name"),
        "statistic_type": STATISTIC_TYPE,
        "workload_uid": workload["uid"],
        "cluster": stored_mapping(workload, "labels").get(SAFE_CLUSTER_LABEL) or cluster,
        "workspace": stored_text(workload, "namespace"),
        # Weighted by samples (the original averaged the hourly averages).
        "avg_gpu_usage_3h": percent(total / count),
        "max_gpu_usage_3h": percent(peak),
        "data_points_count": count,
    }


@cluster_view(
    description="SaFE `workload_statistic`: each running SaFE Workload's 3-hour average and peak GPU "
    "utilization, by (workload_id, statistic_type).",
    deps=[workload_gpu_statistics],
    checks={
        **ROWS_READABLE,
        "usage_within_bounds": "Every average and peak is a percentage with average <= peak (a workload's "
        "that is not is named and not written).",
    },
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
    rows, malformed = [], []
    for workload in workloads:
        try:
            row = safe_workload_row(workload, by_uid.get(workload["uid"], []), cluster.name)
        except MalformedObject as exc:  # a stored row that is not what its columns hold
            malformed.append(Problem("workload", f"{workload.get('name')} {workload['uid']}", str(exc)))
            continue
        if row is not None:
            rows.append(row)
    # Figures SaFE's DECIMAL(5,2) percentages cannot hold are not written: the check names them.
    bad = [r["workload_id"] for r in rows if not (0 <= r["avg_gpu_usage_3h"] <= r["max_gpu_usage_3h"] <= 100)]
    rows = [r for r in rows if r["workload_id"] not in bad]
    with write_transaction(turn.safe_db.engine()) as conn:
        written = write_workload_statistics(conn, rows, now=now)
    return MaterializeResult(
        metadata={"cluster": cluster.name, "dagster/row_count": written, "safe_workloads": len(workloads)},
        check_results=[
            check("usage_within_bounds", not bad, workloads=bad[:50]),
            rows_readable_check(turn, malformed),
        ],
    )
