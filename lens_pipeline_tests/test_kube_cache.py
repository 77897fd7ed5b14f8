"""The watch cache (`kube/cache.py`) between a simulated cluster and `KubeReader`: what the runs
list comes from it once it holds the collection current, equal to the API server's LIST, paged;
from the API server (and said so) while it lists, when its watch fails, when it is unreachable,
and always for Secrets."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from lens_pipeline.clusters import ClusterConfig
from lens_pipeline.collect.objects import LAST_APPLIED
from lens_pipeline.kube.cache import (
    EVERY_RUN,
    WARM,
    WARM_OWNERS,
    WatchCache,
    WatchCacheServer,
    without_unread_fields,
)
from lens_pipeline.kube.reader import KUBE_FIELDS, KubeError, KubeReader, cacheable
from lens_pipeline.sim import SimCluster, SimFleet, SimServer

NAME = "sim-amd-0"
PODS = "/api/v1/pods"
NODES = "/api/v1/nodes"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[SimCluster, SimServer]]:
    fleet = SimFleet.generate(clusters=1, nodes=10, seed=3, vendor="amd", pods_per_node=3)
    with SimServer(fleet) as server:
        yield fleet.cluster(NAME), server


@pytest.fixture
def cache(served) -> Iterator[tuple[WatchCache, str]]:
    with _serving(served) as served_cache:
        yield served_cache


@contextlib.contextmanager
def _serving(served, tokens: tuple[str, ...] = (), **options: Any) -> Iterator[tuple[WatchCache, str]]:
    cluster, server = served
    config = _config(cluster, server)
    cache = WatchCache({NAME: config}, watch_seconds=2, tokens=tokens, **options)
    httpd = WatchCacheServer(cache)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield cache, httpd.url
    finally:
        cache.close()
        httpd.shutdown()
        httpd.server_close()


def _config(cluster: SimCluster, server: SimServer) -> ClusterConfig:
    return ClusterConfig(
        name=NAME, server=server.base_url(NAME), token=cluster.token, request_timeout_seconds=5
    )


def _reader(served, cache_url: str | None, page_size: int = 500, token: str | None = None) -> KubeReader:
    return KubeReader(
        _config(*served), page_size=page_size, max_retries=0, cache_url=cache_url, cache_token=token
    )


def _versions(obj: dict) -> tuple[str, str]:
    return obj["metadata"]["uid"], obj["metadata"]["resourceVersion"]


def _until(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def _served_from_cache(reader: KubeReader, path: str) -> bool:
    reader.list(path, _versions)
    return reader.stats.sources[path] == "watch cache"


def _listed(watch_cache: WatchCache) -> set[tuple[str, str]]:
    """The (cluster, path) of the collections the cache has listed (read from a copy taken under
    its lock: the warmer adds to them meanwhile)."""
    with watch_cache._lock:
        collections = dict(watch_cache._collections)
    return {key for key, c in collections.items() if c.reflector.status().synced_at is not None}


def _lists_of(cluster: SimCluster, path: str) -> list[str]:
    """The API server's LISTs of `path` (first pages: a list's later pages and watches apart)."""
    return [
        line
        for line in cluster.request_log.as_json()["recent"]
        if line.startswith(f"GET {path}?") and "watch=true" not in line and "continue=" not in line
    ]


def test_a_cold_cache_lists_once_and_the_first_run_reads_its_pages_as_they_arrive(served) -> None:
    cluster, _ = served
    cluster.set_fault("kube", delay=0.3)  # each page of the cache's list (5 pods) takes its time
    cluster.request_log.reset()
    listing_at_first_page: list[bool] = []
    try:
        with _serving(served, reader=lambda config: KubeReader(config, page_size=5)) as (watch_cache, url):

            def first_page(items: list, _version: str) -> None:
                if not listing_at_first_page:
                    (collection,) = watch_cache._collections.values()
                    listing_at_first_page.append(collection.reflector.status().synced_at is None)

            reader = _reader(served, url, page_size=7)
            streamed, _ = reader.list_versioned(PODS, _versions, progress=first_page)
            # Served by the cache while its own list was under way; the API server listed once.
            assert reader.stats.sources[PODS] == "watch cache"
            assert listing_at_first_page == [True]
            assert len(_lists_of(cluster, PODS)) == 1
            cluster.set_fault("kube")
            direct = _reader(served, None).list(PODS, _versions)
            assert sorted(streamed) == sorted(direct) and len(streamed) > 3 * 5
    finally:
        cluster.set_fault("kube")


def test_a_cold_list_restarted_under_the_run_makes_the_run_list_again_from_the_cache(served) -> None:
    cluster, _ = served
    cluster.set_fault("kube", delay=0.2)
    try:
        with _serving(served, reader=lambda config: KubeReader(config, page_size=5)) as (_, url):

            def first_page(items: list, _version: str) -> None:
                if reader.stats.restarts == 0 and len(items) <= 7:
                    cluster.expire_next_continue()  # the cache's next page: 410, its list restarts

            reader = _reader(served, url, page_size=7)
            streamed, _ = reader.list_versioned(PODS, _versions, progress=first_page)
            # The pages it had read were of a list that no longer is: it read them all again.
            assert reader.stats.restarts == 1 and reader.stats.sources[PODS] == "watch cache"
            cluster.set_fault("kube")
            assert sorted(streamed) == sorted(_reader(served, None).list(PODS, _versions))
    finally:
        cluster.clear_faults()  # the 410 too, had the list ended before it


class _FailsAtThirdPage(KubeReader):
    """The cache's reader: its list's third page is refused (as a token revoked mid-list would be)."""

    def _get(self, path: str, query: list[tuple[str, Any]]) -> tuple[int, bytes]:
        self.pages_asked = getattr(self, "pages_asked", 0) + any(k == "continue" for k, _ in query)
        if self.pages_asked >= 2:
            return 403, b'{"kind":"Status","message":"revoked mid-list","code":403}'
        return super()._get(path, query)


def test_a_cold_list_that_fails_after_its_first_pages_sends_the_run_to_the_api_server(served) -> None:
    cluster, _ = served
    cluster.set_fault("kube", delay=0.2)
    try:
        with _serving(served, reader=lambda config: _FailsAtThirdPage(config, page_size=5)) as (
            watch_cache,
            url,
        ):
            reader = _reader(served, url, page_size=3)
            listed = reader.list(PODS, _versions)
            # It had read pages of the cache's list; the list failed; it listed the API server.
            assert reader.stats.sources[PODS].startswith("API server (watch cache: HTTP 503")
            assert "revoked mid-list" in reader.stats.sources[PODS]
            assert reader.stats.restarts == 0
            assert not watch_cache._pages, "the failed list's pages are let go at once"
            cluster.set_fault("kube")
            assert sorted(listed) == sorted(_reader(served, None).list(PODS, _versions))
    finally:
        cluster.set_fault("kube")


def test_the_first_list_from_a_warm_cache_is_served_page_by_page(served, cache) -> None:
    cluster, _ = served
    _, url = cache
    reader = _reader(served, url, page_size=7)
    first = reader.list(PODS, _versions)
    _until(lambda: _served_from_cache(reader, PODS))
    cluster.request_log.reset()
    pages = reader.stats.pages
    cached = reader.list(PODS, _versions)
    assert reader.stats.sources[PODS] == "watch cache"
    # Not one LIST of the API server's: only the cache's own watch, renewed.
    asked = [line for line in cluster.request_log.as_json()["recent"] if line.startswith(f"GET {PODS}")]
    assert all("watch=true" in line for line in asked), asked
    assert cached == first == _reader(served, None).list(PODS, _versions)
    assert reader.stats.pages - pages == -(-len(cached) // 7)  # paged as asked
    # Pods are served cut down to what the collectors read (no image, no env...); nodes whole but
    # for the managedFields kube-apiserver writes into each object, which no collector reads.
    pod = reader.list(PODS, lambda obj: obj)[0]
    assert set(pod) == {"metadata", "spec", "status"} and "image" not in pod["spec"]["containers"][0]
    assert "managedFields" not in pod["metadata"]
    _until(lambda: _served_from_cache(reader, "/api/v1/nodes"))
    nodes = _reader(served, None).list("/api/v1/nodes", lambda obj: obj)
    assert all(node["metadata"].pop("managedFields") for node in nodes)
    assert reader.list("/api/v1/nodes", lambda obj: obj) == nodes
    # Ten thousand seconds later, with no word from the watch since: not served as current.
    watch_cache, _ = cache
    watch_cache.idle_seconds = 100_000
    watch_cache._clock = lambda: time.time() + 10_000
    assert reader.list(PODS, _versions) == first
    assert "no sign of life from its watch" in reader.stats.sources[PODS]


def test_a_run_waits_no_longer_than_it_said_nor_than_the_cache_allows(served) -> None:
    cluster, server = served
    cluster.set_fault("kube", delay=1.5)  # the cache's list: two requests (discovery apart) of 1.5 s
    try:
        with _serving(served) as (watch_cache, url):
            watch_cache.max_wait_seconds = 0.5
            reader = KubeReader(_config(cluster, server), max_retries=0, cache_url=url, cache_wait_seconds=30)
            started = time.monotonic()
            reader.list(NODES, _versions)
            # Held for the cache's limit, then told why, and listed from the API server.
            assert "the first page of its list did not arrive in 0.5 s" in reader.stats.sources[NODES]
            assert time.monotonic() - started < 1.5 + 5
            impatient = KubeReader(
                _config(cluster, server), max_retries=0, cache_url=url, cache_wait_seconds=0
            )
            impatient.list(PODS, _versions)
            assert "not kept before: it is being listed now" in impatient.stats.sources[PODS]
    finally:
        cluster.set_fault("kube")


def test_a_cold_list_that_fails_ends_the_wait_with_its_reason(served) -> None:
    cluster, server = served
    cluster.set_fault("kube", 403)
    try:
        with _serving(served) as (_, url):
            reader = KubeReader(_config(cluster, server), max_retries=0, cache_url=url, cache_wait_seconds=30)
            started = time.monotonic()
            with pytest.raises(KubeError, match="HTTP 403"):
                reader.list(NODES, _versions)
            assert time.monotonic() - started < 10, "the wait ended with the failed list"
            assert "not listed yet" in reader.stats.sources[NODES] and "403" in reader.stats.sources[NODES]
    finally:
        cluster.set_fault("kube")


def test_what_the_cache_serves_follows_churn(served, cache) -> None:
    cluster, _ = served
    _, url = cache
    reader, direct = _reader(served, url), _reader(served, None)
    _until(lambda: _served_from_cache(reader, PODS))
    cluster.churn(5)
    _until(lambda: reader.list(PODS, _versions) == direct.list(PODS, _versions))
    assert reader.stats.sources[PODS] == "watch cache"


def test_a_failing_api_server_makes_the_cache_step_aside_and_say_why(served, cache) -> None:
    cluster, _ = served
    watch_cache, url = cache
    reader = _reader(served, url)
    _until(lambda: _served_from_cache(reader, "/api/v1/nodes"))
    cluster.set_fault("kube", 500)
    try:
        # The cache's watch fails at its next request (it asks again every 2 s here): it then
        # answers 503, and the reader goes to the API server, which fails the run as without a cache.
        _until(
            lambda: (
                'lens_watch_cache_served{cluster="sim-amd-0",path="/api/v1/nodes"} 0' in watch_cache.metrics()
            )
        )
        with pytest.raises(KubeError, match="HTTP 500"):
            reader.list("/api/v1/nodes", _versions)
        assert "not current, the API server failed" in reader.stats.sources["/api/v1/nodes"]
    finally:
        cluster.set_fault("kube")
    _until(lambda: _served_from_cache(reader, "/api/v1/nodes"), seconds=60)
    assert (
        'lens_watch_cache_failures_total{cluster="sim-amd-0",path="/api/v1/nodes"}' in watch_cache.metrics()
    )


def test_an_unreachable_cache_and_secrets_go_to_the_api_server(served) -> None:
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]  # closed when the block ends: nothing listens there
    reader = _reader(served, f"http://127.0.0.1:{port}")
    nodes = reader.list("/api/v1/nodes", _versions)
    assert nodes and reader.stats.sources["/api/v1/nodes"].startswith("API server (watch cache: unreachable")
    assert not cacheable("/api/v1/secrets") and not cacheable("/api/v1/namespaces/juicefs/secrets")
    assert cacheable("/apis/kubeflow.org/v1/pytorchjobs") and cacheable(PODS)
    reader.list("/api/v1/secrets", _versions)
    assert "/api/v1/secrets" not in reader.stats.sources


def test_what_the_cache_refuses(served, cache) -> None:
    _, url = cache

    def get(path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(url + path, timeout=5) as response:
                return response.status, orjson.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, orjson.loads(error.read())

    assert get("/clusters/nope/api/v1/pods")[0] == 404
    assert get(f"/clusters/{NAME}/api/v1/secrets")[0] == 404
    status, body = get(f"/clusters/{NAME}/api/v1/pods?labelSelector=a%3Db")
    assert status == 400 and "whole lists only" in body["message"]
    assert get(f"/clusters/{NAME}/api/v1/pods?limit=5&continue=999:5")[0] == 410
    with urllib.request.urlopen(url + "/healthz", timeout=5) as response:
        assert response.read() == b"ok\n"


def test_a_cache_with_tokens_serves_objects_only_to_a_run_bearing_one(served) -> None:
    """Tokens "new,old" (a rotation): a run with either is served; one without, or with another, is
    refused 401, counted, and lists from the API server, saying why. /healthz and /metrics ask for
    no token."""
    with _serving(served, tokens=("new", "old")) as (watch_cache, url):
        for token in (None, "nope"):
            reader = _reader(served, url, token=token)
            assert reader.list("/api/v1/nodes", _versions)
            assert "missing or wrong bearer token" in reader.stats.sources["/api/v1/nodes"]
        assert watch_cache.refused == 2
        assert not watch_cache._collections, "a refused request started a watch"
        for token in ("old", "new"):
            reader = _reader(served, url, token=token)
            _until(lambda reader=reader: _served_from_cache(reader, "/api/v1/nodes"))
        assert watch_cache.refused == 2

        request = urllib.request.Request(f"{url}/clusters/{NAME}/api/v1/nodes")
        request.add_header("Authorization", "Basic bmV3Og==")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"] == "Bearer"
        assert orjson.loads(refused.value.read())["reason"] == "Unauthorized"
        with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
            assert "lens_watch_cache_unauthorized_total 3\n" in response.read().decode()
        with urllib.request.urlopen(url + "/healthz", timeout=5) as response:
            assert response.status == 200


def test_a_run_with_another_registry_entry_is_served_only_what_was_read_with_its_entry(served, cache) -> None:
    """The registry changed (a new token, another server): a run reading the new entry is not served
    what the cache read with the old one; the cache reads the registry again and keeps the cluster
    anew with the run's entry."""
    cluster, server = served
    watch_cache, url = cache
    reader = _reader(served, url)
    _until(lambda: _served_from_cache(reader, "/api/v1/nodes"))
    changed = ClusterConfig(
        name=NAME, server=server.base_url(NAME), token=cluster.token, request_timeout_seconds=6
    )
    other = KubeReader(changed, max_retries=0, cache_url=url)
    assert other.list("/api/v1/nodes", _versions) == reader.list("/api/v1/nodes", _versions)
    assert "registry entry for the cluster is not the run's" in other.stats.sources["/api/v1/nodes"]

    watch_cache._registry = lambda: {NAME: changed}  # the registry file now says so
    _until(lambda: _served_from_cache(other, "/api/v1/nodes"))
    assert watch_cache.clusters[NAME] == changed
    # The old entry's runs are now the ones sent to the API server.
    reader.list("/api/v1/nodes", _versions)
    assert "not the run's" in reader.stats.sources["/api/v1/nodes"]


