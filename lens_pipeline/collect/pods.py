"""Pods: which hold GPUs and how many, and the `gpu_pods`, `pod_resource`, `pod_snapshot` and
`gpu_pods_event` rows of a GPU pod (spec §1.7-1.10, §5)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lens_pipeline.collect.objects import KEPT_METADATA, owner_ref, resource_version
from lens_pipeline.collect.problems import MalformedObject, Problem, mapping, object_name, text_without_nul
from lens_pipeline.collect.quantity import INT32_MAX, bounded_count, whole_units
from lens_pipeline.collect.times import parse_time

# Phases in which a bound pod holds its devices, as the scheduler counts them.
HOLDING_PHASES = frozenset({"Pending", "Running"})
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})

Row = dict[str, Any]
_EMPTY: dict = {}  # read only


def container_gpus(container: object, resource: str) -> int:
    """A container's GPU request; extended resources default their request to the limit."""
    if not isinstance(container, dict):
        raise MalformedObject("a container is not an object")
    # Every container of every pod passes here each run: plain dicts skip `mapping`'s checks.
    resources = container.get("resources")
    if resources.__class__ is not dict:
        resources = _EMPTY if resources is None else mapping(container, "resources")
    requests = resources.get("requests")
    if requests.__class__ is not dict:
        requests = _EMPTY if requests is None else mapping(resources, "requests")
    limits = resources.get("limits")
    if limits.__class__ is not dict:
        limits = _EMPTY if limits is None else mapping(resources, "limits")
    value = requests.get(resource, limits.get(resource))
    if value is None:
        return 0
    return whole_units(value, f"container {container.get('name')!r:.60} {resource}", integer=True)


def _containers(spec: dict, field: str) -> list:
    containers = spec.get(field) or []
    if not isinstance(containers, list):
        raise MalformedObject(f"spec.{field} should be a list")
    return containers


def pod_gpus(pod: dict, resource: str) -> int:
    """The GPUs a pod takes: max(sum over containers, largest init container), as the scheduler counts."""
    spec = mapping(pod, "spec")
    app = sum(container_gpus(c, resource) for c in _containers(spec, "containers"))
    init = max((container_gpus(c, resource) for c in _containers(spec, "initContainers")), default=0)
    return bounded_count(max(app, init), f"the pod's {resource} (sum over its containers)")


@dataclass(frozen=True)
class GpuPod:
    """A pod that requests or limits a GPU, cut down to the fields the collectors read."""

    obj: dict
    resource: str
    gpus: int

    @property
    def metadata(self) -> dict:
        return self.obj["metadata"]

    @property
    def uid(self) -> str:
        return self.metadata["uid"]

    @property
    def node_name(self) -> str:
        return self.obj["spec"].get("nodeName") or ""

    @property
    def phase(self) -> str:
        return self.obj["status"].get("phase") or ""

    @property
    def deleting(self) -> bool:
        return bool(self.metadata.get("deletionTimestamp"))

    @property
    def holds_gpus(self) -> bool:
        return self.phase in HOLDING_PHASES and bool(self.node_name)


_KEPT_STATUS = ("phase", "podIP", "conditions", "containerStatuses", "startTime", "reason")


def _slim_container(container: dict) -> dict:
    return {"name": container.get("name"), "resources": container.get("resources") or {}}


# A container's status without its image, image digest, container id and last state: long strings
# that nothing reads, and 150k pods' worth of them.
_KEPT_CONTAINER_STATUS = ("name", "ready", "started", "restartCount", "state")


def _slim_status(status: dict) -> dict:
    kept = {k: status[k] for k in _KEPT_STATUS if k in status}
    containers = kept.get("containerStatuses")
    if isinstance(containers, list):
        kept["containerStatuses"] = [
            {k: c[k] for k in _KEPT_CONTAINER_STATUS if k in c} if isinstance(c, dict) else c
            for c in containers
        ]
    return kept


def project_gpu_pod(pod: object, resources: tuple[str, ...]) -> GpuPod | Problem | None:
    """Cut a Pod down to a `GpuPod` (None when it asks for no GPU of these resources)."""
    try:
        if not isinstance(pod, dict):
            raise MalformedObject("item is not an object")
        metadata = mapping(pod, "metadata", required=True)
        spec = mapping(pod, "spec", required=True)
        status = mapping(pod, "status")
        # A GPU pod asks for more than zero GPUs in a container or init container (requests or limits).
        found = next(((r, n) for r in resources if (n := pod_gpus(pod, r)) > 0), None)
        if found is None:
            return None
        resource, gpus = found
        for field in ("name", "namespace", "uid"):
            if not isinstance(metadata.get(field), str) or not metadata[field]:
                raise MalformedObject(f"missing metadata.{field}")
        # What the rows and tables take as text or as a mapping must be one: a number or a list
        # there would be stored as something it is not (or refused by the database).
        for path, value, kind in (
            ("metadata.name", metadata["name"], str),
            ("metadata.namespace", metadata["namespace"], str),
            ("metadata.uid", metadata["uid"], str),
            ("spec.nodeName", spec.get("nodeName"), str),
            ("status.phase", status.get("phase"), str),
            ("status.podIP", status.get("podIP"), str),
            ("metadata.labels", metadata.get("labels"), dict),
            ("metadata.annotations", metadata.get("annotations"), dict),
        ):
            if value is not None and not isinstance(value, kind):
                raise MalformedObject(f"{path} should be a {'string' if kind is str else 'mapping'}")
            if kind is str and value and "\x00" in value:
                raise MalformedObject(f"{path} contains a NUL character")
        slim = {
            "metadata": {k: metadata[k] for k in KEPT_METADATA if k in metadata},
            "spec": {
                "nodeName": spec.get("nodeName"),
                "containers": [_slim_container(c) for c in _containers(spec, "containers")],
                "initContainers": [_slim_container(c) for c in _containers(spec, "initContainers")],
            },
            "status": _slim_status(status),
        }
        return GpuPod(slim, resource, gpus)
    except MalformedObject as exc:
        return Problem("Pod", object_name(pod), str(exc))


