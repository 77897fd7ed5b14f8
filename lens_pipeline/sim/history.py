"""A simulated cluster's past, for range queries over past hours and for the hourly truth.

When a cluster keeps history (`SimCluster(..., history=True)`), every change is recorded as it
happens, at the cluster's clock: each GPU node's exporter (up or not; each GPU present or not, who
holds it, its utilization) as a frame whenever it changes, and each GPU pod's life (bound, ended)
and top-level workload. The exporters' samples at any past moment are then a function of time, so
a past hour can be asked again and answers the same. Before the first record the cluster looked as
it did then (nothing moved since its epoch, `lens_pipeline.sim.generate`), except that a GPU was held
only from its pod's binding on.

`hour_truth` computes, from these records alone, what a correct pipeline stores for one hour in
the hourly tables (docs/SIMULATOR.md says the rules).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lens_pipeline.sim.kubeobjects import parse_time, stored_annotations
from lens_pipeline.sim.state import ClusterState, NodeGpus, PodRecord
from lens_pipeline.sim.vendors import GpuDevice, GpuProduct

Owner = tuple[str, str, str] | None  # (namespace, pod, container)
FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodeFrame:
    """One GPU node's exporter at a moment: up (the node Ready), and per GPU present/holder/value."""

    up: bool
    present: tuple[bool, ...]
    owners: tuple[Owner, ...]
    utilization: tuple[float, ...]


@dataclass(frozen=True)
class NodeDevices:
    product: GpuProduct
    devices: tuple[GpuDevice, ...]


def node_frame(state: ClusterState, name: str) -> NodeFrame:
    gpus = state.gpus[name]
    return NodeFrame(
        state.exporter_up(name), tuple(gpus.present), tuple(gpus.owners), tuple(gpus.utilization)
    )


@dataclass
class PodLife:
    """A GPU pod as the scheduler and kubelet told it: bound (PodScheduled) and ended (its grace
    period's end, its containers' finish, or its removal); unix seconds."""

    uid: str
    namespace: str
    name: str
    gpus: int
    workload: str | None  # the top-level workload's uid
    bound_at: float | None = None
    end_at: float | None = None
    seen: tuple[str, str, bool] = ("", "", False)  # (node, phase, deleting) when last looked at

    def holds(self, t: float) -> bool:
        return self.bound_at is not None and self.bound_at <= t and (self.end_at is None or t < self.end_at)


@dataclass(frozen=True)
class WorkloadFacts:
    uid: str
    kind: str
    namespace: str
    name: str
    labels: Mapping[str, Any]
    annotations: Mapping[str, Any]


