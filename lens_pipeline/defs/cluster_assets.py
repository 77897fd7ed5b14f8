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

import time
import traceback
from collections.abc import Iterator

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    BackfillPolicy,
    multi_asset,
)

from lens_pipeline import settings
from lens_pipeline.clusters import ClusterNotFound
from lens_pipeline.defs.batches import BatchReport, record_materialized_now
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
# The tag of the schedule's and the registry sensor's collection runs (their own run-queue slots).
COLLECTION_TAG = "lens/collection"
# How long a backfill's or a hand-launched run waits for an older run to let a cluster go.
HOLD_WAIT_SECONDS = 300.0
HOLD_POLL_SECONDS = 2.0


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
    # One run per cluster at a time. A scheduled run leaves a cluster an older run is working on to
    # that run (the next minute comes soon); a backfill or a run launched by hand waits for it, so
    # that what was asked for is done.
    scheduled = COLLECTION_TAG in context.run.tags
    loaded = registry.load()
    report = BatchReport(names)
    for name in names:
        if name in _held(context) and (scheduled or not _wait_until_free(context, name)):
            context.log.warning(f"cluster {name}: another run is collecting it; left to that run")
            continue
        try:
            cluster = loaded.get(name)
        except ClusterNotFound as exc:
            for part in selected:
                report.failed(name, part.key, str(exc))
            context.log.error(str(exc))
            continue
        done: list[str] = []
        yield from _cluster_turn(
            ClusterTurn(context, cluster, kubernetes, prometheus, lens_db, safe_db, config),
            selected,
            report,
            done,
        )
        if done:
            record_materialized_now(lens_db, name, done, context.log)
    yield from report.merged_checks(context.selected_asset_check_keys)
    report.raise_if_failed()


def _held(context: AssetExecutionContext) -> set[str]:
    """The clusters older runs are collecting now."""
    return clusters_in_runs(
        context.instance,
        statuses=WORKING,
        job_names={JOB_NAME},
        asset_keys=ASSET_KEYS,
        before_run_id=context.run.run_id,
    )


def _wait_until_free(context: AssetExecutionContext, name: str) -> bool:
    """Wait (up to HOLD_WAIT_SECONDS) for the older runs to let the cluster go."""
    context.log.info(f"cluster {name}: another run is collecting it; waiting for it to finish")
    deadline = time.monotonic() + HOLD_WAIT_SECONDS
    while time.monotonic() < deadline:
        time.sleep(HOLD_POLL_SECONDS)
        if name not in _held(context):
            return True
    return False


def _cluster_turn(
    turn: ClusterTurn, selected: list[ClusterPart], report: BatchReport, done: list[str]
) -> Iterator[AssetMaterialization]:
    """One cluster's parts in order; a part whose upstream failed is not computed."""
    name, broken = turn.cluster.name, set[str]()
    # A cluster's turn builds millions of objects, without reference cycles, all let go at its
    # end: the cyclic collector would only rescan them over and over (about a second at the
    # envelope). The collector is back at work once they are let go.
    with paused_gc(freeze=False):
        try:
            # Prometheus evaluates the parts' queries while the Kubernetes objects are listed.
            turn.ask_ahead(selected)
            for index, part in enumerate(selected):
                upstream = [d.key for d in part.deps if d.key in broken]
                if upstream:
                    broken.add(part.key)
                    report.failed(name, part.key, f"not computed: {', '.join(upstream)} failed")
                    continue
                try:
                    result = part.compute(turn)
                except Exception as exc:
                    broken.add(part.key)
                    report.failed(name, part.key, f"{type(exc).__name__}: {exc}")
                    turn.log.error(f"cluster {name}: {part.key} failed:\n{traceback.format_exc()}")
                    turn.forget(_not_run_after(part, selected[index + 1 :], broken))
                    continue
                done.append(part.key)
                yield AssetMaterialization(asset_key=part.key, partition=name, metadata=result.metadata)
                report.checked(name, part.key, result.check_results or ())
        finally:
            turn.release()


def _not_run_after(failed: ClusterPart, rest: list[ClusterPart], broken: set[str]) -> list[ClusterPart]:
    """`failed` and the parts of `rest` that the turn will skip because of it: by the turn's own rule,
    a part is skipped when a part it reads failed or was skipped."""
    skipped, not_run = set(broken), [failed]
    for part in rest:
        if any(d.key in skipped for d in part.deps):
            skipped.add(part.key)
            not_run.append(part)
    return not_run
