"""`hourly_history_automation`: evaluates the hourly history's automation conditions
(defs/history/automation.py) every minute; several partitions asked at once become a backfill."""

from dagster import AssetSelection, AutomationConditionSensorDefinition, DefaultSensorStatus, Definitions

from lens_pipeline.defs.history.assets import KEYS, hourly_history
from lens_pipeline.defs.run_tags import HISTORY_RUN_TAGS

history_automation = AutomationConditionSensorDefinition(
    "hourly_history_automation",
    target=AssetSelection.assets(*KEYS),
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=60,
    run_tags=HISTORY_RUN_TAGS,
    # A tick asking for many (cluster, hour) partitions launches one backfill, on the backfill page.
    emit_backfills=True,
    description="Materializes each cluster's hour once it has closed, and the hours of the last days "
    "that are missing (a new cluster's week, an outage), as backfills.",
)

defs = Definitions(assets=[hourly_history], sensors=[history_automation])
