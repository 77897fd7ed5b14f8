"""`every_cluster_fresh`: a check on `cluster_overview_cache` that names each cluster whose
collectors or views are older than the freshness windows, even when every other cluster is fresh
(Dagster's freshness policies judge an asset across all its partitions).

`cluster_freshness_sensor` evaluates it every minute without a run (an evaluation reported from the
sensor); the check can also be executed from the UI. Both read when each cluster's assets were last
materialized from the Lens database (`asset_freshness`, written at the end of each cluster's turn,
the same figures as `lens_cluster_last_collected_timestamp_seconds` on `lens api`'s /metrics).
"""

from datetime import UTC, datetime

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    DagsterInstance,
    DefaultSensorStatus,
    Definitions,
    MetadataValue,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset_check,
    sensor,
)

from lens_pipeline.collect.freshness import FAIL_AFTER, WARN_AFTER, late_clusters
from lens_pipeline.defs.cluster_assets import ASSET_KEYS
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.defs.resources import LensDatabase
from lens_pipeline.store.overview import materialized_times

CHECKED = AssetKey("cluster_overview_cache")
CHECK_NAME = "every_cluster_fresh"
ASSETS = [key.path[-1] for key in ASSET_KEYS]
MAX_NAMED = 50


def freshness_evaluation(instance: DagsterInstance, lens_db: LensDatabase, now: datetime) -> AssetCheckResult:
    """The check's result over every registered cluster, as of `now`."""
    clusters = instance.get_dynamic_partitions(CLUSTER_PARTITIONS_NAME)
    with lens_db.engine().connect() as conn:
        times = materialized_times(conn, ASSETS)
    late = late_clusters(clusters, times, ASSETS, now)
    failing = [c for c in late if c.failing]
    return AssetCheckResult(
        asset_key=CHECKED,
        check_name=CHECK_NAME,
        passed=not late,
        severity=AssetCheckSeverity.ERROR if failing else AssetCheckSeverity.WARN,
        description=(
            f"{len(late)} of {len(clusters)} clusters late: " + "; ".join(c.describe() for c in late[:10])
            if late
            else f"all {len(clusters)} clusters fresh"
        ),
        metadata={
            "clusters": len(clusters),
            "clusters_late": len(late),
            "clusters_failing": len(failing),
            "late": MetadataValue.json({c.cluster: c.stale for c in late[:MAX_NAMED]}),
            "warn_after_seconds": WARN_AFTER.total_seconds(),
            "fail_after_seconds": FAIL_AFTER.total_seconds(),
        },
    )


@asset_check(
    asset=CHECKED,
    name=CHECK_NAME,
    description="Every registered cluster's collectors and views were materialized within the "
    f"freshness windows ({WARN_AFTER.total_seconds():.0f} s: warning, {FAIL_AFTER.total_seconds():.0f} s: "
    "error); the late clusters are named. Evaluated every minute by cluster_freshness_sensor.",
)
def every_cluster_fresh(context: AssetCheckExecutionContext, lens_db: LensDatabase) -> AssetCheckResult:
    return freshness_evaluation(context.instance, lens_db, datetime.now(UTC))


@sensor(
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description=f"Reports `{CHECK_NAME}` on cluster_overview_cache every minute (no run): the clusters "
    "whose assets are late, by name.",
)
def cluster_freshness_sensor(
    context: SensorEvaluationContext, lens_db: LensDatabase
) -> SensorResult | SkipReason:
    if not context.instance.get_dynamic_partitions(CLUSTER_PARTITIONS_NAME):
        return SkipReason("no cluster partitions yet")
    result = freshness_evaluation(context.instance, lens_db, datetime.now(UTC))
    evaluation = AssetCheckEvaluation(
        asset_key=CHECKED,
        check_name=CHECK_NAME,
        passed=result.passed,
        severity=result.severity,
        description=result.description,
        metadata=result.metadata,
    )
    return SensorResult(asset_events=[evaluation])


defs = Definitions(asset_checks=[every_cluster_fresh], sensors=[cluster_freshness_sensor])
