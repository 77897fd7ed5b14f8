"""Simulated node agents for a whole fleet: every few seconds, each cluster's running GPU pods are
sent to `lens ingest` as container events over the original gRPC protocol (a `Running` event for
a container that appeared, `Exit` for one that went away), so the demo's `container_events` fills.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import grpc

from lens_pipeline.sim import node_agent as agent
from lens_pipeline.sim.fleet import SimCluster, SimFleet
from lens_pipeline.sim.kubeobjects import parse_time

# (node, namespace, pod, pod uid, GPUs, the container's CRI creation in ns since the epoch)
Container = tuple[str, str, str, str, int, int]


class RunningGpuContainers:
    """A cluster's running GPU pods, one container each, by a stable container id; each look parses
    only the pods stored anew since the last (the feed looks at every cluster every few seconds,
    and parsing every pod each time took a fifth of the simulator's CPU in a 100-cluster demo)."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self._seen: dict[str, tuple[bytes, tuple[str, Container] | None]] = {}

    def __call__(self) -> dict[str, Container]:
        seen: dict[str, tuple[bytes, tuple[str, Container] | None]] = {}
        out: dict[str, Container] = {}
        for entry in self.cluster.simulated_objects("pods"):
            before = self._seen.get(entry.key)
            found = before[1] if before is not None and before[0] is entry.raw else self._container(entry.obj)
            seen[entry.key] = (entry.raw, found)
            if found is not None:
                out[found[0]] = found[1]
        self._seen = seen
        return out

    def _container(self, pod: dict[str, Any]) -> tuple[str, Container] | None:
        metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if (pod.get("status") or {}).get("phase") != "Running" or not spec.get("nodeName"):
            return None
        resource = self.cluster.profile.resource
        gpus = sum(
            int(((c.get("resources") or {}).get("limits") or {}).get(resource, 0) or 0)
            for c in spec.get("containers") or []
        )
        if gpus <= 0:
            return None
        key = f"{self.cluster.name}/{metadata['namespace']}/{metadata['name']}/{metadata['uid']}"
        container_id = hashlib.sha256(key.encode()).hexdigest()
        return container_id, (
            spec["nodeName"],
            metadata["namespace"],
            metadata["name"],
            metadata["uid"],
            gpus,
            self._created_ns(pod),
        )

    def _created_ns(self, pod: dict[str, Any]) -> int:
        """When the runtime created the pod's first container: 1.5 s before it started (the
        agent's event puts its start there), by the pod's status; the cluster's clock if none."""
        status = pod.get("status") or {}
        started = next(
            (
                s["state"]["running"]["startedAt"]
                for s in status.get("containerStatuses") or ()
                if "startedAt" in ((s.get("state") or {}).get("running") or {})
            ),
            status.get("startTime"),
        )
        seconds = parse_time(started) if started else self.cluster.now()
        return int(seconds * 1e9) - agent.STARTED_AFTER_CREATED_NS


def _event(cluster: SimCluster, container_id: str, container: Container, status: str, now_ns: int) -> bytes:
    """A `Running` or `Exit` event as the node agent sends it, the agent's clock at `now_ns` (an
    exited container finished then)."""
    node, namespace, pod, uid, gpus, created_ns = container
    seed = int(container_id[:6], 16)
    make_gpu = agent.amd_gpu if cluster.vendor == "amd" else agent.nvidia_gpu
    data: dict[str, Any] = agent.k8s_container(
        container_id,
        name="main",
        pod_name=pod,
        pod_namespace=namespace,
        pod_uid=uid,
        status=status,
        created_ns=created_ns,
        gpus=[make_gpu(i, seed) for i in range(gpus)],
        nics=[agent.infiniband(0, seed)],
        finished_ns=max(now_ns, created_ns + agent.STARTED_AFTER_CREATED_NS),
        updated_ns=now_ns,
    )
    raw = agent.event(status, container_id, data, node=node)
    return agent.with_extra_fields(raw, event_id=f"{container_id}:{status}", cluster=cluster.name)


def feed_forever(fleet: SimFleet, target: str, period: float, stopped: threading.Event) -> None:
    """Until `stopped`: every `period` seconds, what changed in each cluster goes to `target`."""
    sent: dict[str, dict[str, Container]] = {c.name: {} for c in fleet}
    running = {c.name: RunningGpuContainers(c) for c in fleet}
    with grpc.insecure_channel(target) as channel:
        while not stopped.wait(period):
            for cluster in fleet:
                current = running[cluster.name]()
                before = sent[cluster.name]
                now_ns = int(cluster.now() * 1e9)
                events = [
                    _event(cluster, cid, c, "Running", now_ns)
                    for cid, c in current.items()
                    if cid not in before
                ]
                events += [
                    _event(cluster, cid, c, "Exit", now_ns) for cid, c in before.items() if cid not in current
                ]
                if not events:
                    continue
                result = agent.stream_events(channel, events, timeout=30)
                if result.code is None:
                    sent[cluster.name] = current  # what was not acknowledged is sent again next round
