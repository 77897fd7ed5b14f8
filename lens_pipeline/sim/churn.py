"""One churn step of a simulated cluster: pods start, restart, finish, fail, are evicted and reaped;
workloads are scheduled, scaled, created and deleted; nodes go NotReady and come back, are tainted
and cordoned, and lose GPUs and NICs that later return. Every choice comes from the churn RNG."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from lens_pipeline.sim import catalog
from lens_pipeline.sim.catalog import SPAWN_WEIGHTS
from lens_pipeline.sim.state import ClusterState, ObjectRecord, PodRecord
from lens_pipeline.sim.workloads import Controllers

if TYPE_CHECKING:
    from lens_pipeline.sim.fleet import SimCluster

MAINTENANCE_TAINT = "lens.sim/maintenance"
# Kinds whose work runs to completion (finish and fail apply to them).
RUN_TO_COMPLETION = frozenset({"jobs", "cronjobs", "pytorchjobs", "mpijobs", "rayjobs", "workloads"})
WORKLOAD_KINDS = RUN_TO_COMPLETION | {"deployments", "statefulsets", "rayservices", "pods"}
SCALABLE = frozenset({"deployments", "statefulsets"})
# A random pick retries this often before the step gives the event up (a full scan at 150,000 pods
# per event would cost more than the event).
PICKS = 8


def _pick(rng: random.Random, items: list[str], accept: Callable[[str], bool]) -> str | None:
    if not items:
        return None
    for _ in range(PICKS):
        item = items[rng.randrange(len(items))]
        if accept(item):
            return item
    return None


class ChurnStep:
    """The events of one step, applied through the cluster's own methods and controllers."""

    def __init__(self, cluster: SimCluster, state: ClusterState, rng: random.Random, now: float) -> None:
        self.cluster, self.state, self.rng, self.now = cluster, state, rng, now
        self.controllers = Controllers(state, rng, fresh=True)
        self.done: Counter[str] = Counter()
        # Candidate lists, sorted once per step so picks are deterministic; checked again when used.
        self.pods = sorted(state.records["pods"])
        self.tops = sorted(
            uid
            for uid, record in state.by_uid.items()
            if not record.owner and record.resource in WORKLOAD_KINDS and not _safe_linked(state, record)
        )
        self.nodes = state.gpu_node_names()

    def run(self) -> Counter[str]:
        rng, state = self.rng, self.state
        pod_events = max(3, len(self.pods) // 400)
        workload_events = max(2, len(self.tops) // 150)
        node_events = max(2, len(self.nodes) // 100)
        for table, count in (
            (self._pod_events(), pod_events),
            (self._workload_events(), workload_events),
            (self._node_events(), node_events),
        ):
            names, weights = list(table), [weight for _, weight in table.values()]
            for _ in range(count):
                name = rng.choices(names, weights)[0]
                if table[name][0]():
                    self.done[name] += 1
        state.changed()
        return self.done

    # -- pods ----------------------------------------------------------------------------------

    def _pod_events(self) -> dict[str, tuple[Callable[[], bool], int]]:
        return {
            "pod_started": (self._start_bound_pod, 2),
            "container_restarted": (self._restart, 1),
            "pod_evicted": (self._evict, 1),
            "pod_terminating": (self._terminate, 1),
            "pod_removed": (self._reap, 2),
        }

    def _pod_where(self, accept: Callable[[PodRecord], bool]) -> PodRecord | None:
        state = self.state
        key = _pick(self.rng, self.pods, lambda k: (r := state.pod(k)) is not None and accept(r))
        return state.pod(key) if key else None

    def _start_bound_pod(self) -> bool:
        pod = self._pod_where(lambda r: r.phase == "Pending" and bool(r.node) and not r.deleting)
        if pod is None:
            return False
        self.controllers.set_pod_phase(pod.key, "Running", self.now)
        self.controllers.refresh_up([pod], self.now)
        return True

    def _restart(self) -> bool:
        pod = self._pod_where(lambda r: r.phase == "Running" and not r.deleting)
        if pod is None:
            return False
        self.controllers.restart_container(pod.key, self.now)
        return True

    def _controlled(self, record: PodRecord) -> bool:
        owner = self.state.by_uid.get(record.owner)
        return owner is not None and owner.resource in ("replicasets", "statefulsets", "daemonsets")

    def _evict(self) -> bool:
        pod = self._pod_where(lambda r: r.phase == "Running" and not r.deleting and self._controlled(r))
        if pod is None:
            return False
        self.controllers.delete_pod(pod.key, self.now)
        return True

    def _terminate(self) -> bool:
        pod = self._pod_where(lambda r: r.phase == "Running" and not r.deleting and self._controlled(r))
        if pod is None:
            return False
        self.controllers.begin_termination(pod.key, self.now)
        return True

    def _reap(self) -> bool:
        """A terminating pod's grace period ends, or a finished pod's TTL runs out."""
        pod = self._pod_where(lambda r: r.deleting or r.phase in ("Succeeded", "Failed"))
        if pod is None:
            return False
        # A terminating pod's controller makes up its count; a finished one is simply gone.
        self.controllers.delete_pod(pod.key, self.now, replace=pod.deleting)
        return True

    # -- workloads -----------------------------------------------------------------------------

    def _workload_events(self) -> dict[str, tuple[Callable[[], bool], int]]:
        return {
            "workload_scheduled": (self._schedule, 4),
            "workload_finished": (lambda: self._finish(True), 3),
            "workload_failed": (lambda: self._finish(False), 1),
            "workload_scaled": (self._scale, 2),
            "workload_deleted": (self._delete, 2),
            "workload_created": (self._create, 3),
            "cronjob_fired": (self._fire, 1),
        }

    def _top_where(self, accept: Callable[[ObjectRecord], bool]) -> ObjectRecord | None:
        state = self.state
        uid = _pick(self.rng, self.tops, lambda u: (r := state.by_uid.get(u)) is not None and accept(r))
        return state.by_uid.get(uid) if uid else None

    def _schedule(self) -> bool:
        top = self._top_where(
            lambda r: any(p.phase == "Pending" and not p.node for p in self.controllers.pods_of(r.uid))
        )
        return top is not None and self.controllers.start(top.uid, self.now)

    def _finish(self, succeeded: bool) -> bool:
        top = self._top_where(
            lambda r: (
                r.resource in RUN_TO_COMPLETION
                and _dispatches_job(self.state, r)
                and any(
                    p.phase == "Running" and self.controllers.may_end(p)
                    for p in self.controllers.pods_of(r.uid)
                )
            )
        )
        return top is not None and self.controllers.finish(top.uid, self.now, succeeded)

    def _scale(self) -> bool:
        top = self._top_where(lambda r: r.resource in SCALABLE and not r.safe_id)
        if top is None:
            return False
        replicas = self.state.read(top.resource, top.key)["spec"]["replicas"]
        wanted = min(6, max(0, replicas + self.rng.choice((-2, -1, 1, 1, 2))))
        if wanted == replicas:
            return False
        self.controllers.scale(top.uid, wanted, self.now)
        return True

    def _delete(self) -> bool:
        top = self._top_where(lambda r: True)
        return top is not None and self.controllers.delete_tree(top.uid, self.now) > 0

    def _create(self) -> bool:
        rng = self.rng
        if rng.random() < 0.1:
            catalog.spawn_safe_workload(self.controllers, self.now, "Pending", self.state.name)
        else:
            kind = rng.choices(list(SPAWN_WEIGHTS), list(SPAWN_WEIGHTS.values()))[0]
            catalog.spawn(self.controllers, kind, self.now, "Pending")
        return True

    def _fire(self) -> bool:
        top = self._top_where(lambda r: r.resource == "cronjobs")
        return top is not None and catalog.fire_cronjob(self.controllers, top.uid, self.now) is not None

    # -- nodes ---------------------------------------------------------------------------------

    def _node_events(self) -> dict[str, tuple[Callable[[], bool], int]]:
        return {
            "node_not_ready": (self._node_down, 2),
            "node_ready": (self._node_up, 3),
            "taint_added": (lambda: self._taint(True), 1),
            "taint_removed": (lambda: self._taint(False), 1),
            "node_cordoned": (lambda: self._cordon(True), 1),
            "node_uncordoned": (lambda: self._cordon(False), 1),
            "gpu_lost": (self._gpu_lost, 1),
            "gpu_returned": (self._gpu_returned, 2),
            "nic_lost": (self._nic_lost, 1),
            "nic_returned": (self._nic_returned, 2),
        }

    def _node_where(self, accept: Callable[[str], bool]) -> str | None:
        return _pick(self.rng, self.nodes, lambda n: n in self.state.gpus and accept(n))

    def _node_among(self, nodes: Iterable[str]) -> str | None:
        """One of few nodes in a given state (a down node, a missing GPU), picked from all of them."""
        candidates = sorted(n for n in nodes if n in self.state.gpus)
        return self.rng.choice(candidates) if candidates else None

    def _node_down(self) -> bool:
        node = self._node_where(lambda n: n not in self.state.not_ready)
        if node is None:
            return False
        self.cluster.set_node_ready(node, False if self.rng.random() < 0.7 else None)
        return True

    def _node_up(self) -> bool:
        node = self._node_among(self.state.not_ready)
        if node is None:
            return False
        self.cluster.set_node_ready(node, True)
        return True

    def _taint(self, add: bool) -> bool:
        state = self.state
        if add:
            node = self._node_where(lambda n: MAINTENANCE_TAINT not in state.taint_keys.get(n, ()))
        else:
            node = self._node_among(n for n, keys in state.taint_keys.items() if MAINTENANCE_TAINT in keys)
        if node is None:
            return False
        if add:
            self.cluster.add_taint(node, MAINTENANCE_TAINT, "NoSchedule", "true")
        else:
            self.cluster.remove_taint(node, MAINTENANCE_TAINT)
        return True

    def _cordon(self, cordon: bool) -> bool:
        state = self.state
        if cordon:
            node = self._node_where(lambda n: n not in state.cordoned)
        else:
            node = self._node_among(state.cordoned)
        if node is None:
            return False
        self.cluster.cordon(node, cordon)
        return True

    def _gpu_lost(self) -> bool:
        state = self.state
        # Only an idle device can vanish without the node going over its allocatable.
        node = self._node_where(lambda n: state.free_gpus(n) > 0)
        if node is None:
            return False
        gpus = state.gpus[node]
        idle = [i for i, owner in enumerate(gpus.owners) if owner is None and gpus.present[i]]
        if not idle:
            return False
        self.cluster.set_gpu_present(node, self.rng.choice(idle), False)
        return True

    def _gpu_returned(self) -> bool:
        state = self.state
        node = self._node_among(n for n, gpus in state.gpus.items() if not all(gpus.present))
        if node is None:
            return False
        missing = [i for i, present in enumerate(state.gpus[node].present) if not present]
        self.cluster.set_gpu_present(node, self.rng.choice(missing), True)
        return True

    def _nic_lost(self) -> bool:
        state = self.state
        node = self._node_where(lambda n: any(nic.present for nic in state.nics.get(n, ())))
        if node is None:
            return False
        present = [nic.device for nic in state.nics[node] if nic.present]
        self.cluster.set_nic_present(node, self.rng.choice(present), False)
        return True

    def _nic_returned(self) -> bool:
        state = self.state
        node = self._node_among(n for n, nics in state.nics.items() if not all(nic.present for nic in nics))
        if node is None:
            return False
        missing = [nic.device for nic in state.nics[node] if not nic.present]
        self.cluster.set_nic_present(node, self.rng.choice(missing), True)
        return True


def _safe_linked(state: ClusterState, record: ObjectRecord) -> bool:
    """A SaFE Workload's child: churned through the Workload, never on its own."""
    return bool(record.safe_id) and record.safe_id in state.safe_workloads


def _dispatches_job(state: ClusterState, record: ObjectRecord) -> bool:
    if record.resource != "workloads":
        return True
    return any(child.resource == "pytorchjobs" for child in state.linked_children(record.key))
