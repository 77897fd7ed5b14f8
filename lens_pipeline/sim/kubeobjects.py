"""Builders of real-shaped core Kubernetes JSON (Node, Pod, Namespace, Secret, StorageClass), as the
kubelet, the node lifecycle controller and admission plugins would leave them."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import random
import time
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lens_pipeline.sim.vendors import SimVendor

CONTAINERD_VERSION = "containerd://1.7.13"
OS_IMAGE = "Ubuntu 22.04.4 LTS"
KERNEL_VERSION = "5.15.0-116-generic"
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what Kubernetes uses for generated name suffixes


def rfc3339(timestamp: float) -> str:
    return _rfc3339(int(timestamp))


@functools.lru_cache(maxsize=65536)
def _rfc3339(seconds: int) -> str:
    # Formatting was a sixth of generating 150,000 pods; one pod repeats its few instants ten times.
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def stable_hash(text: str) -> int:
    # hash() of a str changes per process (PYTHONHASHSEED); crc32 does not.
    return zlib.crc32(text.encode("utf-8"))


def new_uid(rng: random.Random) -> str:
    """A version-4 UUID from `rng`, as uuid.UUID(int=..., version=4) formats it, at a third of its cost."""
    n = rng.getrandbits(128)
    n = (n & ~(0xC000 << 48)) | (0x8000 << 48)  # variant RFC 4122
    n = (n & ~(0xF000 << 64)) | (4 << 76)  # version 4
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def suffix(rng: random.Random, length: int = 5) -> str:
    return "".join(rng.choices(_NAME_ALPHABET, k=length))


@functools.lru_cache(maxsize=256)
def image_id(image: str) -> str:
    repository = image.rsplit(":", 1)[0]
    return f"{repository}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def _condition(
    kind: str, status: str, reason: str, message: str, heartbeat: float, transition: float
) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "lastHeartbeatTime": rfc3339(heartbeat),
        "lastTransitionTime": rfc3339(transition),
        "reason": reason,
        "message": message,
    }


def node_conditions(ready: bool | None, heartbeat: float, transition: float) -> list[dict[str, Any]]:
    """Kubelet conditions; when the kubelet stops reporting (ready None) the node controller sets all Unknown."""
    if ready is None:
        unknown = ("NodeStatusUnknown", "Kubelet stopped posting node status.")
        return [
            _condition(kind, "Unknown", *unknown, heartbeat, transition)
            for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
        ]
    since = min(transition, heartbeat)
    return [
        _condition(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
            heartbeat,
            since,
        ),
        _condition(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
            heartbeat,
            since,
        ),
        _condition(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
            heartbeat,
            since,
        ),
        _condition("Ready", "True", "KubeletReady", "kubelet is posting ready status", heartbeat, transition)
        if ready
        else _condition(
            "Ready",
            "False",
            "KubeletNotReady",
            "PLEG is not healthy: pleg was last seen active 3m10s ago; threshold is 3m0s",
            heartbeat,
            transition,
        ),
    ]


# Taints the node lifecycle controller keeps in step with the Ready condition.
_READINESS_TAINTS = {False: "node.kubernetes.io/not-ready", None: "node.kubernetes.io/unreachable"}


def readiness_taints(taints: list[dict[str, Any]], ready: bool | None, now: float) -> list[dict[str, Any]]:
    kept = [t for t in taints if t.get("key") not in _READINESS_TAINTS.values()]
    if ready is not True:
        kept.append({"key": _READINESS_TAINTS[ready], "effect": "NoExecute", "timeAdded": rfc3339(now)})
    return kept


def node_info(rng: random.Random, kubelet_version: str) -> dict[str, str]:
    return {
        "machineID": uuid.UUID(int=rng.getrandbits(128)).hex,
        "systemUUID": str(uuid.UUID(int=rng.getrandbits(128))),
        "bootID": new_uid(rng),
        "kernelVersion": KERNEL_VERSION,
        "osImage": OS_IMAGE,
        "containerRuntimeVersion": CONTAINERD_VERSION,
        "kubeletVersion": kubelet_version,
        "kubeProxyVersion": kubelet_version,
        "operatingSystem": "linux",
        "architecture": "amd64",
    }


def node_addresses(index: int, name: str) -> tuple[list[dict[str, str]], str]:
    address = f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"
    cidr = f"10.{128 + (index >> 8) % 128}.{index & 255}.0/24"
    return [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}], cidr


def base_node_labels(name: str, index: int) -> dict[str, str]:
    """Well-known labels; nodes spread over three zones, 32 to a rack."""
    return {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "topology.kubernetes.io/zone": f"zone-{index % 3}",
        "lens.sim/rack": f"rack-{index // 32:03d}",
    }


NODE_ANNOTATIONS = {
    "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
    "node.alpha.kubernetes.io/ttl": "0",
    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
}


def _pod_conditions(
    phase: str, scheduled: bool, has_init: bool, created: float, started: float, changed: float
) -> list[dict[str, Any]]:
    def condition(kind: str, status: bool, at: float, reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": kind,
            "status": "True" if status else "False",
            "lastProbeTime": None,
            "lastTransitionTime": rfc3339(at),
        }
        if reason:
            body["reason"] = reason
        return body

    if not scheduled:
        unschedulable = condition("PodScheduled", False, created, "Unschedulable")
        unschedulable["message"] = "no nodes are available: Insufficient GPUs."
        return [unschedulable]
    running = phase == "Running"
    done_reason = {"Succeeded": "PodCompleted", "Failed": "PodFailed"}.get(phase, "ContainersNotReady")
    # The sandbox exists from start until the pod finishes; then the kubelet tears it down.
    sandbox = phase == "Running"
    sandbox_at = started if phase in ("Pending", "Running") else changed
    return [
        condition("PodReadyToStartContainers", sandbox, sandbox_at),
        condition(
            "Initialized",
            phase != "Pending" or not has_init,
            started,
            None if phase != "Pending" or not has_init else "ContainersNotInitialized",
        ),
        condition("Ready", running, changed, None if running else done_reason),
        condition("ContainersReady", running, changed, None if running else done_reason),
        # Bound a moment before its containers start (at creation, or when a waiting pod got room).
        condition("PodScheduled", True, min(started, max(created + 1, started - 1))),
    ]


def _container_state(phase: str, started: float, finished: float) -> dict[str, Any]:
    if phase == "Running":
        return {"running": {"startedAt": rfc3339(started)}}
    if phase == "Pending":
        return {"waiting": {"reason": "ContainerCreating"}}
    exit_code, reason = (0, "Completed") if phase == "Succeeded" else (1, "Error")
    return {
        "terminated": {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": rfc3339(started),
            "finishedAt": rfc3339(finished),
        }
    }


def pod_status(
    phase: str,
    spec: dict[str, Any],
    created: float,
    started: float,
    changed: float,
    pod_ip: str,
    host_ip: str,
    restarts: dict[str, int],
) -> dict[str, Any]:
    """Status as the kubelet reports it for a pod that entered `phase` at `changed`."""
    scheduled = bool(spec.get("nodeName"))
    conditions = _pod_conditions(
        phase, scheduled, bool(spec.get("initContainers")), created, started, changed
    )
    status: dict[str, Any] = {"phase": phase, "conditions": conditions}
    if not scheduled:
        status["qosClass"] = "Burstable"
        return status
    status["hostIP"] = host_ip
    status["hostIPs"] = [{"ip": host_ip}]
    if phase != "Pending":
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    status["startTime"] = rfc3339(started)
    state = _container_state(phase, started, changed)
    if spec.get("initContainers"):
        init_state = (
            _container_state("Pending", started, started)
            if phase == "Pending"
            else _container_state("Succeeded", started, started)
        )
        status["initContainerStatuses"] = [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": image_id(c["image"]),
                "ready": phase != "Pending",
                "restartCount": 0,
                "started": False,
                "state": init_state,
            }
            for c in spec["initContainers"]
        ]
    status["containerStatuses"] = [
        _container_status(c, phase, restarts.get(c["name"], 0), state, f"{pod_ip}/{started}")
        for c in spec["containers"]
    ]
    status["qosClass"] = "Burstable"
    return status


def _container_status(
    container: dict[str, Any], phase: str, restarts: int, state: dict[str, Any], instance: str
) -> dict[str, Any]:
    created = phase != "Pending"  # a Pending pod's containers do not exist yet
    status: dict[str, Any] = {
        "name": container["name"],
        "image": container["image"],
        "imageID": image_id(container["image"]) if created else "",
        "ready": phase == "Running",
        "restartCount": restarts,
        "started": phase == "Running",
        "state": state,
    }
    if created:
        digest = hashlib.sha256(f"{container['name']}@{instance}".encode()).hexdigest()
        status["containerID"] = f"containerd://{digest}"
    if restarts and created:
        # What the kubelet keeps of the last crash; its times are those of the current run's start.
        at = state.get("running", state.get("terminated", {})).get("startedAt", "")
        status["lastState"] = {
            "terminated": {"exitCode": 1, "reason": "Error", "startedAt": at, "finishedAt": at}
        }
    return status


def container_specs(containers: Sequence[ContainerPlan], image: str, resource: str) -> list[dict[str, Any]]:
    """The containers of a pod (or pod template) as planned: CPU and memory sized by their GPUs."""
    return [
        container_spec(
            c.name, image, resource, c.gpus, max(2, c.gpus * 12), max(4, c.gpus * 128), c.gpus_in_limits_only
        )
        for c in containers
    ]


def container_spec(
    name: str,
    image: str,
    resource: str,
    gpus: int,
    cpu: int,
    memory_gi: int,
    gpus_in_limits_only: bool = False,
) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": str(cpu), "memory": f"{memory_gi}Gi"}
    limits: dict[str, str] = {"memory": f"{memory_gi}Gi"}
    if gpus:
        # kube-apiserver defaults an extended resource's request to its limit; objects restored from
        # backups or written by old admission webhooks can still carry the limit alone.
        if not gpus_in_limits_only:
            requests[resource] = str(gpus)
        limits[resource] = str(gpus)
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": {"limits": limits, "requests": requests},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def tolerations(vendor: SimVendor, gpus: bool) -> list[dict[str, Any]]:
    # The DefaultTolerationSeconds admission plugin adds the last two to every pod.
    tolerations: list[dict[str, Any]] = (
        [{"key": vendor.taint_key, "operator": "Exists", "effect": "NoSchedule"}] if gpus else []
    )
    return tolerations + [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    ]


@dataclass(frozen=True)
class Owner:
    kind: str
    api_version: str
    name: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def parse_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


@dataclass(frozen=True)
class ContainerPlan:
    """One container of a pod to build: its name, GPUs, and whether the GPUs appear in limits only."""

    name: str
    gpus: int = 0
    gpus_in_limits_only: bool = False


def pod_object(
    *,
    name: str,
    namespace: str,
    uid: str,
    created: float,
    labels: dict[str, str],
    owner: Owner | None,
    containers: Sequence[ContainerPlan],
    init_gpus: int,
    image: str,
    vendor: SimVendor,
    restart_policy: str,
    node: str | None,
    host_ip: str,
    phase: str,
    started: float,
    changed: float,
    pod_ip: str,
    restarts: dict[str, int],
    deleting_at: float | None = None,
    annotations: dict[str, str] | None = None,
    volumes: Sequence[dict[str, Any]] = (),
    generate_name: str | None = None,
) -> dict[str, Any]:
    """A pod as kube-apiserver serves it after admission, scheduling and the kubelet's status updates."""
    resource = vendor.resource
    uses_gpus = any(c.gpus for c in containers) or init_gpus > 0
    spec: dict[str, Any] = {
        "volumes": list(volumes),
        "containers": container_specs(containers, image, resource),
        "restartPolicy": restart_policy,
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "schedulerName": "default-scheduler",
        "tolerations": tolerations(vendor, uses_gpus),
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if not volumes:
        del spec["volumes"]
    if init_gpus:
        spec["initContainers"] = [container_spec("warmup", image, resource, init_gpus, cpu=2, memory_gi=16)]
    if node:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {"name": name}
    if generate_name:
        metadata["generateName"] = generate_name
    metadata.update(
        namespace=namespace, uid=uid, resourceVersion="", creationTimestamp=rfc3339(created), labels=labels
    )
    if owner is not None:
        metadata["ownerReferences"] = [owner.reference()]
    if annotations:
        metadata["annotations"] = annotations
    if deleting_at is not None:
        metadata["deletionTimestamp"] = rfc3339(deleting_at)
        metadata["deletionGracePeriodSeconds"] = 30
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": pod_status(phase, spec, created, started, changed, pod_ip, host_ip, restarts),
    }


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def applied_with_kubectl(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as `kubectl apply` leaves it: kubectl keeps the manifest it sent (without this
    annotation, status or what the server sets) in the object's `last-applied-configuration`
    annotation for its next three-way merge, JSON encoded with a newline at the end (kubectl's
    `GetModifiedConfiguration`). Real workloads carry it; its quotes and newline are escaped
    wherever the object is written as JSON text."""
    metadata = obj["metadata"]
    sent = {key: metadata[key] for key in ("annotations", "labels", "name", "namespace") if metadata.get(key)}
    manifest = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": sent, "spec": obj["spec"]}
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":")) + "\n"
    metadata["annotations"] = {**metadata.get("annotations", {}), LAST_APPLIED: text}
    return obj


def stored_annotations(metadata: dict[str, Any]) -> dict[str, Any]:
    """The annotations the Lens database should hold of an object: all but kubectl's last-applied
    copy of the spec, which lens-pipeline does not keep (docs/DIFFERENCES.md)."""
    return {k: v for k, v in (metadata.get("annotations") or {}).items() if k != LAST_APPLIED}


def object_metadata(
    name: str,
    namespace: str | None,
    uid: str,
    created: float,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner: Owner | None = None,
    generation: int | None = 1,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["uid"] = uid
    metadata["resourceVersion"] = ""
    if generation is not None:
        metadata["generation"] = generation
    metadata["creationTimestamp"] = rfc3339(created)
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    if owner is not None:
        metadata["ownerReferences"] = [owner.reference()]
    return metadata


def namespace_object(name: str, uid: str, created: float) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": object_metadata(
            name, None, uid, created, {"kubernetes.io/metadata.name": name}, generation=None
        ),
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def secret_object(
    name: str, namespace: str, uid: str, created: float, data: dict[str, str], kind: str = "Opaque"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_metadata(name, namespace, uid, created, generation=None),
        "type": kind,
        "data": {key: base64.b64encode(value.encode()).decode("ascii") for key, value in data.items()},
    }


def juicefs_storage_class(
    name: str, uid: str, created: float, secret_namespace: str, secret_name: str, default: bool = False
) -> dict[str, Any]:
    """A StorageClass of the JuiceFS CSI driver, pointing its provisioner and mounts at one Secret."""
    parameters = {}
    for stage in ("provisioner", "controller-expand", "node-publish"):
        parameters[f"csi.storage.k8s.io/{stage}-secret-name"] = secret_name
        parameters[f"csi.storage.k8s.io/{stage}-secret-namespace"] = secret_namespace
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else None
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": object_metadata(
            name,
            None,
            uid,
            created,
            {"app.kubernetes.io/name": "juicefs-csi-driver"},
            annotations,
            generation=None,
        ),
        "provisioner": "csi.juicefs.com",
        "parameters": parameters,
        "reclaimPolicy": "Retain",
        "allowVolumeExpansion": True,
        "volumeBindingMode": "Immediate",
    }


def local_storage_class(name: str, uid: str, created: float) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": object_metadata(name, None, uid, created, generation=None),
        "provisioner": "rancher.io/local-path",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }
