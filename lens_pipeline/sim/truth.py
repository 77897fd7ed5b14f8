"""Ground truth of a simulated cluster: the `node` rows the pipeline must store, computed here from
the simulator's own objects and samples (never from lens_pipeline.collect, or it would share its bugs)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from lens_pipeline.sim.vendors import VENDORS, SimVendor

if TYPE_CHECKING:
    from lens_pipeline.sim.fleet import SimCluster

ACTIVE_PHASES = frozenset({"Pending", "Running"})


def _int_quantity(value: Any) -> int:
    """GPU and CPU counts are whole quantities ("8"); anything else counts as 0."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def container_gpu_request(container: Mapping[str, Any], resource: str) -> int:
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    # Extended resources default their request to the limit.
    if resource in requests:
        return _int_quantity(requests[resource])
    return _int_quantity(limits.get(resource, 0))


def pod_gpu_request(pod: Mapping[str, Any], resource: str) -> int:
    """Effective GPU request: init containers run one at a time before the app containers run together."""
    spec = pod.get("spec") or {}
    app = sum(container_gpu_request(c, resource) for c in spec.get("containers") or [])
    init = max((container_gpu_request(c, resource) for c in spec.get("initContainers") or []), default=0)
    return max(app, init)


def is_gpu_node(node: Mapping[str, Any], vendor: SimVendor) -> bool:
    capacity = (node.get("status") or {}).get("capacity") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    return vendor.resource in capacity or vendor.product_label in labels


def node_ready_status(node: Mapping[str, Any]) -> str:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return {"True": "Ready", "False": "NotReady"}.get(condition.get("status"), "Unknown")
    return "Unknown"


def _address(node: Mapping[str, Any]) -> str:
    addresses = (node.get("status") or {}).get("addresses") or []
    for address in addresses:
        if address.get("type") == "InternalIP":
            return address.get("address", "")
    return addresses[0].get("address", "") if addresses else ""


def node_row(
    node: Mapping[str, Any],
    vendor: SimVendor,
    allocated: int,
    utilization_samples: list[float] | None,
) -> dict[str, Any]:
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    status = node.get("status") or {}
    capacity = status.get("capacity") or {}
    info = status.get("nodeInfo") or {}
    taints = (node.get("spec") or {}).get("taints") or []
    ready = node_ready_status(node)
    return {
        "name": metadata.get("name", ""),
        "address": _address(node),
        "gpu_name": labels.get(vendor.product_label, "Unknown"),
        "gpu_count": _int_quantity(capacity.get(vendor.resource, 0)),
        "gpu_allocation": allocated,
        "gpu_utilization": statistics.fmean(utilization_samples) if utilization_samples else None,
        "status": ready,
        "k8s_status": ready,
        "cpu": info.get("architecture", ""),
        "cpu_count": _int_quantity(capacity.get("cpu", 0)),
        "memory": capacity.get("memory", ""),
        "k8s_version": info.get("kubeletVersion", ""),
        "kubelet_version": info.get("kubeletVersion", ""),
        "containerd_version": info.get("containerRuntimeVersion", ""),
        "os": info.get("osImage", ""),
        "driver_version": labels.get(vendor.driver_label, ""),
        "taints": {"taints": [dict(taint) for taint in taints]} if taints else {},
        "labels": dict(labels),
        "annotations": dict(metadata.get("annotations") or {}),
    }


def node_rows(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    utilization: Mapping[str, list[float]],
    vendor: SimVendor,
) -> list[dict[str, Any]]:
    allocated: dict[str, int] = {}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name and (pod.get("status") or {}).get("phase") in ACTIVE_PHASES:
            allocated[node_name] = allocated.get(node_name, 0) + pod_gpu_request(pod, vendor.resource)
    rows = [
        node_row(
            node,
            vendor,
            allocated.get(node["metadata"]["name"], 0),
            utilization.get(node["metadata"]["name"]),
        )
        for node in nodes
        if is_gpu_node(node, vendor)
    ]
    return sorted(rows, key=lambda row: row["name"])


def cluster_truth(cluster: SimCluster) -> dict[str, Any]:
    """`{"cluster", "vendor", "nodes": [node row, ...]}` for the cluster's current state."""
    vendor = VENDORS[cluster.vendor]
    nodes, pods, utilization = cluster.truth_inputs()
    return {
        "cluster": cluster.name,
        "vendor": cluster.vendor,
        "nodes": node_rows(nodes, pods, utilization, vendor),
    }
