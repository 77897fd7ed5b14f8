"""What every collector shares: the asset shape (cluster partitions, group, retries, checks) and the
run shell (the cluster, its shared snapshot, request counts, problems, the common metadata)."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    AutomationCondition,
    Backoff,
    FreshnessPolicy,
    Jitter,
    MaterializeResult,
    RetryPolicy,
    asset,
)

from lens_pipeline.clusters import ClusterConfig
from lens_pipeline.collect.problems import Problem
from lens_pipeline.defs.collectors.reporting import problems_metadata, read_metadata
from lens_pipeline.defs.collectors.snapshot import ClusterSnapshot
from lens_pipeline.defs.partitions import cluster_partitions
from lens_pipeline.defs.resources import ClusterRegistryResource, KubernetesResource

COLLECTOR_RETRY = RetryPolicy(max_retries=2, delay=2, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS)
MAX_LOGGED_PROBLEMS = 20


# The UI shows an asset as late after warn_window and failing after fail_window without a new
# materialization; the schedule refreshes every minute.
FRESHNESS = FreshnessPolicy.time_window(fail_window=timedelta(minutes=5), warn_window=timedelta(minutes=2))


def cluster_asset(
    *,
    group: str,
    description: str,
    checks: dict[str, str],
    deps: Sequence[Any] = (),
    kinds: frozenset[str],
    automation_condition: AutomationCondition | None = None,
) -> Callable[[Callable[..., MaterializeResult]], AssetsDefinition]:
    """`@asset` partitioned by cluster, with retries, freshness and checks (name -> what it guards)."""

    def decorate(fn: Callable[..., MaterializeResult]) -> AssetsDefinition:
        return asset(
            name=fn.__name__,
            partitions_def=cluster_partitions,
            group_name=group,
            kinds=set(kinds),
            deps=list(deps),
            retry_policy=COLLECTOR_RETRY,
            freshness_policy=FRESHNESS,
            automation_condition=automation_condition,
            check_specs=[AssetCheckSpec(n, asset=fn.__name__, description=d) for n, d in checks.items()],
            description=description,
        )(fn)

    return decorate


def collector(
    *,
    description: str,
    checks: dict[str, str],
    deps: Sequence[Any] = (),
    kinds: frozenset[str] = frozenset({"kubernetes", "sql"}),
) -> Callable[[Callable[..., MaterializeResult]], AssetsDefinition]:
    """`@asset` for a per-cluster collector, refreshed by the `collect_every_minute` schedule."""
    return cluster_asset(group="collectors", description=description, checks=checks, deps=deps, kinds=kinds)


def check(name: str, passed: bool, *, warn: bool = False, **metadata: Any) -> AssetCheckResult:
    """An asset check's result: an error when it fails, or only a warning."""
    severity = AssetCheckSeverity.WARN if warn else AssetCheckSeverity.ERROR
    return AssetCheckResult(check_name=name, passed=passed, severity=severity, metadata=metadata)


@dataclass
class CollectorRun:
    """One collector's work on one cluster in one run."""

    context: AssetExecutionContext
    cluster: ClusterConfig
    snapshot: ClusterSnapshot
    problems: list[Problem] = field(default_factory=list)
    prometheus_queries: int = 0

    def __post_init__(self) -> None:
        self._started = datetime.now(UTC)
        self._stats_before = self.snapshot.reader.stats.copy()

    @classmethod
    def start(
        cls, context: AssetExecutionContext, registry: ClusterRegistryResource, kubernetes: KubernetesResource
    ) -> "CollectorRun":
        cluster = registry.cluster(context.partition_key)
        return cls(context, cluster, kubernetes.snapshot(cluster))

    def check(self, name: str, passed: bool, *, warn: bool = False, **metadata: Any) -> AssetCheckResult:
        return check(name, passed, warn=warn, **metadata)

    def readable_check(self, name: str) -> AssetCheckResult:
        """The check every collector has: every object could be read (a warning, not an error)."""
        return self.check(name, not self.problems, warn=True, malformed_objects=len(self.problems))

    def finish(self, metadata: dict[str, Any], checks: list[AssetCheckResult]) -> MaterializeResult:
        for problem in self.problems[:MAX_LOGGED_PROBLEMS]:
            self.context.log.warning(f"cluster {self.cluster.name}: skipped {problem}")
        stats = self.snapshot.reader.stats.since(self._stats_before)
        return MaterializeResult(
            metadata={
                "cluster": self.cluster.name,
                **metadata,
                "duration_seconds": round((datetime.now(UTC) - self._started).total_seconds(), 3),
                **read_metadata(stats, self.prometheus_queries),
                **problems_metadata(self.problems),
            },
            check_results=checks,
        )
