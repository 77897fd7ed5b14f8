"""Simulated GPU clusters: the public face of one cluster (reads, mutations, churn, faults, ground
truth inputs), every call under the cluster's lock, and the fleet of clusters one simulator serves."""

from __future__ import annotations

import gc
import hashlib
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from lens_pipeline.sim import catalog
from lens_pipeline.sim.churn import ChurnStep
from lens_pipeline.sim.dialects import SHIPPED, ExporterDialect, dialect_for
from lens_pipeline.sim.faults import FAULT_TARGETS, TargetFaults, malformed_objects
from lens_pipeline.sim.generate import GENERATION_EPOCH, KUBE_VERSION, populate
from lens_pipeline.sim.history import ClusterHistory, NodeFrame, hour_truth, node_frame
from lens_pipeline.sim.kinds import BY_PLURAL
from lens_pipeline.sim.kubeobjects import node_conditions, parse_time, readiness_taints, rfc3339, stable_hash
from lens_pipeline.sim.nics import SimNic
from lens_pipeline.sim.objects import Change, ListSnapshot, StoredObject
from lens_pipeline.sim.state import ClusterState
from lens_pipeline.sim.truth import ACTIVE_PHASES, TruthInputs, cluster_truth, node_ready_status
from lens_pipeline.sim.vendors import VENDORS, GpuProduct
from lens_pipeline.sim.wire import RequestLog
from lens_pipeline.sim.workloads import PHASES, Controllers

__all__ = ["GENERATION_EPOCH", "SimCluster", "SimFleet"]

GPUS_PER_NODE = 8
CPU_NODES = 2
CONTINUE_TTL_SECONDS = 300.0
# Mutations reachable through POST <base>/_control (each is the SimCluster method of that name).
CONTROL_ACTIONS = frozenset(
    {
        "set_node_ready",
        "remove_node",
        "add_gpu_pod",
        "set_pod_phase",
        "remove_pod",
        "inject_raw_node",
        "inject_raw",
        "inject_malformed",
        "set_fault",
        "clear_faults",
        "expire_continue_tokens",
        "expire_next_continue",
        "rotate_token",
        "require_prometheus_headers",
        "forbid",
        "set_gpu_utilization",
        "set_gpu_present",
        "set_nic_present",
        "set_exporter_running",
        "add_taint",
        "remove_taint",
        "cordon",
        "churn",
        "set_watch_history",
    }
)

Sample = tuple[str, dict[str, str], float]
T = TypeVar("T")


