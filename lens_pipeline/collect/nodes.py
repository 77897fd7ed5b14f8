"""Nodes: a GPU Node object (+ what its pods hold + its exporters' utilization) becomes a `node` row.

Fields follow spec §1.1 with the original's bugs fixed: the real Kubernetes version instead of a
hard-coded one, NotReady nodes kept with their status, the vendor from the registry profile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lens_pipeline.collect.objects import without_unread_metadata
from lens_pipeline.collect.problems import MalformedObject, Problem, mapping, object_name, text_without_nul
from lens_pipeline.collect.quantity import whole_units
from lens_pipeline.vendors import VendorProfile

Row = dict[str, Any]

# The fields a node row needs; everything else (images, volumes...) is dropped at list time.
_KEPT_STATUS = ("capacity", "conditions", "addresses", "nodeInfo")


def project_node(node: dict) -> dict:
    """Keep only what `node_row` reads, so 5,000 nodes with long image lists stay small in memory."""
    if not isinstance(node, dict):
        return node
    status = node.get("status")
    spec = node.get("spec")
    return {
        "metadata": node.get("metadata"),
        "spec": {"taints": spec.get("taints")} if isinstance(spec, dict) else spec,
        "status": {k: status.get(k) for k in _KEPT_STATUS} if isinstance(status, dict) else status,
    }


def node_profile(node: dict, profiles: Iterable[VendorProfile]) -> VendorProfile | None:
    """The vendor whose GPUs the node has: its capacity advertises one of the vendor's GPU resources
    (whole GPUs, MIG instances, partitions, shares) or it has the product label."""
    capacity = mapping(node, "status", "capacity")
    labels = mapping(node, "metadata", "labels")
    for profile in profiles:
        if profile.product_label in labels or any(profile.counts_as_gpus(r) for r in capacity):
            return profile
    return None


def has_gpus(node: dict, profiles: Iterable[VendorProfile]) -> bool:
    """Whether the node advertises GPUs of one of the vendors (a capacity above zero)."""
    capacity = mapping(node, "status", "capacity")
    return any(
        str(quantity) not in ("", "0") and p.counts_as_gpus(r)
        for r, quantity in capacity.items()
        for p in profiles
    )


def node_gpu_count(capacity: Mapping[str, object], profile: VendorProfile) -> int:
    """The GPUs a node's capacity advertises: the units of every resource of the vendor's, one GPU
    each (a node of MIG instances in the `mixed` strategy, or of AMD partitions, advertises several
    resources, and may keep whole GPUs beside them)."""
    return sum(
        whole_units(quantity, f"status.capacity[{resource!r}]", integer=True)
        for resource, quantity in capacity.items()
        if profile.counts_as_gpus(resource)
    )


def ready_status(node: dict) -> str:
    """'Ready', 'NotReady' or 'Unknown' from the NodeReady condition."""
    conditions = mapping(node, "status").get("conditions") or []
    if not isinstance(conditions, list):
        raise MalformedObject("status.conditions should be a list")
    for condition in conditions:
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            return {"True": "Ready", "False": "NotReady"}.get(str(condition.get("status")), "Unknown")
    return "Unknown"


def node_address(node: dict) -> str:
    """The InternalIP (the original took whichever address came first)."""
    addresses = mapping(node, "status").get("addresses") or []
    if not isinstance(addresses, list):
        raise MalformedObject("status.addresses should be a list")
    usable = [a for a in addresses if isinstance(a, dict) and isinstance(a.get("address"), str)]
    for address in usable:
        if address.get("type") == "InternalIP":
            return address["address"]
    return usable[0]["address"] if usable else ""


def node_taints(node: dict) -> dict:
    taints = mapping(node, "spec").get("taints") or []
    if not isinstance(taints, list) or not all(isinstance(t, dict) for t in taints):
        raise MalformedObject("spec.taints should be a list of objects")
    if not taints:
        return {}
    return {"taints": [{k: t[k] for k in ("key", "value", "effect", "timeAdded") if k in t} for t in taints]}


def node_row(
    node: dict,
    profile: VendorProfile,
    *,
    allocated: int,
    utilization: float | None,
) -> Row:
    """The `node` row of one GPU node (without cluster_name and timestamps, which the writer adds)."""
    metadata = without_unread_metadata(mapping(node, "metadata", required=True))
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedObject("missing metadata.name")
    if "\x00" in name:
        raise MalformedObject("metadata.name contains a NUL character")
    status = mapping(node, "status", required=True)
    capacity = mapping(status, "capacity", required=True)
    info = mapping(status, "nodeInfo")
    labels = mapping(metadata, "labels")
    annotations = mapping(metadata, "annotations")
    gpu_name = labels.get(profile.product_label) or "Unknown"
    driver_version = profile.driver_version(labels)
    state = ready_status(node)
    memory = capacity.get("memory", "")
    row = {
        "name": name,
        "address": node_address(node),
        "gpu_name": str(gpu_name),
        "gpu_allocation": allocated,
        "gpu_count": node_gpu_count(capacity, profile),
        "gpu_utilization": utilization,
        "status": state,
        "k8s_status": state,
        "cpu": str(info.get("architecture") or ""),
        "cpu_count": whole_units(capacity.get("cpu", 0), "status.capacity.cpu"),
        "memory": str(memory),
        "k8s_version": str(info.get("kubeletVersion") or ""),
        "kubelet_version": str(info.get("kubeletVersion") or ""),
        "containerd_version": str(info.get("containerRuntimeVersion") or ""),
        "os": str(info.get("osImage") or ""),
        "driver_version": str(driver_version),
        "taints": node_taints(node),
        "labels": labels,
        "annotations": annotations,
    }
    return text_without_nul(row)


def gpu_node_rows(
    nodes: Iterable[dict],
    profiles: tuple[VendorProfile, ...],
    allocated: Mapping[tuple[str, str], int],
    utilization: Mapping[str, float],
) -> tuple[list[Row], list[Problem], set[str]]:
    """Rows for every GPU node, the problems met, and the names of GPU nodes that could not be read.

    Non-GPU nodes are left out. A node that cannot be read is a `Problem`; its name (when known) is
    returned so the writer keeps its stored row instead of treating it as gone.
    """
    rows: list[Row] = []
    problems: list[Problem] = []
    unreadable: set[str] = set()
    for node in nodes:
        name = object_name(node)
        try:
            if not isinstance(node, dict):
                raise MalformedObject("item is not an object")
            profile = node_profile(node, profiles)
            if profile is None:
                continue
            rows.append(
                node_row(
                    node,
                    profile,
                    allocated=allocated.get((name, profile.name), 0),
                    utilization=utilization.get(name),
                )
            )
        except MalformedObject as exc:
            problems.append(Problem("Node", name, str(exc)))
            if name:
                unreadable.add(name)
    rows.sort(key=lambda r: r["name"])
    return rows, problems, unreadable


class NodeIndex:
    """What a Prometheus series may call a node, mapped to the Node's name: the name itself, one of
    its addresses (InternalIP, Hostname...), its `kubernetes.io/hostname` label, or `instance`'s
    `<address>:<port>`. Exporters name nodes by hostname; node_exporter names none, and a scrape
    without relabelling leaves only `instance`."""

    def __init__(self, nodes: Iterable[Any]) -> None:
        self._names: dict[str, str] = {}
        aliases: list[tuple[str, str]] = []
        for node in nodes:
            if not isinstance(node, dict):
                continue
            metadata, status = node.get("metadata"), node.get("status")
            if not isinstance(metadata, dict):
                continue
            name = metadata.get("name")
            if not isinstance(name, str) or not name:
                continue
            self._names[name] = name
            labels = metadata.get("labels")
            if isinstance(labels, dict) and isinstance(labels.get("kubernetes.io/hostname"), str):
                aliases.append((labels["kubernetes.io/hostname"], name))
            addresses = status.get("addresses") if isinstance(status, dict) else None
            for address in addresses if isinstance(addresses, list) else ():
                if isinstance(address, dict) and isinstance(address.get("address"), str):
                    aliases.append((address["address"], name))
        for alias, name in aliases:  # a node's own name wins over another node's address
            self._names.setdefault(alias, name)

    def __len__(self) -> int:
        return len(set(self._names.values()))

    def resolve(self, value: str | None) -> str | None:
        """The node a label value names, or None."""
        if not value:
            return None
        found = self._names.get(value)
        if found is None:
            found = self._names.get(_host_of(value))
        return found


def _host_of(instance: str) -> str:
    """`10.0.0.5:9100` -> `10.0.0.5`, `[fd00::5]:9100` -> `fd00::5`, `node-1` -> `node-1`."""
    if instance.startswith("["):
        return instance[1 : instance.find("]")] if "]" in instance else instance
    host, colon, port = instance.rpartition(":")
    return host if colon and port.isdigit() and ":" not in host else instance


def utilization_by_node(
    samples: Iterable[tuple[Mapping[str, str], float]], node_label: str, nodes: NodeIndex
) -> tuple[dict[str, float], list[str]]:
    """Per-node mean utilization from the samples of a `avg by (<node_label>)` query, and the label
    values that name no node of the cluster."""
    utilization: dict[str, float] = {}
    unmatched: list[str] = []
    for labels, value in samples:
        name = nodes.resolve(labels.get(node_label))
        if name is None:
            unmatched.append(labels.get(node_label) or "(no label)")
        else:
            utilization[name] = value
    return utilization, unmatched


def gpu_models_by_node(nodes: Iterable[dict], profiles: Iterable[VendorProfile]) -> dict[str, str]:
    """Node name -> GPU model label, for `pod_resource.gpu_model` (joined in memory, not per pod)."""
    profiles = tuple(profiles)
    models: dict[str, str] = {}
    for node in nodes:
        metadata = node.get("metadata") if isinstance(node, dict) else None
        if not isinstance(metadata, dict):
            continue
        labels = metadata.get("labels")
        if not isinstance(labels, dict) or not isinstance(metadata.get("name"), str):
            continue
        model = next((labels[p.product_label] for p in profiles if labels.get(p.product_label)), None)
        if model and "\x00" not in str(model):  # such a node is reported by gpu_nodes
            models[metadata["name"]] = str(model)
    return models
