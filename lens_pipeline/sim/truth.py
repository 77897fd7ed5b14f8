"""Ground truth of a simulated cluster: the node, GPU pod, workload and storage rows a correct
pipeline stores, computed from the simulator's own objects (never lens_pipeline.collect's code)."""

from __future__ import annotations

import base64
import contextlib
import gc
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lens_pipeline.sim.kinds import BY_TYPE
from lens_pipeline.sim.kubeobjects import stored_annotations
from lens_pipeline.sim.objects import StoredObject
from lens_pipeline.sim.vendors import SimVendor

if TYPE_CHECKING:
    from lens_pipeline.sim.fleet import SimCluster

ACTIVE_PHASES = frozenset({"Pending", "Running"})
JUICEFS_PROVISIONER = "csi.juicefs.com"
SAFE_STATUS = {"Pending": "Pending", "Running": "Running", "Succeeded": "Done", "Failed": "Failed"}


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


def pod_uses_gpu(pod: Mapping[str, Any], resource: str) -> bool:
    """Any container or init container requests or limits the resource (a non-zero quantity)."""
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for section in ("requests", "limits"):
            if _int_quantity((resources.get(section) or {}).get(resource, 0)):
                return True
    return False


def _pod_gpu_resources(pod: Mapping[str, Any], vendor: SimVendor) -> set[str]:
    spec = pod.get("spec") or {}
    names: set[str] = set()
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for section in ("requests", "limits"):
            names.update(vendor.gpu_resources_in(resources.get(section) or {}))
    return names


