"""`container_events_sensor`: runs that apply the clusters' new container events, many clusters a
run, and an observation (no run) for a cluster whose new events need no processing (the original
ignored k8s events without GPUs).

Which clusters have events to apply is read from the database each tick (segments past each
cluster's watermark), not from the sensor's cursor alone: a cluster skipped while a run of it was
in flight is asked for again on a later tick. The cursor follows the log for the observations.
"""

import time
from collections.abc import Mapping, Sequence

from dagster import (
    AssetObservation,
    AssetPartitionStatus,
    DagsterRunStatus,
    DefaultSensorStatus,
    Definitions,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    in_process_executor,
    sensor,
)

from lens_pipeline.defs.containers.assets import (
    CONTAINER_EVENTS,
    EVENT_CLUSTERS_PER_RUN,
    JOB_NAME,
    container_events,
)
from lens_pipeline.defs.partitions import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    CLUSTER_PARTITIONS_NAME,
    IN_PROGRESS_RUN_STATUSES,
    cluster_partitions,
    clusters_in_runs,
)
from lens_pipeline.defs.resources import LensDatabase
from lens_pipeline.defs.run_tags import CONTAINER_EVENTS_RUN_TAGS
from lens_pipeline.store.event_log import news_after, pending_clusters

# The run queue's own limit for these runs (dagster.yaml, deploy/helm/values.yaml): they have their
# slots beside the collection runs' and carry no `dagster/partition` tag, so they never wait behind
# collection.
CONTAINER_EVENTS_TAG = "lens/container-events"
# A run not started yet will read every event logged before it starts: no second run for it.
WAITING = (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED)
REQUEST_SECONDS = 15  # the sensor's interval
FAILED_RETRY_SECONDS = 60

process_container_events_job = define_asset_job(
    JOB_NAME,
    selection=[container_events],
    executor_def=in_process_executor,
    tags={**CONTAINER_EVENTS_RUN_TAGS, CONTAINER_EVENTS_TAG: "apply"},
    description="Apply the new container events of a batch of clusters from the ingest log.",
)


def event_requests(
    order: Sequence[str],
    pending: Mapping[str, int],
    *,
    busy: set[str],
    alone: set[str],
    now: float,
    span: int = EVENT_CLUSTERS_PER_RUN,
) -> list[RunRequest]:
    """Runs over ranges of cluster partitions (in partition order) that cover every pending cluster
    not `busy`: a range starts and ends at a pending cluster, spans at most `span` partitions (the
    clusters with nothing new in between cost two queries each), and never covers a busy one. A
    cluster in `alone` (its last attempt failed) gets a run of its own, at most one a minute (the
    run key holds the minute), so it neither fails the batch nor spins."""
    requests: list[RunRequest] = []
    batch: list[str] = []

    def flush(every_seconds: int = REQUEST_SECONDS) -> None:
        while batch and batch[-1] not in pending:
            batch.pop()
        if batch:
            newest = max(pending[name] for name in batch if name in pending)
            requests.append(
                RunRequest(
                    # Within one period the daemon makes one run of a key; a later tick may ask again
                    # for events whose run failed.
                    run_key=f"{batch[0]}..{batch[-1]}@{newest}/{int(now // every_seconds)}",
                    tags={
                        ASSET_PARTITION_RANGE_START_TAG: batch[0],
                        ASSET_PARTITION_RANGE_END_TAG: batch[-1],
                    },
                )
            )
        batch.clear()

    for name in order:
        if name in busy:
            flush()  # a range is contiguous: it cannot step over a cluster a run holds
        elif name in alone and name in pending:
            flush()
            batch.append(name)
            flush(every_seconds=FAILED_RETRY_SECONDS)
        elif batch or (name in pending and name not in alone):
            batch.append(name)
            if len(batch) >= span:
                flush()
    flush()
    return requests


@sensor(
    job=process_container_events_job,
    minimum_interval_seconds=15,
    default_status=DefaultSensorStatus.RUNNING,
    description="Starts container_events runs over the clusters with new events in the ingest log, "
    f"up to {EVENT_CLUSTERS_PER_RUN} clusters a run.",
)
def container_events_sensor(
    context: SensorEvaluationContext, lens_db: LensDatabase
) -> SensorResult | SkipReason:
    cursor = int(context.cursor or 0)
    with lens_db.engine().connect() as conn:
        news = news_after(conn, cursor)
        pending = pending_clusters(conn)
    order = context.instance.get_dynamic_partitions(CLUSTER_PARTITIONS_NAME)
    known = set(order)
    unknown = sorted({item.cluster for item in news} - known)
    if unknown:
        context.log.warning(
            f"events for clusters that are not registered partitions (processed once they are): {unknown}"
        )
    observations = [
        AssetObservation(
            asset_key=CONTAINER_EVENTS,
            partition=item.cluster,
            metadata={"events_needing_no_processing": item.events, "log_last_id": item.last_id},
        )
        for item in news
        if item.cluster in known and item.to_process == 0 and item.cluster not in pending
    ]
    pending = {cluster: newest for cluster, newest in pending.items() if cluster in known}
    busy = clusters_in_runs(
        context.instance, statuses=(*WAITING, *IN_PROGRESS_RUN_STATUSES), job_names={JOB_NAME}
    )
    status = context.instance.get_status_by_partition(CONTAINER_EVENTS, list(pending), cluster_partitions)
    alone = {name for name, state in (status or {}).items() if state == AssetPartitionStatus.FAILED}
    requests = event_requests(order, pending, busy=busy, alone=alone, now=time.time())
    if not requests and not observations:
        waiting = sorted(set(pending) & busy)
        return SkipReason(
            f"no events to apply after log id {cursor}"
            + (f"; runs in flight hold {waiting}" if waiting else "")
        )
    return SensorResult(
        run_requests=requests,
        asset_events=observations,
        cursor=str(max([cursor, *(item.last_id for item in news)])),
    )


defs = Definitions(
    assets=[container_events], jobs=[process_container_events_job], sensors=[container_events_sensor]
)