def test_nodes_and_pods_are_kept_from_the_start_and_when_a_cluster_joins(served) -> None:
    """`warm`: what every run lists is listed before a run asks (a restarted `lens watch` is warm by
    the next runs), again for a cluster that joins the registry or whose entry changed, but not
    again for one the cache let go for nobody asking."""
    cluster, server = served
    cluster.request_log.reset()
    with _serving(served, warm=(NODES, PODS)) as (watch_cache, url):

        def kept(name: str) -> set[str]:
            return {path for cluster_name, path in _listed(watch_cache) if cluster_name == name}

        _until(lambda: kept(NAME) == {NODES, PODS})
        assert len(_lists_of(cluster, PODS)) == 1 and len(_lists_of(cluster, NODES)) == 1
        reader = _reader(served, url)
        reader.list(PODS, _versions)
        assert reader.stats.sources[PODS] == "watch cache" and reader.stats.requests == 0
        assert len(_lists_of(cluster, PODS)) == 1  # the run's list was the cache's, not another

        config = watch_cache.clusters[NAME]
        joined = ClusterConfig(name="joined", server=server.base_url(NAME), token=cluster.token)
        watch_cache.set_clusters({NAME: config, "joined": joined})
        _until(lambda: kept("joined") == {NODES, PODS})
        assert len(_lists_of(cluster, PODS)) == 2

        # Nobody asked for them in `idle_seconds`: let go, and not kept again by the next reading
        # of an unchanged registry; kept again when the cluster's entry changes.
        with watch_cache._lock:
            watch_cache._prune(time.time() + watch_cache.idle_seconds + 1)
        assert not watch_cache._collections
        watch_cache.set_clusters({NAME: config, "joined": joined})
        with watch_cache._lock:
            assert not watch_cache._to_warm and not watch_cache._collections
        changed = config.model_copy(update={"request_timeout_seconds": 7})
        watch_cache.set_clusters({NAME: changed, "joined": joined})
        _until(lambda: kept(NAME) == {NODES, PODS})
        assert set(watch_cache._collections) == {(NAME, NODES), (NAME, PODS)}
        assert all(c.config == changed for c in watch_cache._collections.values())

    with pytest.raises(ValueError, match="cannot keep /api/v1/secrets"):
        WatchCache({}, warm=(PODS, "/api/v1/secrets"))