def controller_reference(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with controller: true, else the first one, else None."""
    references = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in references if r.get("controller")), references[0] if references else None)


def controller_uid(obj: Mapping[str, Any]) -> str:
    reference = controller_reference(obj)
    return str(reference.get("uid", "")) if reference else ""


def is_gpu_node(node: Mapping[str, Any], vendor: SimVendor) -> bool:
    capacity = (node.get("status") or {}).get("capacity") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    return bool(vendor.gpu_resources_in(capacity)) or vendor.product_label in labels


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
        "gpu_count": sum(_int_quantity(capacity[r]) for r in vendor.gpu_resources_in(capacity)),
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
        "driver_version": _driver_version(labels, vendor),
        "taints": {"taints": [dict(taint) for taint in taints]} if taints else {},
        "labels": dict(labels),
        "annotations": stored_annotations(metadata),
    }


def _count_allocation(pod: Mapping[str, Any], gpus: int, allocated: dict[str, int]) -> None:
    node_name = (pod.get("spec") or {}).get("nodeName")
    if node_name and (pod.get("status") or {}).get("phase") in ACTIVE_PHASES:
        allocated[node_name] = allocated.get(node_name, 0) + gpus


def node_rows(
    nodes: Iterable[Mapping[str, Any]],
    allocated: Mapping[str, int],
    utilization: Mapping[str, list[float]],
    vendor: SimVendor,
) -> list[dict[str, Any]]:
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


# -- GPU pods ----------------------------------------------------------------------------------


def pod_row(pod: Mapping[str, Any], gpus: int) -> dict[str, Any]:
    metadata = pod["metadata"]
    status = pod.get("status") or {}
    deleted = "deletionTimestamp" in metadata
    phase = status.get("phase", "")
    return {
        "namespace": metadata["namespace"],
        "name": metadata["name"],
        "uid": metadata["uid"],
        "node_name": (pod.get("spec") or {}).get("nodeName") or "",
        "gpu_allocated": gpus,
        "phase": phase,
        "deleted": deleted,
        "running": not deleted and phase == "Running",
        "ip": status.get("podIP") or "",
        "owner_uid": controller_uid(pod),
    }


# -- workloads ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Link:
    """What the owner walk needs of one object: found by how an ownerReference names it."""

    uid: str
    namespace: str
    reference: tuple[str, str, str, str] | None  # the controller ownerReference: apiVersion, kind, name, uid
    safe_label: str  # primus-safe.workload.id
    entry: StoredObject


def _link(obj: Mapping[str, Any], entry: StoredObject) -> _Link:
    metadata = obj["metadata"]
    reference = controller_reference(obj)
    return _Link(
        metadata["uid"],
        metadata.get("namespace", ""),
        (
            reference.get("apiVersion", ""),
            reference.get("kind", ""),
            reference.get("name", ""),
            reference.get("uid", ""),
        )
        if reference
        else None,
        (metadata.get("labels") or {}).get("primus-safe.workload.id", ""),
        entry,
    )


def _reports_failure(obj: Mapping[str, Any]) -> bool:
    status = obj.get("status") or {}
    if obj.get("kind") == "RayJob":
        # KubeRay reports an outcome in jobDeploymentStatus/jobStatus, not in conditions.
        return status.get("jobDeploymentStatus") == "Failed" or status.get("jobStatus") == "FAILED"
    return any(
        c.get("type") == "Failed" and c.get("status") == "True" for c in status.get("conditions") or []
    )


def _safe_gpu_request(workload: Mapping[str, Any]) -> int:
    resource = (workload.get("spec") or {}).get("resource") or {}
    return _int_quantity(resource.get("gpu", 0)) * _int_quantity(resource.get("replica", 0))


def _owner_index(
    objects: Mapping[str, list[StoredObject]],
) -> tuple[dict[tuple[str, str, str, str], _Link], dict[str, _Link]]:
    """Every object that can own a pod, by (apiVersion, kind, namespace, name); SaFE Workloads by name."""
    by_reference: dict[tuple[str, str, str, str], _Link] = {}
    safe_by_name: dict[str, _Link] = {}
    for resource, entries in objects.items():
        if resource == "pods":
            continue
        for entry in entries:
            obj = entry.obj
            link = _link(obj, entry)
            by_reference[(obj["apiVersion"], obj["kind"], link.namespace, obj["metadata"]["name"])] = link
            if resource == "workloads":
                safe_by_name[obj["metadata"]["name"]] = link
    return by_reference, safe_by_name


def _workload_state(obj: Mapping[str, Any], pods: list[dict[str, Any]]) -> tuple[str, int, str]:
    """(namespace, GPUs requested, status) of a workload object from the GPU pods below it."""
    if obj["kind"] == "Workload" and obj["apiVersion"] == "amd.com/v1":
        namespace = (obj.get("spec") or {}).get("workspace", "")
        return (
            namespace,
            _safe_gpu_request(obj),
            SAFE_STATUS.get((obj.get("status") or {}).get("phase", ""), "Running"),
        )
    gpu_request = sum(p["gpu_allocated"] for p in pods if p["running"])
    if any(p["running"] for p in pods):
        status = "Running"
    elif any(p["phase"] == "Pending" and not p["deleted"] for p in pods):
        status = "Pending"
    else:
        status = "Failed" if _reports_failure(obj) else "Done"
    return obj["metadata"].get("namespace", ""), gpu_request, status


def workload_rows(
    objects: Mapping[str, list[StoredObject]], gpu_pods: list[dict[str, Any]], pod_links: Mapping[str, _Link]
) -> list[dict[str, Any]]:
    """Every object above a GPU pod (owner chains walked to the top), and SaFE Workloads above those
    tops through their `primus-safe.workload.id` label."""
    by_reference, safe_by_name = _owner_index(objects)

    def resolve(child: _Link) -> _Link | None:
        if child.reference is None:
            return None
        api_version, kind_name, name, uid = child.reference
        kind = BY_TYPE.get((api_version, kind_name))
        if kind is None:
            return None
        parent = by_reference.get(
            (kind.api_version, kind.kind, child.namespace if kind.namespaced else "", name)
        )
        return parent if parent is not None and parent.uid == uid else None

    pod_uids: dict[str, set[str]] = {}
    parent_uids: dict[str, str] = {}
    links: dict[str, _Link] = {}
    for row in gpu_pods:
        current = pod_links[row["uid"]]
        seen = {row["uid"]}
        while True:
            parent = resolve(current)
            if parent is None:
                # SaFE links the top of a chain to its Workload by label, not by ownerReference.
                if current.uid not in links or current.safe_label not in safe_by_name:
                    break
                parent = safe_by_name[current.safe_label]
                if parent.uid == current.uid:
                    break
                parent_uids[current.uid] = parent.uid
            if parent.uid in seen:
                break
            seen.add(parent.uid)
            if parent.uid not in links:
                links[parent.uid] = parent
                parent_uids.setdefault(parent.uid, parent.reference[3] if parent.reference else "")
                pod_uids[parent.uid] = set()
            pod_uids[parent.uid].add(row["uid"])
            current = parent

    pods_by_uid = {pod["uid"]: pod for pod in gpu_pods}
    rows = []
    for uid in sorted(links):
        obj = links[uid].entry.obj
        metadata = obj["metadata"]
        namespace, gpu_request, status = _workload_state(obj, [pods_by_uid[p] for p in pod_uids[uid]])
        rows.append(
            {
                "uid": uid,
                "group_version": obj["apiVersion"],
                "kind": obj["kind"],
                "namespace": namespace,
                "name": metadata["name"],
                "parent_uid": parent_uids[uid],
                "labels": dict(metadata.get("labels") or {}),
                "annotations": stored_annotations(metadata),
                "gpu_request": gpu_request,
                "status": status,
                "pod_uids": sorted(pod_uids[uid]),
            }
        )
    return rows


# -- storage -----------------------------------------------------------------------------------


def storage_rows(
    storage_classes: Iterable[Mapping[str, Any]], secrets: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    by_key = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in secrets}
    rows = []
    for storage_class in storage_classes:
        if storage_class.get("provisioner") != JUICEFS_PROVISIONER:
            continue
        parameters = storage_class.get("parameters") or {}
        namespace = parameters.get("csi.storage.k8s.io/provisioner-secret-namespace", "")
        name = parameters.get("csi.storage.k8s.io/provisioner-secret-name", "")
        secret = by_key.get((namespace, name))
        if secret is None or "name" not in (secret.get("data") or {}):
            continue
        rows.append(
            {
                "kind": "juicefs",
                "name": base64.b64decode(secret["data"]["name"]).decode("utf-8"),
                "storage_class": storage_class["metadata"]["name"],
                "secret_namespace": namespace,
                "secret_name": name,
            }
        )
    return sorted(rows, key=lambda row: row["storage_class"])


# -- the whole truth ---------------------------------------------------------------------------


@dataclass
class TruthInputs:
    """Everything the truth is computed from, taken under the cluster's lock in one go."""

    objects: dict[str, list[StoredObject]]  # simulated (never injected) objects by resource, in key order
    utilization: dict[str, list[float]]
    removed_pods: list[str]
    removed_workloads: list[str]


@contextlib.contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    # Parsing 150,000 pods makes millions of acyclic dicts; the collector would rescan them over and
    # over (30 s instead of 5 s).
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def cluster_truth(cluster: SimCluster) -> dict[str, Any]:
    """The rows a correct pipeline has stored for the cluster's current state (schema in docs/SIMULATOR.md)."""
    vendor = cluster.profile  # the vendor's, with the resource the cluster's GPUs are advertised as
    # The exporters read the cluster, as the truth does (imported here: they import this module's kin).
    from lens_pipeline.sim.exporters import device_truth, overview_truth

    gpu_devices, rdma_devices = device_truth(cluster)
    inputs = cluster.truth_snapshot()
    objects = inputs.objects
    with _without_cyclic_gc():
        allocated: dict[str, int] = {}
        gpu_pods: list[dict[str, Any]] = []
        pod_links: dict[str, _Link] = {}
        # One pod parsed at a time: the truth of 150,000 pods must not hold them all as dicts.
        for entry in objects["pods"]:
            pod = entry.obj
            # The pod's GPUs of every resource of the vendor, each counted as the scheduler counts it.
            resources = _pod_gpu_resources(pod, vendor)
            gpus = sum(pod_gpu_request(pod, name) for name in resources)
            _count_allocation(pod, gpus, allocated)
            if any(pod_uses_gpu(pod, name) for name in resources):
                row = pod_row(pod, gpus)
                gpu_pods.append(row)
                pod_links[row["uid"]] = _link(pod, entry)
        gpu_pods.sort(key=lambda row: (row["namespace"], row["name"]))
        nodes = node_rows([e.obj for e in objects["nodes"]], allocated, inputs.utilization, vendor)
        return {
            "cluster": cluster.name,
            "vendor": cluster.vendor,
            "nodes": nodes,
            "pods": gpu_pods,
            "removed_pods": sorted(inputs.removed_pods),
            "workloads": workload_rows(objects, gpu_pods, pod_links),
            "removed_workloads": sorted(inputs.removed_workloads),
            "storage": storage_rows(
                [e.obj for e in objects["storageclasses"]], [e.obj for e in objects["secrets"]]
            ),
            "gpu_devices": gpu_devices,
            "rdma_devices": rdma_devices,
            "overview": overview_truth(cluster, nodes),
        }


def _driver_version(labels: dict[str, str], vendor: SimVendor) -> str:
    """The node's driver version: the full label, or the older feature discovery's parts joined."""
    if labels.get(vendor.driver_label):
        return labels[vendor.driver_label]
    parts = [labels.get(key, "") for key in vendor.legacy_driver_labels]
    return ".".join(parts) if parts and all(parts) else ""
