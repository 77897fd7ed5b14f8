"""The automation sensor that keeps the derived assets following their collectors outside the
scheduled runs (which include them already). The assets themselves are parts of
`lens_pipeline.defs.cluster_assets`."""

from dagster import AssetSelection, AutomationConditionSensorDefinition, DefaultSensorStatus, Definitions

from lens_pipeline.defs.cluster_assets import VIEW_KEYS
from lens_pipeline.defs.run_tags import COLLECTION_RUN_TAGS

views_automation = AutomationConditionSensorDefinition(
    "cluster_views_automation",
    target=AssetSelection.assets(*VIEW_KEYS),
    default_status=DefaultSensorStatus.RUNNING,
    # The scheduled runs include the views already: this only follows up manual runs and backfills,
    # and each evaluation over every cluster costs the daemon CPU.
    minimum_interval_seconds=120,
    # Runs of the same assets as the scheduled collection runs: the same settings per run.
    run_tags=COLLECTION_RUN_TAGS,
    description="Materializes a derived asset of a cluster when a collector of that cluster was "
    "materialized without it (a backfill, a manual run); the scheduled runs include them already.",
)

defs = Definitions(sensors=[views_automation])
