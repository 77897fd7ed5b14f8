"""`Reflector`: a collection of a simulated cluster kept by list and watch through the official
client, equal to a fresh LIST after churn, listed again after 410 Gone, and back after the API
server failed for a while."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import orjson
import pytest

from lens_pipeline.clusters import ClusterConfig
from lens_pipeline.kube.reader import KubeError, KubeReader
from lens_pipeline.kube.watch import Reflector, object_key
from lens_pipeline.retry import Backoff
from lens_pipeline.sim import SimCluster, SimFleet, SimServer

NAME = "sim-nvidia-0"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[SimCluster, SimServer]]:
    fleet = SimFleet.generate(clusters=1, nodes=12, seed=5, vendor="nvidia", pods_per_node=3)
    with SimServer(fleet) as server:
        yield fleet.cluster(NAME), server


def _reader(cluster: SimCluster, server: SimServer) -> KubeReader:
    config = ClusterConfig(
        name=NAME, server=server.base_url(NAME), token=cluster.token, request_timeout_seconds=5
    )
    return KubeReader(config, page_size=50)


def _versions(obj: dict) -> tuple[str, str]:
    return object_key(obj), obj["metadata"]["resourceVersion"]


def _until(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


class Running:
    def __init__(self, reflector: Reflector) -> None:
        self.reflector, self.stop = reflector, threading.Event()
        self.thread = threading.Thread(target=reflector.run, args=(self.stop,), daemon=True)

    def __enter__(self) -> Reflector:
        self.thread.start()
        return self.reflector

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()


def test_what_the_reflector_keeps_is_a_fresh_list_after_churn(served) -> None:
    cluster, server = served
    reader = _reader(cluster, server)
    with Running(Reflector(reader, "/api/v1/pods", _versions, watch_seconds=2)) as reflector:
        _until(lambda: reflector.snapshot().synced_at is not None)
        listed = reader.stats.pages
        cluster.churn(6)

        def caught_up() -> bool:
            return reflector.snapshot().items == reader.list("/api/v1/pods", _versions)

        _until(caught_up)
        stats = reflector.stats
        assert stats.lists == 1 and stats.expired == 0 and stats.failures == 0
        assert stats.events.get("ADDED", 0) + stats.events.get("MODIFIED", 0) > 0
        assert reflector.snapshot().error == ""
        assert listed >= 2  # the first list was paged


def test_a_version_no_longer_kept_is_listed_again(served) -> None:
    cluster, server = served
    reader = _reader(cluster, server)
    reflector = Reflector(reader, "/api/v1/pods", _versions, watch_seconds=1)
    reflector.relist()
    cluster.set_watch_history(3)
    try:
        cluster.churn(4)  # more changes than kept
        with pytest.raises(KubeError) as gone:
            reflector.watch_once(threading.Event())
        assert gone.value.status == 410
        with Running(reflector):
            _until(lambda: reflector.stats.lists == 2)
            _until(lambda: reflector.snapshot().items == reader.list("/api/v1/pods", _versions))
    finally:
        cluster.set_watch_history(5_000)
    assert reflector.stats.failures == 0


def test_a_failing_api_server_is_said_and_the_reflector_comes_back(served) -> None:
    cluster, server = served
    reader = _reader(cluster, server)
    reader.max_retries = 0
    quick = Backoff(first=0.05, factor=1.0, cap=0.05)
    with Running(Reflector(reader, "/api/v1/nodes", _versions, watch_seconds=1, backoff=quick)) as reflector:
        _until(lambda: reflector.snapshot().synced_at is not None)
        cluster.set_fault("kube", 503)
        try:
            _until(lambda: "503" in reflector.snapshot().error)
            kept = reflector.snapshot()
            assert kept.items and reflector.stats.failures >= 1  # what was kept is still there
        finally:
            cluster.set_fault("kube")
        cluster.set_node_ready(cluster.node_names()[0], False)
        _until(lambda: reflector.snapshot().items == reader.list("/api/v1/nodes", _versions))
        _until(lambda: reflector.snapshot().error == "")


def test_a_kind_kept_on_a_guess_that_the_cluster_does_not_serve_is_let_go(served) -> None:
    """`absent_ok` (lens watch's collections kept from the start): a first list answered 404 (no
    such CRD) ends the reflector, `absent`, no failure counted; without it, a failure tried again."""
    cluster, server = served
    quick = Backoff(first=0.05, factor=1.0, cap=0.05)
    path = "/apis/jobset.x-k8s.io/v1alpha2/jobsets"
    reader = _reader(cluster, server)
    reader.max_retries = 0
    guess = Reflector(reader, path, _versions, watch_seconds=1, backoff=quick, absent_ok=True)
    running = Running(guess)
    with running:
        running.thread.join(timeout=10)
        assert not running.thread.is_alive()  # ended by itself
    assert guess.absent and not guess.listing and guess.stats.failures == 0 and guess.stats.lists == 0

    # Credentials that may not list it (403): let go the same way.
    cluster.set_fault("kube", 403)
    try:
        forbidden = Reflector(
            _reader(cluster, server), "/api/v1/nodes", _versions, backoff=quick, absent_ok=True
        )
        forbidden.reader.max_retries = 0
        running = Running(forbidden)
        with running:
            running.thread.join(timeout=10)
            assert not running.thread.is_alive()  # ended by itself
        assert forbidden.absent and forbidden.stats.failures == 0
    finally:
        cluster.set_fault("kube")

    asked = Reflector(_reader(cluster, server), path, _versions, watch_seconds=1, backoff=quick)
    with Running(asked):
        _until(lambda: asked.stats.failures >= 2)  # a run asked for it: a failure, tried again
        assert not asked.absent and "404" in asked.snapshot().error

    # A kind it serves is kept as always.
    served_kind = Reflector(
        _reader(cluster, server), "/api/v1/nodes", _versions, watch_seconds=1, absent_ok=True
    )
    with Running(served_kind):
        _until(lambda: served_kind.snapshot().synced_at is not None)
        assert not served_kind.absent and served_kind.snapshot().items


def test_after_the_api_server_was_unreachable_the_reflector_lists_again(served) -> None:
    """A reader that met an unreachable API server refuses further requests at once (a run's
    reader does not wait out the same timeouts twice); the reflector's tries again for real."""
    cluster, server = served
    reader = _reader(cluster, server)
    reader.max_retries = 0
    quick = Backoff(first=0.05, factor=1.0, cap=0.05)
    reflector = Reflector(reader, "/api/v1/nodes", _versions, watch_seconds=1, backoff=quick)
    cluster.set_fault("kube", connection="refuse")
    try:
        with Running(reflector):
            _until(lambda: reflector.stats.failures >= 2)
            assert reflector.snapshot().synced_at is None and reflector.snapshot().error
            cluster.set_fault("kube")
            fresh = _reader(cluster, server)
            _until(lambda: reflector.snapshot().items == fresh.list("/api/v1/nodes", _versions))
    finally:
        cluster.set_fault("kube")
    assert reflector.snapshot().error == ""


def test_a_version_the_server_has_not_reached_is_listed_again(served, monkeypatch) -> None:
    """A watch from a version ahead of the server's (the list came from a server the watch's is
    behind, or etcd was restored) is answered 504 "Too large resource version": as client-go does,
    the reflector lists again instead of asking for the same version for ever."""
    from lens_pipeline.sim import kubeapi

    cluster, server = served
    monkeypatch.setattr(kubeapi, "TOO_LARGE_WAIT_SECONDS", 0.2)
    reader = _reader(cluster, server)
    with Running(Reflector(reader, "/api/v1/nodes", _versions, watch_seconds=1)) as reflector:
        _until(lambda: reflector.snapshot().synced_at is not None)
        with reflector._lock:  # what a list from a server ahead would have left
            reflector._version = str(cluster.resource_version + 1_000)
        _until(lambda: reflector.stats.lists >= 2)
        _until(lambda: reflector.snapshot().resource_version == str(cluster.resource_version))
        assert reflector.stats.expired >= 1 and reflector.stats.failures == 0
        assert reflector.snapshot().items == reader.list("/api/v1/nodes", _versions)


def test_an_unexpected_error_is_said_and_the_reflector_goes_on(served) -> None:
    """A bug in what keeps the objects (here a projection that fails once) does not end the watch
    for good: it is counted and kept as the error, and the next try lists again."""
    cluster, server = served
    failed: list[str] = []

    def project(obj: dict) -> tuple[str, str]:
        if not failed:
            failed.append(object_key(obj))
            raise RuntimeError("a bug")
        return _versions(obj)

    quick = Backoff(first=0.05, factor=1.0, cap=0.05)
    reflector = Reflector(_reader(cluster, server), "/api/v1/nodes", project, watch_seconds=1, backoff=quick)
    with Running(reflector):
        _until(lambda: reflector.snapshot().synced_at is not None)
    assert reflector.stats.failures == 1 and "RuntimeError: a bug" in reflector.stats.last_error
    assert reflector.snapshot().error == "" and len(reflector.snapshot().items) > 1


def test_a_watch_event_that_is_not_json_is_a_clear_error() -> None:
    from lens_pipeline.kube.reader import _parse_event

    with pytest.raises(KubeError, match="not JSON"):
        _parse_event("c", "/api/v1/pods", b"{nope")
    with pytest.raises(KubeError, match="not a watch event"):
        _parse_event("c", "/api/v1/pods", orjson.dumps({"type": "SOMETHING", "object": {}}))
    assert object_key({"metadata": {"namespace": "a", "name": "b"}}) == "a/b"
    assert object_key({"metadata": {"name": "n"}}) == "n"
    assert object_key([1]).startswith("\x00")
