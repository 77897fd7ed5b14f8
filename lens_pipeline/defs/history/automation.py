"""When an hour of a cluster is materialized, with no clicks (declarative automation):

- each hour once it has closed, at five past the next (Prometheus has scraped its last samples,
  the collectors have seen its pods end), after the cluster's collectors ran again;
- every hour of the last `$LENS_HISTORY_BACKFILL_DAYS` days that is still missing: a new cluster's
  week, the hours an outage left out, an hour whose run failed (asked again once an hour, not at
  every tick, so a broken cluster does not fill the run queue).

`hourly_history_automation` evaluates it (defs/history/sensors.py); a tick asking for more than
one partition launches a backfill, which the UI's backfill page shows and cuts into runs of
`$LENS_HISTORY_PARTITIONS_PER_RUN` partitions.
"""

from datetime import timedelta

from dagster import AutomationCondition

from lens_pipeline import settings

CLOSED_HOUR_CRON = "5 * * * *"
RETRY_CRON = "35 * * * *"

closed_hour = AutomationCondition.on_cron(CLOSED_HOUR_CRON)
missing_hour = (
    AutomationCondition.missing()
    & AutomationCondition.in_latest_time_window(timedelta(days=settings.history_backfill_days()))
    # The hour that just closed is `closed_hour`'s, at five past.
    & ~AutomationCondition.in_latest_time_window()
    & ~AutomationCondition.in_progress()
    & (~AutomationCondition.execution_failed() | AutomationCondition.cron_tick_passed(RETRY_CRON))
).with_label("missing in the last days")

HOURLY = (closed_hour | missing_hour).with_label("each closed hour, and the missing ones")
