"""Every served kind through the official client and kubectl: discovery, paging, owner chains as
real controllers leave them, expired continue tokens, and server-side tables."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from kubernetes import client

from lens_pipeline.sim import SimFleet, SimServer, write_registry
from lens_pipeline.sim.serviceproxy import PROXY_PATH
from lens_pipeline_tests.conftest import skip_unless
from lens_pipeline_tests.sim.support import COLLECTIONS, api_client, http, key_of, list_raw, owner_walk

SEED = 7
NAME = "sim-amd-0"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimFleet, SimServer, Path]]:
    """One cluster big enough to hold every kind, served over HTTPS so that kubectl sends its token."""
    fleet = SimFleet.generate(clusters=1, nodes=24, seed=SEED, vendor="amd", pods_per_node=4)
    registry = tmp_path_factory.mktemp("sim-kube") / "clusters.yaml"
    with SimServer(fleet, tls=True) as server:
        write_registry(registry, server)
        yield fleet, server, registry


@pytest.fixture(scope="module")
def everything(served) -> dict[str, list[dict]]:
    _, _, registry = served
    api = api_client(registry, NAME)
    return {path: list_raw(api, path)[0] for path, _ in COLLECTIONS}


def test_discovery_names_every_kind_with_its_scope(served) -> None:
    fleet, server, _ = served
    token = fleet.cluster(NAME).token
    base = server.base_url(NAME)
    _, groups = http(f"{base}/apis", token, server=server)
    assert groups["kind"] == "APIGroupList"
    assert [g["name"] for g in groups["groups"]] == [
        "apps",
        "batch",
        "storage.k8s.io",
        "kubeflow.org",
        "ray.io",
        "amd.com",
    ]
    _, core = http(f"{base}/api/v1", token, server=server)
    assert {r["name"]: r["namespaced"] for r in core["resources"]} == {
        "namespaces": False, "nodes": False, "pods": True, "secrets": True,
    }  # fmt: skip
    _, kubeflow = http(f"{base}/apis/kubeflow.org/v1", token, server=server)
    pytorch = next(r for r in kubeflow["resources"] if r["name"] == "pytorchjobs")
    assert (pytorch["kind"], pytorch["namespaced"], pytorch["verbs"]) == (
        "PyTorchJob",
        True,
        ["get", "list", "watch"],
    )
    _, safe = http(f"{base}/apis/amd.com/v1", token, server=server)
    assert [(r["name"], r["kind"], r["namespaced"]) for r in safe["resources"]] == [
        ("workloads", "Workload", False)
    ]
    _, group = http(f"{base}/apis/ray.io", token, server=server)
    assert group["preferredVersion"] == {"groupVersion": "ray.io/v1", "version": "v1"}


def test_the_official_client_lists_every_kind_with_paging(served, everything) -> None:
    fleet, _, registry = served
    cluster = fleet.cluster(NAME)
    api = api_client(registry, NAME)
    for path, kind in COLLECTIONS:
        items, pages = list_raw(api, path, limit=5)
        resource = path.rsplit("/", 1)[1]
        expected = [entry.key for entry in cluster.truth_snapshot().objects[resource]]
        assert [key_of(item) for item in items] == expected, path  # key order, each once
        assert pages == max(1, -(-len(items) // 5)), path
        assert items and {item["kind"] for item in items} == {kind}, path
        assert items == everything[path]


def test_typed_models_of_the_official_client_accept_every_built_in_kind(served) -> None:
    _, _, registry = served
    api = api_client(registry, NAME)
    apps, batch = client.AppsV1Api(api), client.BatchV1Api(api)
    deployments = apps.list_deployment_for_all_namespaces(limit=500).items
    assert deployments and all(d.spec.selector.match_labels for d in deployments)
    assert (
        apps.list_replica_set_for_all_namespaces().items[0].metadata.owner_references[0].kind == "Deployment"
    )
    assert apps.list_daemon_set_for_all_namespaces().items[0].status.desired_number_scheduled > 0
    assert apps.list_stateful_set_for_all_namespaces().items[0].spec.service_name
    jobs = batch.list_job_for_all_namespaces().items
    assert any(c.type == "Complete" for j in jobs for c in j.status.conditions or [])
    assert batch.list_cron_job_for_all_namespaces().items[0].spec.schedule == "0 */6 * * *"
    classes = client.StorageV1Api(api).list_storage_class().items
    assert {c.provisioner for c in classes} == {"csi.juicefs.com", "rancher.io/local-path"}
    core = client.CoreV1Api(api)
    assert {n.metadata.name for n in core.list_namespace().items} >= {"kube-system", "ml-train", "safe-prod"}
    secret = core.read_namespaced_secret("juicefs-secret-data", "juicefs")
    assert set(secret.data) == {"name", "metaurl", "storage", "bucket"}
    custom = client.CustomObjectsApi(api)
    page = custom.list_cluster_custom_object("kubeflow.org", "v1", "pytorchjobs", limit=2)
    assert len(page["items"]) == 2 and page["metadata"]["continue"]
    first = page["items"][0]["metadata"]
    one = custom.get_namespaced_custom_object(
        "kubeflow.org", "v1", first["namespace"], "pytorchjobs", first["name"]
    )
    assert one["metadata"]["uid"] == first["uid"]


def test_owner_chains_are_what_controllers_make(served, everything) -> None:
    by_uid = {obj["metadata"]["uid"]: obj for items in everything.values() for obj in items}
    chains = owner_walk(everything)
    assert chains and all(chain is not None for chain in chains.values())
    shapes = Counter(
        tuple(by_uid[uid]["kind"] for uid in chain) for chain in chains.values() if chain is not None
    )
    for shape in [("ReplicaSet", "Deployment"), ("Job", "CronJob"), ("StatefulSet",), ("DaemonSet",),
                  ("PyTorchJob",), ("MPIJob",), ("RayCluster", "RayJob"), ("Job", "RayJob"),
                  ("RayCluster", "RayService"), ("Job",), ()]:  # fmt: skip
        assert shapes[shape], f"no pod with owners {shape}: {shapes}"
    pods = {p["metadata"]["uid"]: p for p in everything["/api/v1/pods"]}
    for uid, chain in chains.items():
        name, owner = pods[uid]["metadata"]["name"], by_uid[chain[0]] if chain else None
        if owner is None:
            continue
        reference = pods[uid]["metadata"]["ownerReferences"][0]
        assert (reference["controller"], reference["blockOwnerDeletion"]) == (True, True)
        owner_name = owner["metadata"]["name"]
        if owner["kind"] == "StatefulSet":
            assert (
                name.rsplit("-", 1) == [owner_name, name.rsplit("-", 1)[1]]
                and name.rsplit("-", 1)[1].isdigit()
            )
        elif owner["kind"] == "PyTorchJob":
            assert name == f"{owner_name}-master-0" or name.startswith(f"{owner_name}-worker-")
        elif owner["kind"] in ("ReplicaSet", "Job", "DaemonSet"):
            assert name.startswith(f"{owner_name}-") and len(name) == len(owner_name) + 6
    # SaFE links its children by label, never by ownerReference.
    safe = {w["metadata"]["name"]: w for w in everything["/apis/amd.com/v1/workloads"]}
    assert safe
    for path in ("/apis/kubeflow.org/v1/pytorchjobs", "/apis/apps/v1/deployments"):
        for obj in everything[path]:
            label = obj["metadata"].get("labels", {}).get("primus-safe.workload.id")
            if label:
                assert label in safe and "ownerReferences" not in obj["metadata"]
                assert obj["metadata"]["namespace"] == safe[label]["spec"]["workspace"]
    for workload in safe.values():
        labels = workload["metadata"]["labels"]
        assert {"primus-safe.cluster.id", "primus-safe.workload.id"} <= set(labels)
        assert workload["status"]["phase"] in ("Pending", "Running", "Succeeded", "Failed")
        assert int(workload["spec"]["resource"]["gpu"]) > 0 and workload["spec"]["resource"]["replica"] > 0


def test_pods_carry_phases_conditions_and_statuses_consistent_with_them(everything) -> None:
    pods = everything["/api/v1/pods"]
    phases = Counter(p["status"]["phase"] for p in pods)
    assert set(phases) == {"Pending", "Running", "Succeeded", "Failed"}
    for pod in pods:
        status, spec = pod["status"], pod["spec"]
        conditions = {c["type"]: c for c in status["conditions"]}
        if not spec.get("nodeName"):
            assert status["phase"] == "Pending" and conditions["PodScheduled"]["status"] == "False"
            continue
        assert set(conditions) == {
            "PodScheduled",
            "Initialized",
            "ContainersReady",
            "Ready",
            "PodReadyToStartContainers",
        }
        running = status["phase"] == "Running"
        assert conditions["Ready"]["status"] == ("True" if running else "False")
        assert conditions["PodScheduled"]["lastTransitionTime"] <= conditions["Ready"]["lastTransitionTime"]
        assert status["startTime"] >= pod["metadata"]["creationTimestamp"]
        assert ("podIP" in status) == (status["phase"] != "Pending")
        for container in status["containerStatuses"]:
            state = next(iter(container["state"]))
            assert state == {"Running": "running", "Pending": "waiting"}.get(status["phase"], "terminated")
    resource = "amd.com/gpu"
    containers = [c for p in pods for c in p["spec"]["containers"]]
    assert any(
        resource in c["resources"]["limits"] and resource not in c["resources"]["requests"]
        for c in containers
    )
    assert any(
        resource in c["resources"]["requests"] for p in pods for c in p["spec"].get("initContainers", [])
    )
    assert any("deletionTimestamp" in p["metadata"] for p in pods)
    assert any(c.get("restartCount") for p in pods for c in p["status"].get("containerStatuses", []))


def _field_keys(fields: dict) -> Iterator[str]:
    for key, inner in fields.items():
        yield key
        yield from _field_keys(inner)


def test_every_object_carries_the_managed_fields_kube_apiserver_writes(everything) -> None:
    """`metadata.managedFields` as the API reference defines them: an Update entry for the fields
    of metadata and spec, one for the status subresource, each a FieldsV1 set whose keys are
    `f:<field>`, `k:<keys>`, `v:<value>` or `.`; a keyed list's items named by their key fields, a
    map's set holding "." (labels), an atomic list an empty set (container statuses)."""
    for path, objects in everything.items():
        for obj in objects:
            entries = obj["metadata"]["managedFields"]
            assert entries, path
            for entry in entries:
                assert entry["operation"] in ("Apply", "Update") and entry["fieldsType"] == "FieldsV1"
                assert entry["apiVersion"] == obj["apiVersion"] and entry["manager"]
                assert entry["time"].endswith("Z")
                assert all(k == "." or k[:2] in ("f:", "k:", "v:") for k in _field_keys(entry["fieldsV1"]))
            by_subresource = {entry.get("subresource", ""): entry["fieldsV1"] for entry in entries}
            if obj.get("status"):
                assert set(by_subresource["status"]) == {"f:status"}, path
            if obj.get("spec"):
                assert "f:spec" in by_subresource[""] and "f:status" not in by_subresource[""], path
    pod = next(p for p in everything["/api/v1/pods"] if p["metadata"].get("ownerReferences"))
    (main,) = [e for e in pod["metadata"]["managedFields"] if "subresource" not in e]
    assert main["manager"] == "kube-controller-manager"
    containers = main["fieldsV1"]["f:spec"]["f:containers"]
    assert set(containers) == {f'k:{{"name":"{c["name"]}"}}' for c in pod["spec"]["containers"]}
    assert main["fieldsV1"]["f:metadata"]["f:labels"]["."] == {}
    (status,) = [e for e in pod["metadata"]["managedFields"] if e.get("subresource") == "status"]
    assert status["manager"] == "kubelet" and status["fieldsV1"]["f:status"]["f:containerStatuses"] == {}
    owner = pod["metadata"]["ownerReferences"][0]["uid"]
    assert f'k:{{"uid":"{owner}"}}' in main["fieldsV1"]["f:metadata"]["f:ownerReferences"]


