"""`container_events_sensor`: a cursor on the event log's id; a `container_events` run for each
cluster with new events to process, and an observation (no run) for a cluster whose new events
need no processing (the original ignored k8s events without GPUs)."""

from dagster import (
    AssetKey,
    AssetObservation,
    DagsterRunStatus,
    DefaultSensorStatus,
    Definitions,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    in_process_executor,
    sensor,
)

from lens_pipeline.defs.containers.assets import container_events
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.defs.resources import LensDatabase
from lens_pipeline.defs.run_tags import CONTAINER_EVENTS_RUN_TAGS
from lens_pipeline.store.event_log import news_after

# The run queue allows one container_events run per cluster at a time (dagster.yaml,
# deploy/helm/dagster-values.yaml); not the collectors' tag, so event processing never waits behind
# a minute-long collection run.
CONTAINER_EVENTS_TAG = "lens/container-events"
WAITING = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED]

process_container_events_job = define_asset_job(
    "process_container_events",
    selection=[container_events],
    executor_def=in_process_executor,
    tags=CONTAINER_EVENTS_RUN_TAGS,
    description="Apply one cluster's new container events from the ingest log.",
)


def _waiting_runs(context: SensorEvaluationContext, cluster: str) -> bool:
    """A run of this cluster that has not started yet: it will see the new events anyway."""
    records = context.instance.get_run_records(
        RunsFilter(
            job_name=process_container_events_job.name,
            statuses=WAITING,
            tags={"dagster/partition": cluster},
        ),
        limit=1,
    )
    return bool(records)


@sensor(
    job=process_container_events_job,
    minimum_interval_seconds=15,
    default_status=DefaultSensorStatus.RUNNING,
    description="Starts container_events runs for the clusters with new events in the ingest log.",
)
def container_events_sensor(
    context: SensorEvaluationContext, lens_db: LensDatabase
) -> SensorResult | SkipReason:
    cursor = int(context.cursor or 0)
    with lens_db.engine().connect() as conn:
        news = news_after(conn, cursor)
    if not news:
        return SkipReason(f"no new events after log id {cursor}")
    known = set(context.instance.get_dynamic_partitions(CLUSTER_PARTITIONS_NAME))
    requests, observations, unknown = [], [], []
    for item in news:
        if item.cluster not in known:
            unknown.append(item.cluster)
        elif item.to_process == 0:
            observations.append(
                AssetObservation(
                    asset_key=AssetKey("container_events"),
                    partition=item.cluster,
                    metadata={"events_needing_no_processing": item.events, "log_last_id": item.last_id},
                )
            )
        elif not _waiting_runs(context, item.cluster):
            requests.append(
                RunRequest(
                    run_key=f"{item.cluster}@{item.last_id}",
                    partition_key=item.cluster,
                    tags={CONTAINER_EVENTS_TAG: item.cluster},
                )
            )
    if unknown:
        context.log.warning(
            f"events for clusters that are not registered partitions (processed once they are): {unknown}"
        )
    return SensorResult(
        run_requests=requests,
        asset_events=observations,
        cursor=str(max(item.last_id for item in news)),
    )


defs = Definitions(
    assets=[container_events], jobs=[process_container_events_job], sensors=[container_events_sensor]
)