class SimCluster:
    """One fake GPU cluster. All state changes go through its methods, under its lock."""

    def __init__(
        self,
        name: str,
        vendor: str,
        nodes: int,
        seed: int,
        pods_per_node: float = 2.0,
        *,
        pods: int | None = None,
        gpus_per_node: int = GPUS_PER_NODE,
        cpu_nodes: int = CPU_NODES,
        continue_ttl: float = CONTINUE_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
        dialect: ExporterDialect = SHIPPED,
        history: bool = False,
        managed_fields: bool = True,
        epoch: float = GENERATION_EPOCH,
        gpu_resource: str | None = None,
    ) -> None:
        """`nodes` GPU nodes and `cpu_nodes` CPU nodes; workloads until there are `pods_per_node`
        workload pods per GPU node, or `pods` pods in all (DaemonSet pods included) when given.
        With `history`, every change is recorded, and Prometheus answers for past times as the
        cluster was then (`lens_pipeline.sim.history`). Without `managed_fields`, objects lack the
        `metadata.managedFields` kube-apiserver writes (`lens_pipeline.sim.managed`). The objects are
        made as they stand at `epoch` (unix seconds; by default a fixed instant, so that a seed gives
        byte-identical objects), each made, started or ended up to weeks or months before it.
        `gpu_resource` is the extended resource its GPUs are advertised and requested as, when not
        the vendor's whole-GPU one: a MIG profile of the `mixed` strategy (`nvidia.com/mig-3g.40gb`),
        AMD partitions (`amd.com/cpx_nps4`), a renamed share (`nvidia.com/gpu.shared`); each unit is
        one device of the node, as the exporters then report them."""
        if vendor not in VENDORS:
            raise ValueError(f"cluster {name!r}: vendor must be one of {sorted(VENDORS)}, got {vendor!r}")
        self.name = name
        self.vendor = vendor
        self.profile = VENDORS[vendor]
        if gpu_resource is not None:
            if not self.profile.counts_as_gpus(gpu_resource):
                raise ValueError(f"cluster {name!r}: {gpu_resource!r} is not a {vendor} GPU resource")
            # Still the vendor's: its whole GPUs and other units count too (an object injected with them).
            self.profile = replace(
                self.profile, resource=gpu_resource, other_units=self.profile.counts_as_gpus
            )
        self.dialect = dialect
        self.seed = seed
        self.gpus_per_node = gpus_per_node
        self.continue_ttl = continue_ttl
        self.kube_version = KUBE_VERSION
        self._token_seed = f"lens-sim:{seed}:{name}"
        # Derived, not random, so a registry written twice for the same fleet is identical.
        self.token = hashlib.sha256(self._token_seed.encode()).hexdigest()[:40]
        self.request_log = RequestLog()
        self._clock = clock
        self._rng = random.Random(seed + stable_hash(name))
        # Churn draws from its own sequence: the same seed replays the same churn whatever else ran.
        self._churn_rng = random.Random(f"{seed}:{name}:churn")
        self._churn_steps = 0
        self._lock = threading.RLock()
        self._state = ClusterState(name, self.profile, clock, dialect, managed_fields)
        self._faults = dict.fromkeys(FAULT_TARGETS, TargetFaults())
        # Header name (lower case) -> the values its Prometheus accepts; empty: open.
        self.prometheus_requires: dict[str, frozenset[str]] = {}
        self.prometheus_client_cn: str | None = None
        self._forbidden: set[str] = set()
        self._gone_next_continue = False
        self._tokens_rotated = 0
        self._memo: dict[str, tuple[int, Any]] = {}
        # Generation allocates millions of acyclic dicts; cyclic GC passes over them cost ~40% of the time.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            populate(
                self._state,
                self._rng,
                gpu_nodes=nodes,
                cpu_nodes=cpu_nodes,
                gpus_per_node=gpus_per_node,
                workload_pods=round(nodes * pods_per_node),
                total_pods=pods,
                epoch=epoch,
            )
        finally:
            if gc_was_enabled:
                gc.enable()
        self.history = ClusterHistory() if history else None
        self._record()
        self._changed = threading.Condition(threading.Lock())
        # What each change of a resource wakes (the watches of that resource, through the server's
        # streaming thread): a thread per watch, each woken by its cluster's changes, took a
        # 100-cluster fleet's thousand watches into a convoy on the cores (docs/BENCHMARKS.md).
        self._subscribers: dict[str, set[Callable[[], None]]] = {}
        self._subscribers_lock = threading.Lock()
        self._state.on_new_version = self._new_version

    def __repr__(self) -> str:
        return (
            f"SimCluster({self.name!r}, vendor={self.vendor!r}, dialect={self.dialect.name!r}, "
            f"nodes={len(self._state.gpus)})"
        )

    # -- reading -------------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    @property
    def resource_version(self) -> int:
        return self._state.resource_version

    def wait_for_change(self, after: int, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a resourceVersion past `after`; whether the cluster's is
        past it."""
        with self._changed:  # a version made after the check notifies only once this waits
            return self._changed.wait_for(lambda: self._state.resource_version > after, max(0.0, timeout))

    def subscribe(self, resource: str, wake: Callable[[], None]) -> Callable[[], None]:
        """Call `wake` at each new resourceVersion taken by a change of `resource` (a plural), from
        the changing thread with the cluster locked (so it must only take note); returns what
        cancels it."""
        with self._subscribers_lock:
            self._subscribers.setdefault(resource, set()).add(wake)

        def cancel() -> None:
            with self._subscribers_lock:
                self._subscribers.get(resource, set()).discard(wake)

        return cancel

    def _new_version(self, resource: str) -> None:
        with self._changed:
            self._changed.notify_all()
        with self._subscribers_lock:
            wakes = tuple(self._subscribers.get(resource, ()))
        for wake in wakes:
            wake()

    def node_names(self) -> list[str]:
        """Names of the simulated GPU nodes, sorted."""
        with self._lock:
            return list(self._state.gpu_node_names())

    def get_object(self, kind: str, key: str) -> StoredObject | None:
        """The stored object of resource `kind` (a plural: "pods") at `key` ("ns/name" or "name")."""
        with self._lock:
            return self._state.get(kind, key)

    def object(self, resource: str, key: str) -> dict[str, Any]:
        """A parsed copy of one object (mutating it does not change the cluster)."""
        with self._lock:
            return self._state.read(resource, key)

    def node(self, name: str) -> dict[str, Any]:
        return self.object("nodes", name)

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.object("pods", f"{namespace}/{name}")

    def node_status(self, name: str) -> str:
        """Ready, NotReady or Unknown, from the node's Ready condition."""
        return node_ready_status(self.node(name))

    def node_address(self, name: str) -> str:
        """InternalIP of a simulated node ("" when unknown), as the exporter's scrape address."""
        with self._lock:
            return self._state.node_ip.get(name, "") if name in self._state.node_index else ""

    def exporter_pod(self, node: str) -> dict[str, str]:
        """The GPU exporter's pod on `node` as a ServiceMonitor labels its target (pod, namespace,
        container); empty when the node runs none."""
        namespace, job = self.profile.exporter_namespace, self.profile.exporter_job
        for key in self.pods_on_node(node):
            pod_namespace, _, name = key.partition("/")
            if pod_namespace == namespace and name.startswith(f"{job}-"):
                return {"pod": name, "namespace": namespace, "container": job}
        return {}

    def free_gpus(self, node: str) -> int:
        """GPUs of `node` no bound, active pod holds."""
        with self._lock:
            return self._state.free_gpus(node)

    def pods_on_node(self, node: str) -> list[str]:
        """`namespace/name` keys of the pods bound to `node`, sorted."""
        with self._lock:
            return sorted(self._state.pods_on_node.get(node, ()))

    def list_snapshot(self, kind: str) -> ListSnapshot:
        with self._lock:
            return self._state.stores[kind].snapshot(
                self._state.resource_version, self.now(), self.continue_ttl
            )

    def changes_since(self, kind: str, resource_version: int) -> tuple[list[Change] | None, int, int]:
        """What a watch of `kind` from `resource_version` sends next: the changes after it (None
        when they are no longer all kept), the oldest version a watch may start at, and the
        cluster's current version (every change of `kind` up to it is in the changes)."""
        with self._lock:
            store = self._state.stores[kind]
            return store.changes_since(resource_version), store.oldest_watchable, self._state.resource_version

    def set_watch_history(self, changes: int) -> None:
        """Keep the last `changes` changes of each kind for watches (kube-apiserver's window)."""
        if changes < 0:
            raise ValueError(f"changes must be >= 0, got {changes}")
        with self._lock:
            for store in self._state.stores.values():
                store.history_limit = changes
                store.trim_history()

    def find_snapshot(self, kind: str, snapshot_id: int) -> ListSnapshot | None:
        with self._lock:
            return self._state.stores[kind].find_snapshot(snapshot_id, self.now(), self.continue_ttl)

    def fault(self, target: str) -> int | None:
        """The HTTP status every request to `target` answers, or None."""
        return self._faults[target].status

    def faults(self, target: str) -> TargetFaults:
        return self._faults[target]

    def forbidden(self, path: str) -> bool:
        """Whether RBAC (as injected with `forbid`) denies `path` below the base URL."""
        return any(path == prefix or path.startswith(prefix.rstrip("/") + "/") for prefix in self._forbidden)

    def take_continue_fault(self) -> bool:
        """True once after `expire_next_continue`: that continued list answers 410."""
        with self._lock:
            gone, self._gone_next_continue = self._gone_next_continue, False
            return gone

    def gpu_utilization_samples(self) -> dict[str, list[float]]:
        """Per-GPU utilization of every node whose exporter is up (a NotReady node's is down);
        a vanished GPU has no sample, nor has a broken counter (NaN, or outside 0-100: no
        percentage at all)."""
        with self._lock:
            state = self._state
            return {
                name: [
                    value
                    for value, present in zip(gpus.utilization, gpus.present, strict=True)
                    if present and 0.0 <= value <= 100.0
                ]
                for name, gpus in state.gpus.items()
                if state.exporter_up(name)
            }

    def gpu_product(self, node: str) -> GpuProduct:
        """The GPU model of a simulated GPU node."""
        with self._lock:
            return self._state.gpus[node].product

    def injected_series(self) -> dict[Any, list[Sample]]:
        """The scrape targets added by `inject_series`, with their samples."""
        with self._lock:
            return dict(self._state.injected_series)

    def nics(self) -> dict[str, list[SimNic]]:
        """RDMA/InfiniBand NICs present on each simulated GPU node (vanished ones left out), whether
        or not the node's exporter is up (`node_status` says)."""
        with self._lock:
            return {
                name: [nic for nic in self._state.nics.get(name, []) if nic.present]
                for name in self._state.gpu_node_names()
            }

    def memo(self, name: str, build: Callable[[], T]) -> T:
        """A value derived from the cluster's state, rebuilt only after the state changed."""
        with self._lock:
            hit = self._memo.get(name)
            if hit is not None and hit[0] == self._state.version:
                return hit[1]
            # A memo (every Prometheus series, say) is hundreds of thousands of acyclic objects that
            # live until the state changes: built without the cyclic GC and frozen out of its sight,
            # as the generated fleet is, or every later request pays for rescanning them.
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                value = build()
            finally:
                if gc_was_enabled:
                    gc.freeze()
                    gc.enable()
            self._memo[name] = (self._state.version, value)
            return value

    def exporter_samples(self, at: float | None = None) -> list[Sample]:
        """(metric, labels, value) of every exporter series, as the per-node exporters expose them,
        now or (with history) at the past time `at`. Shared and cached: callers must not modify it."""
        if at is None or self.history is None:
            return self.memo("exporter_samples", lambda: self._samples(self._current_frames()))
        history = self.history
        with self._lock:
            return history.memo(
                ("samples", history.state_key(at)), lambda: self._samples(history.frames_at(at))
            )

    def exporter_up(self, node: str, at: float | None = None) -> bool:
        """Whether the node's exporters answer (its node is Ready), now or at `at`."""
        if at is None or self.history is None:
            return self.node_status(node) == "Ready"
        with self._lock:
            frame = self.history.frame_at(node, at)
        return frame is not None and frame.up

    def _current_frames(self) -> dict[str, NodeFrame]:
        with self._lock:
            return {name: node_frame(self._state, name) for name in self._state.gpu_node_names()}

    def _samples(self, frames: dict[str, NodeFrame]) -> list[Sample]:
        profile = self.profile
        samples: list[Sample] = []
        for name in sorted(frames):
            frame = frames[name]
            if not frame.up:
                continue
            devices = self.history.devices[name] if self.history is not None else None
            gpus = self._state.gpus.get(name)
            product = devices.product if devices is not None else gpus.product  # type: ignore[union-attr]
            device_list = devices.devices if devices is not None else gpus.devices  # type: ignore[union-attr]
            for device, value, owner, present in zip(
                device_list, frame.utilization, frame.owners, frame.present, strict=True
            ):
                if not present:
                    continue
                labels = profile.device_labels(name, device, product, profile.driver_version)
                if owner is not None:
                    pod_label, namespace_label, container_label = profile.workload_labels
                    labels.update({pod_label: owner[1], namespace_label: owner[0], container_label: owner[2]})
                samples.append((profile.util_metric, labels, value))
        return samples

    def _record(self) -> None:
        """With history: what changed, at the cluster's clock."""
        if self.history is not None:
            with self._lock:
                self.history.record(self._state, self.now())

    def truth_inputs(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, list[float]]]:
        """Simulated (not injected) node objects, pod objects and the utilization samples, taken together."""
        with self._lock:
            objects = self._simulated(("nodes", "pods"))
            samples = self.gpu_utilization_samples()
        return [e.obj for e in objects["nodes"]], [e.obj for e in objects["pods"]], samples

    def simulated_objects(self, resource: str) -> list[StoredObject]:
        """The stored objects of `resource` (a plural) the simulation made (injected ones left out),
        still serialized: an entry's `raw` is the same bytes object until the object changes."""
        with self._lock:
            return self._simulated((resource,))[resource]

    def truth_snapshot(self) -> TruthInputs:
        """Every simulated object (injected ones left out) and the samples, taken together; objects
        stay serialized until the truth reads them, one at a time."""
        with self._lock:
            state = self._state
            return TruthInputs(
                self._simulated(tuple(state.stores)),
                self.gpu_utilization_samples(),
                list(state.removed_pods),
                list(state.removed_workloads),
            )

    def _simulated(self, resources: Sequence[str]) -> dict[str, list[StoredObject]]:
        state = self._state
        out = {}
        for resource in resources:
            snapshot = state.stores[resource].snapshot(state.resource_version, self.now(), self.continue_ttl)
            out[resource] = [e for e in snapshot.entries if (resource, e.key) not in state.raw]
        return out

    def hour_truth(self, start: float, step: float = 30.0, **dimensions: Any) -> dict[str, Any]:
        """The hourly tables' rows for the hour from `start` (unix seconds), from the recorded
        history alone (`lens_pipeline.sim.history.hour_truth` says how)."""
        from lens_pipeline.sim.exporters import pod_gpus

        if self.history is None:
            raise ValueError(f"cluster {self.name}: keeps no history (SimCluster(..., history=True))")
        with self._lock:
            return hour_truth(
                self.history,
                start,
                step,
                lambda t: pod_gpus(self, t)[0],
                lambda t: pod_gpus(self, t)[1],
                **dimensions,
            )

    def truth(self) -> dict[str, Any]:
        """The ground truth served at `<base>/_truth`."""
        return cluster_truth(self)

    def request_count(self, path_prefix: str | None = None) -> int:
        """Requests answered below the base URL whose path starts with `path_prefix` (simulator endpoints excluded)."""
        return self.request_log.count(path_prefix)

    # -- churn ---------------------------------------------------------------------------------

    def churn(self, steps: int = 1) -> dict[str, int]:
        """Advance the cluster `steps` churn steps; returns how many events of each kind happened.
        The events depend only on the seed and the cluster's state; timestamps come from the clock."""
        if steps < 0:
            raise ValueError(f"cluster {self.name}: steps must be >= 0, got {steps}")
        done: Counter[str] = Counter()
        with self._lock:
            for _ in range(steps):
                self._churn_steps += 1
                done += ChurnStep(self, self._state, self._churn_rng, self.now()).run()
                self._record()
        return dict(sorted(done.items()))

    # -- node mutations ------------------------------------------------------------------------

    def set_node_ready(self, name: str, ready: bool | None) -> None:
        """Ready True/False; None means the kubelet stopped reporting (status Unknown)."""
        with self._lock:
            node = self._simulated_node(name)
            now = self.now()
            conditions = node["status"]["conditions"]
            previous = next(c for c in conditions if c["type"] == "Ready")
            wanted = {True: "True", False: "False", None: "Unknown"}[ready]
            transition = now if previous["status"] != wanted else parse_time(previous["lastTransitionTime"])
            node["status"]["conditions"] = node_conditions(ready, now, transition)
            self._set_taints(node, readiness_taints(node["spec"].get("taints", []), ready, now))
            self._state.put("nodes", node)
            self._record()

    def add_taint(self, name: str, key: str, effect: str = "NoSchedule", value: str = "") -> None:
        """Add (or replace) the taint `key` on a node."""
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ValueError(
                f"cluster {self.name}: taint effect must be NoSchedule, PreferNoSchedule or NoExecute"
            )
        with self._lock:
            node = self._simulated_node(name)
            taint: dict[str, Any] = {"key": key, "effect": effect}
            if value:
                taint["value"] = value
            taint["timeAdded"] = rfc3339(self.now())
            taints = [t for t in node["spec"].get("taints", []) if t.get("key") != key]
            self._set_taints(node, [*taints, taint])
            self._state.put("nodes", node)

    def remove_taint(self, name: str, key: str) -> None:
        with self._lock:
            node = self._simulated_node(name)
            self._set_taints(node, [t for t in node["spec"].get("taints", []) if t.get("key") != key])
            self._state.put("nodes", node)

    def cordon(self, name: str, cordoned: bool = True) -> None:
        """`kubectl cordon` / `uncordon`: spec.unschedulable and the taint the node controller adds."""
        with self._lock:
            node = self._simulated_node(name)
            key = "node.kubernetes.io/unschedulable"
            taints = [t for t in node["spec"].get("taints", []) if t.get("key") != key]
            if cordoned:
                node["spec"]["unschedulable"] = True
                taints.append({"key": key, "effect": "NoSchedule", "timeAdded": rfc3339(self.now())})
            else:
                node["spec"].pop("unschedulable", None)
            self._set_taints(node, taints)
            self._state.put("nodes", node)

    def set_gpu_present(self, node: str, gpu: int, present: bool) -> None:
        """A GPU vanishes from (or returns to) a node: capacity and allocatable of the vendor resource
        follow, as the device plugin reports them, and the exporter stops (or resumes) its series.
        Only an idle GPU can vanish, and only while the node has a free one (never over-allocate)."""
        with self._lock:
            state = self._state
            obj = self._simulated_node(node)
            gpus = state.gpus.get(node)
            if gpus is None or not 0 <= gpu < len(gpus.devices):
                raise LookupError(f"cluster {self.name}: node {node} has no GPU {gpu}")
            if gpus.present[gpu] == present:
                return
            if not present and (gpus.owners[gpu] is not None or state.free_gpus(node) < 1):
                raise ValueError(
                    f"cluster {self.name}: GPU {gpu} of {node} is allocated; only an idle GPU can vanish"
                )
            gpus.present[gpu] = present
            count = str(sum(gpus.present))
            for section in ("capacity", "allocatable"):
                obj["status"][section][self.profile.resource] = count
            if "nvidia.com/gpu.count" in obj["metadata"]["labels"]:
                obj["metadata"]["labels"]["nvidia.com/gpu.count"] = count
            state.put("nodes", obj)
            self._record()

    def set_nic_present(self, node: str, device: str, present: bool) -> None:
        """An RDMA NIC vanishes from (or returns to) a node."""
        with self._lock:
            self._simulated_node(node)
            nics = self._state.nics.get(node, [])
            index = next((i for i, nic in enumerate(nics) if nic.device == device), None)
            if index is None:
                raise LookupError(f"cluster {self.name}: node {node} has no NIC {device!r}")
            nics[index] = replace(nics[index], present=present)
            self._state.changed()

    def remove_node(self, name: str) -> None:
        """Delete a node (simulated or injected) and every pod bound to it."""
        with self._lock:
            state = self._state
            if state.get("nodes", name) is None:
                raise LookupError(f"cluster {self.name}: node {name!r} not found")
            controllers = Controllers(state, self._rng)
            owners = set()
            for key in sorted(state.pods_on_node.get(name, ())):
                record = state.pod(key)
                owners.add(record.owner if record else "")
                state.remove("pods", key)
            state.remove("nodes", name)
            for owner in sorted(owners - {""}):
                controllers.refresh(owner, self.now())
            self._record()

    def set_dialect(self, dialect: ExporterDialect) -> None:
        """The cluster's exporters speak `dialect` from now on (an upgrade, a configuration change);
        what they wrote before lingers in Prometheus' name lists for its lookback window. Node
        labels already written (GPU feature discovery's) stay as they are."""
        with self._lock:
            self.dialect = replace(dialect, lingering=replace(self.dialect, lingering=None))
            self._state.dialect = self.dialect
            self._state.changed()

    def exporter_running(self, node: str, job: str) -> bool:
        """Whether `node`'s exporter `job` runs (a NotReady node's does not answer either)."""
        with self._lock:
            return (node, job) not in self._state.exporters_down

    def set_exporter_running(self, node: str, job: str, running: bool) -> None:
        """An exporter (`job`: the GPU exporter's, or node_exporter's) of a Ready node crash-loops
        (`running` False: its target answers no series) or recovers. The devices stay: only their
        series are gone, so the truth leaves them out as it does a NotReady node's."""
        with self._lock:
            self._simulated_node(node)
            if running:
                self._state.exporters_down.discard((node, job))
            else:
                self._state.exporters_down.add((node, job))
            self._state.changed()

    def set_gpu_utilization(self, node: str, gpu: int, value: float) -> None:
        """A GPU's utilization from now on (NaN or infinite too: what a broken exporter reports)."""
        with self._lock:
            self._simulated_node(node)
            value = float(value)
            rounded = round(value, self.profile.util_decimals) if math.isfinite(value) else value
            self._state.gpus[node].utilization[gpu] = rounded
            self._state.changed()
            self._record()

    def inject_series(self, job: str, instance: str, samples: list[Sample], node: str = "") -> None:
        """One more scrape target answering `samples` (metric, labels, value) as its exporter writes
        them: a second exporter, an exporter scraped twice, a node that does not exist. Not part of
        the truth, as injected objects are not."""
        from lens_pipeline.sim.exporters import Target

        with self._lock:
            self._state.injected_series[Target(job, node, instance)] = list(samples)
            self._state.changed()

    # -- pod mutations -------------------------------------------------------------------------

    def add_gpu_pod(self, node: str, gpus: int, phase: str = "Running", namespace: str = "default") -> str:
        """A new Job whose one pod requests `gpus` GPUs, bound to `node`; returns the pod's name.
        Refuses to over-allocate."""
        with self._lock:
            self._simulated_node(node)
            self._check_phase(phase)
            if phase in ACTIVE_PHASES:
                self._check_fits(node, gpus, f"new pod on {node}")
            ctl = Controllers(self._state, self._rng)
            key = catalog.spawn_bound_job(ctl, node, gpus, phase, namespace, self.now())
            self._record()
            return key.split("/", 1)[1]

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> None:
        with self._lock:
            key = f"{namespace}/{name}"
            state = self._state
            record = state.pod(key)
            if record is None:
                raise LookupError(f"cluster {self.name}: pod {key!r} not found")
            self._check_phase(phase)
            if phase in ACTIVE_PHASES and record.phase not in ACTIVE_PHASES and record.node:
                self._check_fits(record.node, record.gpus, f"pod {key}")
            controllers = Controllers(state, self._rng)
            controllers.set_pod_phase(key, phase, self.now())
            controllers.refresh_up([record], self.now())
            self._record()

    def remove_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            key = f"{namespace}/{name}"
            if self._state.pod(key) is None:
                raise LookupError(f"cluster {self.name}: pod {key!r} not found")
            Controllers(self._state, self._rng).delete_pod(key, self.now(), replace=False)
            self._record()

    # -- injected objects ----------------------------------------------------------------------

    def inject_raw_node(self, obj: dict[str, Any]) -> str:
        """Serve `obj` verbatim in the Node list (for malformed-input tests); it is never in the truth.
        Returns the key it is stored and fetched under."""
        return self.inject_raw("nodes", obj)

    def inject_raw(self, resource: str, obj: Any) -> str:
        """Serve `obj` verbatim among the objects of `resource` (a plural: "pods", "replicasets"...);
        it joins no index and never the truth. Returns its store key."""
        if resource not in BY_PLURAL:
            raise ValueError(
                f"cluster {self.name}: unknown resource {resource!r}; known: {sorted(BY_PLURAL)}"
            )
        kind = BY_PLURAL[resource]
        with self._lock:
            metadata = obj.get("metadata") if isinstance(obj, dict) else None
            name = metadata.get("name") if isinstance(metadata, dict) else None
            namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
            if not isinstance(name, str) or not name:
                name = f"zz-unnamed-{self._state.resource_version + 1}"
            if kind.namespaced and not isinstance(namespace, str):
                namespace = "default"
            key = kind.key(namespace, name)
            self._state.put_raw(resource, key, obj)
            return key

    def inject_malformed(self, variants: Sequence[str] | None = None) -> list[str]:
        """Serve malformed or badly owned objects among the good ones (all variants by default; see
        faults.MALFORMED). Returns "resource/key" of each injected object."""
        with self._lock:
            state = self._state
            injected = malformed_objects(state, variants, str(state.next_serial()))
            for resource, key, _ in injected:
                if key in state.stores[resource]:
                    raise ValueError(f"cluster {self.name}: {resource} {key!r} already exists")
            for resource, key, obj in injected:
                state.put_raw(resource, key, obj)
            return [f"{resource}/{key}" for resource, key, _ in injected]

    # -- faults --------------------------------------------------------------------------------

    def set_fault(
        self, target: str, status: int | None = None, *, delay: float = 0.0, connection: str | None = None
    ) -> None:
        """Every request to `target` ("kube" or "prometheus") waits `delay` seconds, then answers
        `status`, or loses its connection ("refuse": closed unanswered, "reset": TCP RST). Replaces
        the target's faults; `set_fault(target)` clears them."""
        if target not in FAULT_TARGETS:
            raise ValueError(
                f"cluster {self.name}: fault target must be one of {FAULT_TARGETS}, got {target!r}"
            )
        try:
            faults = TargetFaults(None if status is None else int(status), float(delay), connection)
        except ValueError as exc:
            raise ValueError(f"cluster {self.name}: {exc}") from None
        with self._lock:
            self._faults[target] = faults

    def clear_faults(self) -> None:
        """Every injected fault off (the token stays as rotated; injected objects stay)."""
        with self._lock:
            self._faults = dict.fromkeys(FAULT_TARGETS, TargetFaults())
            self._forbidden.clear()
            self._gone_next_continue = False

    def expire_continue_tokens(self) -> None:
        """Every continue token issued so far answers 410 Gone, as after an etcd compaction."""
        with self._lock:
            for store in self._state.stores.values():
                store.expire_snapshots()

    def expire_next_continue(self) -> None:
        """The next request that carries a continue token answers 410 Gone (once)."""
        with self._lock:
            self._gone_next_continue = True

    def rotate_token(self) -> str:
        """A new bearer token; the old one answers 401 from now on. Returns the new token (rewrite
        the registry with `write_registry` to hand it to clients)."""
        with self._lock:
            self._tokens_rotated += 1
            seed = f"{self._token_seed}:{self._tokens_rotated}"
            self.token = hashlib.sha256(seed.encode()).hexdigest()[:40]
            return self.token

    def require_prometheus_headers(
        self, headers: Mapping[str, Iterable[str]], client_cn: str | None = None
    ) -> None:
        """Its Prometheus answers 401 unless every request carries each header with one of the given
        values (and, over TLS, a client certificate of common name `client_cn`), as one behind an
        authenticating proxy does: OpenShift's thanos-querier wants a bearer token, vmauth or an
        ingress basic auth or a client certificate, Mimir its X-Scope-OrgID. `({})`: open again."""
        for name, values in headers.items():
            if isinstance(values, str | bytes):
                raise TypeError(f"cluster {self.name}: header {name!r} takes a list of values, not one text")
        with self._lock:
            self.prometheus_requires = {name.lower(): frozenset(values) for name, values in headers.items()}
            self.prometheus_client_cn = client_cn

    def prometheus_allows(self, headers: Mapping[str, str], client_cn: str | None) -> bool:
        """Whether a request with these headers (names in lower case) and client certificate gets
        Prometheus' answers."""
        if self.prometheus_client_cn is not None and client_cn != self.prometheus_client_cn:
            return False
        return all(headers.get(name) in accepted for name, accepted in self.prometheus_requires.items())

    def forbid(self, path: str) -> None:
        """Requests to `path` (below the base URL) or anything under it answer 403 Forbidden."""
        if not path.startswith("/"):
            raise ValueError(f"cluster {self.name}: path must start with '/', got {path!r}")
        with self._lock:
            self._forbidden.add(path)

    # -- internals -----------------------------------------------------------------------------

    def _simulated_node(self, name: str) -> dict[str, Any]:
        state = self._state
        if state.get("nodes", name) is None:
            raise LookupError(f"cluster {self.name}: node {name!r} not found")
        if ("nodes", name) in state.raw:
            raise ValueError(f"cluster {self.name}: node {name!r} was injected raw and cannot be changed")
        return state.read("nodes", name)

    @staticmethod
    def _set_taints(node: dict[str, Any], taints: list[dict[str, Any]]) -> None:
        if taints:
            node["spec"]["taints"] = taints
        else:
            node["spec"].pop("taints", None)

    def _check_phase(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"cluster {self.name}: phase must be one of {PHASES}, got {phase!r}")

    def _check_fits(self, node: str, gpus: int, what: str) -> None:
        state = self._state
        capacity, free = state.allocatable.get(node, 0), state.free_gpus(node)
        if gpus > free:
            raise ValueError(
                f"cluster {self.name}: {what} needs {gpus} GPUs but node {node} has {free} of {capacity} free"
            )


