"""What a run over a batch of clusters reports, shared by `cluster_assets` and `container_events`.

Each cluster's parts are materialized one by one as they succeed; what failed is remembered. At
the end the run yields one merged result per check (which clusters failed it and why), and, when
any cluster failed a part, ends as failed: Dagster counts a partition as failed only when the run
that planned it failed without materializing it, so that is what shows the broken clusters' partitions
red while the ones the run wrote stay green. A batch is not retried as a whole (its healthy clusters
are written); a run of one cluster keeps the op's retries.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dagster import (
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    DagsterLogManager,
    Failure,
    MetadataValue,
)
from sqlalchemy.exc import SQLAlchemyError

from lens_pipeline.defs.resources import LensDatabase
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.overview import record_materialized

MAX_NAMED = 50


@dataclass(frozen=True)
class PartFailure:
    cluster: str
    part: str
    error: str


@dataclass
class BatchReport:
    """The check results and failures of a run's clusters, merged at the run's end."""

    clusters: Sequence[str]
    checks: dict[AssetCheckKey, list[tuple[str, AssetCheckResult]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    failures: list[PartFailure] = field(default_factory=list)

    def checked(self, cluster: str, asset: str, results: Iterable[AssetCheckResult]) -> None:
        for result in results:
            self.checks[AssetCheckKey(AssetKey(asset), result.check_name or "")].append((cluster, result))

    def failed(self, cluster: str, part: str, error: str) -> None:
        self.failures.append(PartFailure(cluster, part, error))

    def failed_clusters(self) -> list[str]:
        return sorted({f.cluster for f in self.failures})

    def merged_checks(self, selected: Iterable[AssetCheckKey]) -> Iterator[AssetCheckResult]:
        """One result per selected check, over every cluster the run computed or failed."""
        failed_by_part: dict[str, dict[str, str]] = defaultdict(dict)
        for failure in self.failures:
            failed_by_part[failure.part][failure.cluster] = failure.error
        for key in selected:
            results, failed = self.checks.get(key, []), failed_by_part.get(key.asset_key.path[-1], {})
            if results or failed:
                yield merged_check(key, results, failed)
            else:  # every cluster was left to other runs, or had nothing new: nothing to check
                yield AssetCheckResult(
                    asset_key=key.asset_key,
                    check_name=key.name,
                    passed=True,
                    metadata={"clusters_checked": 0},
                    description="Nothing to check in this run: its clusters had nothing new, or "
                    "other runs held them.",
                )

    def raise_if_failed(self) -> None:
        """End the run as failed when a cluster failed a part (after every cluster had its turn)."""
        if not self.failures:
            return
        failed = self.failed_clusters()
        raise Failure(
            description=f"{len(failed)} of {len(self.clusters)} cluster(s) failed "
            f"({', '.join(failed[:10])}); {len(self.failures)} asset(s) not materialized: "
            + "; ".join(f"{f.cluster}/{f.part}: {f.error}" for f in self.failures[:10]),
            metadata={
                "failed_clusters": MetadataValue.json(failed[:100]),
                "failures": MetadataValue.json([f.__dict__ for f in self.failures[:100]]),
            },
            # Op retries are for a cluster alone: a batch's healthy clusters are already written.
            allow_retries=len(self.clusters) == 1,
        )


def record_materialized_now(
    lens_db: LensDatabase, cluster: str, assets: list[str], log: DagsterLogManager
) -> None:
    """Per cluster and asset, when it was last materialized (`/metrics` of `lens api`, and the
    per-cluster freshness check); a failure to record it is logged, never the cluster's failure."""
    try:
        with write_transaction(lens_db.engine()) as conn:
            record_materialized(conn, cluster, assets, now=datetime.now(UTC))
    except SQLAlchemyError as exc:
        log.warning(f"cluster {cluster}: freshness of {', '.join(assets)} not recorded: {exc}")


def merged_check(
    key: AssetCheckKey, results: list[tuple[str, AssetCheckResult]], failed: dict[str, str]
) -> AssetCheckResult:
    """One result of a check for every cluster of the run: passed when it passed on every cluster;
    a cluster whose asset could not be computed fails it too (an error). What failed where, in
    metadata."""
    if len(results) == 1 and not failed:
        only = results[0][1]
        return AssetCheckResult(
            asset_key=key.asset_key,
            check_name=key.name,
            passed=only.passed,
            severity=only.severity,
            metadata=only.metadata,
            description=only.description,
        )
    failing = [(cluster, result) for cluster, result in results if not result.passed]
    severity = AssetCheckSeverity.WARN
    if failed or any(r.severity == AssetCheckSeverity.ERROR for _, r in failing):
        severity = AssetCheckSeverity.ERROR
    metadata: dict[str, Any] = {
        "clusters_checked": len(results),
        "clusters_failing": sorted(cluster for cluster, _ in failing),
    }
    if failing:
        metadata["failing"] = MetadataValue.json(
            {cluster: _plain(result.metadata) for cluster, result in failing[:MAX_NAMED]}
        )
    if failed:
        metadata["not_computed"] = MetadataValue.json(dict(sorted(failed.items())[:MAX_NAMED]))
    return AssetCheckResult(
        asset_key=key.asset_key,
        check_name=key.name,
        passed=bool(results) and not failing and not failed,
        severity=severity,
        metadata=metadata,
    )


def _plain(metadata: Any) -> dict[str, Any]:
    return {
        k: getattr(v, "value", v) if not isinstance(v, (str, int, float, bool, list)) else v
        for k, v in (metadata or {}).items()
    }
