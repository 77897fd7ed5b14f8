"""Node objects to `node` rows, with real-shaped Kubernetes JSON."""

from __future__ import annotations

import copy

import pytest

from lens_pipeline.collect.nodes import gpu_node_rows, node_row, project_node
from lens_pipeline.collect.pods import allocation_by_node, pod_gpus, pod_resource_row, project_gpu_pod
from lens_pipeline.collect.problems import MalformedObject, Problem
from lens_pipeline.vendors import AMD, NVIDIA, gpu_resources, profiles_for

AMD_NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "gpu-1",
        "labels": {
            "amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM",
            "amd.com/gpu.driver-version": "6.10.5",
        },
        "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
    },
    "spec": {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]},
    "status": {
        "capacity": {"amd.com/gpu": "8", "cpu": "192", "memory": "2113Gi", "pods": "110"},
        "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
        "addresses": [
            {"type": "Hostname", "address": "gpu-1"},
            {"type": "InternalIP", "address": "10.0.0.7"},
        ],
        "nodeInfo": {
            "kubeletVersion": "v1.30.4",
            "containerRuntimeVersion": "containerd://1.7.13",
            "osImage": "Ubuntu 22.04.4 LTS",
            "architecture": "amd64",
        },
        "images": [{"names": ["huge"], "sizeBytes": 1}],
    },
}


def test_an_amd_node_becomes_its_row():
    row = node_row(project_node(AMD_NODE), AMD, allocated=5, utilization=37.5)
    assert row == {
        "name": "gpu-1",
        "address": "10.0.0.7",
        "gpu_name": "AMD_Instinct_MI300X_OAM",
        "gpu_allocation": 5,
        "gpu_count": 8,
        "gpu_utilization": 37.5,
        "status": "Ready",
        "k8s_status": "Ready",
        "cpu": "amd64",
        "cpu_count": 192,
        "memory": "2113Gi",
        "k8s_version": "v1.30.4",
        "kubelet_version": "v1.30.4",
        "containerd_version": "containerd://1.7.13",
        "os": "Ubuntu 22.04.4 LTS",
        "driver_version": "6.10.5",
        "taints": {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]},
        "labels": AMD_NODE["metadata"]["labels"],
        "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
    }
    assert "images" not in project_node(AMD_NODE)["status"]


@pytest.mark.parametrize(
    ("conditions", "status"),
    [
        ([{"type": "Ready", "status": "False"}], "NotReady"),
        ([{"type": "Ready", "status": "Unknown"}], "Unknown"),
        ([], "Unknown"),
    ],
)
def test_not_ready_nodes_keep_their_status(conditions, status):
    node = copy.deepcopy(AMD_NODE)
    node["status"]["conditions"] = conditions
    assert node_row(node, AMD, allocated=0, utilization=None)["status"] == status


def test_nvidia_node_and_auto_vendor_detection():
    node = copy.deepcopy(AMD_NODE)
    node["metadata"]["labels"] = {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/cuda.driver-version.full": "550.54.15",
    }
    node["status"]["capacity"] = {"nvidia.com/gpu": "8", "cpu": "127500m", "memory": "1Ti"}
    cpu_node = {"metadata": {"name": "cpu-1"}, "status": {"capacity": {"cpu": "4"}}}
    rows, problems, _ = gpu_node_rows([node, cpu_node], profiles_for("auto"), {("gpu-1", "nvidia"): 3}, {})
    assert problems == [] and len(rows) == 1
    assert rows[0]["gpu_name"] == "NVIDIA-H100-80GB-HBM3" and rows[0]["gpu_count"] == 8
    assert (
        rows[0]["gpu_allocation"] == 3
        and rows[0]["cpu_count"] == 127
        and rows[0]["driver_version"] == "550.54.15"
    )
    assert rows[0]["gpu_utilization"] is None


def test_older_feature_discovery_labels_still_give_the_driver_version():
    """GPU feature discovery before v0.15.0 labelled only cuda.driver.major/minor/rev."""
    labels = {
        "nvidia.com/cuda.driver.major": "535",
        "nvidia.com/cuda.driver.minor": "161",
        "nvidia.com/cuda.driver.rev": "08",
    }
    assert NVIDIA.driver_version(labels) == "535.161.08"
    assert (
        NVIDIA.driver_version({**labels, "nvidia.com/cuda.driver-version.full": "550.54.15"}) == "550.54.15"
    )
    assert NVIDIA.driver_version({"nvidia.com/cuda.driver.major": "535"}) == ""


def test_a_gpu_node_without_labels_is_unknown_not_an_error():
    node = copy.deepcopy(AMD_NODE)
    del node["metadata"]["labels"]
    row = node_row(node, AMD, allocated=0, utilization=None)
    assert row["gpu_name"] == "Unknown" and row["labels"] == {} and row["driver_version"] == ""


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda n: n.pop("status"), "missing status"),
        (lambda n: n["status"]["capacity"].update({"amd.com/gpu": "eight"}), "amd.com/gpu"),
        (lambda n: n["status"]["capacity"].update({"cpu": True}), "capacity.cpu"),
        (lambda n: n["status"].update({"conditions": "Ready"}), "conditions should be a list"),
        (lambda n: n["spec"].update({"taints": "x"}), "taints"),
        (lambda n: n["metadata"].update({"labels": ["x"]}), "labels should be an object"),
    ],
)
def test_malformed_nodes_are_named_problems_and_protected(mutate, message):
    node = copy.deepcopy(AMD_NODE)
    node["status"]["capacity"]["amd.com/gpu"] = "8"
    mutate(node)
    good = copy.deepcopy(AMD_NODE)
    good["metadata"]["name"] = "gpu-2"
    rows, problems, unreadable = gpu_node_rows([node, good, "junk"], (AMD,), {}, {})
    assert [r["name"] for r in rows] == ["gpu-2"]
    assert any(message in p.message and p.name == "gpu-1" for p in problems), problems
    assert unreadable == {"gpu-1"}
    assert any(p.message == "item is not an object" for p in problems)


def _pod(containers, init=(), phase="Running", node="gpu-1"):
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"nodeName": node, "containers": list(containers), "initContainers": list(init)},
        "status": {"phase": phase},
    }


def _container(requests=None, limits=None):
    return {"name": "c", "resources": {"requests": requests or {}, "limits": limits or {}}}


def test_pod_gpus_counts_as_the_scheduler_does():
    r, amd = "amd.com/gpu", gpu_resources("amd")
    assert pod_gpus(_pod([_container({r: "2"}), _container(limits={r: "3"})]), amd, "amd") == 5
    assert (
        pod_gpus(_pod([_container({r: "1"})], init=[_container({r: "4"}), _container({r: "2"})]), amd, "amd")
        == 4
    )
    assert pod_gpus(_pod([_container({"cpu": "1"})]), amd, "amd") == 0
    # A request wins over its limit; a limit alone is the request.
    assert pod_gpus(_pod([_container({r: "1"}, limits={r: "2"})]), amd, "amd") == 1


def test_only_bound_pending_or_running_pods_hold_gpus():
    r, amd = "amd.com/gpu", gpu_resources("amd")
    held = [
        project_gpu_pod(_pod([_container({r: "2"})], phase=phase, node=node), amd)
        for phase, node in (("Running", "a"), ("Pending", "a"), ("Succeeded", "a"), ("Running", None))
    ]
    assert allocation_by_node(held) == {("a", "amd"): 4}
    assert project_gpu_pod(_pod([_container({"cpu": "2"})]), amd) is None
    bad = project_gpu_pod(_pod([_container({r: "lots"})]), amd)
    assert isinstance(bad, Problem) and bad.name == "ns/p"


def test_node_row_requires_a_name():
    with pytest.raises(MalformedObject, match=r"metadata\.name"):
        node_row({"metadata": {}, "status": {"capacity": {}}}, NVIDIA, allocated=0, utilization=None)


def _timed_pod(phase, node, conditions=(), start=None, finished=None, deleted=None):
    pod = _pod([_container({"amd.com/gpu": "2"})], phase=phase, node=node)
    pod["metadata"]["creationTimestamp"] = "2026-11-01T00:00:00Z"
    if deleted:
        pod["metadata"]["deletionTimestamp"] = deleted
    pod["status"]["conditions"] = [
        {"type": kind, "status": "True", "lastTransitionTime": when} for kind, when in conditions
    ]
    if start:
        pod["status"]["startTime"] = start
    if finished:
        pod["status"]["containerStatuses"] = [
            {"name": "c", "state": {"terminated": {"finishedAt": finished}}}
        ]
    return project_gpu_pod(pod, gpu_resources("amd"))


def test_gpus_are_held_from_binding_to_the_end_not_from_creation():
    """A pod that never got a node held nothing; one evicted or done held its GPUs from its
    scheduling to its end (not from its creation, which may be days of Pending before)."""
    never = pod_resource_row(_timed_pod("Pending", None), "MI300X")
    assert never["bound_at"] is None and never["end_at"] is None
    evicted = _timed_pod(
        "Failed",
        "gpu-1",
        conditions=[("PodScheduled", "2026-11-03T00:00:00Z")],
        start="2026-11-03T00:00:05Z",
        finished="2026-11-03T06:00:00Z",
    )
    row = pod_resource_row(evicted, "MI300X")
    assert (row["bound_at"].isoformat(), row["end_at"].isoformat()) == (
        "2026-11-03T00:00:00+00:00",
        "2026-11-03T06:00:00+00:00",
    )
    done = pod_resource_row(
        _timed_pod("Succeeded", "gpu-1", start="2026-11-02T00:00:00Z", finished="2026-11-02T01:00:00Z"), ""
    )
    assert done["bound_at"].isoformat() == "2026-11-02T00:00:00+00:00"  # no condition: the start time
