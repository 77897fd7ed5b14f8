"""`cluster_assets`: every per-cluster asset, the five collectors and the five views derived from
them, as one Dagster multi-asset partitioned by cluster.

A run covers one cluster or a batch of them (a range of cluster partitions): each cluster in turn
has its collectors, then its views, computed on one snapshot of its Kubernetes objects, released
before the next cluster. Clusters are isolated from each other: when a part fails for one cluster,
that cluster gets no materialization of the part (nor of the parts below it), the error is logged,
and the run goes on with the other clusters. Once every cluster has had its turn, a run in which
any part failed ends as failed: Dagster marks a partition failed only when the run that planned it
failed, so this is what turns the broken cluster's partitions red in the UI while the clusters
materialized by the same run stay green. A batch is not retried as a whole (the healthy clusters
are done); the schedule's next tick runs the failing cluster alone, with retries.
The process start and code load, which cost more than collecting a 100-node cluster, are paid once
per batch instead of once per cluster (docs/SCALING.md).

With `can_subset`, the UI, backfills and declarative automation can still materialize any subset
of the assets; a backfill is cut into runs of at most `$LENS_CLUSTERS_PER_RUN` clusters, so every
run ends well inside run monitoring's limit.
"""

import traceback
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dagster import (
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    BackfillPolicy,
    Failure,
    MetadataValue,
    multi_asset,
)
from sqlalchemy.exc import SQLAlchemyError

from lens_pipeline import settings
from lens_pipeline.clusters import ClusterNotFound
from lens_pipeline.defs.collectors.common import (
    COLLECTOR_RETRY,
    ClusterAssetsConfig,
    ClusterPart,
    ClusterTurn,
)
from lens_pipeline.defs.collectors.gpu_devices import gpu_devices
from lens_pipeline.defs.collectors.gpu_nodes import gpu_nodes
from lens_pipeline.defs.collectors.gpu_pods import gpu_pods
from lens_pipeline.defs.collectors.gpu_workloads import gpu_workloads
from lens_pipeline.defs.collectors.storage_backends import storage_backends
from lens_pipeline.defs.derived.overview import cluster_overview_cache
from lens_pipeline.defs.derived.safe import safe_node_statistic, safe_workload_statistic
from lens_pipeline.defs.derived.statistics import gpu_consumers, workload_gpu_statistics
from lens_pipeline.defs.partitions import WORKING, cluster_partitions, clusters_in_runs
from lens_pipeline.defs.resources import (
    ClusterRegistryResource,
    KubernetesResource,
    LensDatabase,
    PrometheusResource,
    SafeDatabase,
)
from lens_pipeline.memory import paused_gc
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.overview import record_materialized

# gpu_devices comes after gpu_pods (its queries are asked while gpu_pods works: listing is done then,
# so Prometheus does not slow the API's pages) and before gpu_workloads (its answers are let go
# before the owner kinds are listed, when memory peaks).
COLLECTORS: tuple[ClusterPart, ...] = (gpu_nodes, gpu_pods, gpu_devices, gpu_workloads, storage_backends)
VIEWS: tuple[ClusterPart, ...] = (
    cluster_overview_cache,
    workload_gpu_statistics,
    gpu_consumers,
    safe_node_statistic,
    safe_workload_statistic,
)
# In dependency order: a cluster's parts run in this order.
PARTS = COLLECTORS + VIEWS
COLLECTOR_KEYS = [AssetKey(p.key) for p in COLLECTORS]
VIEW_KEYS = [AssetKey(p.key) for p in VIEWS]
ASSET_KEYS = COLLECTOR_KEYS + VIEW_KEYS
JOB_NAME = "collect_cluster"


@dataclass(frozen=True)
class PartFailure:
    cluster: str
    part: str
    error: str