def allocation_by_node(pods: Iterable[GpuPod]) -> dict[tuple[str, str], int]:
    """GPUs held per (node, resource): a node counts only its own vendor's resource."""
    allocated: dict[tuple[str, str], int] = {}
    for pod in pods:
        if pod.holds_gpus:
            key = (pod.node_name, pod.resource)
            allocated[key] = allocated.get(key, 0) + pod.gpus
    return allocated


def owner_uid(metadata: dict) -> str:
    """The controller's uid, else the first owner's, else ''."""
    ref = owner_ref(metadata)
    return ref.uid if ref is not None else ""


def gpu_pod_row(pod: GpuPod) -> Row:
    """`gpu_pods` (spec §1.7); `running` is recomputed from the phase every time (§10.8)."""
    metadata = pod.metadata
    row = {
        "namespace": metadata["namespace"],
        "name": metadata["name"],
        "node_name": pod.node_name,
        "uid": pod.uid,
        "gpu_allocated": pod.gpus,
        "phase": pod.phase,
        "deleted": pod.deleting,
        "running": not pod.deleting and pod.phase == "Running",
        "ip": str(pod.obj["status"].get("podIP") or ""),
        "owner_uid": owner_uid(metadata),
    }
    return text_without_nul(row)


def pod_end_time(pod: GpuPod) -> datetime | None:
    """When the pod stopped holding its GPUs: deletion, or the last container finishing."""
    deletion = parse_time(pod.metadata.get("deletionTimestamp"), "metadata.deletionTimestamp")
    if deletion is not None:
        return deletion
    if pod.phase not in FINISHED_PHASES:
        return None
    finished = []
    for status in pod.obj["status"].get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") if isinstance(status, dict) else None
        if isinstance(terminated, dict):
            finished.append(
                parse_time(terminated.get("finishedAt"), "containerStatuses.state.terminated.finishedAt")
            )
    times = [t for t in finished if t is not None]
    if times:
        return max(times)
    ready = next((c for c in _conditions(pod) if c.get("type") == "Ready"), None)
    return parse_time(ready.get("lastTransitionTime"), "Ready condition time") if ready else None


def pod_bound_time(pod: GpuPod) -> datetime | None:
    """When the pod got its node, and so its GPUs: the PodScheduled condition turning True, else its
    start time; None for a pod never scheduled (it held nothing, however long it waited)."""
    if not pod.node_name:
        return None
    scheduled = next(
        (c for c in _conditions(pod) if c.get("type") == "PodScheduled" and c.get("status") == "True"), None
    )
    if scheduled is not None and scheduled.get("lastTransitionTime"):
        return parse_time(scheduled["lastTransitionTime"], "PodScheduled condition time")
    started = parse_time(pod.obj["status"].get("startTime"), "status.startTime")
    if started is not None:
        return started
    # Bound (a static pod, or a kubelet that reports no conditions yet): from its creation.
    return parse_time(pod.metadata.get("creationTimestamp"), "metadata.creationTimestamp")


def pod_resource_row(pod: GpuPod, gpu_model: str) -> Row:
    """`pod_resource` (spec §1.10): what the pod held, on which GPU model, from when to when. Its
    GPUs are held from `bound_at` (not its creation: a Pending pod holds none) to `end_at`."""
    return {
        "uid": pod.uid,
        "gpu_model": gpu_model,
        "gpu_allocated": pod.gpus,
        "created_at": parse_time(pod.metadata.get("creationTimestamp"), "metadata.creationTimestamp"),
        "bound_at": pod_bound_time(pod),
        "end_at": pod_end_time(pod),
    }


def pod_snapshot_row(pod: GpuPod) -> Row:
    """`pod_snapshot` (spec §1.9) of the pod as listed."""
    return {
        "pod_uid": pod.uid,
        "pod_name": pod.metadata["name"],
        "namespace": pod.metadata["namespace"],
        "spec": pod.obj["spec"],
        "metadata": pod.metadata,
        "status": pod.obj["status"],
        "resource_version": resource_version(pod.metadata),
    }


def _conditions(pod: GpuPod) -> list[dict]:
    conditions = pod.obj["status"].get("conditions") or []
    if not isinstance(conditions, list):
        raise MalformedObject("status.conditions should be a list")
    return [c for c in conditions if isinstance(c, dict)]


def condition_events(pod: GpuPod) -> list[Row]:
    """`gpu_pods_event` rows: each condition that is True, at its real transition time (the original
    wrote the zero time). Keyed by (pod, type, time), so a condition seen again adds nothing."""
    statuses = pod.obj["status"].get("containerStatuses") or []
    first = statuses[0] if statuses and isinstance(statuses[0], dict) else {}
    restarts = first.get("restartCount", 0)
    if not isinstance(restarts, int) or isinstance(restarts, bool):
        restarts = 0  # unreadable: not worth the pod's events
    bounded_count(restarts, "containerStatuses[0].restartCount", INT32_MAX)
    events = []
    for condition in _conditions(pod):
        if condition.get("status") != "True" or not condition.get("type"):
            continue
        when = parse_time(
            condition.get("lastTransitionTime"), f"condition {condition['type']} lastTransitionTime"
        )
        if when is None:
            continue
        events.append(
            {
                "pod_uuid": pod.uid,
                "pod_phase": pod.phase,
                "event_type": str(condition["type"]),
                "created_at": when,
                "restart_count": restarts,
            }
        )
    return events