class SimFleet:
    """The clusters one simulator serves, by name."""

    def __init__(self, clusters: Iterable[SimCluster]) -> None:
        self.clusters: list[SimCluster] = list(clusters)
        self._by_name = {cluster.name: cluster for cluster in self.clusters}
        if len(self._by_name) != len(self.clusters):
            raise ValueError("cluster names in a fleet must be unique")

    def __iter__(self) -> Iterator[SimCluster]:
        return iter(self.clusters)

    def __len__(self) -> int:
        return len(self.clusters)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def cluster(self, name: str) -> SimCluster:
        try:
            return self._by_name[name]
        except KeyError:
            raise LookupError(f"no simulated cluster named {name!r}; have {sorted(self._by_name)}") from None

    def churn(self, steps: int = 1) -> dict[str, dict[str, int]]:
        """`steps` churn steps on every cluster; events per cluster."""
        return {cluster.name: cluster.churn(steps) for cluster in self.clusters}

    @classmethod
    def generate(
        cls,
        clusters: int,
        nodes: int | Sequence[int],
        seed: int,
        vendor: str = "mixed",
        pods_per_node: float = 2.0,
        dialect: str = "shipped",
        gpu_resources: Mapping[str, str] | None = None,
        **cluster_options: Any,
    ) -> SimFleet:
        """Clusters `sim-<vendor>-<i>`; "mixed" alternates amd and nvidia starting with amd. `nodes`
        is the GPU node count of every cluster, or a mix taken in turn (10, 100, 10, 100, ...).
        `dialect` names how every cluster's exporters speak, or `mixed`: each in turn (two clusters
        in a row share one, so that a mixed-vendor fleet shows it on both vendors). `gpu_resources`
        maps a vendor to the resource its clusters' GPUs are advertised as (`SimCluster`'s
        `gpu_resource`)."""
        if vendor not in (*VENDORS, "mixed"):
            raise ValueError(f"vendor must be one of {[*VENDORS, 'mixed']}, got {vendor!r}")
        mix = [nodes] if isinstance(nodes, int) else list(nodes)
        if not mix or any(n < 0 for n in mix):
            raise ValueError(f"node counts must be non-negative, got {nodes!r}")
        made = []
        for i in range(clusters):
            cluster_vendor = ("amd", "nvidia")[i % 2] if vendor == "mixed" else vendor
            made.append(
                SimCluster(
                    f"sim-{cluster_vendor}-{i}",
                    cluster_vendor,
                    mix[i % len(mix)],
                    seed,
                    pods_per_node,
                    dialect=dialect_for(dialect, i // 2, seed),
                    gpu_resource=(gpu_resources or {}).get(cluster_vendor),
                    **cluster_options,
                )
            )
        return cls(made)