def test_an_expired_continue_token_answers_410_and_a_restarted_list_has_every_object_once(served) -> None:
    fleet, _, registry = served
    cluster = fleet.cluster(NAME)
    api = api_client(registry, NAME)
    custom = client.CustomObjectsApi(api)
    first = custom.list_cluster_custom_object("kubeflow.org", "v1", "pytorchjobs", limit=3)
    cluster.expire_continue_tokens()
    with pytest.raises(client.ApiException) as raised:
        custom.list_cluster_custom_object(
            "kubeflow.org", "v1", "pytorchjobs", limit=3, _continue=first["metadata"]["continue"]
        )
    assert (raised.value.status, json.loads(raised.value.body)["reason"]) == (410, "Expired")

    # The one-shot fault: the list in flight dies on its next page; started again, it is whole.
    items, token, restarts = [], None, 0
    cluster.expire_next_continue()
    while True:
        try:
            page = custom.list_cluster_custom_object(
                "kubeflow.org", "v1", "pytorchjobs", limit=3, _continue=token
            )
        except client.ApiException as exc:
            assert exc.status == 410
            items, token, restarts = [], None, restarts + 1
            continue
        items += page["items"]
        token = page["metadata"].get("continue")
        if not token:
            break
    uids = [i["metadata"]["uid"] for i in items]
    every = [i["metadata"]["uid"] for i in list_raw(api, "/apis/kubeflow.org/v1/pytorchjobs")[0]]
    assert restarts == 1 and uids == every and len(set(uids)) == len(uids) > 3


