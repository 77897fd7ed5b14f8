"""What Kubernetes controllers and operators write: the workload objects (Deployment, ReplicaSet,
StatefulSet, DaemonSet, Job, CronJob, Kubeflow PyTorchJob/MPIJob, KubeRay RayJob/RayCluster, SaFE
Workload) and their status, recomputed from the pods and children below them."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lens_pipeline.sim.kubeobjects import ContainerPlan, Owner, container_specs, object_metadata, rfc3339
from lens_pipeline.sim.state import PodRecord
from lens_pipeline.sim.vendors import SimVendor

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
# The Ray Serve application and deployment of the simulator's RayServices (their `serveConfigV2`).
SERVE_APPLICATION = "llm"
SERVE_DEPLOYMENT = "VLLMDeployment"
KUBERAY_VERSION = "v1.6.2"  # a release sets its tag (utils.KUBERAY_VERSION)

# -- pod templates -----------------------------------------------------------------------------


def pod_template(
    labels: dict[str, str],
    containers: Sequence[ContainerPlan],
    image: str,
    vendor: SimVendor,
    restart_policy: str,
) -> dict[str, Any]:
    return {
        "metadata": {"labels": dict(labels)},
        "spec": {
            "containers": container_specs(containers, image, vendor.resource),
            "restartPolicy": restart_policy,
        },
    }


def _selector(labels: dict[str, str]) -> dict[str, Any]:
    return {"matchLabels": dict(labels)}


# -- object builders (status filled in by refresh) ---------------------------------------------


def deployment(
    name: str,
    namespace: str,
    uid: str,
    created: float,
    labels: dict[str, str],
    replicas: int,
    template: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_metadata(
            name, namespace, uid, created, labels, {"deployment.kubernetes.io/revision": "1"}
        ),
        "spec": {
            "replicas": replicas,
            "selector": _selector(template["metadata"]["labels"]),
            "template": template,
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
            },
            "revisionHistoryLimit": 10,
            "progressDeadlineSeconds": 600,
        },
        "status": {},
    }


def replicaset(
    name: str,
    namespace: str,
    uid: str,
    created: float,
    owner: Owner,
    labels: dict[str, str],
    replicas: int,
    template: dict[str, Any],
    revision: int,
) -> dict[str, Any]:
    annotations = {
        "deployment.kubernetes.io/desired-replicas": str(replicas),
        "deployment.kubernetes.io/max-replicas": str(replicas + (replicas + 3) // 4),
        "deployment.kubernetes.io/revision": str(revision),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": object_metadata(name, namespace, uid, created, labels, annotations, owner),
        "spec": {"replicas": replicas, "selector": _selector(labels), "template": template},
        "status": {},
    }


def statefulset(
    name: str,
    namespace: str,
    uid: str,
    created: float,
    labels: dict[str, str],
    replicas: int,
    template: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": object_metadata(name, namespace, uid, created, labels),
        "spec": {
            "replicas": replicas,
            "selector": _selector(template["metadata"]["labels"]),
            "template": template,
            "serviceName": name,
            "podManagementPolicy": "OrderedReady",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "revisionHistoryLimit": 10,
        },
        "status": {},
    }


def daemonset(
    name: str,
    namespace: str,
    uid: str,
    created: float,
    labels: dict[str, str],
    template: dict[str, Any],
    node_selector: dict[str, str] | None,
) -> dict[str, Any]:
    if node_selector:
        template["spec"]["nodeSelector"] = node_selector
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": object_metadata(
            name, namespace, uid, created, labels, {"deprecated.daemonset.template.generation": "1"}
        ),
        "spec": {
            "selector": _selector(template["metadata"]["labels"]),
            "template": template,
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "revisionHistoryLimit": 10,
        },
        "status": {},
    }


def job(
    name: str,
    namespace: str,
    uid: str,
    created: float,
    owner: Owner | None,
    labels: dict[str, str],
    parallelism: int,
    template: dict[str, Any],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    selector_labels = {"batch.kubernetes.io/controller-uid": uid}
    template["metadata"]["labels"].update(
        {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_metadata(name, namespace, uid, created, labels, annotations, owner),
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "backoffLimit": 0,
            "completionMode": "NonIndexed",
            "suspend": False,
            "podReplacementPolicy": "TerminatingOrFailed",
            "manualSelector": False,
            "selector": _selector(selector_labels),
            "template": template,
        },
        "status": {},
    }


def cronjob(
    name: str,
    namespace: str,
    uid: str,
    created: float,
    labels: dict[str, str],
    schedule: str,
    template: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": object_metadata(name, namespace, uid, created, labels),
        "spec": {
            "schedule": schedule,
            "concurrencyPolicy": "Forbid",
            "suspend": False,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 1,
            "jobTemplate": {"metadata": {}, "spec": {"backoffLimit": 0, "template": template}},
        },
        "status": {},
    }


def pytorchjob(
    name: str,
    namespace: str,
    uid: str,
    created: float,
    labels: dict[str, str],
    workers: int,
    template: dict[str, Any],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    specs = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if workers:
        specs["Worker"] = {"replicas": workers, "restartPolicy": "OnFailure", "template": template}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": object_metadata(name, namespace, uid, created, labels, annotations),
        "spec": {"pytorchReplicaSpecs": specs, "runPolicy": {"cleanPodPolicy": "None", "suspend": False}},
        "status": {},
    }


def mpijob(
    name: str,
    namespace: str,
    uid: str,
    created: float,
    labels: dict[str, str],
    workers: int,
    launcher: dict[str, Any],
    worker: dict[str, Any],
    slots: int,
) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "MPIJob",
        "metadata": object_metadata(name, namespace, uid, created, labels),
        "spec": {
            "slotsPerWorker": slots,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": launcher},
                "Worker": {"replicas": workers, "restartPolicy": "Never", "template": worker},
            },
            "runPolicy": {"cleanPodPolicy": "None"},
        },
        "status": {},
    }


def rayjob(
    name: str, namespace: str, uid: str, created: float, labels: dict[str, str], cluster_spec: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": object_metadata(name, namespace, uid, created, labels),
        "spec": {
            "entrypoint": "python /home/ray/samples/train.py",
            "shutdownAfterJobFinishes": False,
            "submissionMode": "K8sJobMode",
            "rayClusterSpec": cluster_spec,
        },
        "status": {},
    }


def rayservice(
    name: str,
    namespace: str,
    uid: str,
    created: float,
    labels: dict[str, str],
    cluster_spec: dict[str, Any],
    serve_config: str,
) -> dict[str, Any]:
    """KubeRay's RayService (ray.io/v1): a Ray Serve application on a RayCluster that KubeRay makes
    from `spec.rayClusterConfig` (and replaces when that changes: the simulator makes one and never
    upgrades it)."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": object_metadata(name, namespace, uid, created, labels),
        "spec": {"serveConfigV2": serve_config, "rayClusterConfig": cluster_spec},
        "status": {},
    }


