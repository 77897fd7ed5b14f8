"""The objects of one simulated cluster and the indices derived from them at every write (owner
tree, pods per node, allocated GPUs, device holders), which the scheduler and controllers read."""

from __future__ import annotations

import contextlib
import random
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lens_pipeline.sim.dialects import SHIPPED, ExporterDialect
from lens_pipeline.sim.kinds import BY_PLURAL, KINDS
from lens_pipeline.sim.managed import managed_fields
from lens_pipeline.sim.nics import SimNic
from lens_pipeline.sim.objects import ObjectStore, StoredObject, to_json
from lens_pipeline.sim.truth import (
    ACTIVE_PHASES,
    container_gpu_request,
    controller_uid,
    node_ready_status,
    pod_gpu_request,
    pod_uses_gpu,
)
from lens_pipeline.sim.vendors import GpuDevice, GpuProduct, SimVendor

SAFE_WORKLOAD_LABEL = "primus-safe.workload.id"
# Written once or read back by the scheduler while generating: serialized straight away.
_NEVER_STAGED = frozenset({"nodes", "pods", "namespaces", "secrets", "storageclasses"})


@dataclass
class NodeGpus:
    """Per-GPU state of one simulated GPU node."""

    product: GpuProduct
    devices: list[GpuDevice]
    utilization: list[float]
    # (namespace, pod, container) of the running container holding each device, or None.
    owners: list[tuple[str, str, str] | None]
    # False while the device has vanished from the node (capacity and exporter drop it).
    present: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.present:
            self.present = [True] * len(self.devices)


@dataclass(slots=True)
class ObjectRecord:
    """What the simulator's controllers need to know of one object, derived from its JSON."""

    resource: str
    key: str
    uid: str
    owner: str  # uid of the controller ownerReference (else the first), "" at the top of a chain
    safe_id: str  # label primus-safe.workload.id of an object at the top of its chain, else ""


@dataclass(slots=True)
class PodRecord(ObjectRecord):
    node: str
    phase: str
    gpus: int  # effective request: max(sum of containers, largest init container)
    uses_gpu: bool  # requests or limits the vendor resource anywhere
    deleting: bool

    @property
    def holds(self) -> int:
        """GPUs the scheduler counts against the node (bound and Pending/Running)."""
        return self.gpus if self.node and self.phase in ACTIVE_PHASES else 0


