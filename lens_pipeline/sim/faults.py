"""Faults a simulated cluster can be told to show: error statuses, slow answers and dropped
connections per API, and malformed or badly owned objects to serve among the good ones."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lens_pipeline.sim.kubeobjects import new_uid
from lens_pipeline.sim.state import ClusterState

FAULT_TARGETS = ("kube", "prometheus")
CONNECTION_FAULTS = ("refuse", "reset")


@dataclass(frozen=True)
class TargetFaults:
    """What every request to one API of a cluster suffers until cleared."""

    status: int | None = None  # answer this HTTP error instead
    delay: float = 0.0  # seconds to wait before answering
    connection: str | None = None  # "refuse": close without answering; "reset": close with a TCP RST

    def __post_init__(self) -> None:
        if self.status is not None and not 400 <= self.status <= 599:
            raise ValueError(f"fault status must be an HTTP error code, got {self.status!r}")
        if not 0 <= self.delay <= 600:
            raise ValueError(f"fault delay must be between 0 and 600 seconds, got {self.delay!r}")
        if self.connection not in (None, *CONNECTION_FAULTS):
            raise ValueError(f"connection fault must be one of {CONNECTION_FAULTS}, got {self.connection!r}")


class ConnectionDropped(Exception):
    """Raised by a handler to make the server drop the connection instead of answering."""

    def __init__(self, mode: str) -> None:
        super().__init__(mode)
        self.mode = mode


# -- malformed and badly owned objects ---------------------------------------------------------

Injected = tuple[str, str, Any]  # (resource, store key, object)


def _gpu_container(resource: str, gpus: Any = "1") -> dict[str, Any]:
    return {
        "name": "main",
        "image": "docker.io/library/busybox:1.36",
        "resources": {"requests": {resource: gpus}, "limits": {resource: gpus}},
    }


def _pod(name: str, namespace: str, resource: str, owners: list[dict[str, Any]], uid: str) -> dict[str, Any]:
    """A well-formed, unscheduled GPU pod (so it never counts against a node), owned by `owners`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": "1",
            "creationTimestamp": "2025-06-01T00:00:00Z",
            "ownerReferences": owners,
        },
        "spec": {"containers": [_gpu_container(resource)], "restartPolicy": "Never"},
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def _reference(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _node_missing_metadata(state: ClusterState, tag: str, rng: random.Random) -> list[Injected]:
    return [("nodes", f"zz-unnamed-{tag}", {"apiVersion": "v1", "kind": "Node", "spec": {}, "status": {}})]


def _ready_gpu_node(
    state: ClusterState, name: str, rng: random.Random, capacity: dict, allocatable: dict
) -> Injected:
    """A Ready node with the vendor's product label and the given capacity and allocatable."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": new_uid(rng), "labels": {state.profile.product_label: "X"}},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    return ("nodes", name, node)


def _node_capacity_not_a_number(state: ClusterState, tag: str, rng: random.Random) -> list[Injected]:
    capacity = {state.resource: "eight", "cpu": "lots"}
    return [_ready_gpu_node(state, f"malformed-capacity-{tag}", rng, capacity, {state.resource: 8.5})]


def _node_gpus_past_any_count(state: ClusterState, tag: str, rng: random.Random) -> list[Injected]:
    """A Ready GPU node advertising 10^20 GPUs: a valid quantity no integer column holds."""
    huge = "99999999999999999999"
    capacity = {state.resource: huge, "cpu": "8"}
    return [_ready_gpu_node(state, f"malformed-huge-capacity-{tag}", rng, capacity, {state.resource: huge})]


def _node_no_status(state: ClusterState, tag: str, rng: random.Random) -> list[Injected]:
    name = f"malformed-no-status-{tag}"
    labels = {state.profile.product_label: "X", "kubernetes.io/hostname": name}
    return [
        ("nodes", name, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
    ]


def _pod_missing_metadata(state: ClusterState, tag: str, rng: random.Random) -> list[Injected]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {"containers": [_gpu_container(state.resource)]},
        "status": {"phase": "Running"},
    }
    return [("pods", f"default/zz-unnamed-{tag}", pod)]


def _pod_containers_not_a_list(state: ClusterState, tag: str, rng: random.Random) -> list[Injected]:
    name = f"malformed-containers-{tag}"
    node = state.gpu_node_names()[0] if state.gpus else ""
    pod = _pod(name, "default", state.resource, [], new_uid(rng))
    pod["spec"] = {"containers": _gpu_container(state.resource), "nodeName": node}
    pod["status"]["phase"] = "Running"
    return [("pods", f"default/{name}", pod)]


def _pod_gpus_not_a_number(state: ClusterState, tag: str, rng: random.Random) -> list[Injected]:
    name = f"malformed-gpus-{tag}"
    pod = _pod(name, "default", state.resource, [], new_uid(rng))
    pod["spec"]["containers"] = [_gpu_container(state.resource, "eight")]
    return [("pods", f"default/{name}", pod)]


def _pod_gpus_past_any_count(state: ClusterState, tag: str, rng: random.Random) -> list[Injected]:
    """A pod running on a real GPU node and asking for 10^20 GPUs (its node's sum would overflow)."""
    name = f"malformed-huge-gpus-{tag}"
    pod = _pod(name, "default", state.resource, [], new_uid(rng))
    pod["spec"]["containers"] = [_gpu_container(state.resource, "99999999999999999999")]
    pod["spec"]["nodeName"] = state.gpu_node_names()[0] if state.gpus else ""
    pod["status"]["phase"] = "Running"
    return [("pods", f"default/{name}", pod)]


def _pod_no_status(state: ClusterState, tag: str, rng: random.Random) -> list[Injected]:
    name = f"malformed-no-status-{tag}"
    pod = _pod(name, "default", state.resource, [], new_uid(rng))
    del pod["status"]
    return [("pods", f"default/{name}", pod)]


def _pod_unknown_owner_kind(state: ClusterState, tag: str, rng: random.Random) -> list[Injected]:
    name = f"unknown-owner-{tag}"
    owner = _reference("example.com/v1alpha1", "FancyJob", f"fancy-{tag}", new_uid(rng))
    return [("pods", f"research/{name}", _pod(name, "research", state.resource, [owner], new_uid(rng)))]


def _pod_owner_cycle(state: ClusterState, tag: str, rng: random.Random) -> list[Injected]:
    """ReplicaSets A and B own each other; a pod hangs below A."""
    a, b = f"cycle-a-{tag}", f"cycle-b-{tag}"
    uid_a, uid_b = new_uid(rng), new_uid(rng)

    def replicaset(name: str, uid: str, owner: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": "research", "uid": uid, "ownerReferences": [owner]},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}},
            "status": {"replicas": 1},
        }

    pod_name = f"{a}-x7k2p"
    pod = _pod(
        pod_name, "research", state.resource, [_reference("apps/v1", "ReplicaSet", a, uid_a)], new_uid(rng)
    )
    return [
        ("replicasets", f"research/{a}", replicaset(a, uid_a, _reference("apps/v1", "ReplicaSet", b, uid_b))),
        ("replicasets", f"research/{b}", replicaset(b, uid_b, _reference("apps/v1", "ReplicaSet", a, uid_a))),
        ("pods", f"research/{pod_name}", pod),
    ]


def _pod_owner_in_other_namespace(state: ClusterState, tag: str, rng: random.Random) -> list[Injected]:
    """The owner exists, but in ml-infer: ownerReferences never cross namespaces, so it does not resolve."""
    job, job_uid = f"elsewhere-{tag}", new_uid(rng)
    owner_job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job, "namespace": "ml-infer", "uid": job_uid},
        "spec": {"parallelism": 1},
        "status": {},
    }
    name = f"{job}-q8w4z"
    pod = _pod(name, "research", state.resource, [_reference("batch/v1", "Job", job, job_uid)], new_uid(rng))
    return [("jobs", f"ml-infer/{job}", owner_job), ("pods", f"research/{name}", pod)]


