"""`gpu_pods`: every pod holding GPUs of the cluster's vendor -> `gpu_pods`, `pod_resource`,
`pod_snapshot` (on change only) and `gpu_pods_event` (each condition that became True)."""

from datetime import UTC, datetime

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    MaterializeResult,
    asset,
)

from lens_pipeline.collect.nodes import gpu_models_by_node
from lens_pipeline.collect.pods import condition_events, gpu_pod_row, pod_resource_row, pod_snapshot_row
from lens_pipeline.collect.problems import MalformedObject, Problem, object_name
from lens_pipeline.defs.collectors.gpu_nodes import COLLECTOR_RETRY, gpu_nodes
from lens_pipeline.defs.collectors.reporting import (
    markdown_table,
    problems_metadata,
    read_metadata,
    sync_metadata,
)
from lens_pipeline.defs.partitions import cluster_partitions
from lens_pipeline.defs.resources import ClusterRegistryResource, KubernetesResource, LensDatabase
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.pods import write_pods

TABLE_COLUMNS = ("namespace", "name", "node_name", "gpu_allocated", "phase", "running", "deleted", "ip")


@asset(
    partitions_def=cluster_partitions,
    group_name="collectors",
    kinds={"kubernetes", "sql"},
    deps=[gpu_nodes],
    retry_policy=COLLECTOR_RETRY,
    check_specs=[
        AssetCheckSpec("every_pod_readable", asset="gpu_pods", description="Every Pod object could be read."),
        AssetCheckSpec(
            "pods_on_known_nodes",
            asset="gpu_pods",
            description="Every scheduled GPU pod runs on a node the cluster lists.",
        ),
    ],
    description="GPU pods of one cluster: gpu_pods, pod_resource, pod_snapshot, gpu_pods_event.",
)
def gpu_pods(
    context: AssetExecutionContext,
    registry: ClusterRegistryResource,
    kubernetes: KubernetesResource,
    lens_db: LensDatabase,
) -> MaterializeResult:
    cluster = registry.cluster(context.partition_key)
    snapshot = kubernetes.snapshot(cluster)
    stats_before = snapshot.reader.stats.copy()
    pods, problems = snapshot.gpu_pods, list(snapshot.pod_problems)
    models = gpu_models_by_node(snapshot.nodes, snapshot.profiles)

    pod_rows, resource_rows, snapshot_rows, events, unreadable = [], [], [], {}, set()
    for pod in pods:
        try:
            model = models.get(pod.node_name, "")
            rows = (
                gpu_pod_row(pod),
                pod_resource_row(pod, model),
                pod_snapshot_row(pod),
                condition_events(pod),
            )
        except MalformedObject as exc:
            problems.append(
                Problem("Pod", f"{pod.metadata.get('namespace')}/{pod.metadata.get('name')}", str(exc))
            )
            unreadable.add(pod.uid)
            continue
        pod_rows.append(rows[0])
        resource_rows.append(rows[1])
        snapshot_rows.append(rows[2])
        events[pod.uid] = rows[3]

    now = datetime.now(UTC)
    with write_transaction(lens_db.engine()) as conn:
        written = write_pods(
            conn,
            cluster.name,
            pods=pod_rows,
            resources=resource_rows,
            snapshots=snapshot_rows,
            events_of=lambda uid: events.get(uid, []),
            now=now,
            unreadable=unreadable,
        )
    for problem in problems[:20]:
        context.log.warning(f"cluster {cluster.name}: skipped {problem}")

    node_names = {object_name(n) for n in snapshot.nodes}
    orphans = sorted(
        {r["node_name"] for r in pod_rows if r["node_name"] and r["node_name"] not in node_names}
    )
    return MaterializeResult(
        metadata={
            "cluster": cluster.name,
            "dagster/row_count": len(pod_rows),
            "running_pods": sum(r["running"] for r in pod_rows),
            "gpus_held_by_running_pods": sum(r["gpu_allocated"] for r in pod_rows if r["running"]),
            **sync_metadata(written["gpu_pods"]),
            "pod_resource_rows_written": written["pod_resource"].written,
            "pod_snapshots_written": written["pod_snapshot"],
            "pod_events_written": written["gpu_pods_event"],
            **read_metadata(snapshot.reader.stats.since(stats_before), 0),
            **problems_metadata(problems),
            "pods": markdown_table(
                sorted(pod_rows, key=lambda r: (r["namespace"], r["name"])), TABLE_COLUMNS
            ),
        },
        check_results=[
            AssetCheckResult(
                check_name="every_pod_readable",
                passed=not problems,
                severity=AssetCheckSeverity.WARN,
                metadata={"malformed_objects": len(problems)},
            ),
            AssetCheckResult(
                check_name="pods_on_known_nodes",
                passed=not orphans,
                severity=AssetCheckSeverity.WARN,
                metadata={"unknown_nodes": orphans[:50]},
            ),
        ],
    )
