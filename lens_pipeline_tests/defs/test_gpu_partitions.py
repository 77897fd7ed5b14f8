"""Clusters whose GPUs are advertised as MIG instances (NVIDIA's `mixed` strategy) or as partitions
(AMD's `mixed` naming), collected through Dagster over real HTTP: every unit is a GPU of its node
and of the pod holding it, as the simulator's truth counts them, and the overview adds them up."""

from __future__ import annotations

import pytest
from dagster import instance_for_test

from lens_pipeline.clusters import load_registry
from lens_pipeline.collect.overview import OVERVIEW_FIGURES
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.defs.resources import ClusterRegistryResource, LensDatabase
from lens_pipeline.kube.reader import KubeReader
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.schema import cluster_overview_cache, gpu_pods, node
from lens_pipeline_tests.defs.support import materialize_cluster, served_fleet
from lens_pipeline_tests.defs.test_collectors_against_truth import POD_COLUMNS, table, truth
from lens_pipeline_tests.defs.test_derived_against_truth import run_cluster
from lens_pipeline_tests.defs.test_gpu_nodes import TRUTH_COLUMNS

ADVERTISED = {"amd": "amd.com/cpx_nps4", "nvidia": "nvidia.com/mig-3g.40gb"}


@pytest.fixture
def partitioned(tmp_path):
    with (
        served_fleet(
            tmp_path, clusters=2, nodes=6, seed=41, vendor="mixed", gpu_resources=ADVERTISED
        ) as served,
        instance_for_test() as instance,
    ):
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [c.name for c in served[0]])
        yield (*served, instance)


def _mig_node(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/mig.strategy": "mixed"},
        },
        "spec": {},
        "status": {
            "capacity": {
                "cpu": "128",
                "memory": "2Ti",
                "nvidia.com/gpu": "2",
                "nvidia.com/mig-1g.10gb": "42",
                "nvidia.com/mig-3g.40gb.shared": "8",
            },
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "10.9.9.9"}],
            "nodeInfo": {"architecture": "amd64", "kubeletVersion": "v1.31.4"},
        },
    }


def _mig_pod(name: str, node_name: str) -> dict:
    def container(cname: str, limits: dict) -> dict:
        return {"name": cname, "image": "train:1", "resources": {"limits": limits}}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "research", "uid": f"uid-{name}", "resourceVersion": "2"},
        "spec": {
            "nodeName": node_name,
            "containers": [
                container("a", {"nvidia.com/mig-1g.10gb": "1"}),
                container("b", {"nvidia.com/mig-3g.40gb.shared": "1"}),
            ],
            "initContainers": [container("warm", {"nvidia.com/mig-1g.10gb": "2"})],
        },
        "status": {"phase": "Running", "podIP": "10.9.9.10"},
    }


def test_partitions_and_mig_instances_are_counted_as_the_truth_counts_them(partitioned, tmp_path):
    fleet, server, registry, instance = partitioned
    lens_url, safe_url = f"sqlite:///{tmp_path / 'lens.db'}", f"sqlite:///{tmp_path / 'safe.db'}"
    ensure_schema(get_engine(lens_url), "lens")
    for cluster in fleet:
        # The API serves what a device plugin of that naming advertises, and nothing whole.
        with KubeReader(load_registry(registry).get(cluster.name)) as kube:
            capacities = [n["status"]["capacity"] for n in kube.list("/api/v1/nodes", lambda o: o)]
        advertised = ADVERTISED[cluster.vendor]
        gpu_capacities = [c for c in capacities if advertised in c]
        assert gpu_capacities
        assert not any(whole in c for c in capacities for whole in ("amd.com/gpu", "nvidia.com/gpu"))

        run_cluster(cluster.name, registry, lens_url, safe_url, instance)
        want = truth(server, cluster.name)
        nodes = sorted(table(lens_url, node, cluster.name), key=lambda r: r["name"])
        assert [{c: r[c] for c in TRUTH_COLUMNS if c != "gpu_utilization"} for r in nodes] == [
            {c: r[c] for c in TRUTH_COLUMNS if c != "gpu_utilization"} for r in want["nodes"]
        ]
        assert sum(r["gpu_count"] for r in nodes) == sum(int(c[advertised]) for c in gpu_capacities)
        assert sum(r["gpu_allocation"] for r in nodes) > 0
        pods = {r["uid"]: r for r in table(lens_url, gpu_pods, cluster.name)}
        assert want["pods"] and all(
            {c: pods[p["uid"]][c] for c in POD_COLUMNS} == {c: p[c] for c in POD_COLUMNS}
            for p in want["pods"]
        )
        (row,) = table(lens_url, cluster_overview_cache, cluster.name)
        assert row["allocation_rate"] > 0
        assert {f: row[f] for f in OVERVIEW_FIGURES} == pytest.approx(
            {f: want["overview"][f] for f in OVERVIEW_FIGURES}, rel=1e-9
        )


def test_a_node_of_whole_gpus_mig_instances_and_shares(partitioned, tmp_path):
    """A node in MIG's `mixed` strategy keeps whole GPUs beside its instances; a pod may hold
    instances of two profiles and an init container's more: counted per resource, then summed."""
    fleet, _server, registry, instance = partitioned
    lens_url = f"sqlite:///{tmp_path / 'lens.db'}"
    cluster = next(c for c in fleet if c.vendor == "nvidia")
    cluster.inject_raw_node(_mig_node("mig-mixed-1"))
    cluster.inject_raw("pods", _mig_pod("mig-train-0", "mig-mixed-1"))
    result = materialize_cluster(
        ["gpu_nodes", "gpu_pods", "gpu_devices"],
        partition_key=cluster.name,
        instance=instance,
        resources={
            "registry": ClusterRegistryResource(clusters_file=str(registry)),
            "lens_db": LensDatabase(url=lens_url),
        },
    )
    assert result.success
    # The node has no exporter (as a MIG node's dcgm-exporter has no DCGM_FI_DEV_GPU_UTIL): its
    # GPUs are unknown to Prometheus, and a check says so rather than passing.
    failed = {c.check_name: c.metadata for c in result.get_asset_check_evaluations() if not c.passed}
    assert failed.keys() == {"every_gpu_node_has_utilization", "every_gpu_node_has_devices"}
    assert all(meta["nodes"].value == ["mig-mixed-1"] for meta in failed.values())
    nodes = {r["name"]: r for r in table(lens_url, node, cluster.name)}
    assert (nodes["mig-mixed-1"]["gpu_count"], nodes["mig-mixed-1"]["gpu_allocation"]) == (2 + 42 + 8, 3)
    pods = {r["name"]: r for r in table(lens_url, gpu_pods, cluster.name)}
    assert pods["mig-train-0"]["gpu_allocated"] == 3 and pods["mig-train-0"]["node_name"] == "mig-mixed-1"