class ClusterState:
    """Every object of one cluster by kind, plus derived indices. Not thread-safe: SimCluster locks."""

    def __init__(
        self,
        name: str,
        profile: SimVendor,
        clock: Callable[[], float],
        dialect: ExporterDialect = SHIPPED,
        managed_fields: bool = True,
    ) -> None:
        self.name = name
        # Each stored object carries `metadata.managedFields`, as kube-apiserver writes them.
        self.managed_fields = managed_fields
        self.profile = profile
        self.dialect = dialect
        # Scrape targets added by hand (sim.exporters.Target -> samples), beside the simulated ones.
        self.injected_series: dict[Any, list[tuple[str, dict[str, str], float]]] = {}
        # (node, job) of exporters that crash-loop on a node that is itself Ready: no series.
        self.exporters_down: set[tuple[str, str]] = set()
        self.resource = profile.resource
        self.clock = clock
        self.stores = {kind.plural: ObjectStore(kind.plural) for kind in KINDS}
        self.resource_version = 0
        # Called at each new resourceVersion with the resource it is of (the cluster wakes the
        # watches of that resource); none while populated.
        self.on_new_version: Callable[[str], None] | None = None
        self.version = 0  # bumps on every change, including samples, to invalidate cached series
        self.raw: set[tuple[str, str]] = set()
        self.records: dict[str, dict[str, ObjectRecord]] = {kind.plural: {} for kind in KINDS}
        self.by_uid: dict[str, ObjectRecord] = {}
        self.children: dict[str, set[str]] = {}
        self.safe_workloads: dict[str, str] = {}  # SaFE Workload name -> uid
        self.safe_children: dict[str, set[str]] = {}  # SaFE Workload name -> uids of labelled top objects
        self.gpu_ancestors: set[str] = set()  # uids that ever had a GPU pod below them
        self.removed_pods: list[str] = []
        self.removed_workloads: list[str] = []
        self.gpus: dict[str, NodeGpus] = {}
        self.nics: dict[str, list[SimNic]] = {}
        self.node_index: dict[str, int] = {}
        self.node_ip: dict[str, str] = {}
        self.allocatable: dict[str, int] = {}
        self.allocated: dict[str, int] = {}
        self.pods_on_node: dict[str, set[str]] = {}
        self.pod_ip_serial: dict[str, int] = {}
        self.serial = 0
        self._staged: dict[tuple[str, str], dict[str, Any]] | None = None
        self._gpu_nodes_sorted: list[str] | None = None
        self._schedulable: set[str] = set()
        self._schedulable_sorted: list[str] | None = None
        # What node churn looks for, kept as nodes are written instead of re-read from their JSON.
        self.not_ready: set[str] = set()
        self.cordoned: set[str] = set()
        self.taint_keys: dict[str, frozenset[str]] = {}

    # -- reading -------------------------------------------------------------------------------

    def get(self, resource: str, key: str) -> StoredObject | None:
        return self.stores[resource].get(key)

    def read(self, resource: str, key: str) -> dict[str, Any]:
        """A parsed copy of the object (while staged: the staged dict itself)."""
        if self._staged is not None and (resource, key) in self._staged:
            return self._staged[(resource, key)]
        entry = self.stores[resource].get(key)
        if entry is None:
            raise LookupError(f"cluster {self.name}: {BY_PLURAL[resource].kind} {key!r} not found")
        return entry.obj

    @contextlib.contextmanager
    def staging(self) -> Iterator[None]:
        """Inside, workload objects (not nodes or pods) are kept as dicts and serialized once at the
        end: generation writes each one twice (created, then its status) and would pay a parse and
        two serializations for it. Nothing may list or GET them meanwhile."""
        self._staged = {}
        try:
            yield
        finally:
            staged, self._staged = self._staged, None
            for (resource, key), obj in staged.items():
                self.stores[resource].put(key, self._serialized(resource, obj))
            for resource in {resource for resource, _ in staged}:
                self.stores[resource].forget_history(self.resource_version)

    def record(self, resource: str, key: str) -> ObjectRecord | None:
        return self.records[resource].get(key)

    def pod(self, key: str) -> PodRecord | None:
        return self.records["pods"].get(key)  # type: ignore[return-value]

    def child_records(self, uid: str) -> list[ObjectRecord]:
        """Direct children through ownerReferences, in key order (deterministic)."""
        found = [self.by_uid[child] for child in self.children.get(uid, ())]
        return sorted(found, key=lambda r: (r.resource, r.key))

    def linked_children(self, workload_name: str) -> list[ObjectRecord]:
        """Top-level objects labelled `primus-safe.workload.id=<name>`: a SaFE Workload's children."""
        found = [self.by_uid[uid] for uid in self.safe_children.get(workload_name, ())]
        return sorted(found, key=lambda r: (r.resource, r.key))

    def descendants(self, uid: str) -> list[ObjectRecord]:
        """Everything below `uid` through ownerReferences, deepest first (the order to delete in)."""
        out: list[ObjectRecord] = []
        # Sorted: set order changes with PYTHONHASHSEED, and deletion order decides resourceVersions.
        stack = [(child, False) for child in sorted(self.children.get(uid, ()))]
        seen: set[str] = set()
        while stack:
            current, expanded = stack.pop()
            if expanded:
                out.append(self.by_uid[current])
                continue
            if current in seen or current not in self.by_uid:
                continue
            seen.add(current)
            stack.append((current, True))
            stack.extend((child, False) for child in sorted(self.children.get(current, ())))
        return out

    def exporter_up(self, node: str) -> bool:
        """Whether `node`'s GPU exporter is scraped: it runs on the node, so it is down with it,
        and on its own when it crash-loops."""
        entry = self.stores["nodes"].get(node)
        if entry is None or node not in self.gpus or (node, self.profile.exporter_job) in self.exporters_down:
            return False
        return node_ready_status(entry.obj) == "Ready"

    def free_gpus(self, node: str) -> int:
        return self.allocatable.get(node, 0) - self.allocated.get(node, 0)

    def schedulable_nodes(self) -> list[str]:
        if self._schedulable_sorted is None:
            self._schedulable_sorted = sorted(self._schedulable)
        return self._schedulable_sorted

    def place(self, rng: random.Random, demands: list[int], tries: int = 12) -> list[str] | None:
        """Nodes for a gang of pods needing `demands` GPUs each, all or none, as a gang scheduler
        would (probing random nodes, so a full cluster answers quickly with None)."""
        if not demands:
            return []
        nodes = self.schedulable_nodes()
        if not nodes:
            return None
        taken: dict[str, int] = {}
        chosen = []
        for gpus in demands:
            for _ in range(tries):
                node = nodes[rng.randrange(len(nodes))]
                if self.free_gpus(node) - taken.get(node, 0) >= gpus:
                    break
            else:
                return None
            taken[node] = taken.get(node, 0) + gpus
            chosen.append(node)
        return chosen

    # -- writing -------------------------------------------------------------------------------

    def next_serial(self) -> int:
        """A number for the next workload name, unique in this cluster."""
        self.serial += 1
        return self.serial

    def gpu_node_names(self) -> list[str]:
        if self._gpu_nodes_sorted is None:
            self._gpu_nodes_sorted = sorted(self.gpus)
        return self._gpu_nodes_sorted

    def next_resource_version(self, resource: str) -> str:
        """The next resourceVersion, taken by a change of `resource` (a plural: "pods")."""
        self.resource_version += 1
        self.version += 1
        if self.on_new_version is not None:
            self.on_new_version(resource)
        return str(self.resource_version)

    def changed(self) -> None:
        self.version += 1

    def put(self, resource: str, obj: dict[str, Any]) -> ObjectRecord:
        """Create or replace a simulated object: new resourceVersion, serialized, indices updated."""
        kind = BY_PLURAL[resource]
        metadata = obj["metadata"]
        key = kind.key(metadata.get("namespace"), metadata["name"])
        if (resource, key) in self.raw:
            raise ValueError(
                f"cluster {self.name}: {kind.kind} {key!r} was injected raw and cannot be changed"
            )
        old = self.records[resource].get(key)
        if old is not None and old.uid != metadata["uid"]:
            # A new object under an old name (a StatefulSet pod) is a delete and a create.
            self.remove(resource, key)
            old = None
        metadata["resourceVersion"] = self.next_resource_version(resource)
        if resource == "pods":
            record: ObjectRecord = self._pod_record(key, obj)
        else:
            record = ObjectRecord(resource, key, metadata["uid"], controller_uid(obj), "")
            if not record.owner and resource != "workloads":
                record.safe_id = (metadata.get("labels") or {}).get(SAFE_WORKLOAD_LABEL, "")
        if self._staged is not None and resource not in _NEVER_STAGED:
            self._staged[(resource, key)] = obj
        else:
            self.stores[resource].put(key, self._serialized(resource, obj), self.resource_version)
        if old is not None:
            self.children.get(old.owner, set()).discard(old.uid)
            self.safe_children.get(old.safe_id, set()).discard(old.uid)
        self.records[resource][key] = record
        self.by_uid[record.uid] = record
        if record.owner:
            self.children.setdefault(record.owner, set()).add(record.uid)
        if record.safe_id and resource != "pods":
            self.safe_children.setdefault(record.safe_id, set()).add(record.uid)
        if resource == "nodes":
            self._index_node(key, obj)
        elif resource == "workloads":
            self.safe_workloads[metadata["name"]] = record.uid
        elif isinstance(record, PodRecord):
            self._index_pod(old, record, obj)  # type: ignore[arg-type]
        return record

    def _serialized(self, resource: str, obj: dict[str, Any]) -> bytes:
        """The object as served: with its managedFields, which are built for the bytes alone (kept
        on 100,000 staged objects, their dicts would take a gigabyte)."""
        if not self.managed_fields:
            return to_json(obj)
        kind = BY_PLURAL[resource]
        api_version = f"{kind.group}/{kind.version}" if kind.group else kind.version
        metadata = {**obj["metadata"], "managedFields": managed_fields(kind.kind, api_version, obj)}
        return to_json({**obj, "metadata": metadata})

    def put_raw(self, resource: str, key: str, obj: Any) -> None:
        """Serve `obj` verbatim (malformed-input tests); it joins no index and never the truth."""
        if key in self.stores[resource]:
            raise ValueError(f"cluster {self.name}: {BY_PLURAL[resource].kind} {key!r} already exists")
        self.next_resource_version(resource)
        self.stores[resource].put(key, to_json(obj), self.resource_version)
        self.raw.add((resource, key))

    def remove(self, resource: str, key: str) -> None:
        # Recorded at the version the removal takes (next_resource_version, below).
        entry = self.stores[resource].remove(key, self.resource_version + 1)
        if self._staged is not None and self._staged.pop((resource, key), None) is not None:
            entry = StoredObject(key, b"")
        if entry is None:
            return
        self.next_resource_version(resource)
        if (resource, key) in self.raw:
            self.raw.discard((resource, key))
            return
        record = self.records[resource].pop(key)
        self.by_uid.pop(record.uid, None)
        self.children.get(record.owner, set()).discard(record.uid)
        self.safe_children.get(record.safe_id, set()).discard(record.uid)
        if not self.children.get(record.uid):
            self.children.pop(record.uid, None)
        if isinstance(record, PodRecord):
            self._unindex_pod(record)
            if record.uses_gpu:
                self.removed_pods.append(record.uid)
        elif record.uid in self.gpu_ancestors:
            self.removed_workloads.append(record.uid)
        if resource == "nodes":
            self._unindex_node(key)
        elif resource == "workloads":
            self.safe_workloads.pop(key, None)

    def pod_ip(self, node: str) -> str:
        """The next address of the node's pod CIDR (wrapping after 250, as IPAM reuses freed ones)."""
        index = self.node_index.get(node, 0)
        serial = self.pod_ip_serial[node] = self.pod_ip_serial.get(node, 0) + 1
        return f"10.{128 + (index >> 8) % 128}.{index & 255}.{2 + (serial - 1) % 250}"

    # -- indices -------------------------------------------------------------------------------

    def _pod_record(self, key: str, pod: dict[str, Any]) -> PodRecord:
        metadata, spec = pod["metadata"], pod["spec"]
        owner = controller_uid(pod)
        return PodRecord(
            "pods",
            key,
            metadata["uid"],
            owner,
            "" if owner else (metadata.get("labels") or {}).get(SAFE_WORKLOAD_LABEL, ""),
            spec.get("nodeName") or "",
            pod["status"].get("phase", ""),
            pod_gpu_request(pod, self.resource),
            pod_uses_gpu(pod, self.resource),
            "deletionTimestamp" in metadata,
        )

    def _index_pod(self, old: PodRecord | None, new: PodRecord, pod: dict[str, Any]) -> None:
        if old is not None:
            self._unindex_pod(old, keep_devices=old.node == new.node and new.phase == "Running")
        if new.node:
            self.pods_on_node.setdefault(new.node, set()).add(new.key)
            self.allocated[new.node] = self.allocated.get(new.node, 0) + new.holds
        if new.phase == "Running" and not (
            old is not None and old.node == new.node and old.phase == "Running"
        ):
            self._assign_devices(new, pod)
        if old is None and new.uses_gpu:
            self._mark_gpu_ancestors(new)

    def _unindex_pod(self, record: PodRecord, keep_devices: bool = False) -> None:
        if record.node:
            self.pods_on_node.get(record.node, set()).discard(record.key)
            self.allocated[record.node] = self.allocated.get(record.node, 0) - record.holds
        if record.phase == "Running" and not keep_devices:
            self._release_devices(record)

    def _mark_gpu_ancestors(self, pod: PodRecord) -> None:
        current: ObjectRecord | None = pod
        seen: set[str] = set()
        while current is not None and current.uid not in seen:
            seen.add(current.uid)
            if current is not pod:
                self.gpu_ancestors.add(current.uid)
            if not current.owner and current.safe_id in self.safe_workloads:
                self.gpu_ancestors.add(self.safe_workloads[current.safe_id])
            current = self.by_uid.get(current.owner) if current.owner else None

    def _index_node(self, name: str, node: dict[str, Any]) -> None:
        self._schedulable_sorted = None
        self._gpu_nodes_sorted = None
        if self._is_schedulable(node):
            self._schedulable.add(name)
        else:
            self._schedulable.discard(name)
        spec = node.get("spec") or {}
        for index, present in (
            (self.not_ready, node_ready_status(node) != "Ready"),
            (self.cordoned, bool(spec.get("unschedulable"))),
        ):
            if present:
                index.add(name)
            else:
                index.discard(name)
        self.taint_keys[name] = frozenset(t.get("key", "") for t in spec.get("taints") or [])
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        self.allocatable[name] = int(allocatable.get(self.resource, 0))
        addresses = node["status"].get("addresses", [])
        self.node_ip[name] = next((a["address"] for a in addresses if a["type"] == "InternalIP"), "")

    def _unindex_node(self, name: str) -> None:
        self.not_ready.discard(name)
        self.cordoned.discard(name)
        self.taint_keys.pop(name, None)
        self._schedulable.discard(name)
        self._schedulable_sorted = None
        self._gpu_nodes_sorted = None
        for index in (self.allocatable, self.allocated, self.node_ip, self.node_index, self.gpus, self.nics):
            index.pop(name, None)  # type: ignore[attr-defined]

    def _is_schedulable(self, node: dict[str, Any]) -> bool:
        spec = node.get("spec") or {}
        if spec.get("unschedulable") or node_ready_status(node) != "Ready":
            return False
        # GPU pods tolerate the vendor's NoSchedule taint (their toleration is for NoSchedule); every
        # other NoSchedule/NoExecute taint keeps them off.
        return not any(
            taint.get("effect") in ("NoSchedule", "NoExecute")
            and not (taint.get("effect") == "NoSchedule" and taint.get("key") == self.profile.taint_key)
            for taint in spec.get("taints") or []
        )

    def _assign_devices(self, record: PodRecord, pod: dict[str, Any]) -> None:
        """Give each container of a running pod the lowest free devices, as the device plugin does."""
        gpus = self.gpus.get(record.node)
        if gpus is None:
            return
        namespace, name = record.key.split("/", 1)
        free = [i for i, owner in enumerate(gpus.owners) if owner is None and gpus.present[i]]
        decimals = self.profile.util_decimals
        # One pod in six holds its GPUs without using them (allocated but idle, under 3.3 %).
        idle = zlib.crc32(record.uid.encode()) % 6 == 0
        for container in pod["spec"].get("containers") or []:
            wanted = container_gpu_request(container, self.resource)
            for index in free[:wanted]:
                gpus.owners[index] = (namespace, name, container["name"])
                gpus.utilization[index] = round(_utilization(record.uid, index, idle), decimals)
            free = free[wanted:]
        self.changed()

    def idle_devices(self, key: str) -> None:
        """The GPUs a running pod holds are no longer used (its work ended, the pod lives on)."""
        record = self.pod(key)
        held = self._held_devices(record) if record is not None else None
        if record is None or held is None:
            return
        gpus, indices = held
        for index in indices:
            gpus.utilization[index] = round(_utilization(record.uid, index, True), self.profile.util_decimals)
        self.changed()

    def _release_devices(self, record: PodRecord) -> None:
        held = self._held_devices(record)
        if held is None:
            return
        gpus, indices = held
        for index in indices:
            gpus.owners[index] = None
            gpus.utilization[index] = 0.0
        self.changed()

    def _held_devices(self, record: PodRecord) -> tuple[NodeGpus, list[int]] | None:
        """The devices of the pod's node and the indices of those it holds; None off a GPU node."""
        gpus = self.gpus.get(record.node)
        if gpus is None:
            return None
        namespace, name = record.key.split("/", 1)
        return gpus, [
            i for i, owner in enumerate(gpus.owners) if owner is not None and owner[:2] == (namespace, name)
        ]


def _utilization(uid: str, index: int, idle: bool) -> float:
    """A held GPU's utilization: under 3.3 % when idle, else 35-100 %. Drawn from the pod and the
    device, not an RNG, so churn order cannot shift other values."""
    spread = zlib.crc32(f"{uid}/{index}".encode()) % 6501
    return spread / 2000 if idle else 35.0 + spread / 100
