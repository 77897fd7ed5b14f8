"""Pods: which hold GPUs and how many, and the `gpu_pods`, `pod_resource`, `pod_snapshot` and
`gpu_pods_event` rows of a GPU pod (spec §1.7-1.10, §5)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from lens_pipeline.collect.objects import KEPT_METADATA, OwnerRef, owner_ref, resource_version
from lens_pipeline.collect.owners import SAFE_WORKLOAD_LABEL
from lens_pipeline.collect.problems import MalformedObject, Problem, mapping, object_name, text_without_nul
from lens_pipeline.collect.quantity import INT32_MAX, bounded_count, whole_units
from lens_pipeline.collect.times import parse_time
from lens_pipeline.vendors import GpuResources

# Phases in which a bound pod holds its devices, as the scheduler counts them.
HOLDING_PHASES = frozenset({"Pending", "Running"})
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})

Row = dict[str, Any]
_EMPTY: dict = {}  # read only
_UNSEEN = object()


def container_gpus(container: object, resources: GpuResources, vendor: str) -> dict[str, int]:
    """A container's requests of `vendor`'s GPU resources (usually one: `amd.com/gpu`, or MIG
    instances of several profiles); extended resources default their request to the limit."""
    if not isinstance(container, dict):
        raise MalformedObject("a container is not an object")
    # Every container of every pod passes here each run: plain dicts skip `mapping`'s checks.
    requested = container.get("resources")
    if requested.__class__ is not dict:
        requested = _EMPTY if requested is None else mapping(container, "resources")
    requests = requested.get("requests")
    if requests.__class__ is not dict:
        requests = _EMPTY if requests is None else mapping(requested, "requests")
    limits = requested.get("limits")
    if limits.__class__ is not dict:
        limits = _EMPTY if limits is None else mapping(requested, "limits")
    found: dict[str, int] = {}
    known = resources.known
    for quantities in (requests, limits):
        for resource in quantities:
            whose = known.get(resource, _UNSEEN)
            if whose is _UNSEEN:
                whose = resources.vendor_of(resource)
            if whose == vendor and resource not in found:
                value = requests.get(resource, limits.get(resource))
                if value is None:  # a null quantity (the API server serves none): no GPU, as before
                    continue
                found[resource] = whole_units(
                    value, f"container {container.get('name')!r:.60} {resource}", integer=True
                )
    return found


def _containers(spec: dict, field: str) -> list:
    containers = spec.get(field) or []
    if not isinstance(containers, list):
        raise MalformedObject(f"spec.{field} should be a list")
    return containers


def pod_gpus(pod: dict, resources: GpuResources, vendor: str) -> int:
    """The GPUs of `vendor` a pod takes: per resource, max(sum over containers, largest init
    container), as the scheduler counts; summed over the vendor's resources (a pod may hold MIG
    instances of two profiles), one GPU per unit."""
    spec = mapping(pod, "spec")
    app: dict[str, int] = {}
    for container in _containers(spec, "containers"):
        for resource, count in container_gpus(container, resources, vendor).items():
            app[resource] = app.get(resource, 0) + count
    init: dict[str, int] = {}
    for container in _containers(spec, "initContainers"):
        for resource, count in container_gpus(container, resources, vendor).items():
            init[resource] = max(init.get(resource, 0), count)
    if not init:  # nearly every pod: no init container asks for a GPU
        if not app:
            return 0
        if len(app) == 1:
            ((resource, count),) = app.items()
            return bounded_count(count, f"the pod's {resource} (sum over its containers)")
    total = 0
    for resource in app.keys() | init.keys():
        total += bounded_count(
            max(app.get(resource, 0), init.get(resource, 0)),
            f"the pod's {resource} (sum over its containers)",
        )
    return bounded_count(total, f"the pod's {vendor} GPUs (sum over its GPU resources)")


def held_gpus(pod: dict, resources: GpuResources) -> tuple[str, int] | None:
    """(vendor, GPUs) of the first of the cluster's vendors whose GPUs the pod takes, or None."""
    for profile in resources.profiles:
        gpus = pod_gpus(pod, resources, profile.name)
        if gpus > 0:
            return profile.name, gpus
    return None


