"""`storage_backends`: JuiceFS (and future) StorageClasses and their Secrets -> `storage`."""

from datetime import UTC, datetime

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    MaterializeResult,
    asset,
)

from lens_pipeline.collect.problems import MalformedObject, Problem, object_name
from lens_pipeline.collect.storage import driver_for, secret_ref, storage_row
from lens_pipeline.defs.collectors.gpu_nodes import COLLECTOR_RETRY
from lens_pipeline.defs.collectors.reporting import (
    markdown_table,
    problems_metadata,
    read_metadata,
    sync_metadata,
)
from lens_pipeline.defs.partitions import cluster_partitions
from lens_pipeline.defs.resources import ClusterRegistryResource, KubernetesResource, LensDatabase
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.storage import write_storage


@asset(
    partitions_def=cluster_partitions,
    group_name="collectors",
    kinds={"kubernetes", "sql"},
    retry_policy=COLLECTOR_RETRY,
    check_specs=[
        AssetCheckSpec(
            "every_backend_readable",
            asset="storage_backends",
            description="Every storage class a driver knows could be read with its Secret.",
        )
    ],
    description="Storage backends of one cluster (JuiceFS first): the `storage` table.",
)
def storage_backends(
    context: AssetExecutionContext,
    registry: ClusterRegistryResource,
    kubernetes: KubernetesResource,
    lens_db: LensDatabase,
) -> MaterializeResult:
    cluster = registry.cluster(context.partition_key)
    snapshot = kubernetes.snapshot(cluster)
    stats_before = snapshot.reader.stats.copy()
    classes = snapshot.reader.list("/apis/storage.k8s.io/v1/storageclasses", lambda o: o)
    rows, problems, unreadable = [], [], []
    for storage_class in classes:
        if not isinstance(storage_class, dict) or driver_for(storage_class) is None:
            continue
        try:
            ref = secret_ref(storage_class)
            # A few GETs, one per backend's Secret: listing every Secret of the cluster would read them all.
            secret = snapshot.reader.get(f"/api/v1/namespaces/{ref[0]}/secrets/{ref[1]}") if ref else None
            rows.append(storage_row(storage_class, secret))
        except MalformedObject as exc:
            problems.append(Problem("StorageClass", object_name(storage_class), str(exc)))
            unreadable.append(object_name(storage_class))
    rows = sorted({(r["kind"], r["name"]): r for r in rows}.values(), key=lambda r: (r["kind"], r["name"]))
    with write_transaction(lens_db.engine()) as conn:
        result = write_storage(conn, cluster.name, rows, now=datetime.now(UTC), keep_all=bool(unreadable))
    for problem in problems:
        context.log.warning(f"cluster {cluster.name}: {problem}")
    return MaterializeResult(
        metadata={
            "cluster": cluster.name,
            "dagster/row_count": len(rows),
            **sync_metadata(result),
            **read_metadata(snapshot.reader.stats.since(stats_before), 0),
            **problems_metadata(problems),
            "backends": markdown_table(rows, ("kind", "name", "status")),
        },
        check_results=[
            AssetCheckResult(
                check_name="every_backend_readable",
                passed=not problems,
                severity=AssetCheckSeverity.WARN,
                metadata={"problems": len(problems)},
            )
        ],
    )
