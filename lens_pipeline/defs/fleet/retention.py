"""Run retention: a month of one-minute runs per cluster must not grow the Dagster instance without
bound. `dagster.yaml`'s `retention` purges schedule and sensor ticks; finished runs (and their event
logs) older than `keep_hours` are deleted here, every hour. See docs/OPERATIONS.md for the growth."""

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
from dagster._core.storage.dagster_run import FINISHED_STATUSES
from pydantic import Field


class RetentionConfig(Config):
    keep_hours: float = Field(default=24.0, ge=0, description="finished runs younger than this stay")
    max_deletions: int = Field(default=20_000, ge=1, description="at most this many per run (catch-up)")


@op(description="Delete finished runs, and their event logs, older than `keep_hours`.")
def delete_old_runs(context: OpExecutionContext, config: RetentionConfig) -> Output[int]:
    before = datetime.now(UTC) - timedelta(hours=config.keep_hours)
    deleted = 0
    while deleted < config.max_deletions:
        records = context.instance.get_run_records(
            RunsFilter(statuses=list(FINISHED_STATUSES), updated_before=before),
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


@job(description="Run retention: finished runs older than keep_hours go, with their event logs.")
def prune_run_history() -> None:
    delete_old_runs()


prune_every_hour = ScheduleDefinition(
    name="prune_run_history_hourly",
    job=prune_run_history,
    cron_schedule="17 * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Keeps the Dagster instance to the last day of runs.",
)

defs = Definitions(jobs=[prune_run_history], schedules=[prune_every_hour])