class GpuPod:
    """A pod that requests or limits a GPU: what the collectors read of it, a few dozen bytes, and
    the object cut down to what its rows need (`obj`) while they are to be built.

    `obj` is None for a pod listed unchanged since its rows were stored (the same uid at the same
    resourceVersion: nothing of it to build again), and once `gpu_pods` has written it."""

    __slots__ = (
        "deleting",
        "gpus",
        "ip",
        "name",
        "namespace",
        "node_name",
        "obj",
        "owner",
        "owner_problem",
        "phase",
        "safe_workload",
        "uid",
        "vendor",
    )

    def __init__(
        self, metadata: dict, spec: dict, status: dict, vendor: str, gpus: int, obj: dict | None
    ) -> None:
        self.uid: str = metadata["uid"]
        self.namespace: str = metadata["namespace"]
        self.name: str = metadata["name"]
        self.node_name: str = spec.get("nodeName") or ""
        self.phase: str = status.get("phase") or ""
        self.ip: str = str(status.get("podIP") or "")
        self.deleting = bool(metadata.get("deletionTimestamp"))
        self.vendor, self.gpus = vendor, gpus
        self.owner: OwnerRef | None = None
        self.owner_problem: str | None = None
        try:
            self.owner = owner_ref(metadata)
        except MalformedObject as exc:
            self.owner_problem = str(exc)
        labels = metadata.get("labels")
        found = labels.get(SAFE_WORKLOAD_LABEL) if isinstance(labels, dict) else None
        self.safe_workload: str = found if isinstance(found, str) else ""
        self.obj = obj

    @property
    def holds_gpus(self) -> bool:
        return self.phase in HOLDING_PHASES and bool(self.node_name)

    @property
    def running(self) -> bool:
        return not self.deleting and self.phase == "Running"

    def kept(self) -> dict:
        """The object as cut down at list time (only a pod whose rows are to be built has it)."""
        if self.obj is None:
            raise RuntimeError(f"pod {self.namespace}/{self.name}: its object was not kept")
        return self.obj


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


def project_gpu_pod(
    pod: object, resources: GpuResources, known: Mapping[str, tuple[str, int]] | None = None
) -> GpuPod | Problem | None:
    """Cut a Pod down to a `GpuPod` (None when it asks for no GPU of these resources).

    `known` maps the uid of each pod whose rows are stored to the resourceVersion they were built
    from and the GPUs they say it holds. Kubernetes gives an object a new resourceVersion at every
    change, so a pod listed at that same version is that same object: it costs the comparison of
    one string, and keeps no `obj`."""
    if known and pod.__class__ is dict:
        metadata = pod.get("metadata")  # type: ignore[union-attr]
        uid = metadata.get("uid") if metadata.__class__ is dict else None
        stored = known.get(uid) if uid.__class__ is str else None  # type: ignore[arg-type]
        if stored is not None and stored[0] == metadata.get("resourceVersion"):  # type: ignore[union-attr]
            try:
                return _unchanged_pod(pod, metadata, resources, stored[1])  # type: ignore[arg-type]
            except (MalformedObject, KeyError, AttributeError):
                pass  # not what was stored after all: read as any other
    try:
        return _project(pod, resources)
    except MalformedObject as exc:
        return Problem("Pod", object_name(pod), str(exc))


def _unchanged_pod(pod: dict, metadata: dict, resources: GpuResources, gpus: int) -> GpuPod | None:
    if len(resources.profiles) == 1:  # the one vendor's GPUs, as many as when its rows were built
        found: tuple[str, int] | None = (resources.profiles[0].name, gpus)
    else:
        found = held_gpus(pod, resources)
    if found is None:
        return None
    return GpuPod(metadata, pod["spec"], pod.get("status") or {}, found[0], found[1], None)


def _project(pod: object, resources: GpuResources) -> GpuPod | None:
    if not isinstance(pod, dict):
        raise MalformedObject("item is not an object")
    metadata = mapping(pod, "metadata", required=True)
    spec = mapping(pod, "spec", required=True)
    status = mapping(pod, "status")
    # A GPU pod asks for more than zero GPUs in a container or init container (requests or limits).
    found = held_gpus(pod, resources)
    if found is None:
        return None
    vendor, gpus = found
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
    slim = _slim(metadata, spec, status)
    return GpuPod(slim["metadata"], slim["spec"], slim["status"], vendor, gpus, slim)


def _slim(metadata: dict, spec: dict, status: dict) -> dict:
    return {
        "metadata": {k: metadata[k] for k in KEPT_METADATA if k in metadata},
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": [_slim_container(c) for c in _containers(spec, "containers")],
            "initContainers": [_slim_container(c) for c in _containers(spec, "initContainers")],
        },
        "status": _slim_status(status),
    }


