"""The shape every derived asset shares: the collectors' (cluster partitions, retries, freshness,
checks), its own group, and declarative automation. Each cluster's collection run materializes
them after the collectors; when a collector is materialized alone (a backfill, a retry), the
automation sensor brings them up to date."""

from collections.abc import Callable, Sequence

from dagster import AssetCheckResult, AutomationCondition, MaterializeResult
from sqlalchemy import Table

from lens_pipeline.collect.problems import Problem
from lens_pipeline.defs.collectors.common import (
    MAX_LOGGED_PROBLEMS,
    ClusterPart,
    ClusterTurn,
    check,
    cluster_part,
)

GROUP = "cluster_views"
# The check of every view that reads stored rows.
ROWS_READABLE = {
    "stored_rows_readable": "Every stored row the view reads holds what its columns should (a row that "
    "does not is skipped, counted and named; the rest is computed)."
}


def rows_readable_check(turn: ClusterTurn, malformed: Sequence[Problem]) -> AssetCheckResult:
    """`stored_rows_readable`: the rows skipped as malformed, counted and named (a warning)."""
    for problem in malformed[:MAX_LOGGED_PROBLEMS]:
        turn.log.warning(f"cluster {turn.cluster.name}: skipped stored {problem}")
    return check(
        "stored_rows_readable",
        not malformed,
        warn=True,
        malformed_rows=len(malformed),
        rows=[str(p) for p in malformed[:MAX_LOGGED_PROBLEMS]],
    )


def cluster_view(
    *,
    description: str,
    checks: dict[str, str],
    deps: Sequence[ClusterPart] = (),
    kinds: frozenset[str] = frozenset({"sql"}),
    table: Table | None = None,
) -> Callable[[Callable[[ClusterTurn], MaterializeResult]], ClusterPart]:
    """`@asset` for a per-cluster asset computed from stored tables (and Prometheus)."""
    return cluster_part(
        group=GROUP,
        description=description,
        checks=checks,
        deps=deps,
        kinds=kinds,
        automation_condition=AutomationCondition.eager(),
        table=table,
    )
