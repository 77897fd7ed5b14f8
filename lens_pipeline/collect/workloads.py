"""Workloads: each owner above a GPU pod becomes a `gpu_workload` row (spec §1.5, §4.5, §6.3).

Status: a SaFE `Workload` maps its phase; any other owner is Running while a pod below it runs,
Pending while one waits, else Failed when the object reports failure, else Done. Deleted is
decided by the writer, when the object itself is gone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lens_pipeline.collect.objects import resource_version
from lens_pipeline.collect.owners import SAFE_GROUP_VERSION, SAFE_KIND
from lens_pipeline.collect.pods import GpuPod
from lens_pipeline.collect.problems import MalformedObject, mapping, text_without_nul
from lens_pipeline.collect.quantity import INT32_MAX, bounded_count, whole_units
from lens_pipeline.collect.times import parse_time

Row = dict[str, Any]
SAFE_PHASES = {"Pending": "Pending", "Running": "Running", "Succeeded": "Done", "Failed": "Failed"}
ACTIVE = frozenset({"Running", "Pending"})


def is_safe_workload(obj: Mapping[str, Any]) -> bool:
    return obj.get("apiVersion") == SAFE_GROUP_VERSION and obj.get("kind") == SAFE_KIND


def reports_failure(obj: Mapping[str, Any]) -> bool:
    """Job, Kubeflow and Ray jobs say so in a `Failed` condition (Ray also in jobStatus)."""
    found = obj.get("status")
    status = found if isinstance(found, dict) else {}
    conditions = status.get("conditions") or []
    failed = (
        any(
            isinstance(c, dict) and c.get("type") == "Failed" and c.get("status") == "True"
            for c in conditions
        )
        if isinstance(conditions, list)
        else False
    )
    return failed or status.get("phase") == "Failed" or status.get("jobStatus") == "FAILED"


def workload_status(obj: Mapping[str, Any], pods: Iterable[GpuPod]) -> tuple[str, int]:
    """(status, gpu_request) of one owner, from its own state and the GPU pods below it."""
    if is_safe_workload(obj):
        spec = mapping(dict(obj), "spec")
        resource = mapping(spec, "resource")
        gpus = whole_units(resource.get("gpu", 0), "spec.resource.gpu", integer=True)
        replicas = whole_units(resource.get("replica", 1), "spec.resource.replica", integer=True)
        phase = (obj.get("status") or {}).get("phase") if isinstance(obj.get("status"), dict) else None
        request = bounded_count(gpus * replicas, "spec.resource.gpu x spec.resource.replica", INT32_MAX)
        return SAFE_PHASES.get(str(phase), "Pending" if phase is None else "Running"), request
    live = [p for p in pods if not p.deleting]
    running = [p for p in live if p.phase == "Running"]
    if running:
        return "Running", sum(p.gpus for p in running)
    if any(p.phase == "Pending" for p in live):
        return "Pending", 0
    return ("Failed" if reports_failure(obj) else "Done"), 0


def workload_namespace(obj: Mapping[str, Any]) -> str:
    """A workload's namespace; a SaFE Workload's is the workspace it runs in."""
    namespace = mapping(dict(obj), "metadata").get("namespace") or ""
    if is_safe_workload(obj):
        return str(mapping(dict(obj), "spec").get("workspace") or namespace)
    return namespace


def workload_row(obj: Mapping[str, Any], parent_uid: str, pods: list[GpuPod]) -> Row:
    """The `gpu_workload` row of one owner object (without cluster_name, end_at and timestamps)."""
    metadata = mapping(dict(obj), "metadata", required=True)
    status, gpu_request = workload_status(obj, pods)
    namespace = workload_namespace(obj)
    labels = mapping(metadata, "labels")
    annotations = mapping(metadata, "annotations")
    if not isinstance(obj.get("apiVersion"), str) or not isinstance(obj.get("kind"), str):
        raise MalformedObject("object lacks apiVersion or kind")
    for field in ("name", "namespace"):
        if not isinstance(metadata.get(field) or "", str):
            raise MalformedObject(f"metadata.{field} should be a string")
    row = {
        "uid": metadata["uid"],
        "group_version": obj["apiVersion"],
        "kind": obj["kind"],
        "namespace": namespace,
        "name": str(metadata.get("name") or ""),
        "parent_uid": parent_uid,
        "gpu_request": gpu_request,
        "status": status,
        "source": "k8s",
        "labels": labels,
        "annotations": annotations,
        "created_at": parse_time(metadata.get("creationTimestamp"), "metadata.creationTimestamp"),
    }
    return text_without_nul(row)


def snapshot_row(obj: Mapping[str, Any]) -> Row:
    """A `gpu_workload_snapshot` row: the object as listed (no managedFields)."""
    metadata = obj["metadata"]
    version = resource_version(metadata)
    return {
        "uid": metadata["uid"],
        "group_version": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "name": metadata.get("name"),
        "namespace": metadata.get("namespace") or "",
        "metadata": None,
        "detail": dict(obj),
        "resource_version": version,
    }
