"""One run over a batch of clusters (a range of cluster partitions), against simulated clusters over
real HTTP: every healthy cluster is collected and derived, a broken one gets no materialization
and is run alone by the next tick, and a cluster an older run holds is left to that run."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from dagster import (
    AssetKey,
    AssetPartitionStatus,
    DagsterRun,
    DagsterRunStatus,
    build_schedule_context,
    instance_for_test,
)
from sqlalchemy import select

from lens_pipeline.defs import cluster_assets, resources
from lens_pipeline.defs.cluster_assets import ASSET_KEYS, COLLECTION_TAG
from lens_pipeline.defs.collectors.schedules import collect_every_minute, failing_clusters
from lens_pipeline.defs.partitions import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    CLUSTER_PARTITIONS_NAME,
    cluster_partitions,
)
from lens_pipeline.defs.resources import (
    ClusterRegistryResource,
    KubernetesResource,
    LensDatabase,
    SafeDatabase,
)
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.schema import cluster_overview_cache
from lens_pipeline_tests.defs.support import (
    DEAD_URL,
    add_unreachable_cluster,
    edit_registry,
    materializations,
    materialize_cluster,
)
from lens_pipeline_tests.defs.test_gpu_nodes import assert_table_equals_truth


def _batch(first: str, last: str) -> dict[str, str]:
    return {ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last}


def _run(instance, registry, tmp_path, tags):
    return materialize_cluster(
        instance=instance,
        tags=tags,
        raise_on_error=False,
        resources={
            **resources.defs.resources,
            "registry": ClusterRegistryResource(clusters_file=str(registry)),
            "kubernetes": KubernetesResource(max_retries=0, backoff_seconds=0.05),
            "lens_db": LensDatabase(url=f"sqlite:///{tmp_path / 'lens.db'}"),
            "safe_db": SafeDatabase(url=f"sqlite:///{tmp_path / 'safe.db'}"),
        },
    )


def _check(result, asset: str, name: str):
    (evaluation,) = (
        e
        for e in result.get_asset_check_evaluations()
        if e.asset_key == AssetKey(asset) and e.check_name == name
    )
    return evaluation


def test_a_batch_collects_every_healthy_cluster_and_isolates_a_broken_one(tmp_path):
    fleet = SimFleet.generate(clusters=3, nodes=6, seed=4, vendor="mixed")
    healthy = [c.name for c in fleet]
    with SimServer(fleet) as server, instance_for_test() as instance:
        registry = write_registry(tmp_path / "clusters.yaml", server)
        add_unreachable_cluster(registry, "broken")
        order = [healthy[0], "broken", *healthy[1:]]
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, order)

        result = _run(instance, registry, tmp_path, _batch(order[0], order[-1]))
        # The run fails, after every healthy cluster was written once (no retry of the batch).
        assert not result.success
        for asset in ("gpu_nodes", "gpu_pods", "cluster_overview_cache", "safe_node_statistic"):
            assert sorted(m.partition for m in materializations(result, asset)) == sorted(healthy), asset
        # Dagster's partition status, as the UI shows it: the broken cluster failed for every asset,
        # the clusters the same run wrote are materialized.
        for key in ASSET_KEYS:
            status = instance.get_status_by_partition(key, order, cluster_partitions)
            assert status == {
                name: AssetPartitionStatus.FAILED if name == "broken" else AssetPartitionStatus.MATERIALIZED
                for name in order
            }, key
        for name in healthy:
            assert_table_equals_truth(f"sqlite:///{tmp_path / 'lens.db'}", server, name)
        with get_engine(f"sqlite:///{tmp_path / 'lens.db'}").connect() as conn:
            overviews = conn.execute(select(cluster_overview_cache.c.cluster_name)).scalars().all()
        assert sorted(overviews) == sorted(healthy)

        # One check result for the batch, saying which cluster could not be computed and why.
        evaluation = _check(result, "gpu_nodes", "every_node_readable")
        assert not evaluation.passed
        assert evaluation.metadata["clusters_checked"].value == 3
        not_computed = evaluation.metadata["not_computed"].value
        assert list(not_computed) == ["broken"] and "Connection refused" in not_computed["broken"]
        # Once the API proved unreachable, the cluster's other collectors do not wait out its timeouts.
        storage = _check(result, "storage_backends", "every_backend_readable")
        assert "not tried: the API was unreachable" in storage.metadata["not_computed"].value["broken"]
        views = _check(result, "cluster_overview_cache", "every_healthy_node_in_one_bucket")
        assert "not computed: gpu_nodes" in views.metadata["not_computed"].value["broken"]

        # The next tick runs the broken cluster alone and the others together.
        assert failing_clusters(instance, order) == {"broken"}  # every collector of it failed
        tick = datetime(2026, 11, 22, 10, 7, tzinfo=UTC)
        requests = collect_every_minute(
            build_schedule_context(instance=instance, scheduled_execution_time=tick)
        )
        assert [(r.partition_key, r.tags.get(ASSET_PARTITION_RANGE_START_TAG)) for r in requests] == [
            (healthy[0], None),
            ("broken", None),
            (None, healthy[1]),
        ]

        # Alone, the broken cluster fails its own run, with the cause.
        alone = _run(instance, registry, tmp_path, {"dagster/partition": "broken"})
        assert not alone.success

        # Once it answers again, its next run turns it green.
        edit_registry(registry, lambda document: _point_at(document, "broken", healthy[0]))
        assert _run(instance, registry, tmp_path, {"dagster/partition": "broken"}).success
        assert failing_clusters(instance, order) == set()


def _point_at(document: dict, name: str, like: str) -> None:
    """Give cluster `name` the API and Prometheus of cluster `like`."""
    (entry,) = [e for e in document["clusters"] if e["name"] == name]
    (model,) = [e for e in document["clusters"] if e["name"] == like]
    entry.clear()
    entry.update({**model, "name": name})


def test_a_cluster_an_older_run_holds_is_left_to_it_by_the_schedule_and_waited_for_by_a_backfill(
    tmp_path, monkeypatch
):
    fleet = SimFleet.generate(clusters=2, nodes=4, seed=6, vendor="amd")
    names = [c.name for c in fleet]
    with SimServer(fleet) as server, instance_for_test() as instance:
        registry = write_registry(tmp_path / "clusters.yaml", server)
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, names)
        instance.add_run(
            DagsterRun(
                job_name="collect_cluster",
                run_id="older",
                status=DagsterRunStatus.STARTED,
                tags={"dagster/partition": names[0]},
            )
        )
        scheduled = {**_batch(names[0], names[1]), COLLECTION_TAG: "scheduled"}
        result = _run(instance, registry, tmp_path, scheduled)
        assert result.success
        assert [m.partition for m in materializations(result, "gpu_nodes")] == [names[1]]

        # A backfill's run waits for the older run to let the cluster go, then collects it.
        monkeypatch.setattr(cluster_assets, "HOLD_POLL_SECONDS", 0.2)
        older = instance.get_run_by_id("older")
        threading.Timer(1.5, lambda: instance.report_run_failed(older)).start()
        started = time.monotonic()
        result = _run(instance, registry, tmp_path, _batch(names[0], names[1]))
        assert result.success and time.monotonic() - started > 1.5
        assert sorted(m.partition for m in materializations(result, "gpu_nodes")) == sorted(names)


def test_a_cluster_whose_prometheus_is_down_runs_alone_from_the_next_tick(tmp_path):
    fleet = SimFleet.generate(clusters=3, nodes=4, seed=8, vendor="amd")
    names = [c.name for c in fleet]
    with SimServer(fleet) as server, instance_for_test() as instance:
        registry = write_registry(tmp_path / "clusters.yaml", server)

        def prometheus_down(document: dict) -> None:
            (entry,) = [e for e in document["clusters"] if e["name"] == names[1]]
            entry["prometheus_url"] = DEAD_URL

        edit_registry(registry, prometheus_down)
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, names)

        result = _run(instance, registry, tmp_path, _batch(names[0], names[2]))
        assert not result.success
        # Its Kubernetes collectors are written; the devices, read from Prometheus, are not.
        assert sorted(m.partition for m in materializations(result, "gpu_nodes")) == sorted(names)
        assert sorted(m.partition for m in materializations(result, "gpu_devices")) == [names[0], names[2]]
        status = instance.get_status_by_partition(AssetKey("gpu_devices"), names, cluster_partitions)
        assert status[names[1]] == AssetPartitionStatus.FAILED
        assert status[names[0]] == status[names[2]] == AssetPartitionStatus.MATERIALIZED
        nodes = instance.get_status_by_partition(AssetKey("gpu_nodes"), names, cluster_partitions)
        assert set(nodes.values()) == {AssetPartitionStatus.MATERIALIZED}
        assert failing_clusters(instance, names) == {names[1]}
        tick = datetime(2026, 11, 22, 10, 8, tzinfo=UTC)
        requests = collect_every_minute(
            build_schedule_context(instance=instance, scheduled_execution_time=tick)
        )
        assert [r.partition_key for r in requests] == names  # each alone: the failing one splits the range