@multi_asset(
    name="cluster_assets",
    specs=[part.spec() for part in PARTS],
    check_specs=[spec for part in PARTS for spec in part.check_specs()],
    partitions_def=cluster_partitions,
    can_subset=True,
    retry_policy=COLLECTOR_RETRY,
    # A backfill over many clusters runs in batches, as the schedule's runs do: each run pays the
    # process start once for many clusters and still ends well inside run monitoring's limit.
    backfill_policy=BackfillPolicy.multi_run(max_partitions_per_run=settings.clusters_per_run()),
    description="The collectors and the views derived from them, for one cluster or a batch of clusters.",
)
def cluster_assets(
    context: AssetExecutionContext,
    config: ClusterAssetsConfig,
    registry: ClusterRegistryResource,
    kubernetes: KubernetesResource,
    prometheus: PrometheusResource,
    lens_db: LensDatabase,
    safe_db: SafeDatabase,
) -> Iterator[AssetMaterialization | AssetCheckResult]:
    selected = [part for part in PARTS if AssetKey(part.key) in context.selected_asset_keys]
    names = list(context.partition_keys)
    # One run per cluster at a time: a cluster an older run is working on is left to that run.
    held = clusters_in_runs(
        context.instance,
        statuses=WORKING,
        job_names={JOB_NAME},
        asset_keys=ASSET_KEYS,
        before_run_id=context.run.run_id,
    )
    loaded = registry.load()
    checks: dict[AssetCheckKey, list[tuple[str, AssetCheckResult]]] = defaultdict(list)
    failures: list[PartFailure] = []
    for name in names:
        if name in held:
            context.log.warning(f"cluster {name}: another run is collecting it; left to that run")
            continue
        try:
            cluster = loaded.get(name)
        except ClusterNotFound as exc:
            failures += [PartFailure(name, part.key, str(exc)) for part in selected]
            context.log.error(str(exc))
            continue
        turn = ClusterTurn(context, cluster, kubernetes, prometheus, lens_db, safe_db, config)
        broken: set[str] = set()
        done: list[str] = []
        # A cluster's turn builds millions of objects, without reference cycles, all let go at its
        # end: the cyclic collector would only rescan them over and over (about a second at the
        # envelope). The collector is back at work once they are let go.
        with paused_gc(freeze=False):
            try:
                for index, part in enumerate(selected):
                    # Prometheus evaluates the next part's queries while this part works.
                    turn.prefetch(
                        [p for p in selected[index : index + 2] if not broken & {d.key for d in p.deps}]
                    )
                    upstream = [d.key for d in part.deps if d.key in broken]
                    if upstream:
                        broken.add(part.key)
                        failures.append(
                            PartFailure(name, part.key, f"not computed: {', '.join(upstream)} failed")
                        )
                        continue
                    try:
                        result = part.compute(turn)
                    except Exception as exc:
                        broken.add(part.key)
                        failures.append(PartFailure(name, part.key, f"{type(exc).__name__}: {exc}"))
                        context.log.error(f"cluster {name}: {part.key} failed:\n{traceback.format_exc()}")
                        continue
                    done.append(part.key)
                    yield AssetMaterialization(asset_key=part.key, partition=name, metadata=result.metadata)
                    for check in result.check_results or ():
                        checks[AssetCheckKey(AssetKey(part.key), check.check_name or "")].append(
                            (name, check)
                        )
            finally:
                turn.release()
        if done:
            _record_materialized(lens_db, name, done, context)

    failed_by_part: dict[str, dict[str, str]] = defaultdict(dict)
    for failure in failures:
        failed_by_part[failure.part][failure.cluster] = failure.error
    for key in context.selected_asset_check_keys:
        results, failed = checks.get(key, []), failed_by_part.get(key.asset_key.path[-1], {})
        if results or failed:  # nothing to say when every cluster was left to other runs
            yield merged_check(key, results, failed)
    if failures:
        failed_clusters = sorted({f.cluster for f in failures})
        raise Failure(
            description=f"{len(failed_clusters)} of {len(names)} cluster(s) failed "
            f"({', '.join(failed_clusters[:10])}); {len(failures)} asset(s) not materialized: "
            + "; ".join(f"{f.cluster}/{f.part}: {f.error}" for f in failures[:10]),
            metadata={
                "failed_clusters": MetadataValue.json(failed_clusters[:100]),
                "failures": MetadataValue.json([f.__dict__ for f in failures[:100]]),
            },
            # Op retries are for a cluster alone: a batch's healthy clusters are already written.
            allow_retries=len(names) == 1,
        )


def _record_materialized(lens_db: LensDatabase, cluster: str, assets: list[str], context: Any) -> None:
    """Per cluster and asset, when it was last materialized (`/metrics` of `lens api`); a failure to
    record it is logged, never the cluster's failure."""
    try:
        with write_transaction(lens_db.engine()) as conn:
            record_materialized(conn, cluster, assets, now=datetime.now(UTC))
    except SQLAlchemyError as exc:
        context.log.warning(f"cluster {cluster}: freshness of {', '.join(assets)} not recorded: {exc}")


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
            {cluster: _plain(result.metadata) for cluster, result in failing[:50]}
        )
    if failed:
        metadata["not_computed"] = MetadataValue.json(dict(sorted(failed.items())[:50]))
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
