"""GPUs advertised under other names than a whole GPU's: MIG instances of NVIDIA's `mixed` strategy,
AMD's partitions under `-resource_naming_strategy mixed`, time-slicing's renamed share. The names
are the device plugins' own (NVIDIA/k8s-device-plugin internal/rm/rm.go and api/config/v1;
ROCm/k8s-device-plugin cmd/k8s-device-plugin/main.go); each unit counts as one GPU."""

from __future__ import annotations

import copy

import pytest

from lens_pipeline.collect.nodes import gpu_node_rows, has_gpus, node_profile
from lens_pipeline.collect.pods import GpuPod, allocation_by_node, pod_gpus, project_gpu_pod
from lens_pipeline.collect.problems import Problem
from lens_pipeline.sim.vendors import VENDORS as SIM_VENDORS
from lens_pipeline.vendors import AMD, NVIDIA, gpu_resources, profiles_for


@pytest.mark.parametrize(
    ("resource", "vendor"),
    [
        ("nvidia.com/gpu", "nvidia"),
        ("nvidia.com/gpu.shared", "nvidia"),  # renameByDefault
        ("nvidia.com/mig-1g.10gb", "nvidia"),
        ("nvidia.com/mig-7g.80gb", "nvidia"),
        ("nvidia.com/mig-1g.10gb.me", "nvidia"),  # the profile 1g.10gb+me, `+` written `.`
        ("nvidia.com/mig-1g.10gb.me.all", "nvidia"),
        ("nvidia.com/mig-1g.10gb-me", "nvidia"),
        ("nvidia.com/mig-3g.40gb.shared", "nvidia"),
        ("amd.com/gpu", "amd"),
        ("amd.com/cpx_nps4", "amd"),
        ("amd.com/spx_nps1", "amd"),
        ("amd.com/dpx_nps2", "amd"),
        ("cpu", None),
        ("memory", None),
        ("nvidia.com/gpu-shared", None),
        ("nvidia.com/gpus", None),
        ("nvidia.com/mig", None),
        ("nvidia.com/mig-", None),
        ("nvidia.com/mig-big", None),
        ("nvidia.com/mig-1c.3g.20gb", None),  # a compute instance's profile: never advertised
        ("nvidia.com/mig-1g.gb", None),
        ("example.com/mig-1g.10gb", None),
        ("amd.com/gpu.shared", None),
        ("amd.com/xgmi", None),
        ("amd.com/cpx", None),
        ("amd.com/cpx_nps", None),
        ("amd.com/abc_nps4", None),
        ("xamd.com/cpx_nps4", None),
        ("rdma/hca_shared_devices_a", None),
    ],
)
def test_which_resources_are_whose_gpus(resource, vendor):
    assert gpu_resources("auto").vendor_of(resource) == vendor
    assert NVIDIA.counts_as_gpus(resource) == (vendor == "nvidia")
    assert AMD.counts_as_gpus(resource) == (vendor == "amd")
    # A cluster of one vendor never counts the other's.
    other = "amd" if vendor == "nvidia" else "nvidia"
    assert gpu_resources(other).vendor_of(resource) is None
    # The simulator's truth, by its own rule, agrees.
    assert {v for v, sim in SIM_VENDORS.items() if sim.counts_as_gpus(resource)} == (
        {vendor} if vendor else set()
    )


def _node(name, capacity, labels=None):
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {},
        "status": {
            "capacity": {"cpu": "64", "memory": "1Ti", **capacity},
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        },
    }


def _pod(name, node, containers, init=(), phase="Running"):
    def container(i, requests, limits=None):
        return {"name": f"c{i}", "resources": {"requests": requests, "limits": limits or {}}}

    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {
            "nodeName": node,
            "containers": [container(i, *c) for i, c in enumerate(containers)],
            "initContainers": [container(i, *c) for i, c in enumerate(init)],
        },
        "status": {"phase": phase},
    }