def test_the_owner_kinds_are_kept_from_the_start_where_the_cluster_serves_them(served) -> None:
    """The default `WARM`: the nodes, the pods and the owner kinds a run lists are kept before a run
    asks; the kinds the cluster does not serve (no such CRD: 404) are let go, counted, and neither a
    failure nor a collection not served on /metrics (no alert)."""
    cluster, _server = served
    direct = _reader(served, None)
    served_paths, absent = set(), set()
    for path in WARM:
        try:
            direct.list(path, _versions)
            served_paths.add(path)
        except KubeError as exc:
            assert exc.status == 404, exc
            absent.add(path)
    # The simulated cluster serves some owner kinds and not others: both cases are exercised.
    assert {NODES, PODS, "/apis/apps/v1/replicasets", "/apis/batch/v1/jobs"} <= served_paths
    assert "/apis/jobset.x-k8s.io/v1alpha2/jobsets" in absent

    with _serving(served, warm=WARM) as (watch_cache, url):
        _until(
            lambda: (
                watch_cache.not_served == len(absent)
                and _listed(watch_cache) >= {(NAME, p) for p in served_paths}
            )
        )
        with watch_cache._lock:
            assert set(watch_cache._collections) == {(NAME, path) for path in served_paths}
            assert not watch_cache._to_warm
        assert all(c.reflector.stats.failures == 0 for c in watch_cache._collections.values())
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
        served_lines = [line for line in metrics.splitlines() if line.startswith("lens_watch_cache_served{")]
        assert len(served_lines) == len(served_paths) and all(line.endswith(" 1") for line in served_lines)
        assert f"lens_watch_cache_not_served_total {len(absent)}" in metrics
        assert "lens_watch_cache_warm_queued 0" in metrics

        # A run's owner kinds come from the cache, no request to the API server for them.
        cluster.request_log.reset()
        run = _reader(served, url)
        for path in ("/apis/apps/v1/replicasets", "/apis/batch/v1/jobs"):
            assert run.list(path, _versions) == direct.list(path, _versions)
            assert run.stats.sources[path] == "watch cache"
        assert run.stats.requests == 0


