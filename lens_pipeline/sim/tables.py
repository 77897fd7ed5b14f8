"""Server-side printing (`meta.k8s.io/v1` Table), which kubectl asks for on every `get`: the columns
kube-apiserver's printers and the CRDs' additionalPrinterColumns give each kind."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from lens_pipeline.sim.kinds import ResourceKind
from lens_pipeline.sim.objects import StoredObject

Column = tuple[str, str, int, Callable[[dict[str, Any], float], Any]]  # name, type, priority, cell


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    """obj[a][b]..., or `default` anywhere along a path that malformed objects may break."""
    for part in path:
        if not isinstance(obj, dict):
            return default
        obj = obj.get(part)
    return default if obj is None else obj


def _time(text: Any) -> float | None:
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery's duration.HumanDuration: "45s", "3m20s", "5h", "12d", "2y40d"."""
    s = int(seconds)
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 192:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    years = days // 365
    if days < 365 * 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"


def _age(obj: dict[str, Any], now: float) -> str:
    created = _time(_get(obj, "metadata", "creationTimestamp"))
    return "<unknown>" if created is None else human_duration(now - created)


def _name(obj: dict[str, Any], now: float) -> str:
    return str(_get(obj, "metadata", "name", default=""))


def _node_status(obj: dict[str, Any], now: float) -> str:
    ready = next(
        (
            c
            for c in _get(obj, "status", "conditions", default=[])
            if isinstance(c, dict) and c.get("type") == "Ready"
        ),
        None,
    )
    status = {"True": "Ready", "False": "NotReady"}.get(ready.get("status") if ready else "", "Unknown")
    return status + (",SchedulingDisabled" if _get(obj, "spec", "unschedulable") else "")


def _node_roles(obj: dict[str, Any], now: float) -> str:
    labels = _get(obj, "metadata", "labels", default={})
    roles = sorted(key.split("/", 1)[1] for key in labels if key.startswith("node-role.kubernetes.io/"))
    return ",".join(roles) or "<none>"


def _pod_status(obj: dict[str, Any], now: float) -> str:
    """kubectl's STATUS column: the phase, or the reason a container is waiting or terminated."""
    if _get(obj, "metadata", "deletionTimestamp"):
        return "Terminating"
    reason = _get(obj, "status", "phase", default="Unknown")
    for status in _get(obj, "status", "containerStatuses", default=[]):
        state = _get(status, "state", default={})
        if _get(state, "waiting", "reason"):
            reason = state["waiting"]["reason"]
        elif _get(state, "terminated", "reason"):
            reason = state["terminated"]["reason"]
    return str(reason)


def _pod_ready(obj: dict[str, Any], now: float) -> str:
    statuses = _get(obj, "status", "containerStatuses", default=[])
    containers = _get(obj, "spec", "containers", default=[])
    total = len(containers) if isinstance(containers, list) else 0
    return f"{sum(1 for s in statuses if isinstance(s, dict) and s.get('ready'))}/{total}"


def _pod_restarts(obj: dict[str, Any], now: float) -> int:
    return sum(
        s.get("restartCount", 0)
        for s in _get(obj, "status", "containerStatuses", default=[])
        if isinstance(s, dict)
    )


def _ready_of(ready: str, total: str) -> Callable[[dict[str, Any], float], str]:
    return lambda obj, now: f"{_get(obj, 'status', ready, default=0)}/{_get(obj, 'spec', total, default=0)}"


def _field(*path: str, default: Any = 0) -> Callable[[dict[str, Any], float], Any]:
    return lambda obj, now: _get(obj, *path, default=default)


def _crd_text(*path: str) -> Callable[[dict[str, Any], float], Any]:
    """A CRD's printer column of type string, as kube-apiserver fills it: the value at the JSON path
    printed as text (a number too), null where the object has none."""

    def cell(obj: dict[str, Any], now: float) -> Any:
        value = _get(obj, *path)
        if value is None:
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        return value if isinstance(value, str) else orjson.dumps(value).decode()

    return cell


def _job_status(obj: dict[str, Any], now: float) -> str:
    for condition in _get(obj, "status", "conditions", default=[]):
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            return str(condition["type"])
    return "Running" if _get(obj, "status", "active") else "Pending"


def _job_duration(obj: dict[str, Any], now: float) -> str:
    start = _time(_get(obj, "status", "startTime"))
    end = _time(_get(obj, "status", "completionTime")) or now
    return "" if start is None else human_duration(end - start)


def _last_condition(obj: dict[str, Any], now: float) -> str:
    conditions = _get(obj, "status", "conditions", default=[])
    return str(conditions[-1].get("type", "")) if conditions else ""


def _cronjob_active(obj: dict[str, Any], now: float) -> int:
    return len(_get(obj, "status", "active", default=[]))


def _since(*path: str) -> Callable[[dict[str, Any], float], str]:
    def cell(obj: dict[str, Any], now: float) -> str:
        at = _time(_get(obj, *path))
        return "<none>" if at is None else human_duration(now - at)

    return cell


NAME: Column = ("Name", "string", 0, _name)
AGE: Column = ("Age", "string", 0, _age)

