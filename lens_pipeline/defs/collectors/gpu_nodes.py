"""`gpu_nodes`: the cluster's GPU nodes, what their pods hold and how busy they are -> `node`.

Two paged LISTs (nodes, pods) and one grouped Prometheus query per vendor, whatever the size of
the cluster; the rows come from `collect.nodes`, the write from `store.nodes`.
"""

from datetime import UTC, datetime

from dagster import MaterializeResult

from lens_pipeline.collect.nodes import gpu_node_rows, utilization_by_node
from lens_pipeline.collect.pods import allocation_by_node
from lens_pipeline.defs.collectors.common import ClusterTurn, CollectorRun, collector, prometheus_check
from lens_pipeline.defs.collectors.reporting import markdown_table, sync_metadata
from lens_pipeline.prom.reader import PromError
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.nodes import stored_utilization, write_gpu_nodes
from lens_pipeline.store.schema import node

TABLE_COLUMNS = ("name", "gpu_name", "gpu_count", "gpu_allocation", "gpu_utilization", "status", "address")


@collector(
    table=node,
    description="GPU nodes of one cluster (Lens `node` table): capacity, allocation, utilization, health.",
    kinds=frozenset({"kubernetes", "prometheus", "sql"}),
    checks={
        "allocation_within_capacity": "No node has more GPUs allocated than it has.",
        "every_node_readable": "Every Node and Pod object of the cluster could be read.",
        "utilization_fresh": "Prometheus answered the utilization query this run, every sample readable.",
        "every_gpu_node_has_utilization": "Every Ready GPU node has utilization series that name it "
        "(else its utilization is unknown, NULL).",
    },
    prometheus_queries=lambda dialect: [p.node_utilization_query() for p in dialect.profiles],
)
def gpu_nodes(turn: ClusterTurn) -> MaterializeResult:
    run = CollectorRun(turn)
    snapshot = run.snapshot
    run.problems += snapshot.pod_problems

    prom = turn.prometheus_reader()
    utilization: dict[str, float] | None = {}
    unmatched: list[str] = []
    prom_error = "no prometheus_url in the registry" if prom is None else None
    if prom is not None:
        try:
            for profile in turn.dialect().profiles:
                samples = prom.vector(profile.node_utilization_query())
                found, strangers = utilization_by_node(
                    ((s.labels, s.value) for s in samples), profile.node_label, snapshot.node_index
                )
                utilization.update(found)
                unmatched += strangers
        except PromError as exc:
            turn.log.warning(f"{exc}; keeping each node's last stored utilization")
            prom_error, utilization = str(exc), None

    with write_transaction(turn.lens_db.engine()) as conn:
        measured = utilization is not None
        if utilization is None:
            utilization = {
                k: v for k, v in stored_utilization(conn, run.cluster.name).items() if v is not None
            }
        rows, node_problems, unreadable = gpu_node_rows(
            snapshot.nodes, snapshot.profiles, allocation_by_node(snapshot.gpu_pods), utilization
        )
        result = write_gpu_nodes(conn, run.cluster.name, rows, now=datetime.now(UTC), unreadable=unreadable)
    run.problems[:0] = node_problems

    capacity = sum(r["gpu_count"] for r in rows)
    allocated = sum(r["gpu_allocation"] for r in rows)
    over = [r["name"] for r in rows if r["gpu_allocation"] > r["gpu_count"]]
    unknown = [
        r["name"] for r in rows if r["status"] == "Ready" and r["gpu_count"] and r["gpu_utilization"] is None
    ]
    return run.finish(
        {
            "dagster/row_count": len(rows),
            "gpu_nodes": len(rows),
            "ready_nodes": sum(r["status"] == "Ready" for r in rows),
            "gpu_capacity": capacity,
            "gpu_allocated": allocated,
            "allocation_rate": round(100.0 * allocated / capacity, 3) if capacity else 0.0,
            "nodes_without_utilization": len(unknown),
            **sync_metadata(result),
            **turn.dialect_metadata(),
            "nodes": markdown_table(rows, TABLE_COLUMNS),
        },
        [
            run.check(
                "allocation_within_capacity", not over, over_allocated_nodes=over[:50], count=len(over)
            ),
            run.readable_check("every_node_readable"),
            prometheus_check("utilization_fresh", turn, run.malformed_samples_mark, prom_error),
            run.check(
                "every_gpu_node_has_utilization",
                not measured or not unknown,
                warn=True,
                count=len(unknown),
                nodes=unknown[:20],
                series_naming_no_node=len(unmatched),
                unmatched_node_labels=sorted(set(unmatched))[:20],
                **turn.dialect_metadata(),
            ),
        ],
    )