def rayservice_cluster_annotations(cluster_spec: dict[str, Any]) -> dict[str, str]:
    """What KubeRay's RayService controller adds to the annotations of the RayCluster it makes: the
    hash of the cluster spec without the worker counts (SHA-1 of its JSON, base32hex), which tells it
    when a new cluster is due, the number of worker groups and its own version."""
    groups = [
        {k: v for k, v in group.items() if k not in ("replicas", "minReplicas", "maxReplicas")}
        for group in cluster_spec["workerGroupSpecs"]
    ]
    material = json.dumps({**cluster_spec, "workerGroupSpecs": groups}, separators=(",", ":"), sort_keys=True)
    return {
        "ray.io/hash-without-replicas-and-workers-to-delete": base64.b32hexencode(
            hashlib.sha1(material.encode(), usedforsecurity=False).digest()
        ).decode(),
        "ray.io/num-worker-groups": str(len(groups)),
        "ray.io/kuberay-version": KUBERAY_VERSION,
    }


def raycluster(
    name: str,
    namespace: str,
    uid: str,
    created: float,
    owner: Owner,
    labels: dict[str, str],
    cluster_spec: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": object_metadata(name, namespace, uid, created, labels, owner=owner),
        "spec": cluster_spec,
        "status": {},
    }


def ray_cluster_spec(
    head: dict[str, Any], worker: dict[str, Any], workers: int, ray_version: str = "2.9.0"
) -> dict[str, Any]:
    return {
        "rayVersion": ray_version,
        "headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0"}, "template": head},
        "workerGroupSpecs": [
            {
                "groupName": "gpu-group",
                "replicas": workers,
                "minReplicas": workers,
                "maxReplicas": workers,
                "rayStartParams": {},
                "template": worker,
            }
        ],
    }