def test_namespaced_lists_and_gets_and_selectors(served, everything) -> None:
    fleet, server, _ = served
    token = fleet.cluster(NAME).token
    base = server.base_url(NAME)
    jobs = everything["/apis/batch/v1/jobs"]
    namespace = jobs[0]["metadata"]["namespace"]
    status, page = http(f"{base}/apis/batch/v1/namespaces/{namespace}/jobs?limit=2", token, server=server)
    assert status == 200 and {j["metadata"]["namespace"] for j in page["items"]} == {namespace}
    assert page["kind"] == "JobList" and page["apiVersion"] == "batch/v1"
    status, one = http(
        f"{base}/apis/batch/v1/namespaces/{namespace}/jobs/{jobs[0]['metadata']['name']}",
        token,
        server=server,
    )
    assert status == 200 and one == jobs[0]
    status, named = http(
        f"{base}/apis/apps/v1/deployments?fieldSelector=metadata.name%3D{everything['/apis/apps/v1/deployments'][0]['metadata']['name']}",
        token,
        server=server,
    )
    assert status == 200 and len(named["items"]) == 1
    status, body = http(
        f"{base}/apis/apps/v1/deployments?fieldSelector=spec.replicas%3D1", token, server=server
    )
    assert (status, body["message"]) == (400, "field label not supported: spec.replicas")
    status, safe = http(
        f"{base}/apis/amd.com/v1/workloads?labelSelector=primus-safe.cluster.id%3D{NAME}",
        token,
        server=server,
    )
    assert status == 200 and safe["items"] == everything["/apis/amd.com/v1/workloads"]
    status, body = http(f"{base}/apis/amd.com/v1/namespaces/x/workloads", token, server=server)
    assert status == 404  # cluster-scoped: no namespaced path
    status, namespace_object = http(f"{base}/api/v1/namespaces/juicefs", token, server=server)
    assert status == 200 and namespace_object["status"]["phase"] == "Active"


