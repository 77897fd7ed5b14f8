"""The shape every derived asset shares: the collectors' (cluster partitions, retries, freshness,
checks), its own group, and declarative automation. Each cluster's collection run materializes
them after the collectors; when a collector is materialized alone (a backfill, a retry), the
automation sensor brings them up to date."""

from collections.abc import Callable, Sequence

from dagster import AutomationCondition, MaterializeResult

from lens_pipeline.defs.collectors.common import ClusterPart, ClusterTurn, cluster_part

GROUP = "cluster_views"


def cluster_view(
    *,
    description: str,
    checks: dict[str, str],
    deps: Sequence[ClusterPart] = (),
    kinds: frozenset[str] = frozenset({"sql"}),
) -> Callable[[Callable[[ClusterTurn], MaterializeResult]], ClusterPart]:
    """`@asset` for a per-cluster asset computed from stored tables (and Prometheus)."""
    return cluster_part(
        group=GROUP,
        description=description,
        checks=checks,
        deps=deps,
        kinds=kinds,
        automation_condition=AutomationCondition.eager(),
    )
