"""Every derived asset, in the order a cluster's run materializes them, and the automation sensor
that keeps them following their collectors outside the scheduled runs."""

from dagster import AssetSelection, AutomationConditionSensorDefinition, DefaultSensorStatus, Definitions

from lens_pipeline.defs.derived.overview import cluster_overview_cache
from lens_pipeline.defs.derived.safe import safe_node_statistic, safe_workload_statistic
from lens_pipeline.defs.derived.statistics import gpu_consumers, workload_gpu_statistics

VIEWS = (
    cluster_overview_cache,
    workload_gpu_statistics,
    gpu_consumers,
    safe_node_statistic,
    safe_workload_statistic,
)

views_automation = AutomationConditionSensorDefinition(
    "cluster_views_automation",
    target=AssetSelection.assets(*VIEWS),
    default_status=DefaultSensorStatus.RUNNING,
    # The scheduled runs include the views already: this only follows up manual runs and backfills,
    # and each evaluation over every cluster costs the daemon CPU.
    minimum_interval_seconds=120,
    description="Materializes a derived asset of a cluster when a collector of that cluster was "
    "materialized without it (a backfill, a manual run); the scheduled runs include them already.",
)

defs = Definitions(assets=list(VIEWS), sensors=[views_automation])