def test_a_rayservice_is_what_kuberay_makes_of_it(served, everything) -> None:
    """KubeRay's RayService (ray-operator/apis/ray/v1/rayservice_types.go, its controller): the
    RayCluster it makes is `<service>-<5>`, owned by it as controller, labelled with where it came from
    and annotated with the service's annotations and KubeRay's own; its pods carry `ray.io/serve`;
    the service is Ready with as many serve endpoints as pods run."""
    services = everything["/apis/ray.io/v1/rayservices"]
    assert services
    clusters = {c["metadata"]["name"]: c for c in everything["/apis/ray.io/v1/rayclusters"]}
    pods = everything["/api/v1/pods"]
    for service in services:
        metadata, status = service["metadata"], service["status"]
        assert service["spec"]["serveConfigV2"].startswith("applications:\n")
        assert "kubectl.kubernetes.io/last-applied-configuration" in metadata["annotations"]
        (cluster,) = [
            c
            for c in clusters.values()
            if c["metadata"].get("ownerReferences", [{}])[0].get("uid") == metadata["uid"]
        ]
        reference = cluster["metadata"]["ownerReferences"][0]
        assert (reference["kind"], reference["apiVersion"], reference["controller"]) == (
            "RayService",
            "ray.io/v1",
            True,
        )
        name = cluster["metadata"]["name"]
        assert name.startswith(f"{metadata['name']}-") and len(name) == len(metadata["name"]) + 6
        assert cluster["metadata"]["labels"] == {
            "ray.io/originated-from-crd": "RayService",
            "ray.io/originated-from-cr-name": metadata["name"],
        }
        annotations = cluster["metadata"]["annotations"]
        assert annotations.items() >= metadata["annotations"].items()
        assert annotations["ray.io/num-worker-groups"] == "1"
        assert len(annotations["ray.io/hash-without-replicas-and-workers-to-delete"]) == 32
        assert cluster["spec"] == service["spec"]["rayClusterConfig"]
        own = [p for p in pods if p["metadata"].get("labels", {}).get("ray.io/cluster") == name]
        assert own and all(
            p["metadata"]["ownerReferences"][0]["uid"] == cluster["metadata"]["uid"] for p in own
        )
        assert all(
            p["metadata"]["labels"]["ray.io/identifier"]
            == f"{name}-{p['metadata']['labels']['ray.io/node-type']}"
            for p in own
        )
        assert all(
            p["metadata"]["labels"]["ray.io/serve"] == "true"
            for p in own
            if p["metadata"]["labels"]["ray.io/node-type"] == "worker"
        )
        running = sum(
            1 for p in own if p["status"]["phase"] == "Running" and "deletionTimestamp" not in p["metadata"]
        )
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        if running:
            assert ready["status"] == "True" and ready["reason"] == "NonZeroServeEndpoints"
            assert (status["serviceStatus"], status["numServeEndpoints"]) == ("Running", running)
            assert status["activeServiceStatus"]["rayClusterName"] == name
        else:
            assert ready["status"] == "False" and "serviceStatus" not in status
    # Its printer columns (the CRD's additionalPrinterColumns, both of type string).
    fleet, server, _ = served
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    status, table = http(
        f"{server.base_url(NAME)}/apis/ray.io/v1/rayservices",
        fleet.cluster(NAME).token,
        accept=accept,
        server=server,
    )
    assert status == 200
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Name",
        "service status",
        "num serve endpoints",
        "Age",
    ]
    for row, service in zip(table["rows"], services, strict=True):
        endpoints = service["status"].get("numServeEndpoints")
        assert row["cells"][1:3] == [
            service["status"].get("serviceStatus"),
            None if endpoints is None else str(endpoints),
        ]


