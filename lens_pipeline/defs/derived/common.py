"""The shape every derived asset shares: cluster partitions, a group, retries and checks."""

from collections.abc import Callable, Sequence
from typing import Any

from dagster import AssetCheckSpec, AssetsDefinition, asset

from lens_pipeline.defs.collectors.common import COLLECTOR_RETRY
from lens_pipeline.defs.partitions import cluster_partitions

GROUP = "cluster_views"


def cluster_view(
    *,
    description: str,
    checks: dict[str, str],
    deps: Sequence[Any] = (),
    kinds: frozenset[str] = frozenset({"sql"}),
) -> Callable[[Callable[..., Any]], AssetsDefinition]:
    """`@asset` for a per-cluster asset computed from stored tables (and Prometheus)."""

    def decorate(fn: Callable[..., Any]) -> AssetsDefinition:
        return asset(
            name=fn.__name__,
            partitions_def=cluster_partitions,
            group_name=GROUP,
            kinds=set(kinds),
            deps=list(deps),
            retry_policy=COLLECTOR_RETRY,
            check_specs=[AssetCheckSpec(n, asset=fn.__name__, description=d) for n, d in checks.items()],
            description=description,
        )(fn)

    return decorate
