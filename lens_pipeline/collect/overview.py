"""The cluster overview (spec §3) from the `node` rows and a handful of Prometheus figures: pure.

The original's bugs are fixed here (docs/DIFFERENCES.md, O1-O5): a GPU node that is NotReady (or
reports no GPUs) is faulty instead of vanishing from every count; a node is faulty for a taint
only when the taint keeps pods off it; every healthy node lands in exactly one idle bucket; the
allocation rate is over healthy nodes; storage and RDMA figures add up every volume and NIC.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lens_pipeline.collect.problems import MalformedObject, Problem
from lens_pipeline.collect.stored import (
    readable_rows,
    stored_count,
    stored_figure,
    stored_mapping,
    stored_text,
)
from lens_pipeline.vendors import PROFILES

# Taints that keep new pods off a node: a node carrying one is out of service (PreferNoSchedule is not).
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# ... except a taint keyed by the GPU resource itself (`nvidia.com/gpu=present:NoSchedule`, which GKE
# puts on every GPU node pool and many clusters put on their GPU nodes): it keeps off the pods that
# request no GPU, and a pod that requests the resource tolerates it (where the API server enables
# the admission plugin ExtendedResourceToleration, it adds that toleration by itself, keyed by each
# extended resource the pod requests). Such a node serves GPU pods. Any of the vendors' GPU
# resources counts (a MIG instance's, a partition's), as a pod requesting it tolerates its taint.


def is_dedication_taint_key(key: object) -> bool:
    """Whether a taint keyed `key` is a GPU resource's own."""
    return isinstance(key, str) and any(profile.counts_as_gpus(key) for profile in PROFILES.values())


NODE_COUNTS = (
    "total_nodes",
    "healthy_nodes",
    "faulty_nodes",
    "fully_idle_nodes",
    "partially_idle_nodes",
    "busy_nodes",
)
STORAGE_FIGURES = (
    "storage_total_space",
    "storage_used_space",
    "storage_usage_percentage",
    "storage_total_inodes",
    "storage_used_inodes",
    "storage_inodes_usage_percentage",
    "storage_read_bandwidth",
    "storage_write_bandwidth",
)
RDMA_FIGURES = ("rdma_total_tx", "rdma_total_rx")
OVERVIEW_FIGURES = (*NODE_COUNTS, "allocation_rate", "utilization", *STORAGE_FIGURES, *RDMA_FIGURES)


def overview_node(row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored `node` row with the columns the overview reads, each checked (a malformed one names
    its column, and the row is left out of the figures)."""
    taints = stored_mapping(row, "taints").get("taints") or []
    if not isinstance(taints, list):
        raise MalformedObject("taints.taints should be a list")
    return {
        "name": stored_text(row, "name"),
        "gpu_count": stored_count(row, "gpu_count"),
        "gpu_allocation": stored_count(row, "gpu_allocation"),
        "gpu_utilization": stored_figure(row, "gpu_utilization"),
        "status": stored_text(row, "status"),
        "taints": {"taints": taints},
    }


def readable_nodes(rows: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[Problem]]:
    """The rows the overview can read, and a problem naming each one it cannot."""
    return readable_rows(rows, overview_node, "node", "name")


def is_faulty(node: Mapping[str, Any]) -> bool:
    """A GPU node is faulty when it is not Ready, reports no GPUs, or carries a blocking taint that
    GPU pods do not tolerate: any but the GPU resource's own NoSchedule (the toleration that
    ExtendedResourceToleration adds is for NoSchedule only; a NoExecute one keeps them off)."""
    if node.get("status") != "Ready" or not node.get("gpu_count"):
        return True
    taints = (node.get("taints") or {}).get("taints") or []
    return any(
        isinstance(t, Mapping)
        and t.get("effect") in BLOCKING_EFFECTS
        and not (t.get("effect") == "NoSchedule" and is_dedication_taint_key(t.get("key")))
        for t in taints
    )


def node_figures(nodes: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Node counts, idle buckets and the allocation rate (0-100) of one cluster's `node` rows."""
    counts = dict.fromkeys(NODE_COUNTS, 0)
    capacity = allocated = 0
    for node in nodes:
        counts["total_nodes"] += 1
        if is_faulty(node):
            counts["faulty_nodes"] += 1
            continue
        counts["healthy_nodes"] += 1
        gpus, used = int(node["gpu_count"]), int(node.get("gpu_allocation") or 0)
        capacity, allocated = capacity + gpus, allocated + used
        bucket = "fully_idle_nodes" if used == 0 else "busy_nodes" if used >= gpus else "partially_idle_nodes"
        counts[bucket] += 1
    return {**counts, "allocation_rate": 100.0 * allocated / capacity if capacity else 0.0}


def weighted_utilization(nodes: Iterable[Mapping[str, Any]]) -> float | None:
    """The mean GPU utilization of the stored nodes, weighted by their GPUs: the live path's stand-in
    for `avg(<utilization metric>)` when Prometheus is not asked. None when no node's is known."""
    total = weight = 0.0
    for node in nodes:
        if node.get("gpu_utilization") is None or not node.get("gpu_count"):
            continue
        total += float(node["gpu_utilization"]) * node["gpu_count"]
        weight += node["gpu_count"]
    return total / weight if weight else None


# JuiceFS reports made-up figures for a volume without a quota (pkg/meta/base.go, statRootFs): a
# total space of 1 PiB, doubled until the used space is at most 80 % of it, and free inodes of
# 10 Mi, doubled until the used inodes are at most 80 % of the total. Such a total is no capacity.
JUICEFS_UNLIMITED_SPACE = float(1 << 50)
JUICEFS_UNLIMITED_FREE_INODES = float(10 << 20)