# A node in MIG's `mixed` strategy: two whole GPUs, six H100s as 1g.10gb instances (7 each, 42),
# one as two 3g.40gb instances shared by time-slicing (renamed: 4 replicas each) and one as a 1g.10gb+me.
MIG_NODE = _node(
    "mig-1",
    {
        "nvidia.com/gpu": "2",
        "nvidia.com/mig-1g.10gb": "42",
        "nvidia.com/mig-3g.40gb.shared": "8",
        "nvidia.com/mig-1g.10gb.me": "1",
    },
    {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/mig.strategy": "mixed"},
)
# An MI300X node in CPX / NPS4 mode under the `mixed` naming strategy: 8 GPUs of 8 partitions each.
AMD_CPX_NODE = _node(
    "cpx-1", {"amd.com/cpx_nps4": "64"}, {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}
)


def test_a_node_of_mig_instances_or_partitions_counts_every_unit():
    auto = profiles_for("auto")
    rows, problems, _ = gpu_node_rows([MIG_NODE, AMD_CPX_NODE], auto, {("mig-1", "nvidia"): 5}, {})
    assert problems == []
    by_name = {r["name"]: r for r in rows}
    assert by_name["mig-1"]["gpu_count"] == 2 + 42 + 8 + 1 and by_name["mig-1"]["gpu_allocation"] == 5
    assert by_name["cpx-1"]["gpu_count"] == 64
    # Without the product label (no feature discovery), the resources alone make it a GPU node.
    bare = copy.deepcopy(AMD_CPX_NODE)
    bare["metadata"]["labels"] = {}
    assert node_profile(bare, auto) is AMD and has_gpus(bare, auto)
    assert node_profile(bare, (NVIDIA,)) is None and not has_gpus(bare, (NVIDIA,))
    # A partition count that is no count is the node's problem, named by its resource.
    broken = _node("cpx-2", {"amd.com/cpx_nps4": "lots"}, {})
    rows, problems, unreadable = gpu_node_rows([broken], auto, {}, {})
    assert rows == [] and unreadable == {"cpx-2"} and "amd.com/cpx_nps4" in problems[0].message


def test_a_pod_holding_mig_instances_of_several_profiles():
    nvidia = gpu_resources("nvidia")
    pod = _pod(
        "train",
        "mig-1",
        [({"nvidia.com/mig-1g.10gb": "1"},), ({}, {"nvidia.com/mig-3g.40gb.shared": "1"}), ({"cpu": "4"},)],
        init=[({"nvidia.com/mig-1g.10gb": "2"},)],
    )
    # Per resource as the scheduler counts it (1g.10gb: max(1, init 2) = 2; 3g.40gb: its limit, 1).
    assert pod_gpus(pod, nvidia, "nvidia") == 3
    projected = project_gpu_pod(pod, nvidia)
    assert isinstance(projected, GpuPod) and (projected.vendor, projected.gpus) == ("nvidia", 3)
    shared = project_gpu_pod(_pod("share", "mig-1", [({"nvidia.com/gpu.shared": "1"},)]), nvidia)
    assert isinstance(shared, GpuPod) and shared.gpus == 1
    assert allocation_by_node([projected, shared]) == {("mig-1", "nvidia"): 4}
    # An AMD cluster's reading of the same pod: no GPU of its own.
    assert project_gpu_pod(pod, gpu_resources("amd")) is None


def test_auto_clusters_tell_the_vendor_by_the_resource_and_unchanged_pods_keep_it():
    auto = gpu_resources("auto")
    amd_pod = _pod("p", "cpx-1", [({"amd.com/cpx_nps4": "8"},)])
    amd_pod["metadata"]["resourceVersion"] = "17"
    projected = project_gpu_pod(amd_pod, auto)
    assert isinstance(projected, GpuPod) and (projected.vendor, projected.gpus) == ("amd", 8)
    for resources in (auto, gpu_resources("amd")):
        again = project_gpu_pod(amd_pod, resources, {"uid-p": ("17", 8)})
        assert isinstance(again, GpuPod) and again.obj is None and (again.vendor, again.gpus) == ("amd", 8)
    bad = project_gpu_pod(_pod("q", "n", [({"nvidia.com/mig-1g.10gb": "1.5"},)]), auto)
    assert isinstance(bad, Problem) and "nvidia.com/mig-1g.10gb" in bad.message
    # A null quantity (no API server serves one) is no GPU, as before, and hides none of the others.
    nulls = _pod("r", "n", [({"nvidia.com/gpu": "3"}, {"amd.com/gpu": None}), ({"nvidia.com/gpu": None},)])
    projected = project_gpu_pod(nulls, auto)
    assert isinstance(projected, GpuPod) and (projected.vendor, projected.gpus) == ("nvidia", 3)


def test_the_memo_of_names_stays_bounded():
    resources = gpu_resources("auto").__class__(profiles_for("auto"))
    for i in range(10_000):
        assert resources.vendor_of(f"example.com/r{i}") is None
    assert resources.vendor_of("nvidia.com/mig-2g.20gb") == "nvidia"
    assert len(resources.known) <= 4096
