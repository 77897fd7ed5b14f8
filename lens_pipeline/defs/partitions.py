"""The cluster partitions: one dynamic partition per registered cluster, kept equal to the registry
by `cluster_registry_sensor`; and which clusters the runs in flight are working on."""

from collections.abc import Collection, Mapping, Sequence

from dagster import DagsterInstance, DagsterRunStatus, DynamicPartitionsDefinition, RunsFilter

# Dagster's documented run tags for the partition (or range of partitions) a run materializes; the
# public API names no constant for them.
PARTITION_NAME_TAG = "dagster/partition"
ASSET_PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
ASSET_PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"
# Run statuses, from the public enum.
IN_PROGRESS_RUN_STATUSES = (
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
    DagsterRunStatus.SUSPENDED,
)
FINISHED_STATUSES = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
# A run holds its clusters from its request until it ends: one waiting in the run queue will do the
# work too, so another requested beside it would only pile up behind it.
HOLDING_RUN_STATUSES = (DagsterRunStatus.NOT_STARTED, DagsterRunStatus.QUEUED, *IN_PROGRESS_RUN_STATUSES)

CLUSTER_PARTITIONS_NAME = "cluster"
cluster_partitions = DynamicPartitionsDefinition(name=CLUSTER_PARTITIONS_NAME)

# Tag of a collection run of one cluster; the run queue allows one run per value at a time.
CLUSTER_TAG = "lens/cluster"
# Tag of a collection run over a batch of clusters ("first..last" of the partition range).
BATCH_TAG = "lens/batch"

WORKING = (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING)


def clusters_of_run(tags: Mapping[str, str], order: Sequence[str]) -> list[str]:
    """The cluster partitions a run covers, from its partition tags (one key, or a key range in
    the partitions' order)."""
    if PARTITION_NAME_TAG in tags:
        return [tags[PARTITION_NAME_TAG]]
    start, end = tags.get(ASSET_PARTITION_RANGE_START_TAG), tags.get(ASSET_PARTITION_RANGE_END_TAG)
    if start is None or end is None or start not in order or end not in order:
        return []
    return list(order[order.index(start) : order.index(end) + 1])


def clusters_in_runs(
    instance: DagsterInstance,
    *,
    statuses: Collection[DagsterRunStatus] = HOLDING_RUN_STATUSES,
    job_names: Collection[str] | None = None,
    asset_keys: Collection[object] | None = None,
    before_run_id: str | None = None,
) -> set[str]:
    """Clusters held by the runs in `statuses` of `job_names` or touching `asset_keys` (by any run
    when both are None).

    With `before_run_id`, only runs created before that one count (ties broken by run id), so that
    of two runs started together on the same cluster exactly one gives way."""
    records = instance.get_run_records(RunsFilter(statuses=list(statuses)))
    if not records:
        return set()
    mine = None
    if before_run_id is not None:
        mine = instance.get_run_record_by_id(before_run_id)
    order = instance.get_dynamic_partitions(CLUSTER_PARTITIONS_NAME)
    wanted = set(asset_keys or ())
    every_run = job_names is None and asset_keys is None
    held: set[str] = set()
    for record in records:
        run = record.dagster_run
        if mine is not None and (record.create_timestamp, run.run_id) >= (
            mine.create_timestamp,
            before_run_id,
        ):
            continue  # this run, or a younger one: that one gives way
        ours = (
            every_run
            or (job_names is not None and run.job_name in job_names)
            or bool(wanted & set(run.asset_selection or ()))
        )
        if ours:
            held.update(clusters_of_run(run.tags, order))
    return held
