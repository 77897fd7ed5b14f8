"""Which clusters are late: per cluster, the assets whose last materialization is older than the
freshness windows. Dagster's freshness policies judge an asset across all its partitions, so one
stale cluster among many fresh ones would never show; this judges each cluster."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

# The schedule collects every minute: late after two minutes, failing after five.
WARN_AFTER = timedelta(minutes=2)
FAIL_AFTER = timedelta(minutes=5)


@dataclass(frozen=True)
class LateCluster:
    cluster: str
    # asset -> seconds since its last materialization (None: never materialized)
    stale: dict[str, float | None]
    failing: bool  # older than FAIL_AFTER (or never): an error, not a warning

    def describe(self) -> str:
        ages = ", ".join(
            f"{asset} {'never' if age is None else f'{age:.0f} s ago'}"
            for asset, age in sorted(self.stale.items())
        )
        return f"{self.cluster}: {ages}"


def late_clusters(
    clusters: Sequence[str],
    materialized: Mapping[str, Mapping[str, datetime]],
    assets: Sequence[str],
    now: datetime,
    *,
    warn_after: timedelta = WARN_AFTER,
    fail_after: timedelta = FAIL_AFTER,
) -> list[LateCluster]:
    """The clusters (in the given order) with at least one of `assets` older than `warn_after`."""
    late = []
    for cluster in clusters:
        times = materialized.get(cluster, {})
        stale: dict[str, float | None] = {}
        failing = False
        for asset in assets:
            when = times.get(asset)
            age = None if when is None else (now - when).total_seconds()
            if age is None or age > warn_after.total_seconds():
                stale[asset] = None if age is None else round(age, 1)
                failing = failing or age is None or age > fail_after.total_seconds()
        if stale:
            late.append(LateCluster(cluster, stale, failing))
    return late
