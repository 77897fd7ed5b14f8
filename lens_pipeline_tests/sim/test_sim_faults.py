"""Injected faults as the official client meets them: error statuses, slow answers, dropped
connections, expired continue tokens, rotated tokens, RBAC denials, and malformed objects."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
from kubernetes import client

from lens_pipeline.sim import SimCluster, SimFleet, SimServer, write_registry
from lens_pipeline_tests.sim.support import (
    api_client,
    continue_token,
    control,
    http,
    list_raw,
    owner_walk,
    truth,
)

SEED = 5


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[SimCluster, SimServer, Path]]:
    fleet = SimFleet.generate(clusters=1, nodes=6, seed=SEED, vendor="amd")
    registry = tmp_path / "clusters.yaml"
    with SimServer(fleet) as server:
        write_registry(registry, server)
        yield fleet.clusters[0], server, registry


def _core(registry: Path, name: str, retries: int = 0) -> client.CoreV1Api:
    api = api_client(registry, name)
    api.configuration.retries = retries
    api.rest_client.pool_manager.connection_pool_kw["retries"] = retries
    return client.CoreV1Api(api)


def test_status_faults_answer_every_call_until_cleared(sim) -> None:
    cluster, server, registry = sim
    core = _core(registry, cluster.name)
    for status in (500, 503, 429):
        assert control(server, cluster.name, action="set_fault", target="kube", status=status)[0] == 200
        with pytest.raises(client.ApiException) as raised:
            core.list_node(limit=1)
        assert raised.value.status == status
        assert json.loads(raised.value.body)["kind"] == "Status"
    assert control(server, cluster.name, action="clear_faults")[0] == 200
    assert core.list_node(limit=1).items
    assert control(server, cluster.name, action="set_fault", target="kube", status=200)[0] == 400


def test_slow_responses_are_measurably_slow(sim) -> None:
    cluster, _, registry = sim
    core = _core(registry, cluster.name)
    cluster.set_fault("kube", delay=0.4)
    started = time.perf_counter()
    core.list_node(limit=1)
    assert time.perf_counter() - started >= 0.4
    cluster.set_fault("kube")
    started = time.perf_counter()
    core.list_node(limit=1)
    assert time.perf_counter() - started < 0.4


@pytest.mark.parametrize("mode", ["refuse", "reset"])
def test_dropped_connections_raise_in_the_client(sim, mode) -> None:
    cluster, server, registry = sim
    core = _core(registry, cluster.name)
    cluster.set_fault("kube", connection=mode)
    with pytest.raises(urllib3.exceptions.HTTPError) as raised:
        core.list_node(limit=1)
    reason = str(raised.value)
    assert (
        ("reset" in reason.lower())
        if mode == "reset"
        else ("without response" in reason or "aborted" in reason.lower())
    )
    # The fault is the Kubernetes API's only: Prometheus and the simulator's own endpoints answer.
    assert http(f"{server.prometheus_url(cluster.name)}/api/v1/query?query=count(gpu_gfx_activity)")[0] == 200
    assert truth(server, cluster.name)["nodes"]
    cluster.clear_faults()
    assert core.list_node(limit=1).items


def test_the_next_continue_answers_410_once(sim) -> None:
    cluster, _, registry = sim
    core = _core(registry, cluster.name)
    page = core.list_pod_for_all_namespaces(limit=4)
    cluster.expire_next_continue()
    with pytest.raises(client.ApiException) as raised:
        core.list_pod_for_all_namespaces(limit=4, _continue=continue_token(page.metadata))
    assert raised.value.status == 410
    assert json.loads(raised.value.body)["reason"] == "Expired"
    again = core.list_pod_for_all_namespaces(limit=4, _continue=continue_token(page.metadata))
    assert again.items  # one-shot: the same token works once the fault is spent


def test_a_rotated_token_answers_401_until_the_client_has_the_new_one(sim) -> None:
    cluster, server, registry = sim
    old = _core(registry, cluster.name)
    status, body = control(server, cluster.name, action="rotate_token")
    assert status == 200 and body["result"] == cluster.token
    with pytest.raises(client.ApiException) as raised:
        old.list_node(limit=1)
    assert (raised.value.status, json.loads(raised.value.body)["reason"]) == (401, "Unauthorized")
    write_registry(registry, server)
    assert _core(registry, cluster.name).list_node(limit=1).items


def test_forbidden_paths_answer_403_and_others_do_not(sim) -> None:
    cluster, server, registry = sim
    core = _core(registry, cluster.name)
    assert control(server, cluster.name, action="forbid", path="/api/v1/secrets")[0] == 200
    cluster.forbid("/api/v1/namespaces/juicefs/secrets")
    with pytest.raises(client.ApiException) as raised:
        core.list_secret_for_all_namespaces()
    body = json.loads(raised.value.body)
    assert (raised.value.status, body["reason"]) == (403, "Forbidden")
    assert body["message"].startswith(
        'secrets is forbidden: User "system:serviceaccount:lens:lens-collector" cannot list'
    )
    with pytest.raises(client.ApiException) as raised:
        core.read_namespaced_secret("juicefs-secret-data", "juicefs")
    assert raised.value.status == 403
    assert core.list_node(limit=1).items and core.list_namespaced_secret("ml-train").items
    cluster.clear_faults()
    assert core.list_secret_for_all_namespaces().items


def test_malformed_objects_are_served_but_never_in_the_truth(sim) -> None:
    cluster, server, registry = sim
    before = truth(server, cluster.name)
    status, body = control(server, cluster.name, action="inject_malformed")
    assert status == 200
    injected = body["result"]
    assert len(injected) == 16 and any(i.startswith("replicasets/") for i in injected)
    api = api_client(registry, cluster.name)
    nodes, _ = list_raw(api, "/api/v1/nodes", limit=3)
    pods, _ = list_raw(api, "/api/v1/pods", limit=3)
    assert {"kind": "Node", "apiVersion": "v1", "spec": {}, "status": {}} in nodes
    assert any(isinstance(p.get("spec", {}).get("containers"), dict) for p in pods)
    assert any("status" not in p for p in pods)
    names = {n.get("metadata", {}).get("name") for n in nodes}
    assert any(str(n).startswith("malformed-capacity-") for n in names)
    # Owner problems: an unknown kind, a cycle, an owner in another namespace, a missing owner.
    objects = {path: list_raw(api, path)[0] for path in (
        "/api/v1/pods", "/apis/apps/v1/replicasets", "/apis/batch/v1/jobs", "/apis/apps/v1/deployments",
        "/apis/apps/v1/statefulsets", "/apis/apps/v1/daemonsets", "/apis/batch/v1/cronjobs",
        "/apis/kubeflow.org/v1/pytorchjobs", "/apis/kubeflow.org/v1/mpijobs", "/apis/ray.io/v1/rayjobs",
        "/apis/ray.io/v1/rayclusters", "/apis/ray.io/v1/rayservices", "/apis/amd.com/v1/workloads",
    )}  # fmt: skip
    broken = {uid for uid, chain in owner_walk(objects).items() if chain is None}
    prefixes = ("unknown-owner-", "cycle-a-", "elsewhere-", "orphan-")
    injected_pods = {
        p["metadata"]["uid"] for p in pods if p.get("metadata", {}).get("name", "").startswith(prefixes)
    }
    assert len(injected_pods) == 4 and broken == injected_pods
    # The truth is what it was: injected objects are not part of the cluster a pipeline must mirror.
    after = truth(server, cluster.name)
    assert after == before
    # Tables for kubectl survive them too.
    status, table = http(
        f"{server.base_url(cluster.name)}/api/v1/pods", cluster.token,
        accept="application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )  # fmt: skip
    assert status == 200 and len(table["rows"]) == len(pods)
    with pytest.raises(ValueError, match="unknown malformed variants"):
        cluster.inject_malformed(["pod-made-of-cheese"])


def test_prometheus_faults_are_separate(sim) -> None:
    cluster, server, registry = sim
    cluster.set_fault("prometheus", 503, delay=0.2)
    started = time.perf_counter()
    status, body = http(f"{server.prometheus_url(cluster.name)}/api/v1/query?query=count(gpu_gfx_activity)")
    assert (status, body["status"]) == (503, "error") and time.perf_counter() - started >= 0.2
    assert _core(registry, cluster.name).list_node(limit=1).items
    with pytest.raises(ValueError, match="connection fault"):
        cluster.set_fault("prometheus", connection="sometimes")