def slim_pod(pod: Any) -> Any:
    """A pod cut down to what `project_gpu_pod` reads of it, for a watch cache to keep and serve:
    `project_gpu_pod` of it gives what `project_gpu_pod` of the whole pod gives, for any resource.
    (Extend the two together.) A pod with anything this cannot cut without changing that answer (a
    field of the wrong type, which the whole pod would be reported for) is kept whole."""
    if pod.__class__ is not dict:
        return pod
    metadata, spec, status = pod.get("metadata"), pod.get("spec"), pod.get("status")
    if metadata.__class__ is not dict or spec.__class__ is not dict:
        return pod
    if status is not None and status.__class__ is not dict:
        return pod
    if metadata.get("annotations") is not None and metadata["annotations"].__class__ is not dict:
        return pod  # checked by the projection, and not kept
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        if containers is None:
            continue
        if containers.__class__ is not list:
            return pod
        for container in containers:
            if container.__class__ is not dict:
                return pod
            resources = container.get("resources")
            if resources is not None and resources.__class__ is not dict:
                return pod
    return _slim(metadata, spec, status or {})


def allocation_by_node(pods: Iterable[GpuPod]) -> dict[tuple[str, str], int]:
    """GPUs held per (node, vendor): a node counts only its own vendor's GPUs."""
    allocated: dict[tuple[str, str], int] = {}
    for pod in pods:
        if pod.holds_gpus:
            key = (pod.node_name, pod.vendor)
            allocated[key] = allocated.get(key, 0) + pod.gpus
    return allocated


def gpu_pod_row(pod: GpuPod) -> Row:
    """`gpu_pods` (spec §1.7); `running` is recomputed from the phase every time (§10.8)."""
    if pod.owner_problem is not None:
        raise MalformedObject(pod.owner_problem)
    row = {
        "namespace": pod.namespace,
        "name": pod.name,
        "node_name": pod.node_name,
        "uid": pod.uid,
        "gpu_allocated": pod.gpus,
        "phase": pod.phase,
        "deleted": pod.deleting,
        "running": pod.running,
        "ip": pod.ip,
        # The controller's uid, else the first owner's, else ''.
        "owner_uid": pod.owner.uid if pod.owner is not None else "",
    }
    return text_without_nul(row)


def pod_end_time(pod: GpuPod) -> datetime | None:
    """When the pod stopped holding its GPUs: deletion, or the last container finishing."""
    obj = pod.kept()
    deletion = parse_time(obj["metadata"].get("deletionTimestamp"), "metadata.deletionTimestamp")
    if deletion is not None:
        return deletion
    if pod.phase not in FINISHED_PHASES:
        return None
    finished = []
    for status in obj["status"].get("containerStatuses") or []:
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
    obj = pod.kept()
    started = parse_time(obj["status"].get("startTime"), "status.startTime")
    if started is not None:
        return started
    # Bound (a static pod, or a kubelet that reports no conditions yet): from its creation.
    return parse_time(obj["metadata"].get("creationTimestamp"), "metadata.creationTimestamp")


def pod_resource_row(pod: GpuPod, gpu_model: str) -> Row:
    """`pod_resource` (spec §1.10): what the pod held, on which GPU model, from when to when. Its
    GPUs are held from `bound_at` (not its creation: a Pending pod holds none) to `end_at`."""
    return {
        "uid": pod.uid,
        "gpu_model": gpu_model,
        "gpu_allocated": pod.gpus,
        "created_at": parse_time(
            pod.kept()["metadata"].get("creationTimestamp"), "metadata.creationTimestamp"
        ),
        "bound_at": pod_bound_time(pod),
        "end_at": pod_end_time(pod),
    }


def pod_snapshot_row(pod: GpuPod) -> Row:
    """`pod_snapshot` (spec §1.9) of the pod as listed."""
    obj = pod.kept()
    return {
        "pod_uid": pod.uid,
        "pod_name": pod.name,
        "namespace": pod.namespace,
        "spec": obj["spec"],
        "metadata": obj["metadata"],
        "status": obj["status"],
        "resource_version": resource_version(obj["metadata"]),
    }


def _conditions(pod: GpuPod) -> list[dict]:
    conditions = pod.kept()["status"].get("conditions") or []
    if not isinstance(conditions, list):
        raise MalformedObject("status.conditions should be a list")
    return [c for c in conditions if isinstance(c, dict)]


def condition_events(pod: GpuPod) -> list[Row]:
    """`gpu_pods_event` rows: each condition that is True, at its real transition time (the original
    wrote the zero time). Keyed by (pod, type, time), so a condition seen again adds nothing."""
    statuses = pod.kept()["status"].get("containerStatuses") or []
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
