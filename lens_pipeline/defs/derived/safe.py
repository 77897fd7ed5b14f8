"""The SaFE database's statistics (spec §6.1, §6.2), for every cluster (the original skipped the one
named "default", §10.11):

- `safe_node_statistic`: each GPU node's utilization (a copy of Lens `node.gpu_utilization`),
  keyed by (cluster, node_name); a node that leaves is soft-deleted, one that returns is live.
- `safe_workload_statistic`: each running or pending SaFE `Workload`'s average and peak GPU
  utilization over the last three hours, from the hourly workload statistics, keyed by
  (workload_id, statistic_type "3h").
"""

from datetime import UTC, datetime

from dagster import MaterializeResult

from lens_pipeline.collect.problems import MalformedObject, Problem
from lens_pipeline.collect.safe import (
    SAFE_GROUP_VERSION,
    WINDOW,
    node_statistic_row,
    usage_within_bounds,
    workload_statistic_row,
)
from lens_pipeline.defs.collectors.common import ClusterTurn, check
from lens_pipeline.defs.collectors.gpu_nodes import gpu_nodes
from lens_pipeline.defs.collectors.reporting import sync_metadata
from lens_pipeline.defs.derived.common import ROWS_READABLE, cluster_view, rows_readable_check
from lens_pipeline.defs.derived.statistics import workload_gpu_statistics
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.schema import node_statistic, safe_workload_statistic
from lens_pipeline.store.statistics import (
    ACTIVE,
    active_workloads,
    gpu_node_utilization,
    stored_hours,
    write_node_statistics,
    write_workload_statistics,
)


@cluster_view(
    description="SaFE `node_statistic`: every GPU node's utilization, by (cluster, node_name).",
    table=node_statistic,
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
            rows.append(node_statistic_row(node))
        except MalformedObject as exc:
            # Still a GPU node: its row stays, its utilization unknown (DECIMAL(5,2) holds no other).
            malformed.append(Problem("node", str(node["name"]), str(exc)))
            rows.append({"node_name": node["name"], "gpu_utilization": None})
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


@cluster_view(
    description="SaFE `workload_statistic`: each running SaFE Workload's 3-hour average and peak GPU "
    "utilization, by (workload_id, statistic_type).",
    table=safe_workload_statistic,
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
            row = workload_statistic_row(workload, by_uid.get(workload["uid"], []), cluster.name)
        except MalformedObject as exc:  # a stored row that is not what its columns hold
            malformed.append(Problem("workload", f"{workload.get('name')} {workload['uid']}", str(exc)))
            continue
        if row is not None:
            rows.append(row)
    # Figures SaFE's DECIMAL(5,2) percentages cannot hold are not written: the check names them.
    bad = [r["workload_id"] for r in rows if not usage_within_bounds(r)]
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
