"""The simulator's watches, through the official client's `Watch` and through kubectl: the changes
after a list's resourceVersion in order, the initial ADDED events of a watch without one, 410
Expired once the changes are no longer kept, bookmarks, selectors and the server's timeout."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.client import HTTPResponse, HTTPSConnection
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from kubernetes import client, watch

from lens_pipeline.sim import SimFleet, SimServer, kubeapi, write_registry
from lens_pipeline_tests.conftest import skip_unless
from lens_pipeline_tests.sim.support import api_client, http

NAME = "sim-amd-0"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimFleet, SimServer, Path]]:
    fleet = SimFleet.generate(clusters=1, nodes=8, seed=11, vendor="amd", pods_per_node=1)
    registry = tmp_path_factory.mktemp("sim-watch") / "clusters.yaml"
    with SimServer(fleet, tls=True) as server:
        write_registry(registry, server)
        yield fleet, server, registry


@pytest.fixture
def v1(served) -> client.CoreV1Api:
    return client.CoreV1Api(api_client(served[2], NAME))


def _free_node(fleet: SimFleet) -> str:
    cluster = fleet.cluster(NAME)
    return max(cluster.node_names(), key=lambda node: cluster.free_gpus(node))


def _events(stream: Iterator[dict]) -> list[tuple[str, str, str]]:
    return [
        (e["type"], (e["raw_object"].get("metadata") or {}).get("name", ""), e["raw_object"]["metadata"]["resourceVersion"])
        for e in stream
    ]  # fmt: skip


def test_a_watch_from_a_lists_version_sees_a_pods_life_in_order(served, v1) -> None:
    fleet, _, _ = served
    cluster = fleet.cluster(NAME)
    cluster.set_watch_history(5_000)
    listed = v1.list_pod_for_all_namespaces()
    name = cluster.add_gpu_pod(_free_node(fleet), 1)
    cluster.set_pod_phase("default", name, "Succeeded")
    cluster.remove_pod("default", name)
    seen = _events(
        watch.Watch().stream(
            v1.list_pod_for_all_namespaces,
            resource_version=listed.metadata.resource_version,
            timeout_seconds=1,
        )
    )
    mine = [(kind, version) for kind, pod, version in seen if pod == name]
    assert [kind for kind, _ in mine] == ["ADDED", "MODIFIED", "DELETED"]
    versions = [int(version) for _, _, version in seen]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert int(mine[-1][1]) <= cluster.resource_version
    # Everything it reported is what a list now shows: the pod is gone, the others unchanged.
    after = {p.metadata.name for p in v1.list_pod_for_all_namespaces().items}
    assert name not in after and {p.metadata.name for p in listed.items} - {name} <= after


def test_a_watch_without_a_version_starts_with_every_object_of_its_namespace(served, v1) -> None:
    listed = [p.metadata.name for p in v1.list_namespaced_pod("kube-system").items]
    seen = _events(watch.Watch().stream(v1.list_namespaced_pod, "kube-system", timeout_seconds=1))
    assert [(kind, pod) for kind, pod, _ in seen] == [("ADDED", pod) for pod in listed]
    assert listed


def test_a_watch_from_before_the_kept_changes_is_told_410_and_a_relist_recovers(served, v1) -> None:
    fleet, _, _ = served
    cluster = fleet.cluster(NAME)
    listed = v1.list_pod_for_all_namespaces().metadata.resource_version
    cluster.set_watch_history(2)
    try:
        for _ in range(3):
            name = cluster.add_gpu_pod(_free_node(fleet), 1)
            cluster.remove_pod("default", name)
        with pytest.raises(client.ApiException) as gone:
            list(
                watch.Watch().stream(
                    v1.list_pod_for_all_namespaces, resource_version=listed, timeout_seconds=1
                )
            )
        assert gone.value.status == 410 and "too old resource version" in gone.value.reason
        again = v1.list_pod_for_all_namespaces().metadata.resource_version
        name = cluster.add_gpu_pod(_free_node(fleet), 1)
        seen = _events(
            watch.Watch().stream(v1.list_pod_for_all_namespaces, resource_version=again, timeout_seconds=1)
        )
        assert [(kind, pod) for kind, pod, _ in seen] == [("ADDED", name)]
        cluster.remove_pod("default", name)
    finally:
        cluster.set_watch_history(5_000)


def test_bookmarks_carry_the_current_version_when_asked_for(served, v1, monkeypatch) -> None:
    fleet, _, _ = served
    monkeypatch.setattr(kubeapi, "BOOKMARK_SECONDS", 0.2)
    listed = v1.list_node().metadata.resource_version
    stream = watch.Watch().stream(
        v1.list_node, resource_version=listed, allow_watch_bookmarks=True, timeout_seconds=1
    )
    seen = _events(stream)
    assert seen and {kind for kind, _, _ in seen} == {"BOOKMARK"}
    assert int(seen[-1][2]) == fleet.cluster(NAME).resource_version
    quiet = _events(watch.Watch().stream(v1.list_node, resource_version=listed, timeout_seconds=1))
    assert quiet == []


def test_selectors_filter_the_events_and_the_timeout_ends_the_stream(served, v1) -> None:
    fleet, _, _ = served
    cluster = fleet.cluster(NAME)
    listed = v1.list_pod_for_all_namespaces().metadata.resource_version
    name = cluster.add_gpu_pod(_free_node(fleet), 1)
    start = time.monotonic()
    other = _events(
        watch.Watch().stream(
            v1.list_pod_for_all_namespaces,
            resource_version=listed,
            field_selector="metadata.namespace=kube-system",
            timeout_seconds=1,
        )
    )
    assert other == [] and 0.9 < time.monotonic() - start < 5
    mine = _events(
        watch.Watch().stream(
            v1.list_pod_for_all_namespaces,
            resource_version=listed,
            field_selector="metadata.namespace=default",
            timeout_seconds=1,
        )
    )
    assert [(kind, pod) for kind, pod, _ in mine] == [("ADDED", name)]
    cluster.remove_pod("default", name)


def test_a_change_wakes_the_subscribers_of_its_resource_only(served) -> None:
    """What a watch is woken by: a change of its own resource, not of another (a cluster's dozen
    watches, lens watch keeping its owner kinds, are not all stepped at each pod that changes)."""
    fleet, _server, _registry = served
    cluster = fleet.cluster(NAME)
    node = cluster.node_names()[0]
    woken: list[str] = []
    cancels = [
        cluster.subscribe(resource, lambda r=resource: woken.append(r)) for resource in ("nodes", "jobs")
    ]
    try:
        cluster.set_node_ready(node, False)
        assert woken and set(woken) == {"nodes"}
        cancels[0]()
        woken.clear()
        cluster.set_node_ready(node, True)
        assert woken == []
    finally:
        for cancel in cancels:
            cancel()
        cluster.set_node_ready(node, True)


def _open_watch(server: SimServer, path: str, token: str) -> HTTPResponse:
    context = ssl.create_default_context(cadata=server.certificate.ca_pem.decode("ascii"))
    split = urlsplit(server.base_url(NAME))
    connection = HTTPSConnection(split.hostname, split.port, context=context, timeout=10)
    connection.request("GET", f"{split.path}{path}", headers={"Authorization": f"Bearer {token}"})
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Connection") == "close"
    return response


def test_many_watches_are_streamed_by_one_thread_and_a_client_that_goes_is_let_go(served) -> None:
    """Forty watches at once: every one sees the new pod, the server runs no thread per watch, and
    the watches whose clients close their connections are no longer streamed."""
    fleet, server, _ = served
    cluster = fleet.cluster(NAME)
    streams = server._httpd.watches
    before_streams, before_threads = len(streams), threading.active_count()
    listed = cluster.resource_version
    responses = [
        _open_watch(
            server, f"/api/v1/pods?watch=true&resourceVersion={listed}&timeoutSeconds=30", cluster.token
        )
        for _ in range(40)
    ]
    deadline = time.monotonic() + 10
    while len(streams) < before_streams + 40 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(streams) == before_streams + 40
    while threading.active_count() > before_threads + 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # the requests' threads end once they have handed their watch over
    assert threading.active_count() <= before_threads + 1  # a request's thread still ending, at most
    name = cluster.add_gpu_pod(_free_node(fleet), 1)
    try:
        for response in responses:
            event = json.loads(response.readline())
            assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", name)
    finally:
        cluster.remove_pod("default", name)
    for response in responses[:30]:
        response.close()
    while len(streams) > before_streams + 10 and time.monotonic() < deadline + 10:
        time.sleep(0.05)
    assert len(streams) == before_streams + 10
    for response in responses[30:]:
        response.close()


def test_a_bad_resource_version_is_a_400(served) -> None:
    fleet, server, _ = served
    token = fleet.cluster(NAME).token
    status, body = http(
        f"{server.base_url(NAME)}/api/v1/pods?watch=true&resourceVersion=abc", token, server=server
    )
    assert status == 400 and body["reason"] == "BadRequest" and "resourceVersion" in body["message"]


def test_a_watch_from_a_version_not_reached_waits_for_it_then_is_a_504(served, v1, monkeypatch) -> None:
    """As kube-apiserver's watch cache: a version ahead of the server's is waited for (3 s there),
    and the watch goes on when it is reached; else 504 Timeout, cause ResourceVersionTooLarge."""
    fleet, server, _ = served
    cluster = fleet.cluster(NAME)
    monkeypatch.setattr(kubeapi, "TOO_LARGE_WAIT_SECONDS", 0.5)
    ahead = cluster.resource_version + 1_000
    status, body = http(
        f"{server.base_url(NAME)}/api/v1/pods?watch=true&resourceVersion={ahead}",
        cluster.token,
        server=server,
    )
    assert status == 504 and body["reason"] == "Timeout"
    assert body["message"] == f"Timeout: Too large resource version: {ahead}, current: {ahead - 1_000}"
    assert body["details"]["causes"] == [
        {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
    ]

    monkeypatch.setattr(kubeapi, "TOO_LARGE_WAIT_SECONDS", 10.0)
    next_version = cluster.resource_version + 1
    added: list[str] = []
    threading.Timer(0.3, lambda: added.append(cluster.add_gpu_pod(_free_node(fleet), 1))).start()
    seen = _events(
        watch.Watch().stream(
            v1.list_pod_for_all_namespaces, resource_version=str(next_version), timeout_seconds=2
        )
    )
    assert added and ("ADDED", added[0]) in [(kind, pod) for kind, pod, _ in seen]
    cluster.remove_pod("default", added[0])


def test_kubectl_get_watch_shows_a_new_pod(served, tmp_path) -> None:
    kubectl = shutil.which("kubectl")
    skip_unless(kubectl is not None, "kubectl is not installed (Debian: kubernetes-client)")
    fleet, _, registry = served
    cluster = fleet.cluster(NAME)
    env = {**os.environ, "KUBECONFIG": str(registry.parent / "kubeconfigs" / f"{NAME}.yaml")}
    command = [
        kubectl,
        "--cache-dir",
        str(tmp_path / "cache"),
        "get",
        "pods",
        "-n",
        "default",
        "--watch",
        "-o",
        "name",
    ]
    watcher = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(watcher.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        before = [key for key in cluster.list_snapshot("pods").keys if key.startswith("default/")]
        deadline = time.monotonic() + 30
        while len(lines) < len(before) and time.monotonic() < deadline:
            time.sleep(0.1)
        name = cluster.add_gpu_pod(_free_node(fleet), 1)
        while f"pod/{name}\n" not in lines and time.monotonic() < deadline:
            time.sleep(0.1)
        assert f"pod/{name}\n" in lines, (lines, watcher.poll())
    finally:
        watcher.kill()
        watcher.wait()
    cluster.remove_pod("default", name)
