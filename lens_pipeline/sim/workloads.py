"""The simulated cluster's controllers at work: pods created and named as controllers do, placed by
a gang scheduler, started, finished, failed, scaled, evicted and deleted, with every status above
a changed pod recomputed. What each kind of workload looks like is in catalog.py."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from lens_pipeline.sim.controllers import STATUS, StatusInput
from lens_pipeline.sim.kubeobjects import (
    ContainerPlan,
    Owner,
    new_uid,
    parse_time,
    pod_object,
    pod_status,
    rfc3339,
    suffix,
)
from lens_pipeline.sim.state import ClusterState, ObjectRecord, PodRecord

PHASES = ("Pending", "Running", "Succeeded", "Failed")


@dataclass(frozen=True)
class PodPlan:
    """One pod a controller is about to create."""

    name: str
    labels: dict[str, str]
    owner: Owner | None
    containers: tuple[ContainerPlan, ...]
    restart_policy: str
    init_gpus: int = 0
    generate_name: str | None = None
    node: str | None = None  # a DaemonSet's pod is bound to its node from the start
    volumes: tuple[dict[str, Any], ...] = ()

    @property
    def gpus(self) -> int:
        return max(sum(c.gpus for c in self.containers), self.init_gpus)


@dataclass
class Timeline:
    """When a unit of work was created, started, and last changed (finished, for finished ones)."""

    created: float
    started: float
    changed: float


@dataclass
class Spawned:
    """The top object of a new workload and the outcome its pods were given."""

    uid: str
    outcome: str
    pods: list[str] = field(default_factory=list)


class Controllers:
    """Creates and changes workloads in one ClusterState, drawing every choice from `rng`."""

    def __init__(self, state: ClusterState, rng: random.Random, fresh: bool = False) -> None:
        self.state = state
        self.rng = rng
        self.profile = state.profile
        # Fresh workloads (churn) are created now; generated ones have a history behind them.
        self.fresh = fresh
        # uid -> latest `now` of the statuses waiting for deferred_status() to end.
        self._deferred: dict[str, float] | None = None
        # Rare shapes a generated cluster shows at least once, however small, so tests and demos meet them.
        self._unshown = set() if fresh else {"gpus-in-limits-only", "gpu-init-container", "terminating-pod"}

    def _first(self, shape: str) -> bool:
        if shape in self._unshown:
            self._unshown.discard(shape)
            return True
        return False

    @contextlib.contextmanager
    def deferred_status(self) -> Iterator[None]:
        """Compute each touched object's status once, when the block ends (generation would
        otherwise recompute a CronJob's or a SaFE Workload's status once per child)."""
        self._deferred = {}
        try:
            yield
        finally:
            deferred, self._deferred = self._deferred, None
            depth: dict[str, int] = {}
            for uid in sorted(deferred, key=lambda u: (-self._depth(u, depth), u)):
                record = self.state.by_uid.get(uid)
                if record is not None and record.resource != "pods":
                    self._refresh_one(record, deferred[uid])

    def _depth(self, uid: str, memo: dict[str, int]) -> int:
        """How far below the top of its chain (SaFE's label link included) an object sits."""
        if uid not in memo:
            record = self.state.by_uid.get(uid)
            above = self._above(record) if record is not None else ""
            memo[uid] = 0  # a cycle stops here
            memo[uid] = 1 + self._depth(above, memo) if above else 0
        return memo[uid]

    def _above(self, record: ObjectRecord) -> str:
        if record.owner:
            return record.owner
        if record.resource != "pods":
            return self.state.safe_workloads.get(record.safe_id, "")
        return ""

    # -- naming --------------------------------------------------------------------------------

    def workload_name(self, bases: Sequence[str]) -> str:
        return f"{self.rng.choice(bases)}-{self.state.next_serial():04d}"

    def pod_name(self, namespace: str, prefix: str) -> str:
        while True:
            name = f"{prefix}{suffix(self.rng)}"
            if f"{namespace}/{name}" not in self.state.stores["pods"]:
                return name

    def containers(self, main: str, gpus: int) -> tuple[ContainerPlan, ...]:
        rng = self.rng
        limits_only = gpus > 0 and (self._first("gpus-in-limits-only") or rng.random() < 0.05)
        containers = [ContainerPlan(main, gpus, limits_only)]
        if gpus >= 2 and rng.random() < 0.1:
            containers = [
                ContainerPlan(main, gpus // 2, limits_only),
                ContainerPlan(f"{main}-2", gpus - gpus // 2),
            ]
        if rng.random() < 0.2:
            containers.append(ContainerPlan("log-shipper"))
        return tuple(containers)

    def init_gpus(self, gpus: int) -> int:
        # A few pods check their devices in an init container that takes more GPUs than the app.
        if not gpus or gpus >= 8:
            return 0
        return self.rng.choice((4, 8)) if self._first("gpu-init-container") or self.rng.random() < 0.05 else 0

    def timeline(self, now: float, outcome: str, max_age: float = 14 * 86400) -> Timeline:
        rng = self.rng
        created = now if self.fresh else now - rng.uniform(60, max_age)
        started = min(created + rng.uniform(1, 60), now)
        if outcome == "Pending":
            changed = started
        elif outcome == "Running":
            changed = min(started + rng.uniform(5, 120), now)
        else:
            changed = min(started + rng.uniform(60, 6 * 3600), now)
        return Timeline(created, started, changed)

    # -- pods ----------------------------------------------------------------------------------

    def create_pods(
        self,
        namespace: str,
        plans: Sequence[PodPlan],
        outcome: str,
        timeline: Timeline,
        image: str,
        terminating_share: float = 0.0,
    ) -> tuple[str, list[str]]:
        """Create the pods of one unit of work (a gang: placed all together or not at all); returns
        the outcome they got and their keys. Running falls back when the cluster has no room: to
        Pending, or (as if it ran earlier) to Succeeded or Failed for pods that may end."""
        rng, state = self.rng, self.state
        nodes: list[str | None]
        if outcome == "Running":
            floating = [plan for plan in plans if plan.node is None]
            placed = state.place(rng, [plan.gpus for plan in floating])
            if placed is None:
                outcome = rng.choices(("Pending", "Succeeded", "Failed"), weights=(10, 75, 15))[0]
                if any(plan.restart_policy == "Always" for plan in plans):
                    # The kubelet restarts such a pod's containers whatever their exit: it never
                    # ends Succeeded or Failed, and without room it waits to be scheduled.
                    outcome = "Pending"
                timeline = Timeline(
                    timeline.created, timeline.started, max(timeline.changed, timeline.started + 60)
                )
            else:
                found = iter(placed)
                nodes = [plan.node or next(found) for plan in plans]
        if outcome == "Pending":
            nodes = [plan.node for plan in plans]
        elif outcome in ("Succeeded", "Failed"):
            # Finished pods keep the node they ran on; they no longer count against it.
            gpu_nodes = state.gpu_node_names()
            any_nodes = state.schedulable_nodes() or gpu_nodes
            nodes = [
                plan.node
                or (rng.choice(gpu_nodes if plan.gpus and gpu_nodes else any_nodes) if any_nodes else None)
                for plan in plans
            ]
            if None in nodes:
                outcome, nodes = "Pending", [plan.node for plan in plans]
        keys = []
        for index, (plan, node) in enumerate(zip(plans, nodes, strict=True)):
            if outcome == "Failed":
                phase = "Failed" if index == 0 or rng.random() < 0.5 else "Succeeded"
            else:
                phase = outcome
            terminating = terminating_share > 0 and (
                self._first("terminating-pod") or rng.random() < terminating_share
            )
            deleting = timeline.changed + 20 if phase == "Running" and terminating else None
            keys.append(self.put_pod(namespace, plan, phase, node, timeline, image, deleting))
        return outcome, keys

    def put_pod(
        self,
        namespace: str,
        plan: PodPlan,
        phase: str,
        node: str | None,
        timeline: Timeline,
        image: str,
        deleting_at: float | None,
    ) -> str:
        state = self.state
        restarts = (
            {c.name: self.rng.choice((0, 0, 0, 0, 1, 2)) for c in plan.containers}
            if phase != "Pending"
            else {}
        )
        pod = pod_object(
            name=plan.name,
            namespace=namespace,
            uid=new_uid(self.rng),
            created=timeline.created,
            labels=dict(plan.labels),
            owner=plan.owner,
            containers=plan.containers,
            init_gpus=plan.init_gpus,
            image=image,
            vendor=self.profile,
            restart_policy=plan.restart_policy,
            node=node,
            host_ip=state.node_ip.get(node or "", ""),
            phase=phase,
            started=timeline.started,
            changed=timeline.changed,
            pod_ip=state.pod_ip(node) if node and phase != "Pending" else "",
            restarts=restarts,
            deleting_at=deleting_at,
            volumes=plan.volumes,
            generate_name=plan.generate_name,
        )
        state.put("pods", pod)
        return f"{namespace}/{plan.name}"

    def set_pod_phase(self, key: str, phase: str, now: float, node: str | None = None) -> None:
        """Move a pod to `phase` at `now` (binding it to `node` first when given), as kubelet reports."""
        state = self.state
        pod = state.read("pods", key)
        if node is not None:
            pod["spec"]["nodeName"] = node
        bound = pod["spec"].get("nodeName") or ""
        if phase != "Pending" and not bound:
            raise ValueError(
                f"cluster {state.name}: pod {key} is not bound to a node, it can only be Pending"
            )
        status = pod["status"]
        created = parse_time(pod["metadata"]["creationTimestamp"])
        started = parse_time(status["startTime"]) if "startTime" in status else now
        restarts = {s["name"]: s.get("restartCount", 0) for s in status.get("containerStatuses", [])}
        pod_ip = status.get("podIP") or (state.pod_ip(bound) if bound and phase != "Pending" else "")
        pod["status"] = pod_status(
            phase, pod["spec"], created, started, now, pod_ip, state.node_ip.get(bound, ""), restarts
        )
        state.put("pods", pod)

    # -- status --------------------------------------------------------------------------------

    def refresh(self, uid: str, now: float) -> None:
        """Recompute the status of `uid` and of every object above it (SaFE's label link included)."""
        state = self.state
        seen: set[str] = set()
        while uid and uid not in seen:
            seen.add(uid)
            record = state.by_uid.get(uid)
            if record is None:
                return
            if record.resource != "pods":
                self._refresh_one(record, now)
            uid = self._above(record)

    def refresh_tree(self, uid: str, now: float) -> None:
        """Recompute every status in the tree below `uid` (deepest first), then above it."""
        for record in self.state.descendants(uid):
            if record.resource != "pods":
                self._refresh_one(record, now)
        self.refresh(uid, now)

    def _refresh_one(self, record: ObjectRecord, now: float) -> None:
        if self._deferred is not None:
            self._deferred[record.uid] = max(now, self._deferred.get(record.uid, now))
            return
        state = self.state
        obj = state.read(record.resource, record.key)
        compute = STATUS.get(obj["kind"])
        if compute is None:
            return
        if record.resource == "workloads":
            tops = state.linked_children(obj["metadata"]["name"])
            below = [d for top in tops for d in (top, *state.descendants(top.uid))]
        else:
            tops = [r for r in state.child_records(record.uid) if r.resource != "pods"]
            below = state.descendants(record.uid)
        pods = [r for r in below if isinstance(r, PodRecord)]
        children = [state.read(r.resource, r.key) for r in tops]
        status = compute(StatusInput(obj, pods, children, now))
        if status != obj.get("status"):
            obj["status"] = status
            state.put(record.resource, obj)

    def statefulset_pod(self, sts: dict[str, Any], index: int) -> PodPlan:
        metadata = sts["metadata"]
        name = f"{metadata['name']}-{index}"
        revision = f"{metadata['name']}-{metadata['uid'][:10].replace('-', '')}"
        labels = {
            **sts["spec"]["template"]["metadata"]["labels"],
            "apps.kubernetes.io/pod-index": str(index),
            "controller-revision-hash": revision,
            "statefulset.kubernetes.io/pod-name": name,
        }
        containers = tuple(
            ContainerPlan(c["name"], int(c["resources"]["limits"].get(self.profile.resource, 0)))
            for c in sts["spec"]["template"]["spec"]["containers"]
        )
        owner = Owner("StatefulSet", "apps/v1", metadata["name"], metadata["uid"])
        return PodPlan(name, labels, owner, containers, "Always")

    # -- changes -------------------------------------------------------------------------------

    def start(self, uid: str, now: float) -> bool:
        """Schedule and start the unbound Pending pods below `uid`, all or none."""
        state = self.state
        pending = [r for r in self.pods_of(uid) if r.phase == "Pending" and not r.node and not r.deleting]
        if not pending:
            return False
        nodes = state.place(self.rng, [r.gpus for r in pending])
        if nodes is None:
            return False
        for record, node in zip(pending, nodes, strict=True):
            self.set_pod_phase(record.key, "Running", now, node)
        self.refresh_up(pending, now)
        return True

    def finish(self, uid: str, now: float, succeeded: bool) -> bool:
        """Run-to-completion work ends: its active pods succeed, or the first fails and takes the rest.
        Pods that restart Always (a RayJob's cluster, kept after its job) run on, their GPUs idle."""
        pods, kept = [], []
        for record in self.pods_of(uid):
            if record.phase in ("Running", "Pending") and record.node:
                (pods if self.may_end(record) else kept).append(record)
        if not pods:
            return False
        for index, record in enumerate(pods):
            self.set_pod_phase(record.key, "Succeeded" if succeeded or index else "Failed", now)
        for record in kept:
            if record.phase == "Running":
                self.state.idle_devices(record.key)
        for record in [r for r in self.pods_of(uid) if r.phase == "Pending" and not r.node]:
            self.state.remove("pods", record.key)  # never scheduled: the operator deletes them
        self.refresh_up(pods, now)
        return True

    def may_end(self, record: PodRecord) -> bool:
        """Whether the pod can end Succeeded or Failed: not when it restarts Always."""
        return self.state.read("pods", record.key)["spec"].get("restartPolicy") != "Always"

    def pods_of(self, uid: str) -> list[PodRecord]:
        state = self.state
        record = state.by_uid.get(uid)
        if record is None:
            return []
        if isinstance(record, PodRecord):
            return [record]
        tops = state.linked_children(record.key) if record.resource == "workloads" else [record]
        below = [d for top in tops for d in state.descendants(top.uid)]
        return sorted((r for r in below if isinstance(r, PodRecord)), key=lambda r: r.key)

    def refresh_up(self, pods: Sequence[PodRecord], now: float) -> None:
        for owner in sorted({p.owner for p in pods if p.owner}):
            self.refresh(owner, now)

    def restart_container(self, key: str, now: float) -> None:
        pod = self.state.read("pods", key)
        statuses = pod["status"].get("containerStatuses") or []
        if not statuses:
            return
        statuses[0]["restartCount"] = statuses[0].get("restartCount", 0) + 1
        at = rfc3339(now)
        statuses[0]["lastState"] = {
            "terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": at, "finishedAt": at}
        }
        if "running" in statuses[0]["state"]:
            statuses[0]["state"] = {"running": {"startedAt": at}}
        self.state.put("pods", pod)

    def begin_termination(self, key: str, now: float) -> None:
        """Graceful deletion starts (the pod stays, terminating, until `delete_pod`); a ReplicaSet
        counts only live pods, so it creates the replacement right away."""
        state = self.state
        pod = state.read("pods", key)
        pod["metadata"]["deletionTimestamp"] = rfc3339(now + 30)
        pod["metadata"]["deletionGracePeriodSeconds"] = 30
        record = state.put("pods", pod)
        owner = state.by_uid.get(record.owner)
        if owner is not None and owner.resource == "replicasets":
            self._replace(owner, key.split("/", 1)[0], "", now)
        self.refresh_up([record], now)  # type: ignore[list-item]

    def delete_pod(self, key: str, now: float, replace: bool = True) -> str | None:
        """Delete a pod; with `replace`, the StatefulSet or DaemonSet above it (or a ReplicaSet, when
        the pod was not already terminating) creates its replacement. Returns the replacement's key."""
        state = self.state
        record = state.pod(key)
        if record is None:
            return None
        owner = state.by_uid.get(record.owner)
        state.remove("pods", key)
        replacement = None
        replaced_already = record.deleting and owner is not None and owner.resource == "replicasets"
        if (
            replace
            and not replaced_already
            and owner is not None
            and owner.resource in ("replicasets", "statefulsets", "daemonsets")
        ):
            ordinal = int(key.rsplit("-", 1)[1]) if owner.resource == "statefulsets" else 0
            replacement = self._replace(owner, key.split("/", 1)[0], record.node, now, ordinal)
        if owner is not None:
            self.refresh(owner.uid, now)
        return replacement

    def _replace(self, owner: ObjectRecord, namespace: str, node: str, now: float, index: int = 0) -> str:
        """The pod a ReplicaSet, StatefulSet (ordinal `index`) or DaemonSet (on `node`) creates to
        make up its count; Pending until the scheduler or kubelet gets to it."""
        obj = self.state.read(owner.resource, owner.key)
        template = obj["spec"]["template"]
        if owner.resource == "statefulsets":
            plan = self.statefulset_pod(obj, index)
        else:
            labels = dict(template["metadata"]["labels"])
            if owner.resource == "daemonsets":
                labels.update(controller_revision_hash_of(self.state, owner.uid))
            containers = tuple(
                ContainerPlan(c["name"], int(c["resources"]["limits"].get(self.profile.resource, 0)))
                for c in template["spec"]["containers"]
            )
            prefix = f"{obj['metadata']['name']}-"
            reference = Owner(obj["kind"], obj["apiVersion"], obj["metadata"]["name"], obj["metadata"]["uid"])
            plan = PodPlan(
                self.pod_name(namespace, prefix),
                labels,
                reference,
                containers,
                "Always",
                generate_name=prefix,
                node=node if owner.resource == "daemonsets" else None,
            )
        image = template["spec"]["containers"][0]["image"]
        _, keys = self.create_pods(namespace, [plan], "Pending", Timeline(now, now, now), image)
        return keys[0]

    def scale(self, uid: str, replicas: int, now: float) -> None:
        """Scale a Deployment (through its newest ReplicaSet) or a StatefulSet to `replicas`."""
        state = self.state
        record = state.by_uid[uid]
        obj = state.read(record.resource, record.key)
        obj["spec"]["replicas"] = replicas
        obj["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        state.put(record.resource, obj)
        target = record
        if record.resource == "deployments":
            sets = [
                state.read("replicasets", r.key)
                for r in state.child_records(uid)
                if r.resource == "replicasets"
            ]
            rs = max(
                sets, key=lambda s: int(s["metadata"]["annotations"]["deployment.kubernetes.io/revision"])
            )
            rs["spec"]["replicas"] = replicas
            rs["metadata"]["annotations"]["deployment.kubernetes.io/desired-replicas"] = str(replicas)
            target = state.put("replicasets", rs)
        pods = [r for r in state.child_records(target.uid) if isinstance(r, PodRecord) and not r.deleting]
        namespace = record.key.split("/", 1)[0]
        if target.resource == "statefulsets":
            ordinals = {int(r.key.rsplit("-", 1)[1]): r for r in pods}
            # Ordinals go from the highest down, and come back from the lowest free one up.
            for ordinal in sorted(ordinals, reverse=True)[: max(0, len(pods) - replicas)]:
                state.remove("pods", ordinals[ordinal].key)
            missing = [i for i in range(replicas) if i not in ordinals]
            for ordinal in missing[: max(0, replicas - len(pods))]:
                self._replace(target, namespace, "", now, ordinal)
        else:
            # A ReplicaSet deletes unready pods first.
            for victim in sorted(pods, key=lambda r: (r.phase == "Running", r.key))[
                : max(0, len(pods) - replicas)
            ]:
                state.remove("pods", victim.key)
            for _ in range(replicas - len(pods)):
                self._replace(target, namespace, "", now)
        self.refresh_tree(uid, now)

    def delete_tree(self, uid: str, now: float) -> int:
        """Delete an object and everything below it (a SaFE Workload: with its label-linked children),
        as the garbage collector's foreground deletion ends; returns how many objects went."""
        state = self.state
        record = state.by_uid.get(uid)
        if record is None:
            return 0
        tops = [record]
        if record.resource == "workloads":
            tops += state.linked_children(record.key)
        removed = 0
        for top in tops:
            for below in state.descendants(top.uid):
                state.remove(below.resource, below.key)
                removed += 1
            if state.by_uid.get(top.uid) is not None:
                state.remove(top.resource, top.key)
                removed += 1
        owner = record.owner
        if owner:
            self.refresh(owner, now)
        return removed


def controller_revision_hash_of(state: ClusterState, daemonset_uid: str) -> dict[str, str]:
    """The revision label the DaemonSet's existing pods carry (replacements carry the same)."""
    for record in state.child_records(daemonset_uid):
        if isinstance(record, PodRecord):
            labels = state.read("pods", record.key)["metadata"]["labels"]
            return {"controller-revision-hash": labels.get("controller-revision-hash", "")}
    return {}
