"""Owner chains and workload rows from real-shaped objects (no cluster, no database)."""

from __future__ import annotations

import pytest

from lens_pipeline.collect.objects import KindRef, owner_ref
from lens_pipeline.collect.owners import parent_uid, plurals_from_discovery, resolve_chains
from lens_pipeline.collect.pods import GpuPod, project_gpu_pod
from lens_pipeline.collect.problems import MalformedObject
from lens_pipeline.collect.workloads import workload_row, workload_status
from lens_pipeline.vendors import gpu_resources

RS = KindRef("apps/v1", "ReplicaSet")
DEPLOY = KindRef("apps/v1", "Deployment")
PTJ = KindRef("kubeflow.org/v1", "PyTorchJob")


def obj(
    kind: KindRef,
    name: str,
    uid: str,
    owner: tuple[KindRef, str, str] | None = None,
    ns: str = "team",
    labels: dict | None = None,
    **extra,
) -> dict:
    metadata = {
        "name": name,
        "namespace": ns,
        "uid": uid,
        "resourceVersion": "7",
        "labels": labels or {},
        "creationTimestamp": "2026-11-01T00:00:00Z",
    }
    if owner:
        k, n, u = owner
        metadata["ownerReferences"] = [
            {"apiVersion": k.group_version, "kind": k.kind, "name": n, "uid": u, "controller": True}
        ]
    return {"apiVersion": kind.group_version, "kind": kind.kind, "metadata": metadata, **extra}


def pod(
    name: str, uid: str, owner=None, phase="Running", gpus=2, ns="team", deleting=False, labels=None
) -> GpuPod:
    raw = obj(KindRef("v1", "Pod"), name, uid, owner, ns=ns, labels=labels)
    if deleting:
        raw["metadata"]["deletionTimestamp"] = "2026-11-02T00:00:00Z"
    raw["spec"] = {
        "nodeName": "n1",
        "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": str(gpus)}}}],
    }
    raw["status"] = {"phase": phase}
    projected = project_gpu_pod(raw, gpu_resources("amd"))
    assert isinstance(projected, GpuPod)
    return projected


def test_a_deployment_chain_resolves_from_listed_objects():
    objects = {"d1": obj(DEPLOY, "web", "d1"), "r1": obj(RS, "web-abc", "r1", (DEPLOY, "web", "d1"))}
    p = pod("web-abc-x", "p1", (RS, "web-abc", "r1"))
    chains = resolve_chains([p], objects, {RS, DEPLOY})
    assert chains.ancestors == {"p1": ["r1", "d1"]} and chains.problems == []


@pytest.mark.parametrize(
    ("objects", "listed", "problem"),
    [
        ({}, {RS}, None),  # owner deleted, GC not done yet: chain ends quietly
        ({}, set(), "not served"),  # unknown kind
        (
            {"r1": obj(RS, "a", "r1", (RS, "b", "r2")), "r2": obj(RS, "b", "r2", (RS, "a", "r1"))},
            {RS},
            "cycle",
        ),
        ({"r1": obj(RS, "a", "r1", ns="elsewhere")}, {RS}, "namespace elsewhere"),
    ],
)
def test_broken_chains_are_problems_not_crashes(objects, listed, problem):
    p = pod("x", "p1", (RS, "a", "r1"))
    chains = resolve_chains([p], objects, listed)
    if problem is None:
        assert chains.problems == []
    else:
        assert len(chains.problems) == 1 and problem in chains.problems[0].message


def test_safe_workloads_adopt_children_by_label():
    safe = obj(
        KindRef("amd.com/v1", "Workload"),
        "train-1",
        "w1",
        ns="primus-safe",
        spec={"workspace": "team", "resource": {"gpu": "8", "replica": 2}},
        status={"phase": "Running"},
    )
    job = obj(PTJ, "train-1-ptj", "j1", labels={"primus-safe.workload.id": "train-1"})
    p = pod("train-1-ptj-master-0", "p1", (PTJ, "train-1-ptj", "j1"))
    objects = {"w1": safe, "j1": job}
    chains = resolve_chains([p], objects, {PTJ})
    assert chains.ancestors["p1"] == ["j1", "w1"]
    assert parent_uid(job["metadata"], {"train-1": "w1"}) == "w1"
    row = workload_row(safe, "", [p])
    assert (row["namespace"], row["status"], row["gpu_request"], row["kind"]) == (
        "team",
        "Running",
        16,
        "Workload",
    )


@pytest.mark.parametrize(
    ("pods", "status_block", "expected"),
    [
        ([("Running", False), ("Pending", False)], {}, ("Running", 2)),
        ([("Pending", False)], {}, ("Pending", 0)),
        ([("Running", True)], {}, ("Done", 0)),  # the only running pod is being deleted
        ([("Succeeded", False)], {}, ("Done", 0)),
        ([("Failed", False)], {"conditions": [{"type": "Failed", "status": "True"}]}, ("Failed", 0)),
        ([], {}, ("Done", 0)),
    ],
)
def test_workload_status_from_its_pods(pods, status_block, expected):
    job = obj(KindRef("batch/v1", "Job"), "j", "j1", status=status_block)
    gpu_pods = [
        pod(f"p{i}", f"u{i}", phase=phase, deleting=deleting) for i, (phase, deleting) in enumerate(pods)
    ]
    assert workload_status(job, gpu_pods) == expected


def test_discovery_maps_kinds_to_plurals():
    document = {
        "resources": [
            {
                "name": "pytorchjobs",
                "kind": "PyTorchJob",
                "namespaced": True,
                "verbs": ["get", "list", "watch"],
            },
            {"name": "pytorchjobs/status", "kind": "PyTorchJob", "namespaced": True, "verbs": ["get"]},
            {"name": "secrets", "kind": "Secret", "namespaced": True, "verbs": ["get"]},
        ]
    }
    assert plurals_from_discovery("kubeflow.org/v1", document) == {"PyTorchJob": ("pytorchjobs", True)}
    assert PTJ.list_path("pytorchjobs") == "/apis/kubeflow.org/v1/pytorchjobs"
    assert KindRef("v1", "Pod").list_path("pods") == "/api/v1/pods"


def test_malformed_owner_references_are_named():
    with pytest.raises(MalformedObject, match="ownerReferences should be a list"):
        owner_ref({"ownerReferences": "r1"})
    with pytest.raises(MalformedObject, match="lacks uid"):
        owner_ref({"ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "n"}]})