def test_what_every_run_lists_is_never_let_go_and_a_guess_is_let_go_whenever_its_list_says_so(
    served,
) -> None:
    """Credentials that may list nothing (403), after the API server first failed (500): the owner
    kinds kept on a guess are let go once their list answers 403, even after failed tries; the
    nodes, the pods and the storage classes are failures, reported not served, and served once the
    API server answers again."""
    cluster, _server = served
    cluster.set_fault("kube", 500)
    try:
        with _serving(served, warm=WARM, reader=lambda config: KubeReader(config, max_retries=0)) as (
            watch_cache,
            url,
        ):

            def failing() -> int:
                with watch_cache._lock:
                    collections = list(watch_cache._collections.values())
                return sum(c.reflector.stats.failures > 0 for c in collections)

            _until(lambda: failing() == len(WARM))  # every one tried, and failed (not a guess's 404)
            assert watch_cache.not_served == 0
            cluster.set_fault("kube", 403)
            _until(lambda: watch_cache.not_served == len(WARM_OWNERS))
            with watch_cache._lock:
                assert set(watch_cache._collections) == {(NAME, path) for path in EVERY_RUN}
            metrics = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
            assert sorted(
                m for m in metrics.splitlines() if m.startswith("lens_watch_cache_served{")
            ) == sorted(f'lens_watch_cache_served{{cluster="{NAME}",path="{path}"}} 0' for path in EVERY_RUN)
            cluster.set_fault("kube")
            _until(lambda: _listed(watch_cache) == {(NAME, path) for path in EVERY_RUN})
    finally:
        cluster.set_fault("kube")