def test_tables_for_kubectl(served) -> None:
    fleet, server, _ = served
    token = fleet.cluster(NAME).token
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    status, table = http(f"{server.base_url(NAME)}/api/v1/pods?limit=4", token, accept=accept, server=server)
    assert status == 200 and table["kind"] == "Table" and table["metadata"]["continue"]
    assert [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
    ]
    assert len(table["rows"]) == 4 and table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


# -- kubectl -----------------------------------------------------------------------------------

KUBECTL = shutil.which("kubectl")


def _kubectl(served, tmp_path: Path, *args: str) -> str:
    skip_unless(KUBECTL is not None, "kubectl is not installed (Debian: kubernetes-client)")
    _, _, registry = served
    env = {**os.environ, "KUBECONFIG": str(registry.parent / "kubeconfigs" / f"{NAME}.yaml")}
    done = subprocess.run(
        [KUBECTL, "--cache-dir", str(tmp_path / "kube-cache"), *args],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kubectl_get_nodes(served, everything, tmp_path) -> None:
    out = _kubectl(served, tmp_path, "get", "nodes")
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert [line.split()[0] for line in lines[1:]] == [
        n["metadata"]["name"] for n in everything["/api/v1/nodes"]
    ]


def test_kubectl_get_pods_in_chunks(served, everything, tmp_path) -> None:
    fleet, _, _ = served
    cluster = fleet.cluster(NAME)
    cluster.request_log.reset()
    out = _kubectl(served, tmp_path, "get", "pods", "-A", "--chunk-size=7")
    lines = out.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert ["/".join(line.split()[:2]) for line in lines[1:]] == [
        key_of(p) for p in everything["/api/v1/pods"]
    ]
    pods = len(everything["/api/v1/pods"])
    assert cluster.request_count("/api/v1/pods") == -(-pods // 7)
    names = _kubectl(served, tmp_path, "get", "pods", "-n", "kube-system", "-o", "name").split()
    assert names and all(n.startswith("pod/kube-proxy-") for n in names)


def test_kubectl_get_deployments_and_pytorchjobs(served, everything, tmp_path) -> None:
    out = _kubectl(served, tmp_path, "get", "deployments", "-A")
    assert out.splitlines()[0].split() == ["NAMESPACE", "NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    assert len(out.splitlines()) - 1 == len(everything["/apis/apps/v1/deployments"])
    out = _kubectl(served, tmp_path, "get", "pytorchjobs", "-A")
    assert out.splitlines()[0].split() == ["NAMESPACE", "NAME", "STATE", "AGE"]
    assert {line.split()[1] for line in out.splitlines()[1:]} == {
        j["metadata"]["name"] for j in everything["/apis/kubeflow.org/v1/pytorchjobs"]
    }
    as_json = json.loads(_kubectl(served, tmp_path, "get", "workloads.amd.com", "-o", "json"))
    assert [w["metadata"]["uid"] for w in as_json["items"]] == [
        w["metadata"]["uid"] for w in everything["/apis/amd.com/v1/workloads"]
    ]


def test_kubectl_get_rayservices(served, everything, tmp_path) -> None:
    """kubectl prints the CRD's printer columns as kube-apiserver fills them."""
    out = _kubectl(served, tmp_path, "get", "rayservices", "-A")
    lines = out.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "SERVICE", "STATUS", "NUM", "SERVE", "ENDPOINTS", "AGE"]
    rows = {line.split()[1]: line.split() for line in lines[1:]}
    services = everything["/apis/ray.io/v1/rayservices"]
    assert rows.keys() == {s["metadata"]["name"] for s in services}
    for service in services:
        status = service["status"]
        if "serviceStatus" in status:
            assert rows[service["metadata"]["name"]][2:4] == ["Running", str(status["numServeEndpoints"])]


def test_kubectl_api_resources(served, tmp_path) -> None:
    out = _kubectl(served, tmp_path, "api-resources", "--no-headers")
    rows = {line.split()[0]: line.split() for line in out.splitlines()}
    assert set(rows) == {path.rsplit("/", 1)[1] for path, _ in COLLECTIONS}
    assert rows["pytorchjobs"][-3:] == ["kubeflow.org/v1", "true", "PyTorchJob"]
    assert rows["workloads"][-3:] == ["amd.com/v1", "false", "Workload"]
    assert rows["deployments"][1:] == ["deploy", "apps/v1", "true", "Deployment"]


def test_kubectl_reaches_prometheus_through_the_service_proxy(served, tmp_path) -> None:
    """kubectl, a client of its own, holds the simulator's service proxy to the API server's: the
    Service's port by name answers what Prometheus answers; without the port, the API server's
    Status."""
    _, server, registry = served
    query = "/api/v1/query?query=count(up)"
    # `--raw` takes the path from the server's root: the simulator serves each cluster below its own.
    proxy = f"/clusters/{NAME}{PROXY_PATH}"
    through = json.loads(_kubectl(served, tmp_path, "get", "--raw", proxy + query))
    direct = requests.get(
        server.prometheus_url(NAME) + query, verify=registry.parent / "sim-ca.crt", timeout=30
    )
    assert through["status"] == "success" and through["data"]["result"]
    assert through["data"]["result"][0]["value"][1] == direct.json()["data"]["result"][0]["value"][1]
    bare = proxy.replace(":web/proxy", "/proxy")
    done = subprocess.run(
        [KUBECTL, "--cache-dir", str(tmp_path / "kube-cache"), "get", "--raw", bare + query],
        env={**os.environ, "KUBECONFIG": str(registry.parent / "kubeconfigs" / f"{NAME}.yaml")},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and "no endpoints available" in done.stderr, done.stderr