def _pod_owner_missing(state: ClusterState, tag: str, rng: random.Random) -> list[Injected]:
    name = f"orphan-{tag}-5c9d8"
    owner = _reference("apps/v1", "ReplicaSet", f"vanished-{tag}", new_uid(rng))
    return [("pods", f"research/{name}", _pod(name, "research", state.resource, [owner], new_uid(rng)))]


MALFORMED: dict[str, Callable[[ClusterState, str, random.Random], list[Injected]]] = {
    "node-missing-metadata": _node_missing_metadata,
    "node-capacity-not-a-number": _node_capacity_not_a_number,
    "node-gpus-past-any-count": _node_gpus_past_any_count,
    "node-no-status": _node_no_status,
    "pod-missing-metadata": _pod_missing_metadata,
    "pod-containers-not-a-list": _pod_containers_not_a_list,
    "pod-gpus-not-a-number": _pod_gpus_not_a_number,
    "pod-gpus-past-any-count": _pod_gpus_past_any_count,
    "pod-no-status": _pod_no_status,
    "pod-unknown-owner-kind": _pod_unknown_owner_kind,
    "pod-owner-cycle": _pod_owner_cycle,
    "pod-owner-in-other-namespace": _pod_owner_in_other_namespace,
    "pod-owner-missing": _pod_owner_missing,
}


def malformed_objects(state: ClusterState, variants: Sequence[str] | None, tag: str) -> list[Injected]:
    chosen = list(MALFORMED) if variants is None else list(variants)
    unknown = [v for v in chosen if v not in MALFORMED]
    if unknown:
        raise ValueError(
            f"cluster {state.name}: unknown malformed variants {unknown}; known: {sorted(MALFORMED)}"
        )
    # Their uids come from their own seed, so injecting never shifts the cluster's random sequence.
    rng = random.Random(f"{state.name}/malformed/{tag}")
    return [item for variant in chosen for item in MALFORMED[variant](state, tag, rng)]