def juicefs_space_capacity(total: float, used: float) -> float | None:
    """The volume's capacity in bytes, or None when `total` is the figure of a volume without quota."""
    made_up = JUICEFS_UNLIMITED_SPACE
    while made_up * 8 < used * 10:
        made_up *= 2
    return None if total == made_up else total


def juicefs_inode_capacity(total: float, used: float) -> float | None:
    """The volume's inode capacity, or None when `total` is the figure of a volume without quota."""
    free = JUICEFS_UNLIMITED_FREE_INODES
    while used > free * 4:
        free *= 2
    return None if total == used + free else total


@dataclass(frozen=True)
class StorageVolume:
    """One JuiceFS volume's figures from Prometheus: bytes, inodes, bytes per second. None: unknown
    (a volume without quota has no capacity to measure usage against; a volume without series has
    no figure at all)."""

    total_space: float | None = 0.0
    used_space: float | None = 0.0
    total_inodes: float | None = 0.0
    used_inodes: float | None = 0.0
    read_bandwidth: float | None = 0.0
    write_bandwidth: float | None = 0.0


def _total(values: Iterable[float | None]) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _percentage(used: float | None, total: float | None) -> float | None:
    if total is None or used is None:
        return None
    return 100.0 * used / total if total else 0.0


def storage_figures(volumes: Iterable[StorageVolume]) -> dict[str, float | None]:
    """Every volume added up (the original took the newest `storage` row only). A figure that one
    volume lacks makes the cluster's unknown: a sum over some volumes is not the cluster's."""
    volumes = list(volumes)
    space, used = _total(v.total_space for v in volumes), _total(v.used_space for v in volumes)
    inodes, used_inodes = _total(v.total_inodes for v in volumes), _total(v.used_inodes for v in volumes)
    return {
        "storage_total_space": space,
        "storage_used_space": used,
        "storage_usage_percentage": _percentage(used, space),
        "storage_total_inodes": inodes,
        "storage_used_inodes": used_inodes,
        "storage_inodes_usage_percentage": _percentage(used_inodes, inodes),
        "storage_read_bandwidth": _total(v.read_bandwidth for v in volumes),
        "storage_write_bandwidth": _total(v.write_bandwidth for v in volumes),
    }


def overview_row(
    nodes: Iterable[Mapping[str, Any]],
    *,
    utilization: float | None,
    storage: Mapping[str, float | None] | None = None,
    rdma: tuple[float | None, float | None] = (None, None),
) -> dict[str, float | None]:
    """One `cluster_overview_cache` row's figures (no cluster name, no times). Storage and RDMA
    figures not given are unknown (NULL): only Prometheus knows them."""
    rx, tx = rdma
    return {
        **node_figures(nodes),
        "utilization": utilization,
        **(storage if storage is not None else dict.fromkeys(STORAGE_FIGURES)),
        "rdma_total_rx": rx,
        "rdma_total_tx": tx,
    }


def api_overview(row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored overview as the original's `GpuClusterOverview` JSON: storage and RDMA figures in
    snake_case without their prefixes, node counts in camelCase (spec §3, quirk §10.12 kept for
    wire compatibility)."""
    return {
        "total_space": row["storage_total_space"],
        "used_space": row["storage_used_space"],
        "usage_percentage": row["storage_usage_percentage"],
        "total_inodes": row["storage_total_inodes"],
        "used_inodes": row["storage_used_inodes"],
        "inodes_usage_percentage": row["storage_inodes_usage_percentage"],
        "read_bandwidth": row["storage_read_bandwidth"],
        "write_bandwidth": row["storage_write_bandwidth"],
        "total_tx": row["rdma_total_tx"],
        "total_rx": row["rdma_total_rx"],
        "totalNodes": row["total_nodes"],
        "healthyNodes": row["healthy_nodes"],
        "faultyNodes": row["faulty_nodes"],
        "fullyIdleNodes": row["fully_idle_nodes"],
        "partiallyIdleNodes": row["partially_idle_nodes"],
        "busyNodes": row["busy_nodes"],
        "allocationRate": row["allocation_rate"],
        "utilization": row["utilization"],
    }


def juicefs_volumes(
    volumes: Sequence[str], figures: Mapping[str, Mapping[str, float]], capacities: Mapping[str, float]
) -> tuple[list[StorageVolume], list[str]]:
    """Each JuiceFS volume's figures from the grouped answers (`figures`: figure name -> volume ->
    value; a volume absent from an answer has that figure unknown), with the registry's
    `capacities` winning over the reported ones; and the volumes whose capacity is unknown (no
    quota: JuiceFS then reports a synthetic total, which is not a capacity)."""
    stored, uncapped = [], []
    for volume in volumes:
        seen = {name: values.get(volume) for name, values in figures.items()}
        used, used_inodes = seen.get("used_space"), seen.get("used_inodes")
        space = capacities.get(volume)
        reported_space, reported_inodes = seen.get("total_space"), seen.get("total_inodes")
        if space is None and reported_space is not None:
            space = juicefs_space_capacity(reported_space, used or 0.0)
        inodes = juicefs_inode_capacity(reported_inodes, used_inodes or 0.0) if reported_inodes else None
        if space is None:
            uncapped.append(volume)
        stored.append(
            StorageVolume(
                total_space=space,
                used_space=used,
                total_inodes=inodes,
                used_inodes=used_inodes,
                read_bandwidth=seen.get("read_bandwidth"),
                write_bandwidth=seen.get("write_bandwidth"),
            )
        )
    return stored, uncapped