@dataclass
class ClusterHistory:
    """Frames of every GPU node and the lives of every GPU pod since recording began."""

    times: dict[str, list[float]] = field(default_factory=dict)
    frames: dict[str, list[NodeFrame]] = field(default_factory=dict)
    devices: dict[str, NodeDevices] = field(default_factory=dict)
    pods: dict[str, PodLife] = field(default_factory=dict)
    workloads: dict[str, WorkloadFacts] = field(default_factory=dict)
    changes: list[float] = field(default_factory=list)  # when any frame changed, in order
    # Before the first record: the pods holding GPUs then, by (namespace, name), and the earlier
    # times at which one of them was bound (each starts another state).
    first_holders: dict[tuple[str, str], PodLife] = field(default_factory=dict)
    bound_before: list[float] = field(default_factory=list)
    _memo: dict[Any, Any] = field(default_factory=dict)

    # -- recording ---------------------------------------------------------------------------------

    def record(self, state: ClusterState, t: float) -> None:
        """What changed since the last record, at `t` (calls come in clock order)."""
        changed = False
        for name in state.gpu_node_names():
            gpus: NodeGpus = state.gpus[name]
            self.devices.setdefault(name, NodeDevices(gpus.product, tuple(gpus.devices)))
            changed |= self._put_frame(name, t, node_frame(state, name))
        for name in self.frames.keys() - set(state.gpus):  # removed: its exporter is gone
            last = self.frames[name][-1]
            changed |= self._put_frame(name, t, NodeFrame(False, last.present, last.owners, last.utilization))
        if changed:
            if self.changes and self.changes[-1] == t:
                self._memo.clear()  # the state at t changed again
            else:
                self.changes.append(t)
        self._record_pods(state, t)
        if self.changes == [t]:
            self._first_holders(t)

    def _first_holders(self, first: float) -> None:
        lives = {(life.namespace, life.name): life for life in self.pods.values()}
        held = {owner[:2] for frames in self.frames.values() for owner in frames[0].owners if owner}
        self.first_holders = {key: lives[key] for key in held if key in lives}
        self.bound_before = sorted(
            {
                life.bound_at
                for life in self.first_holders.values()
                if life.bound_at is not None and life.bound_at < first
            }
        )
        self._memo.clear()

    def _put_frame(self, name: str, t: float, frame: NodeFrame) -> bool:
        times, frames = self.times.setdefault(name, []), self.frames.setdefault(name, [])
        if frames and frames[-1] == frame:
            return False
        if times and times[-1] == t:
            frames[-1] = frame
        else:
            times.append(t)
            frames.append(frame)
        return True

    def _record_pods(self, state: ClusterState, t: float) -> None:
        live: set[str] = set()
        for key, record in state.records["pods"].items():
            if not isinstance(record, PodRecord) or not record.uses_gpu or ("pods", key) in state.raw:
                continue
            live.add(record.uid)
            life = self.pods.get(record.uid)
            if life is None:
                namespace, name = key.split("/", 1)
                life = self.pods[record.uid] = PodLife(
                    record.uid, namespace, name, record.gpus, self._top_workload(state, record)
                )
            seen = (record.node, record.phase, record.deleting)
            if seen != life.seen:
                life.seen = seen
                self._update_life(life, state.read("pods", key), t)
        for uid, life in self.pods.items():
            if uid not in live and life.end_at is None and life.seen != ("", "", True):
                life.end_at = t  # removed without having ended first
                life.seen = ("", "", True)

    @staticmethod
    def _update_life(life: PodLife, pod: Mapping[str, Any], t: float) -> None:
        status = pod.get("status") or {}
        if life.bound_at is None and (pod.get("spec") or {}).get("nodeName"):
            scheduled = next(
                (
                    c
                    for c in status.get("conditions") or []
                    if c.get("type") == "PodScheduled" and c.get("status") == "True"
                ),
                None,
            )
            life.bound_at = parse_time(scheduled["lastTransitionTime"]) if scheduled else t
        if life.end_at is not None:
            return
        deletion = (pod.get("metadata") or {}).get("deletionTimestamp")
        if deletion:
            life.end_at = parse_time(deletion)
        elif status.get("phase") in FINISHED:
            finished = [
                parse_time(s["state"]["terminated"]["finishedAt"])
                for s in status.get("containerStatuses") or []
                if "terminated" in (s.get("state") or {})
            ]
            life.end_at = max(finished) if finished else t

    def _top_workload(self, state: ClusterState, pod: PodRecord) -> str | None:
        """The uid of the pod's top-level workload: its controller chain walked up, then the SaFE
        Workload a top carries the label of. None for a pod without owners."""
        current, seen = state.by_uid.get(pod.owner) if pod.owner else None, {pod.uid}
        top = None
        while current is not None and current.uid not in seen:
            seen.add(current.uid)
            top = current
            current = state.by_uid.get(current.owner) if current.owner else None
        if top is None:
            return None
        safe = state.safe_workloads.get(top.safe_id) if top.safe_id else None
        if safe is not None and safe in state.by_uid:
            top = state.by_uid[safe]
        if top.uid not in self.workloads:
            obj = state.read(top.resource, top.key)
            metadata = obj["metadata"]
            safe_workload = obj.get("kind") == "Workload" and obj.get("apiVersion") == "amd.com/v1"
            self.workloads[top.uid] = WorkloadFacts(
                top.uid,
                obj.get("kind", ""),
                (obj.get("spec") or {}).get("workspace", "")
                if safe_workload
                else metadata.get("namespace", ""),
                metadata["name"],
                dict(metadata.get("labels") or {}),
                stored_annotations(metadata),
            )
        return top.uid

    # -- reading -----------------------------------------------------------------------------------

    def state_key(self, t: float) -> int:
        """Which state the cluster was in at `t`: the index of the record in force, or before the
        first record a negative number, one for each set of pods holding GPUs then."""
        if self.changes and t < self.changes[0]:
            return bisect.bisect_right(self.bound_before, t) - len(self.bound_before) - 1
        return max(0, bisect.bisect_right(self.changes, t) - 1)

    def frames_at(self, t: float) -> dict[str, NodeFrame]:
        return {name: self._frame(name, t) for name in self.times}

    def frame_at(self, name: str, t: float) -> NodeFrame | None:
        """The node's exporter at `t` (None for a node never recorded)."""
        return self._frame(name, t) if name in self.times else None

    def _frame(self, name: str, t: float) -> NodeFrame:
        index = bisect.bisect_right(self.times[name], t) - 1
        if index >= 0:
            return self.frames[name][index]
        return self._before_recording(self.frames[name][0], t)

    def _before_recording(self, frame: NodeFrame, t: float) -> NodeFrame:
        """The first frame as it stood at an earlier `t`: a GPU whose pod was not bound yet was
        free, and read 0. (One it holds at the first record it held from its binding on, whatever
        its life says of its end: the exporter showed it there.)"""
        owners, utilization = list(frame.owners), list(frame.utilization)
        for index, owner in enumerate(owners):
            life = self.first_holders.get(owner[:2]) if owner else None
            if life is not None and (life.bound_at is None or t < life.bound_at):
                owners[index], utilization[index] = None, 0.0
        return NodeFrame(frame.up, frame.present, tuple(owners), tuple(utilization))

    def memo(self, key: Any, build: Callable[[], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]


# -- the hourly truth --------------------------------------------------------------------------

SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})


