"""When an hour of a cluster is materialized, with no clicks (declarative automation):

- each hour once it has closed, at five past the next (Prometheus has scraped its last samples,
  the collectors have seen its pods end), after the cluster's collectors ran again;
- a new cluster's last closed hour as soon as its first collection is done, not at the next five
  past (Dagster's cron condition holds only for the partitions that existed at the tick);
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

# Means what `AutomationCondition.on_cron` means (the automation tests hold it to that: the hour
# at five past once the collectors ran since), at a fraction of the cost. In on_cron the collectors'
# "updated since the tick" is a `since`, which is evaluated over the whole collector and not cut to
# the candidates: every cluster whose collectors ran is mapped onto all of its hours (days x 24
# partitions), at every evaluation, even when no hour waits. Here the same `since` sits under an
# And behind `in_latest_time_window`, which on a collector (no time dimension) is true of every
# candidate; the And keeps only candidates, the clusters of the hours still waiting, so only those
# are mapped. 100 clusters, on the one asset that carries it: 1.7 s an evaluation with on_cron, 0.14 s
# here (bench/bench_automation.py, docs/BENCHMARKS.md eighteenth pass).
collectors_ran_since_tick = AutomationCondition.in_latest_time_window() & (
    AutomationCondition.newly_updated().since(AutomationCondition.cron_tick_passed(CLOSED_HOUR_CRON))
    | AutomationCondition.will_be_requested()
)
closed_hour = (
    AutomationCondition.in_latest_time_window()
    & AutomationCondition.cron_tick_passed(CLOSED_HOUR_CRON).since_last_handled()
    & AutomationCondition.all_deps_match(collectors_ran_since_tick).with_label(
        "the cluster's collectors ran since five past"
    )
).with_label("the hour that closed, at five past")
# A cluster added after five past: its collectors' first materialization is what is new (for the
# cluster's every other hour, their partitions were there before the hour closed). `newly_true`
# keeps its own state over all the collectors' partitions, whatever the candidates, so an hour's
# partition appearing at the top of the hour does not make every cluster's collectors "new". That
# state starts empty where it has none: the sensor's very first evaluation is left to five past
# (`initial_evaluation`), but an upgrade to this condition on a running sensor, a cluster removed and
# added again, or a collector wiped, make the clusters concerned "new" once (their closed hour is
# asked then, and once more at five past when that falls between the hour and five past).
first_collection = (
    AutomationCondition.any_deps_match((~AutomationCondition.missing()).newly_true())
    & AutomationCondition.all_deps_match(~AutomationCondition.missing())
).with_label("the cluster's first collection just finished")
new_cluster_hour = (
    AutomationCondition.in_latest_time_window()
    & AutomationCondition.missing()
    & ~AutomationCondition.in_progress()
    & ~AutomationCondition.initial_evaluation()
    & first_collection
).with_label("a new cluster's closed hour, after its first collection")
missing_hour = (
    # The window first: `missing` lists the partitions it is given, and the history's hours go back
    # further than the backfill's days.
    AutomationCondition.in_latest_time_window(timedelta(days=settings.history_backfill_days()))
    # The hour that just closed is `closed_hour`'s, at five past.
    & ~AutomationCondition.in_latest_time_window()
    & AutomationCondition.missing()
    & ~AutomationCondition.in_progress()
    & (~AutomationCondition.execution_failed() | AutomationCondition.cron_tick_passed(RETRY_CRON))
).with_label("missing in the last days")

HOURLY = (closed_hour | new_cluster_hour | missing_hour).with_label("each closed hour, and the missing ones")
