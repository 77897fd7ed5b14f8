"""Collection runs: one run per cluster every minute, tagged so that the queue runs at most one per
cluster at a time."""

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    Definitions,
    RunRequest,
    ScheduleEvaluationContext,
    SkipReason,
    define_asset_job,
    in_process_executor,
    schedule,
)

from lens_pipeline.defs.collectors.gpu_devices import gpu_devices
from lens_pipeline.defs.collectors.gpu_nodes import gpu_nodes
from lens_pipeline.defs.collectors.gpu_pods import gpu_pods
from lens_pipeline.defs.collectors.gpu_workloads import gpu_workloads
from lens_pipeline.defs.collectors.storage_backends import storage_backends
from lens_pipeline.defs.derived.assets import VIEWS
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME, CLUSTER_TAG

COLLECTORS = (gpu_nodes, gpu_pods, gpu_workloads, gpu_devices, storage_backends)

collect_cluster_job = define_asset_job(
    "collect_cluster",
    selection=AssetSelection.assets(*COLLECTORS, *VIEWS),
    executor_def=in_process_executor,
    description="Every collector of one cluster and everything derived from them, in one process "
    "(startup costs seconds per run).",
)


@schedule(
    cron_schedule="* * * * *",
    job=collect_cluster_job,
    default_status=DefaultScheduleStatus.RUNNING,
    description="Each registered cluster's collectors, once a minute.",
)
def collect_every_minute(context: ScheduleEvaluationContext) -> list[RunRequest] | SkipReason:
    clusters = context.instance.get_dynamic_partitions(CLUSTER_PARTITIONS_NAME)
    if not clusters:
        return SkipReason("no cluster partitions yet: cluster_registry_sensor adds them from the registry")
    tick = context.scheduled_execution_time.isoformat() if context.scheduled_execution_time else "manual"
    return [
        RunRequest(run_key=f"{name}@{tick}", partition_key=name, tags={CLUSTER_TAG: name})
        for name in sorted(clusters)
    ]


defs = Definitions(assets=list(COLLECTORS), jobs=[collect_cluster_job], schedules=[collect_every_minute])