def test_the_collections_kept_from_the_start_are_listed_a_few_at_a_time(served) -> None:
    """A fleet's first lists do not all start at once (each would hold a parsed page): at most
    `warm_at_once` are under way; a run's ask is not queued behind them."""
    cluster, server = served
    cluster.set_fault("kube", delay=1.0)  # each list (one page) takes a second
    fleet = {
        name: ClusterConfig(name=name, server=server.base_url(NAME), token=cluster.token)
        for name in ("a", "b", "c")
    }
    most, sampling = 0, threading.Event()
    try:
        with _serving(served, warm=(NODES, PODS), warm_at_once=2) as (watch_cache, url):

            def sample() -> None:  # the warmer's lists under way, the run's own apart
                nonlocal most
                while not sampling.wait(0.02):
                    with watch_cache._lock:
                        warming = [c for key, c in watch_cache._collections.items() if key != ("c", PODS)]
                    most = max(most, sum(c.reflector.listing for c in warming))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            watch_cache.set_clusters({**watch_cache.clusters, **fleet})
            # A run asks for the last cluster's pods, queued behind four lists of a second each
            # (two at a time): kept at once, and served while the cluster's nodes still wait.
            started = time.monotonic()
            run = KubeReader(fleet["c"], max_retries=0, cache_url=url)
            run.list(PODS, _versions)
            assert run.stats.sources[PODS] == "watch cache" and run.stats.requests == 0
            assert time.monotonic() - started < 1.9
            assert ("c", NODES) not in watch_cache._collections

            def all_listed() -> bool:
                with watch_cache._lock:
                    collections = list(watch_cache._collections.values())
                return len(collections) == 8 and not any(c.reflector.listing for c in collections)

            _until(all_listed)
            sampling.set()
            sampler.join()
            assert most == 2
            assert all(c.reflector.status().synced_at for c in watch_cache._collections.values())
    finally:
        sampling.set()
        cluster.set_fault("kube")


def test_a_warm_list_stuck_on_a_cluster_whose_entry_changed_frees_its_place(served) -> None:
    """One at a time, and the first hangs (an API server that never answers): once the registry
    gives that cluster another entry, its list is no longer waited for, and the next are listed."""
    cluster, server = served
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        stuck = ClusterConfig(
            name="stuck",
            server=f"http://127.0.0.1:{silent.getsockname()[1]}",
            token="t",
            request_timeout_seconds=60,
        )
        watch_cache = WatchCache({"stuck": stuck}, warm=(NODES,), warm_at_once=1, watch_seconds=2)
        try:
            _until(lambda: ("stuck", NODES) in watch_cache._collections)
            hung = watch_cache._collections[("stuck", NODES)].thread
            moved = ClusterConfig(name="stuck", server=server.base_url(NAME), token=cluster.token)
            other = ClusterConfig(name="other", server=server.base_url(NAME), token=cluster.token)
            watch_cache.set_clusters({"stuck": moved, "other": other})

            _until(lambda: {name for name, _ in _listed(watch_cache)} == {"stuck", "other"}, seconds=15)
        finally:
            watch_cache.close()
    # The silent server gone, the hung list fails and its thread ends (not left to later tests).
    hung.join(timeout=30)
    assert not hung.is_alive()


def test_an_edit_of_a_clusters_prometheus_or_exporters_alone_keeps_what_the_cache_holds(
    served, cache
) -> None:
    """What the cache serves depends on how the API server is reached (`KUBE_FIELDS`), not on the
    entry's other fields: a new Prometheus URL neither drops 165,000 kept pods nor turns a run
    with the new entry away. Every field of an entry is one or the other."""
    assert KUBE_FIELDS | {
        "enabled",  # always true where a ClusterConfig exists
        "vendor",
        "prometheus_url",
        "prometheus_http",
        "exporters",
        "juicefs_capacity_bytes",
    } == set(ClusterConfig.model_fields)
    cluster, _ = served
    watch_cache, url = cache
    _until(lambda: _served_from_cache(_reader(served, url), NODES))
    (kept,) = watch_cache._collections.values()
    edited = watch_cache.clusters[NAME].model_copy(update={"prometheus_url": "http://elsewhere:9090"})
    watch_cache.set_clusters({NAME: edited})
    assert list(watch_cache._collections.values()) == [kept] and not kept.stop.is_set()
    run = KubeReader(edited, max_retries=0, cache_url=url)
    assert _served_from_cache(run, NODES)
    watch_cache.set_clusters({NAME: edited.model_copy(update={"token": cluster.token + "x"})})
    assert not watch_cache._collections and kept.stop.is_set()


def test_the_cache_keeps_no_field_owners_nor_kubectls_copy_of_the_spec() -> None:
    """What no collector reads is not kept (managedFields; kubectl's last-applied-configuration, a
    copy of the spec); every other annotation is. An object with neither is kept as it came, and a
    malformed one is left for the collectors to report."""
    applied = {
        "kind": "Deployment",
        "metadata": {
            "name": "d",
            "managedFields": [{"manager": "kubectl-client-side-apply"}],
            "annotations": {LAST_APPLIED: '{"kind":"Deployment"}\n', "team": "a"},
        },
        "spec": {"replicas": 1},
    }
    assert without_unread_fields(applied) == {
        "kind": "Deployment",
        "metadata": {"name": "d", "annotations": {"team": "a"}},
        "spec": {"replicas": 1},
    }
    assert LAST_APPLIED in applied["metadata"]["annotations"]  # the listed object is not changed
    plain = {"metadata": {"name": "p", "annotations": {"team": "a"}}}
    odd = {"metadata": {"name": "o", "annotations": ["not", "a", "map"]}}
    assert without_unread_fields(plain) is plain and without_unread_fields(odd) is odd
