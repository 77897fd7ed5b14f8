"""`cluster_registry_sensor`: adds a partition for every new cluster in the registry, with a first
collection run for the new ones (they need not wait for the schedule's next minute), and removes
the partitions of clusters that left it, but only when no run of theirs is in flight."""

from dagster import (
    DefaultSensorStatus,
    Definitions,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from lens_pipeline import settings
from lens_pipeline.defs.collectors.schedules import collect_cluster_job, collection_requests
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME, cluster_partitions, clusters_in_runs
from lens_pipeline.defs.resources import ClusterRegistryResource


@sensor(
    job=collect_cluster_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="Keeps the `cluster` partitions equal to the cluster registry.",
)
def cluster_registry_sensor(
    context: SensorEvaluationContext, registry: ClusterRegistryResource
) -> SensorResult | SkipReason:
    loaded = registry.load()
    for error in loaded.errors:
        context.log.warning(f"registry {loaded.source}: {error}")
    # An unreadable registry says nothing about which clusters left: never remove on its word.
    listed = loaded.listed()
    current = set(context.instance.get_dynamic_partitions(CLUSTER_PARTITIONS_NAME))
    added = sorted(set(loaded.clusters) - current)
    gone = sorted(current - listed) if listed is not None else []
    busy = clusters_in_runs(context.instance) & set(gone)
    removed = [name for name in gone if name not in busy]
    if busy:
        context.log.info(f"clusters left the registry but have runs in flight, removal waits: {sorted(busy)}")
    if not added and not removed:
        return SkipReason(f"partitions match the registry ({len(current)} clusters)")
    requests = []
    if added:
        requests.append(cluster_partitions.build_add_request(added))
    if removed:
        requests.append(cluster_partitions.build_delete_request(removed))
    context.log.info(f"cluster partitions: added {added}, removed {removed}")
    # The new partitions come last, in this order: their first collection, in batches.
    ticks = int(context.cursor or 0) + 1
    first_runs = collection_requests(
        added, busy=set(), alone=set(), batch_size=settings.clusters_per_run(), tick=f"registered-{ticks}"
    )
    return SensorResult(dynamic_partitions_requests=requests, run_requests=first_runs, cursor=str(ticks))


defs = Definitions(sensors=[cluster_registry_sensor])
