"""Declarative automation of the derived assets, evaluated with the code location's own definitions
on a real instance after real materializations against the simulator."""

from __future__ import annotations

from dagster import evaluate_automation_conditions, instance_for_test

from lens_pipeline.definitions import defs
from lens_pipeline.defs import resources
from lens_pipeline.defs.cluster_assets import VIEW_KEYS
from lens_pipeline.defs.derived.assets import views_automation
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.defs.resources import ClusterRegistryResource, LensDatabase, SafeDatabase
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline_tests.defs.support import materialize_cluster


def requested(result) -> set[tuple[str, str]]:
    return {
        (key.to_user_string(), partition)
        for key in VIEW_KEYS
        for partition in result.get_requested_partitions(key)
    }


def test_views_follow_a_collector_materialized_alone_and_nothing_else(tmp_path):
    assert views_automation.default_status.value == "RUNNING"
    fleet = SimFleet.generate(clusters=2, nodes=6, seed=3, vendor="amd")
    names = [c.name for c in fleet]
    with SimServer(fleet) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, names)
        registry = write_registry(tmp_path / "clusters.yaml", server)
        run_resources = {
            **resources.defs.resources,
            "registry": ClusterRegistryResource(clusters_file=str(registry)),
            "lens_db": LensDatabase(url=f"sqlite:///{tmp_path / 'lens.db'}"),
            "safe_db": SafeDatabase(url=f"sqlite:///{tmp_path / 'safe.db'}"),
        }
        assets = list(defs.resolve_asset_graph().assets_defs)
        result = evaluate_automation_conditions(defs=assets, instance=instance)
        cursor = result.cursor

        # A scheduled run: collectors and views together. Nothing is left to follow.
        for name in names:
            assert materialize_cluster(partition_key=name, instance=instance, resources=run_resources).success
        result = evaluate_automation_conditions(defs=assets, instance=instance, cursor=cursor)
        assert requested(result) == set()

        # gpu_nodes alone for one cluster (a backfill): its views of that cluster follow, only them.
        assert materialize_cluster(
            ["gpu_nodes"], partition_key=names[0], instance=instance, resources=run_resources
        ).success
        result = evaluate_automation_conditions(defs=assets, instance=instance, cursor=result.cursor)
        assert requested(result) == {
            ("cluster_overview_cache", names[0]),
            ("safe_node_statistic", names[0]),
        }