COLUMNS: dict[str, list[Column]] = {
    "nodes": [
        NAME,
        ("Status", "string", 0, _node_status),
        ("Roles", "string", 0, _node_roles),
        AGE,
        ("Version", "string", 0, _field("status", "nodeInfo", "kubeletVersion", default="")),
    ],
    "pods": [
        NAME,
        ("Ready", "string", 0, _pod_ready),
        ("Status", "string", 0, _pod_status),
        ("Restarts", "string", 0, _pod_restarts),
        AGE,
        ("IP", "string", 1, _field("status", "podIP", default="<none>")),
        ("Node", "string", 1, _field("spec", "nodeName", default="<none>")),
    ],
    "namespaces": [NAME, ("Status", "string", 0, _field("status", "phase", default="")), AGE],
    "secrets": [
        NAME,
        ("Type", "string", 0, _field("type", default="")),
        ("Data", "string", 0, lambda obj, now: len(_get(obj, "data", default={}))),
        AGE,
    ],
    "deployments": [
        NAME,
        ("Ready", "string", 0, _ready_of("readyReplicas", "replicas")),
        ("Up-to-date", "string", 0, _field("status", "updatedReplicas")),
        ("Available", "string", 0, _field("status", "availableReplicas")),
        AGE,
    ],
    "replicasets": [
        NAME,
        ("Desired", "integer", 0, _field("spec", "replicas")),
        ("Current", "integer", 0, _field("status", "replicas")),
        ("Ready", "integer", 0, _field("status", "readyReplicas")),
        AGE,
    ],
    "statefulsets": [NAME, ("Ready", "string", 0, _ready_of("readyReplicas", "replicas")), AGE],
    "daemonsets": [
        NAME,
        ("Desired", "integer", 0, _field("status", "desiredNumberScheduled")),
        ("Current", "integer", 0, _field("status", "currentNumberScheduled")),
        ("Ready", "integer", 0, _field("status", "numberReady")),
        ("Up-to-date", "integer", 0, _field("status", "updatedNumberScheduled")),
        ("Available", "integer", 0, _field("status", "numberAvailable")),
        (
            "Node Selector",
            "string",
            0,
            lambda obj, now: (
                ",".join(
                    f"{k}={v}"
                    for k, v in _get(obj, "spec", "template", "spec", "nodeSelector", default={}).items()
                )
                or "<none>"
            ),
        ),
        AGE,
    ],
    "jobs": [
        NAME,
        ("Status", "string", 0, _job_status),
        (
            "Completions",
            "string",
            0,
            lambda obj, now: (
                f"{_get(obj, 'status', 'succeeded', default=0)}/{_get(obj, 'spec', 'completions', default=1)}"
            ),
        ),
        ("Duration", "string", 0, _job_duration),
        AGE,
    ],
    "cronjobs": [
        NAME,
        ("Schedule", "string", 0, _field("spec", "schedule", default="")),
        ("Timezone", "string", 0, _field("spec", "timeZone", default="<none>")),
        ("Suspend", "boolean", 0, _field("spec", "suspend", default=False)),
        ("Active", "integer", 0, _cronjob_active),
        ("Last Schedule", "string", 0, _since("status", "lastScheduleTime")),
        AGE,
    ],
    "storageclasses": [
        NAME,
        ("Provisioner", "string", 0, _field("provisioner", default="")),
        ("ReclaimPolicy", "string", 0, _field("reclaimPolicy", default="Delete")),
        ("VolumeBindingMode", "string", 0, _field("volumeBindingMode", default="Immediate")),
        ("AllowVolumeExpansion", "string", 0, _field("allowVolumeExpansion", default=False)),
        AGE,
    ],
    # The CRDs' additionalPrinterColumns (training-operator, KubeRay); SaFE's Workload has none.
    "pytorchjobs": [NAME, ("State", "string", 0, _last_condition), AGE],
    "mpijobs": [NAME, AGE, ("State", "string", 0, _last_condition)],
    "rayjobs": [
        NAME,
        ("Job Status", "string", 0, _crd_text("status", "jobStatus")),
        ("Deployment Status", "string", 0, _crd_text("status", "jobDeploymentStatus")),
        ("Ray Cluster Name", "string", 0, _crd_text("status", "rayClusterName")),
        AGE,
    ],
    "rayservices": [
        NAME,
        ("service status", "string", 0, _crd_text("status", "serviceStatus")),
        ("num serve endpoints", "string", 0, _crd_text("status", "numServeEndpoints")),
        AGE,
    ],
    "rayclusters": [
        NAME,
        ("Desired Workers", "integer", 0, _field("status", "desiredWorkerReplicas")),
        ("Available Workers", "integer", 0, _field("status", "availableWorkerReplicas")),
        ("Status", "string", 0, _crd_text("status", "state")),
        AGE,
    ],
    "workloads": [NAME, AGE],
}


def render_table(
    kind: ResourceKind, entries: Sequence[StoredObject], metadata: dict[str, Any], now: float
) -> bytes:
    columns = COLUMNS.get(kind.plural, [NAME, AGE])
    rows = []
    for entry in entries:
        obj = entry.obj
        if not isinstance(obj, dict):
            obj = {}
        partial = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": _get(obj, "metadata", default={}),
        }
        rows.append({"cells": [cell(obj, now) for _, _, _, cell in columns], "object": partial})
    return orjson.dumps(
        {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": metadata,
            "columnDefinitions": [
                {
                    "name": name,
                    "type": kind_,
                    "format": "name" if name == "Name" else "",
                    "description": "",
                    "priority": priority,
                }
                for name, kind_, priority, _ in columns
            ],
            "rows": rows,
        }
    )