def safe_workload(
    name: str,
    uid: str,
    created: float,
    labels: dict[str, str],
    annotations: dict[str, str],
    workspace: str,
    gpus: int,
    replica: int,
    kind: tuple[str, str, str],
    image: str,
    resource: str,
) -> dict[str, Any]:
    """SaFE's Workload (cluster-scoped); SaFE dispatches it as `kind` into namespace `workspace`."""
    group, version, kind_name = kind
    return {
        "apiVersion": "amd.com/v1",
        "kind": "Workload",
        "metadata": object_metadata(name, None, uid, created, labels, annotations),
        "spec": {
            "resource": {
                "replica": replica,
                "cpu": str(max(2, gpus * 12)),
                "gpu": str(gpus),
                "gpuName": resource,
                "memory": f"{max(4, gpus * 128)}Gi",
                "ephemeralStorage": "50Gi",
            },
            "workspace": workspace,
            "image": image,
            "entryPoint": base64.b64encode(b"bash train.sh").decode("ascii"),
            "groupVersionKind": {"group": group, "version": version, "kind": kind_name},
            "maxRetry": 0,
            "priority": 1,
            "ttlSecondsAfterFinished": 60,
        },
        "status": {},
    }


# -- status ------------------------------------------------------------------------------------


@dataclass
class PodCounts:
    active: int = 0  # Pending or Running, not terminating
    running: int = 0
    pending: int = 0
    succeeded: int = 0
    failed: int = 0

    @classmethod
    def of(cls, pods: Sequence[PodRecord]) -> PodCounts:
        counts = cls()
        for pod in pods:
            if pod.phase == "Succeeded":
                counts.succeeded += 1
            elif pod.phase == "Failed":
                counts.failed += 1
            elif not pod.deleting:
                counts.active += 1
                if pod.phase == "Running":
                    counts.running += 1
                else:
                    counts.pending += 1
        return counts

    @property
    def outcome(self) -> str:
        """Pending | Running | Succeeded | Failed, as a gang job's pods add up."""
        if self.failed:
            return "Failed"
        if self.running:
            return "Running"
        if self.active:
            return "Pending"
        return "Succeeded" if self.succeeded else "Pending"


def _without_zeros(status: dict[str, Any], *keys: str) -> dict[str, Any]:
    # Go's `omitempty` drops zero counts from these statuses.
    for key in keys:
        if not status.get(key):
            status.pop(key, None)
    return status


def _condition(
    previous: Sequence[dict[str, Any]],
    kind: str,
    status: bool,
    reason: str,
    message: str,
    now: float,
    stamps: tuple[str, ...] = ("lastTransitionTime",),
) -> dict[str, Any]:
    text = "True" if status else "False"
    old = next((c for c in previous if c.get("type") == kind), None)
    at = old.get("lastTransitionTime") if old and old.get("status") == text else rfc3339(now)
    condition: dict[str, Any] = {"type": kind, "status": text}
    for stamp in stamps:
        condition[stamp] = at
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


@dataclass
class StatusInput:
    """What a controller reads to write an object's status."""

    obj: dict[str, Any]
    pods: list[PodRecord]  # every pod below the object (through any depth)
    children: list[dict[str, Any]]  # direct non-pod children (or SaFE's label-linked ones)
    now: float


