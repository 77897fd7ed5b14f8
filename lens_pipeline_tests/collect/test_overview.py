"""collect/overview.py: JuiceFS volumes from the grouped answers, the cluster's storage figures, and which GPU nodes are faulty."""

from __future__ import annotations

from lens_pipeline.collect.overview import (
    JUICEFS_UNLIMITED_SPACE,
    is_faulty,
    juicefs_volumes,
    node_figures,
    storage_figures,
)

TIB = float(1 << 40)


def test_each_volume_takes_its_figures_and_a_volume_without_quota_has_no_capacity():
    figures = {
        "total_space": {
            "quota": 10 * TIB,
            "unlimited": JUICEFS_UNLIMITED_SPACE,
            "registered": JUICEFS_UNLIMITED_SPACE,
        },
        "used_space": {"quota": 4 * TIB, "unlimited": 1 * TIB, "registered": 3 * TIB},
        "total_inodes": {"quota": 1000.0},
        "used_inodes": {"quota": 10.0, "unlimited": 5.0},
        "read_bandwidth": {"quota": 7.0},
        "write_bandwidth": {},
    }
    volumes, uncapped = juicefs_volumes(
        ["quota", "unlimited", "registered", "silent"], figures, {"registered": 20 * TIB}
    )
    quota, unlimited, registered, silent = volumes
    assert (quota.total_space, quota.used_space, quota.total_inodes, quota.read_bandwidth) == (
        10 * TIB,
        4 * TIB,
        1000.0,
        7.0,
    )
    assert unlimited.total_space is None and unlimited.used_space == 1 * TIB  # 1 PiB made up: no capacity
    assert registered.total_space == 20 * TIB  # the registry's capacity wins over the made-up total
    assert silent.used_space is None and silent.write_bandwidth is None  # no series: unknown, not 0
    assert uncapped == ["unlimited", "silent"]
    totals = storage_figures(volumes)
    assert totals["storage_used_space"] is None  # one volume's usage is unknown: so is the sum


def test_a_gpu_node_is_faulty_for_taints_gpu_pods_do_not_tolerate():
    """The vendor's dedication taint (`nvidia.com/gpu=present:NoSchedule`, GKE's on every GPU node
    pool) keeps only pods without GPUs off: a GPU pod tolerates it, so the node serves GPU work.
    Any other NoSchedule or NoExecute taint (cordon, maintenance) takes the node out of service;
    PreferNoSchedule does not."""

    def node(*taints: tuple[str, str]) -> dict:
        listed = [{"key": key, "value": "present", "effect": effect} for key, effect in taints]
        return {"status": "Ready", "gpu_count": 8, "gpu_allocation": 4, "taints": {"taints": listed}}

    assert not is_faulty(node())
    assert not is_faulty(node(("nvidia.com/gpu", "NoSchedule")))
    assert not is_faulty(node(("amd.com/gpu", "NoSchedule")))
    # The toleration Kubernetes adds for the resource's taint is for NoSchedule: NoExecute evicts.
    assert is_faulty(node(("amd.com/gpu", "NoExecute")))
    # The same holds for a taint keyed by a MIG instance's or a partition's resource, which pods
    # requesting it tolerate; a resource that holds no GPU is a taint like any other.
    assert not is_faulty(node(("nvidia.com/mig-1g.10gb", "NoSchedule")))
    assert not is_faulty(node(("amd.com/cpx_nps4", "NoSchedule")))
    assert is_faulty(node(("amd.com/cpx_nps4", "NoExecute")))
    assert is_faulty(node(("rdma/hca", "NoSchedule")))
    assert is_faulty({**node(), "taints": {"taints": [{"key": 7, "effect": "NoSchedule"}]}})
    assert not is_faulty(node(("example.com/maintenance", "PreferNoSchedule")))
    assert is_faulty(node(("node.kubernetes.io/unschedulable", "NoSchedule")))
    assert is_faulty(node(("nvidia.com/gpu", "NoSchedule"), ("example.com/maintenance", "NoExecute")))
    assert is_faulty({**node(), "status": "NotReady"}) and is_faulty({**node(), "gpu_count": 0})
    figures = node_figures([node(("nvidia.com/gpu", "NoSchedule")), node(("x", "NoSchedule"))])
    assert (figures["healthy_nodes"], figures["faulty_nodes"], figures["allocation_rate"]) == (1, 1, 50.0)
