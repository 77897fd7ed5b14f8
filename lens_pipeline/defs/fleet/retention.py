"""Retention: a month of one-minute runs per cluster must not grow the Dagster instance nor the Lens
database without bound. `dagster.yaml`'s `retention` purges schedule and sensor ticks; finished runs
of this code location (and their event logs) older than `keep_hours` are deleted here every hour,
and the Lens history nothing needs any more (superseded snapshots, the device changelog, the events
of pods that are gone) every night after `keep_days`, with the hourly history's hours after
`hourly_keep_days`. See docs/OPERATIONS.md for the growth.

In a Dagster shared with other code locations, only our runs go: those tagged with
`lens/code-location` (every run of our jobs and sensors), and those Dagster tagged with this code
location's name (`dagster/code_location`, which Dagster 1.12 and later gives every run launched
through a workspace: a materialization or backfill started in the UI carries no tag of ours). The
others' are their owners' to keep."""

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from dagster import (
    Config,
    DefaultScheduleStatus,
    Definitions,
    OpExecutionContext,
    Output,
    RunsFilter,
    ScheduleDefinition,
    job,
    op,
)
from pydantic import Field, field_validator

from lens_pipeline import settings
from lens_pipeline.defs.partitions import FINISHED_STATUSES
from lens_pipeline.defs.resources import LensDatabase
from lens_pipeline.defs.run_tags import (
    CODE_LOCATION,
    CODE_LOCATION_TAG,
    DAGSTER_CODE_LOCATION_TAG,
    RETENTION_RUN_TAGS,
)
from lens_pipeline.store.history import prune_history, prune_hourly

# Thirteen months of hours: a year back and the month before it.
DEFAULT_HOURLY_KEEP_DAYS = 400.0
# A longer time than a date can go back (`timedelta` of infinite days does not exist).
MAX_KEEP_DAYS = 100 * 365.0


class RetentionConfig(Config):
    keep_hours: float = Field(default=24.0, ge=0, description="finished runs younger than this stay")
    max_deletions: int = Field(default=20_000, ge=1, description="at most this many per run (catch-up)")


def our_runs(run_tags: Mapping[str, str]) -> list[dict[str, str]]:
    """The run tags that mark a run as ours, each alone enough: our own tag, and the code location
    Dagster named the run that asks (absent from a run executed in process, as in tests)."""
    marks = [{CODE_LOCATION_TAG: CODE_LOCATION}]
    if run_tags.get(DAGSTER_CODE_LOCATION_TAG):
        marks.append({DAGSTER_CODE_LOCATION_TAG: run_tags[DAGSTER_CODE_LOCATION_TAG]})
    return marks


@op(description="Delete this code location's finished runs, and their event logs, older than `keep_hours`.")
def delete_old_runs(context: OpExecutionContext, config: RetentionConfig) -> Output[int]:
    before = datetime.now(UTC) - timedelta(hours=config.keep_hours)
    deleted = 0
    for mark in our_runs(context.run.tags):
        while deleted < config.max_deletions:
            records = context.instance.get_run_records(
                RunsFilter(statuses=list(FINISHED_STATUSES), updated_before=before, tags=mark),
                limit=min(500, config.max_deletions - deleted),
                ascending=True,
            )
            records = [r for r in records if r.dagster_run.run_id != context.run_id]
            if not records:
                break
            for record in records:
                context.instance.delete_run(record.dagster_run.run_id)
            deleted += len(records)
    context.log.info(f"deleted {deleted} runs finished before {before.isoformat()}")
    return Output(deleted, metadata={"deleted_runs": deleted, "finished_before": before.isoformat()})


@job(
    description="Run retention: this code location's finished runs older than keep_hours go, with "
    "their event logs.",
    tags=RETENTION_RUN_TAGS,
)
def prune_run_history() -> None:
    delete_old_runs()


prune_every_hour = ScheduleDefinition(
    name="prune_run_history_hourly",
    job=prune_run_history,
    cron_schedule="17 * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Keeps the Dagster instance to the last day of runs.",
)


class HistoryRetentionConfig(Config):
    keep_days: float = Field(default=30.0, ge=0, description="history younger than this stays")
    hourly_keep_days: float | None = Field(
        default=None,
        description=f"hours of the hourly history younger than this stay (default {DEFAULT_HOURLY_KEEP_DAYS:.0f} "
        "days, or $LENS_HISTORY_DAYS when that is longer; never under it: an hour Dagster shows "
        "materialized keeps its rows)",
    )

    @field_validator("hourly_keep_days")
    @classmethod
    def _not_inside_the_partitions(cls, value: float | None) -> float | None:
        if value is not None and not (settings.history_days() <= value < MAX_KEEP_DAYS):  # NaN too
            raise ValueError(
                f"hourly_keep_days {value} is not between the {settings.history_days()} days of hours "
                "the hourly history's partitions hold ($LENS_HISTORY_DAYS: hours Dagster shows "
                f"materialized would lose their rows) and {MAX_KEEP_DAYS:.0f}"
            )
        return value

    def hourly_days(self) -> float:
        if self.hourly_keep_days is not None:
            return self.hourly_keep_days
        return max(DEFAULT_HOURLY_KEEP_DAYS, float(settings.history_days()))


@op(
    description="Delete the Lens history older than `keep_days` that nothing needs: snapshots superseded "
    "by a newer one of the same pod or workload (the newest always stays), device changelog rows and "
    "the events of pods that are gone; and the hourly history's hours older than `hourly_keep_days`."
)
def delete_old_history(
    context: OpExecutionContext, config: HistoryRetentionConfig, lens_db: LensDatabase
) -> Output[int]:
    now = datetime.now(UTC)
    before = now - timedelta(days=config.keep_days)
    hours_before = (now - timedelta(days=config.hourly_days())).replace(minute=0, second=0, microsecond=0)
    deleted = prune_history(lens_db.engine(), before)
    deleted.update(prune_hourly(lens_db.engine(), hours_before))
    context.log.info(
        f"deleted {deleted} (rows older than {before.isoformat()}; hours before {hours_before.isoformat()})"
    )
    return Output(
        sum(deleted.values()),
        metadata={
            **{f"deleted_{table}": n for table, n in deleted.items()},
            "older_than": before.isoformat(),
            "hours_before": hours_before.isoformat(),
        },
    )


@job(
    description="Lens history retention: superseded snapshots, old changelog rows and the events of gone "
    "pods go after keep_days, the hourly history's hours after hourly_keep_days.",
    tags=RETENTION_RUN_TAGS,
)
def prune_lens_history() -> None:
    delete_old_history()


prune_every_night = ScheduleDefinition(
    name="prune_lens_history_nightly",
    job=prune_lens_history,
    cron_schedule="43 3 * * *",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Keeps the Lens database's history tables to the last 30 days (the newest snapshots and "
    "the events of live pods stay), and the hourly history to the last 400.",
)

defs = Definitions(
    jobs=[prune_run_history, prune_lens_history], schedules=[prune_every_hour, prune_every_night]
)