def _is_finished(obj: dict[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed", "Succeeded") and c.get("status") == "True"
        for c in obj.get("status", {}).get("conditions", [])
    )


def replicaset_status(inp: StatusInput) -> dict[str, Any]:
    counts = PodCounts.of(inp.pods)
    status = {
        "replicas": counts.active,
        "fullyLabeledReplicas": counts.active,
        "readyReplicas": counts.running,
        "availableReplicas": counts.running,
        "observedGeneration": inp.obj["metadata"].get("generation", 1),
    }
    return _without_zeros(status, "fullyLabeledReplicas", "readyReplicas", "availableReplicas")


def deployment_status(inp: StatusInput) -> dict[str, Any]:
    counts = PodCounts.of(inp.pods)
    wanted = inp.obj["spec"]["replicas"]
    previous = inp.obj.get("status", {}).get("conditions", [])
    stamps = ("lastUpdateTime", "lastTransitionTime")
    available = counts.running >= max(0, wanted - max(1, wanted // 4))
    current = max(
        inp.children,
        key=lambda rs: int(rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]),
        default=None,
    )
    status = {
        "observedGeneration": inp.obj["metadata"].get("generation", 1),
        "replicas": counts.active,
        "updatedReplicas": counts.active,
        "readyReplicas": counts.running,
        "availableReplicas": counts.running,
        "unavailableReplicas": max(0, wanted - counts.running),
        "conditions": [
            _condition(
                previous,
                "Available",
                available,
                "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                "Deployment has minimum availability."
                if available
                else "Deployment does not have minimum availability.",
                inp.now,
                stamps,
            ),
            _condition(
                previous,
                "Progressing",
                True,
                "NewReplicaSetAvailable",
                f'ReplicaSet "{current["metadata"]["name"] if current else ""}" has successfully progressed.',
                inp.now,
                stamps,
            ),
        ],
    }
    return _without_zeros(
        status, "updatedReplicas", "readyReplicas", "availableReplicas", "unavailableReplicas"
    )


def statefulset_status(inp: StatusInput) -> dict[str, Any]:
    counts = PodCounts.of(inp.pods)
    revision = f"{inp.obj['metadata']['name']}-{inp.obj['metadata']['uid'][:10].replace('-', '')}"
    status = {
        "observedGeneration": inp.obj["metadata"].get("generation", 1),
        "replicas": counts.active,
        "readyReplicas": counts.running,
        "currentReplicas": counts.active,
        "updatedReplicas": counts.active,
        "currentRevision": revision,
        "updateRevision": revision,
        "collisionCount": 0,
        "availableReplicas": counts.running,
    }
    return _without_zeros(status, "readyReplicas", "currentReplicas", "updatedReplicas")


def daemonset_status(inp: StatusInput) -> dict[str, Any]:
    counts = PodCounts.of(inp.pods)
    scheduled = len([p for p in inp.pods if p.node])
    return {
        "currentNumberScheduled": scheduled,
        "numberMisscheduled": 0,
        "desiredNumberScheduled": scheduled,
        "numberReady": counts.running,
        "observedGeneration": 1,
        "updatedNumberScheduled": scheduled,
        "numberAvailable": counts.running,
        **({"numberUnavailable": scheduled - counts.running} if scheduled > counts.running else {}),
    }


def job_status(inp: StatusInput) -> dict[str, Any]:
    old = inp.obj.get("status", {})
    if _is_finished(inp.obj):
        return old  # a finished Job's counts are final, even after its pods are reaped
    counts = PodCounts.of(inp.pods)
    previous = old.get("conditions", [])
    status: dict[str, Any] = {}
    if counts.running or counts.succeeded or counts.failed:
        status["startTime"] = old.get("startTime") or rfc3339(inp.now)
    status.update(
        active=counts.active, ready=counts.running, succeeded=counts.succeeded, failed=counts.failed
    )
    status = _without_zeros(status, "active", "succeeded", "failed")
    stamps = ("lastProbeTime", "lastTransitionTime")
    if counts.failed and not counts.active:
        status["conditions"] = [
            _condition(
                previous,
                "FailureTarget",
                True,
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
                inp.now,
                stamps,
            ),
            _condition(
                previous,
                "Failed",
                True,
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
                inp.now,
                stamps,
            ),
        ]
    elif counts.succeeded >= inp.obj["spec"].get("completions", 1) and not counts.active:
        status["conditions"] = [
            _condition(previous, "Complete", True, "", "", inp.now, stamps),
        ]
        status["completionTime"] = rfc3339(inp.now)
    status["uncountedTerminatedPods"] = {}
    return status


def cronjob_status(inp: StatusInput) -> dict[str, Any]:
    active = [j for j in inp.children if not _is_finished(j)]
    status: dict[str, Any] = {}
    if active:
        status["active"] = [
            {
                "kind": "Job",
                "namespace": j["metadata"]["namespace"],
                "name": j["metadata"]["name"],
                "uid": j["metadata"]["uid"],
                "apiVersion": "batch/v1",
                "resourceVersion": j["metadata"]["resourceVersion"],
            }
            for j in active
        ]
    if inp.children:
        status["lastScheduleTime"] = max(j["metadata"]["creationTimestamp"] for j in inp.children)
    done = [j["status"]["completionTime"] for j in inp.children if j.get("status", {}).get("completionTime")]
    if done:
        status["lastSuccessfulTime"] = max(done)
    return status


def _kubeflow_status(inp: StatusInput, replica_types: dict[str, str]) -> dict[str, Any]:
    """Kubeflow's common JobStatus. `replica_types` maps a pod's replica-type label to its spec key."""
    old = inp.obj.get("status", {})
    if _is_finished(inp.obj):
        return old
    kind = inp.obj["kind"]
    name = f"{inp.obj['metadata']['namespace']}/{inp.obj['metadata']['name']}"
    previous = old.get("conditions", [])
    stamps = ("lastUpdateTime", "lastTransitionTime")
    counts = PodCounts.of(inp.pods)
    replica_statuses: dict[str, dict[str, Any]] = {}
    for label, spec_key in replica_types.items():
        pods = [p for p in inp.pods if _replica_type(p.key) == label]
        of_type = PodCounts.of(pods)
        replica_statuses[spec_key] = _without_zeros(
            {"active": of_type.active, "succeeded": of_type.succeeded, "failed": of_type.failed},
            "succeeded",
            "failed",
        )
    conditions = [
        _condition(previous, "Created", True, f"{kind}Created", f"{kind} {name} is created.", inp.now, stamps)
    ]
    outcome = counts.outcome
    status: dict[str, Any] = {"conditions": conditions, "replicaStatuses": replica_statuses}
    if outcome != "Pending":
        status["startTime"] = old.get("startTime") or rfc3339(inp.now)
        conditions.append(
            _condition(
                previous,
                "Running",
                outcome == "Running",
                f"{kind}Running",
                f"{kind} {name} is running.",
                inp.now,
                stamps,
            )
        )
    if outcome in TERMINAL_PHASES:
        verb = (
            "successfully completed"
            if outcome == "Succeeded"
            else "is failed because 1 Master replica(s) failed"
        )
        conditions.append(
            _condition(previous, outcome, True, f"{kind}{outcome}", f"{kind} {name} {verb}.", inp.now, stamps)
        )
        status["completionTime"] = rfc3339(inp.now)
    status["lastReconcileTime"] = rfc3339(inp.now)
    return status


def _replica_type(key: str) -> str:
    """The training operator's pod names: `<job>-<type>-<index>`, and MPI's `<job>-launcher`."""
    name = key.split("/", 1)[-1]
    return "launcher" if name.endswith("-launcher") else name.rsplit("-", 2)[-2]


def pytorchjob_status(inp: StatusInput) -> dict[str, Any]:
    return _kubeflow_status(inp, {"master": "Master", "worker": "Worker"})


def mpijob_status(inp: StatusInput) -> dict[str, Any]:
    return _kubeflow_status(inp, {"launcher": "Launcher", "worker": "Worker"})


def raycluster_status(inp: StatusInput) -> dict[str, Any]:
    counts = PodCounts.of(inp.pods)
    workers = inp.obj["spec"]["workerGroupSpecs"][0]["replicas"]
    ready_workers = max(0, counts.running - 1)
    status: dict[str, Any] = {
        "desiredWorkerReplicas": workers,
        "minWorkerReplicas": workers,
        "maxWorkerReplicas": workers,
        "readyWorkerReplicas": ready_workers,
        "availableWorkerReplicas": ready_workers,
        "observedGeneration": 1,
    }
    if counts.running:
        status["state"] = "ready"
        status["lastUpdateTime"] = inp.obj.get("status", {}).get("lastUpdateTime") or rfc3339(inp.now)
    return _without_zeros(status, "readyWorkerReplicas", "availableWorkerReplicas")


def rayjob_status(inp: StatusInput) -> dict[str, Any]:
    old = inp.obj.get("status", {})
    if old.get("jobDeploymentStatus") in ("Complete", "Failed"):
        return old
    # The job's outcome is its submitter's once that ended (the cluster may outlive it); until
    # then the cluster's.
    submitters = {child["metadata"]["uid"] for child in inp.children if child.get("kind") == "Job"}
    ended = [p for p in inp.pods if p.owner in submitters and p.phase in TERMINAL_PHASES]
    outcome = PodCounts.of(ended or [p for p in inp.pods if p.owner not in submitters]).outcome
    job_status, deployment_status = {
        "Pending": ("PENDING", "Initializing"),
        "Running": ("RUNNING", "Running"),
        "Succeeded": ("SUCCEEDED", "Complete"),
        "Failed": ("FAILED", "Failed"),
    }[outcome]
    cluster = inp.children[0]["metadata"]["name"] if inp.children else ""
    status: dict[str, Any] = {
        "jobId": f"{inp.obj['metadata']['name']}-{inp.obj['metadata']['uid'][:5]}",
        "rayClusterName": cluster,
        "dashboardURL": f"{cluster}-head-svc.{inp.obj['metadata']['namespace']}.svc.cluster.local:8265",
        "jobStatus": job_status,
        "jobDeploymentStatus": deployment_status,
        "startTime": old.get("startTime") or rfc3339(inp.now),
        "observedGeneration": 1,
    }
    if outcome in TERMINAL_PHASES:
        status["endTime"] = rfc3339(inp.now)
    if outcome == "Failed":
        status["reason"] = "AppFailed"
        status["message"] = "Job entrypoint command failed with exit code 1"
    return status


def rayservice_status(inp: StatusInput) -> dict[str, Any]:
    """As KubeRay's RayService controller writes it: the cluster it made is pending until it serves,
    then active; `Ready` while it has serve endpoints (its running pods: KubeRay labels a worker
    `ray.io/serve=true` from the start and the head once it serves), and `serviceStatus` says the
    same."""
    old = inp.obj.get("status", {})
    cluster = inp.children[0]["metadata"]["name"] if inp.children else ""
    endpoints = PodCounts.of(inp.pods).running
    previous = old.get("conditions", [])
    was_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in previous)
    active = cluster if endpoints or old.get("activeServiceStatus") else ""
    initializing = (False, "Initializing", "RayService is initializing")
    if endpoints:
        ready = (True, "NonZeroServeEndpoints", "Number of serve endpoints is greater than 0")
    elif was_ready:
        ready = (False, "ZeroServeEndpoints", "Number of serve endpoints dropped to 0")
    else:
        ready = initializing
    upgrade = (
        (False, "NoPendingCluster", "Active Ray cluster exists and no pending Ray cluster")
        if active
        else initializing
    )
    conditions = [
        _condition(previous, "Ready", *ready, inp.now),
        _condition(previous, "UpgradeInProgress", *upgrade, inp.now),
    ]
    for condition in conditions:
        condition["observedGeneration"] = 1
    status: dict[str, Any] = {"conditions": conditions, "observedGeneration": 1}
    if endpoints:
        status["serviceStatus"] = "Running"
        status["numServeEndpoints"] = endpoints
    serving = {"rayClusterName": cluster}
    if active:
        serving["applicationStatuses"] = {
            SERVE_APPLICATION: {
                "status": "RUNNING" if endpoints else "DEPLOYING",
                "serveDeploymentStatuses": {
                    SERVE_DEPLOYMENT: {"status": "HEALTHY" if endpoints else "UPDATING"}
                },
            }
        }
        status["activeServiceStatus"] = serving
    elif cluster:
        status["pendingServiceStatus"] = serving
    status["lastUpdateTime"] = (
        old.get("lastUpdateTime") if old.get("conditions") == conditions else rfc3339(inp.now)
    )
    return status


def safe_workload_status(inp: StatusInput) -> dict[str, Any]:
    """SaFE's phase follows the job it dispatched (a Deployment never finishes: Running or Pending)."""
    old = inp.obj.get("status", {})
    if old.get("phase") in TERMINAL_PHASES:
        return old
    outcome = PodCounts.of(inp.pods).outcome if inp.pods else "Pending"
    if inp.obj["spec"]["groupVersionKind"]["kind"] == "Deployment" and outcome in TERMINAL_PHASES:
        outcome = "Running"
    previous = old.get("conditions", [])
    stamps = ("lastTransitionTime",)
    conditions = [
        _condition(previous, "AdminScheduled", True, "", "the workload is scheduled", inp.now, stamps),
        _condition(previous, "AdminDispatched", True, "", "the workload is dispatched", inp.now, stamps),
        _condition(
            previous, f"K8s{outcome}", True, "", f"the workload is {outcome.lower()}", inp.now, stamps
        ),
    ]
    for condition in conditions:
        condition["observedGeneration"] = 1
        condition.setdefault("reason", condition["type"])
    status: dict[str, Any] = {"phase": outcome, "conditions": conditions}
    if outcome != "Pending":
        status["startTime"] = old.get("startTime") or rfc3339(inp.now)
    if outcome in TERMINAL_PHASES:
        status["endTime"] = rfc3339(inp.now)
    return status


STATUS: dict[str, Callable[[StatusInput], dict[str, Any]]] = {
    "ReplicaSet": replicaset_status,
    "Deployment": deployment_status,
    "StatefulSet": statefulset_status,
    "DaemonSet": daemonset_status,
    "Job": job_status,
    "CronJob": cronjob_status,
    "PyTorchJob": pytorchjob_status,
    "MPIJob": mpijob_status,
    "RayCluster": raycluster_status,
    "RayJob": rayjob_status,
    "RayService": rayservice_status,
    "Workload": safe_workload_status,
}