@dataclass(frozen=True)
class GpuSample:
    """One GPU of one pod at a step, as the exporter showed it."""

    utilization: float
    memory_used: float | None
    memory_total: float | None


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between the nearest ranks (Prometheus' quantile_over_time)."""
    ordered = sorted(values)
    h = (len(ordered) - 1) * q
    low = math.floor(h)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (h - low) * (ordered[high] - ordered[low])


def _figures(values: list[float], percentiles: Iterable[str]) -> dict[str, float | None]:
    names = {"avg": None, "min": None, "max": None, **dict.fromkeys(percentiles)}
    if not values:
        return {f"{n}_utilization": None for n in names}
    out = {"avg": sum(values) / len(values), "min": min(values), "max": max(values)}
    out |= {p: quantile(values, int(p[1:]) / 100) for p in percentiles}
    return {f"{n}_utilization": v for n, v in out.items()}


@dataclass
class _Group:
    """A dimension value's steps: GPUs held, utilization sums, workloads, pods, memory."""

    gpus: dict[int, int] = field(default_factory=dict)
    sums: dict[int, float] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    idle: dict[int, int] = field(default_factory=dict)
    workloads: dict[int, set[str]] = field(default_factory=dict)
    pods: dict[int, int] = field(default_factory=dict)
    memory: dict[int, list[tuple[float, float]]] = field(default_factory=dict)

    def add(self, k: int, life: PodLife, gpus: list[GpuSample], idle_below: float) -> None:
        self.gpus[k] = self.gpus.get(k, 0) + life.gpus
        self.pods[k] = self.pods.get(k, 0) + 1
        if life.workload:
            self.workloads.setdefault(k, set()).add(life.workload)
        measured = [g.utilization for g in gpus if g.utilization >= 0]
        if measured:
            self.sums[k] = self.sums.get(k, 0.0) + sum(measured)
            self.counts[k] = self.counts.get(k, 0) + len(measured)
        self.idle[k] = self.idle.get(k, 0) + sum(1 for g in gpus if g.utilization < idle_below)
        memory = [(g.memory_used, g.memory_total) for g in gpus if g.memory_used is not None]
        if memory:
            self.memory.setdefault(k, []).extend(memory)  # type: ignore[arg-type]

    def utilization(self) -> dict[int, float]:
        return {k: self.sums[k] / c for k, c in self.counts.items() if c}


def hour_truth(
    history: ClusterHistory,
    start: float,
    step: float,
    gpus_at: Callable[[float], dict[tuple[str, str], list[GpuSample]]],
    capacity_at: Callable[[float], int],
    *,
    label_keys: tuple[str, ...] = ("app", "team", "env"),
    annotation_keys: tuple[str, ...] = ("project", "cost-center"),
    default_value: str = "unknown",
    idle_below: float = 5.0,
    snapshot_every: int = 10,
) -> dict[str, Any]:
    """The hourly tables' rows for the hour from `start`, at steps of `step` seconds:
    `gpus_at(t)` gives each pod's GPUs as the exporters showed them, `capacity_at(t)` how many GPUs
    they reported. A pod counts at t when it held its GPUs then (bound <= t < end)."""
    n = round(3600 / step)
    cluster, namespaces, workloads = _Group(), dict[str, _Group](), dict[str, _Group]()
    values: dict[tuple[str, str, str], _Group] = {}
    capacity: dict[int, int] = {}
    for k in range(n):
        t = start + k * step
        held = gpus_at(t)
        reported = capacity_at(t)
        if reported:
            capacity[k] = reported
        for life in history.pods.values():
            if not life.holds(t):
                continue
            gpus = held.get((life.namespace, life.name), [])
            cluster.add(k, life, gpus, idle_below)
            if not life.workload:
                continue
            facts = history.workloads[life.workload]
            for kind, keys, source in (
                ("label", label_keys, facts.labels),
                ("annotation", annotation_keys, facts.annotations),
            ):
                for key in keys:
                    value = str(source.get(key) or "")[:255] or default_value
                    values.setdefault((kind, key, value), _Group()).add(k, life, gpus, idle_below)
            if life.namespace in SYSTEM_NAMESPACES:
                continue
            workloads.setdefault(life.workload, _Group()).add(k, life, gpus, idle_below)
        for life in history.pods.values():
            if life.holds(t) and life.namespace not in SYSTEM_NAMESPACES:
                gpus = held.get((life.namespace, life.name), [])
                namespaces.setdefault(life.namespace, _Group()).add(k, life, gpus, idle_below)
    return {
        "cluster": _cluster_truth(cluster, capacity, n),
        "namespaces": {ns: _dimension_truth(g, n) for ns, g in namespaces.items()},
        "labels": {key: _dimension_truth(g, n) for key, g in values.items()},
        "workloads": {
            uid: _workload_truth(history.workloads[uid], g, n, step) for uid, g in workloads.items()
        },
        "snapshots": _snapshot_truth(
            history, cluster, capacity, namespaces, values, workloads, start, step, n, snapshot_every
        ),
    }


def _cluster_truth(group: _Group, capacity: dict[int, int], n: int) -> dict[str, Any]:
    mean_capacity = sum(capacity.values()) / len(capacity) if capacity else None
    allocated = sum(group.gpus.values()) / n
    utilization = list(group.utilization().values())
    return {
        "total_gpu_capacity": mean_capacity,
        "allocated_gpu_count": allocated,
        "allocation_rate": 100 * allocated / mean_capacity if mean_capacity else None,
        **_figures(utilization, ("p50", "p95")),
        "sample_count": len(utilization),
    }


def _dimension_truth(group: _Group, n: int) -> dict[str, Any]:
    utilization = list(group.utilization().values())
    return {
        "allocated_gpu_count": sum(group.gpus.values()) / n,
        "active_workload_count": sum(len(w) for w in group.workloads.values()) / n,
        **_figures(utilization, ()),
        "sample_count": len(utilization),
    }


def _workload_truth(facts: WorkloadFacts, group: _Group, n: int, step: float) -> dict[str, Any]:
    utilization = group.utilization()
    per_step_used = [sum(u for u, _ in m) / len(m) / 1024 for m in group.memory.values()]
    per_step_total = [sum(t for _, t in m) / len(m) / 1024 for m in group.memory.values()]
    replicas = list(group.pods.values())
    return {
        "namespace": facts.namespace,
        "workload_name": facts.name,
        "workload_type": facts.kind,
        "allocated_gpu_count": sum(group.gpus.values()) / n,
        **_figures(list(utilization.values()), ("p50", "p90", "p95")),
        "sample_count": len(utilization),
        "total_sum": sum(utilization.values()),
        "avg_gpu_memory_used": sum(per_step_used) / len(per_step_used) if per_step_used else None,
        "max_gpu_memory_used": max(per_step_used) if per_step_used else None,
        "avg_gpu_memory_total": sum(per_step_total) / len(per_step_total) if per_step_total else None,
        "avg_replica_count": sum(replicas) / len(replicas),
        "max_replica_count": max(replicas),
        "min_replica_count": min(replicas),
        "workload_status": "Running" if n - 1 in group.pods else "Ended",
        "allocated_gpu_seconds": sum(group.gpus.values()) * step,
        "idle_gpu_seconds": sum(group.idle.values()) * step,
        "labels": dict(facts.labels),
        "annotations": dict(facts.annotations),
    }


def _snapshot_truth(
    history: ClusterHistory,
    cluster: _Group,
    capacity: dict[int, int],
    namespaces: dict[str, _Group],
    values: dict[tuple[str, str, str], _Group],
    workloads: dict[str, _Group],
    start: float,
    step: float,
    n: int,
    every: int,
) -> dict[float, dict[str, Any]]:
    def held(group: _Group, k: int, count: bool = True) -> dict[str, Any]:
        u = group.utilization().get(k)
        out = {"allocatedGpu": group.gpus[k], "utilization": u}
        return out | {"workloadCount": len(group.workloads.get(k, ()))} if count else out

    snapshots = {}
    for k in range(0, n, every):
        details = {
            "namespaces": {
                ns: {
                    **held(g, k),
                    "workloads": sorted(
                        (
                            {"uid": uid, "name": f.name, "namespace": f.namespace, "kind": f.kind}
                            | held(workloads[uid], k, False)
                            for uid, f in history.workloads.items()
                            if uid in workloads and k in workloads[uid].gpus and f.namespace == ns
                        ),
                        key=lambda w: w["uid"],
                    ),
                }
                for ns, g in namespaces.items()
                if k in g.gpus
            },
            "labels": {
                f"{key}:{value}": held(g, k)
                for (kind, key, value), g in values.items()
                if kind == "label" and k in g.gpus
            },
            "annotations": {
                f"{key}:{value}": held(g, k)
                for (kind, key, value), g in values.items()
                if kind == "annotation" and k in g.gpus
            },
        }
        snapshots[start + k * step] = {
            "total_gpu_capacity": capacity.get(k, 0),
            "allocated_gpu_count": cluster.gpus.get(k, 0),
            "allocation_details": details,
        }
    return snapshots
