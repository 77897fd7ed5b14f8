"""Collection runs: every registered cluster once a minute, healthy clusters in batches.

A batch is a range of cluster partitions in one run (`lens_pipeline.defs.cluster_assets`), so the
seconds a run costs before it does any work are paid once per batch. A cluster whose last
collection failed runs alone (retried with backoff), so a broken cluster delays its batch at most
once; a cluster some run is still queued for or working on is left out of this minute's requests.
"""

from collections.abc import Sequence

from dagster import (
    AssetPartitionStatus,
    AssetSelection,
    DagsterInstance,
    DefaultScheduleStatus,
    Definitions,
    RunRequest,
    ScheduleEvaluationContext,
    SkipReason,
    define_asset_job,
    in_process_executor,
    schedule,
)

from lens_pipeline import settings
from lens_pipeline.defs.cluster_assets import ASSET_KEYS, COLLECTION_TAG, JOB_NAME, cluster_assets
from lens_pipeline.defs.partitions import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    BATCH_TAG,
    CLUSTER_PARTITIONS_NAME,
    CLUSTER_TAG,
    cluster_partitions,
    clusters_in_runs,
)
from lens_pipeline.defs.run_tags import COLLECTION_RUN_TAGS

collect_cluster_job = define_asset_job(
    JOB_NAME,
    # With the checks the collectors and views report, not every check of their assets: the fleet's
    # `every_cluster_fresh` is its sensor's, and a run that planned it would record it skipped each
    # minute, which the UI shows in place of the sensor's verdict (late clusters included).
    selection=AssetSelection.assets(*ASSET_KEYS).without_checks()
    | AssetSelection.checks(*cluster_assets.check_keys),
    executor_def=in_process_executor,
    tags={**COLLECTION_RUN_TAGS, COLLECTION_TAG: "scheduled"},
    description="Every collector of a cluster (or of a batch of clusters) and everything derived from "
    "them, in one process (startup costs seconds per run).",
)


def failing_clusters(instance: DagsterInstance, clusters: Sequence[str]) -> set[str]:
    """Clusters whose partition of one of the collectors or views is failed in Dagster's status (the
    last run that planned it failed without materializing it)."""
    failed: set[str] = set()
    for key in ASSET_KEYS:
        status = instance.get_status_by_partition(key, list(clusters), cluster_partitions)
        failed |= {name for name, state in (status or {}).items() if state == AssetPartitionStatus.FAILED}
    return failed


def collection_requests(
    clusters: Sequence[str], *, busy: set[str], alone: set[str], batch_size: int, tick: str
) -> list[RunRequest]:
    """Runs for `clusters` (in partition order): contiguous batches of at most `batch_size`, a run of
    its own for each cluster in `alone`, none for the `busy` ones."""
    requests: list[RunRequest] = []
    batch: list[str] = []

    def flush() -> None:
        if len(batch) == 1:
            name = batch[0]
            requests.append(
                RunRequest(run_key=f"{name}@{tick}", partition_key=name, tags={CLUSTER_TAG: name})
            )
        elif batch:
            span = f"{batch[0]}..{batch[-1]}"
            requests.append(
                RunRequest(
                    run_key=f"{span}@{tick}",
                    tags={
                        ASSET_PARTITION_RANGE_START_TAG: batch[0],
                        ASSET_PARTITION_RANGE_END_TAG: batch[-1],
                        BATCH_TAG: span,
                    },
                )
            )
        batch.clear()

    for name in clusters:
        if name in busy:
            flush()  # a range is contiguous: it cannot step over a busy cluster
        elif name in alone:
            flush()
            batch.append(name)
            flush()
        else:
            batch.append(name)
            if len(batch) >= batch_size:
                flush()
    flush()
    return requests


@schedule(
    cron_schedule="* * * * *",
    job=collect_cluster_job,
    default_status=DefaultScheduleStatus.RUNNING,
    description="Each registered cluster's collectors, once a minute: healthy clusters in batches of "
    f"${settings.LENS_CLUSTERS_PER_RUN} (default {settings.DEFAULT_CLUSTERS_PER_RUN}), failing ones "
    "alone.",
)
def collect_every_minute(context: ScheduleEvaluationContext) -> list[RunRequest] | SkipReason:
    clusters = context.instance.get_dynamic_partitions(CLUSTER_PARTITIONS_NAME)
    if not clusters:
        return SkipReason("no cluster partitions yet: cluster_registry_sensor adds them from the registry")
    busy = clusters_in_runs(context.instance, job_names={JOB_NAME}, asset_keys=ASSET_KEYS)
    alone = failing_clusters(context.instance, clusters) - busy
    tick = context.scheduled_execution_time.isoformat() if context.scheduled_execution_time else "manual"
    requests = collection_requests(
        clusters, busy=busy, alone=alone, batch_size=settings.clusters_per_run(), tick=tick
    )
    if busy:
        context.log.info(f"left to the runs still going: {sorted(busy)}")
    return requests or SkipReason(f"every cluster has a run going: {sorted(busy)}")


defs = Definitions(assets=[cluster_assets], jobs=[collect_cluster_job], schedules=[collect_every_minute])
