"""`gpu_nodes`: the cluster's GPU nodes, what their pods hold and how busy they are -> `node`.

Two paged LISTs (nodes, pods) and one grouped Prometheus query per vendor, whatever the size of
the cluster; the rows come from `collect.nodes`, the write from `store.nodes`.
"""

from datetime import UTC, datetime

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    Backoff,
    Jitter,
    MaterializeResult,
    RetryPolicy,
    asset,
)

from lens_pipeline.collect.nodes import gpu_node_rows, utilization_by_node
from lens_pipeline.collect.pods import allocation_by_node
from lens_pipeline.defs.collectors.reporting import (
    markdown_table,
    problems_metadata,
    read_metadata,
    sync_metadata,
)
from lens_pipeline.defs.partitions import cluster_partitions
from lens_pipeline.defs.resources import (
    ClusterRegistryResource,
    KubernetesResource,
    LensDatabase,
    PrometheusResource,
)
from lens_pipeline.prom.reader import PromError
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.nodes import stored_utilization, write_gpu_nodes

COLLECTOR_RETRY = RetryPolicy(max_retries=2, delay=2, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS)
TABLE_COLUMNS = ("name", "gpu_name", "gpu_count", "gpu_allocation", "gpu_utilization", "status", "address")


@asset(
    partitions_def=cluster_partitions,
    group_name="collectors",
    kinds={"kubernetes", "prometheus", "sql"},
    retry_policy=COLLECTOR_RETRY,
    check_specs=[
        AssetCheckSpec(
            "allocation_within_capacity",
            asset="gpu_nodes",
            description="No node has more GPUs allocated than it has.",
        ),
        AssetCheckSpec(
            "every_node_readable",
            asset="gpu_nodes",
            description="Every Node and Pod object of the cluster could be read.",
        ),
        AssetCheckSpec(
            "utilization_fresh",
            asset="gpu_nodes",
            description="Prometheus answered the utilization query this run.",
        ),
    ],
    description="GPU nodes of one cluster (Lens `node` table): capacity, allocation, utilization, health.",
)
def gpu_nodes(
    context: AssetExecutionContext,
    registry: ClusterRegistryResource,
    kubernetes: KubernetesResource,
    prometheus: PrometheusResource,
    lens_db: LensDatabase,
) -> MaterializeResult:
    cluster = registry.cluster(context.partition_key)
    snapshot = kubernetes.snapshot(cluster)
    profiles = snapshot.profiles
    started, stats_before = datetime.now(UTC), snapshot.reader.stats.copy()
    nodes, gpu_pods, problems = snapshot.nodes, snapshot.gpu_pods, snapshot.pod_problems

    prom = prometheus.reader(cluster)
    utilization: dict[str, float] | None = {}
    prom_error = "no prometheus_url in the registry" if prom is None else None
    if prom is not None:
        try:
            for profile in profiles:
                samples = prom.vector(profile.node_utilization_query())
                utilization.update(
                    utilization_by_node(((s.labels, s.value) for s in samples), profile.node_label)
                )
        except PromError as exc:
            context.log.warning(f"{exc}; keeping each node's last stored utilization")
            prom_error, utilization = str(exc), None

    engine = lens_db.engine()
    with write_transaction(engine) as conn:
        if utilization is None:
            utilization = {k: v for k, v in stored_utilization(conn, cluster.name).items() if v is not None}
        rows, node_problems, unreadable = gpu_node_rows(
            nodes, profiles, allocation_by_node(gpu_pods), utilization
        )
        result = write_gpu_nodes(conn, cluster.name, rows, now=datetime.now(UTC), unreadable=unreadable)
    problems = node_problems + problems
    for problem in problems[:20]:
        context.log.warning(f"cluster {cluster.name}: skipped {problem}")

    capacity = sum(r["gpu_count"] for r in rows)
    allocated = sum(r["gpu_allocation"] for r in rows)
    over = [r["name"] for r in rows if r["gpu_allocation"] > r["gpu_count"]]
    return MaterializeResult(
        metadata={
            "cluster": cluster.name,
            "dagster/row_count": len(rows),
            "gpu_nodes": len(rows),
            "ready_nodes": sum(r["status"] == "Ready" for r in rows),
            "gpu_capacity": capacity,
            "gpu_allocated": allocated,
            "allocation_rate": round(100.0 * allocated / capacity, 3) if capacity else 0.0,
            "duration_seconds": round((datetime.now(UTC) - started).total_seconds(), 3),
            **sync_metadata(result),
            **read_metadata(snapshot.reader.stats.since(stats_before), prom.queries if prom else 0),
            **problems_metadata(problems),
            "nodes": markdown_table(rows, TABLE_COLUMNS),
        },
        check_results=[
            AssetCheckResult(
                check_name="allocation_within_capacity",
                passed=not over,
                metadata={"over_allocated_nodes": over[:50], "count": len(over)},
            ),
            AssetCheckResult(
                check_name="every_node_readable",
                passed=not problems,
                severity=AssetCheckSeverity.WARN,
                metadata={"malformed_objects": len(problems)},
            ),
            AssetCheckResult(
                check_name="utilization_fresh",
                passed=prom_error is None,
                severity=AssetCheckSeverity.WARN,
                metadata={"error": prom_error or ""},
            ),
        ],
    )
