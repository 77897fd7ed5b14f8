"""The watch cache: the collections the collection runs list, kept by list and watch for every
cluster of the registry, and served to the runs as paged LISTs, the way kube-apiserver serves them.

A run per minute that lists 150,000 pods again asks the API server (and etcd behind it) for the
whole cluster every minute to learn what changed. `lens watch` lists each collection once and then
watches it (`Reflector`): the API server sends only the changes. The runs ask the cache first
(`KubeReader(cache_url=...)`) and the API server when the cache cannot answer.

- Every cluster's nodes, pods and storage classes (what every run lists; the pods the largest) and
  the owner kinds GPU pods commonly belong to (`WARM`) are kept from the start, and from when a
  cluster joins the registry or its entry changes: a restarted `lens watch` lists them before the
  next runs come, not when they ask. An owner kind the cluster does not serve (no such CRD: its
  list answers 404), or that the cluster's credentials may not list (403), is let go without a
  failure.
- Any other collection is kept from the first time a run asks for it: the cache starts listing and
  watching it, and serves that run the pages of its list as they arrive (`Reflector.arriving`), so
  that the API server is listed once, not by the run and the cache side by side. Each page is
  waited for as long as the run said it would wait (`lensWaitSeconds`, at most
  `max_wait_seconds`); past that, or when the list failed, the answer is 503 and the run lists from
  the API server, as without the cache; a list the cache had to start again (410) answers the
  run's next page 410, and the run lists again. A collection listed again after a watch's 410 is
  served the same way. One nobody asked for in `idle_seconds` stops being watched.
- Otherwise the cache answers only what it holds current: a collection whose watch or list is
  failing (the API server unreachable, a token refused), or without a sign of life, answers 503
  with the reason, and the run asks the API server itself (and says so in its metadata).
- Only unfiltered lists of a whole collection at cluster scope, and never Secrets or ConfigMaps:
  whatever may hold credentials stays between the runs and the API server.
- Items are served as the API server sent them (each object's JSON), so a run reads the same
  objects either way, but for what no collector reads: pods are cut down to what the collectors
  read of them (`slim_pod`: the projection of the cut pod is the projection of the whole one), a
  half or less of their bytes to parse in every run, and every other object loses its
  `metadata.managedFields` (often a third of its bytes) and kubectl's last-applied-configuration
  annotation (a copy of the spec on whatever was applied with `kubectl apply`). Pages (`limit`,
  `continue`) come from a snapshot taken at the first page.
- With tokens (`$LENS_WATCH_CACHE_TOKEN`, comma-separated during a rotation), every request for
  objects must carry `Authorization: Bearer <one of them>`; the runs send the first. A request
  without is answered 401 and counted; the run then lists from the API server and says why.
- `/metrics`: per collection, whether it is served, how old its last sign of life is, objects,
  events, lists again, failures; requests refused for their token. `/healthz`.
"""

from __future__ import annotations

import logging
import math
import secrets
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from lens_pipeline import bearer
from lens_pipeline.clusters import ClusterConfig
from lens_pipeline.collect.objects import without_unread_metadata
from lens_pipeline.collect.pods import slim_pod
from lens_pipeline.kube.reader import (
    ENTRY_PARAMETER,
    WAIT_PARAMETER,
    KubeReader,
    cacheable,
    entry_digest,
    same_kube_entry,
)
from lens_pipeline.kube.watch import Arriving, Kept, Reflector

log = logging.getLogger(__name__)

IDLE_SECONDS = 900.0
# Each watch asks the server to end it after a minute, and the next starts from where it ended:
# a connection that died without a word (no RST) is found within a minute and a half (the read
# timeout), and a collection without a sign of life for two watches and a half minute is not served.
CACHE_WATCH_SECONDS = 60
# The longest a request waits for a collection being listed (a run says how long it would).
MAX_WAIT_SECONDS = 120.0
# A LIST's later pages are served from the snapshot of its first page for this long.
PAGES_SECONDS = 300.0
# What is kept of each object of a collection, as served (JSON); the others are kept whole but for
# their managedFields and kubectl's last-applied annotation (`without_unread_fields`).
CUT: dict[str, Callable[[Any], Any]] = {"/api/v1/pods": slim_pod}
# The kinds GPU pods commonly belong to, up their owner chains (Deployments' ReplicaSets, Jobs and
# CronJobs, StatefulSets (also LeaderWorkerSets' groups), DaemonSets (a GPU pod on every node: burn-in,
# node checks), the Kubeflow training operator's jobs, the MPI operator's v2 MPIJob, KubeRay (a
# RayJob's or a RayService's RayCluster: KubeRay makes either the controller owner of the cluster it
# creates), JobSet, LeaderWorkerSet, Volcano, SaFE): a cluster serves those of its CRDs, and a run
# lists each one its GPU pods' chains reach. Any other is kept when first asked.
WARM_OWNERS = (
    "/apis/apps/v1/replicasets",
    "/apis/apps/v1/deployments",
    "/apis/apps/v1/statefulsets",
    "/apis/apps/v1/daemonsets",
    "/apis/batch/v1/jobs",
    "/apis/batch/v1/cronjobs",
    "/apis/kubeflow.org/v1/pytorchjobs",
    "/apis/kubeflow.org/v1/mpijobs",
    "/apis/kubeflow.org/v1/tfjobs",
    "/apis/kubeflow.org/v2beta1/mpijobs",
    "/apis/ray.io/v1/rayclusters",
    "/apis/ray.io/v1/rayjobs",
    "/apis/ray.io/v1/rayservices",
    "/apis/jobset.x-k8s.io/v1alpha2/jobsets",
    "/apis/leaderworkerset.x-k8s.io/v1/leaderworkersets",
    "/apis/batch.volcano.sh/v1alpha1/jobs",
    "/apis/amd.com/v1/workloads",
)
# What every collection run lists of every cluster (the pods the largest collection): kept from the
# start, and a failure to list them is one (not a guess let go).
EVERY_RUN = ("/api/v1/nodes", "/api/v1/pods", "/apis/storage.k8s.io/v1/storageclasses")
# What `lens watch` keeps of every cluster from the start: what every run lists, and the owner kinds
# its runs are likely to list (any other path of `--warm` is such a guess too).
WARM = (*EVERY_RUN, *WARM_OWNERS)
# At most this many of them are listed at once (at the start, when clusters join): a fleet's first
# lists all at once would each hold a parsed page, for no sooner an end on the same CPU.
WARM_AT_ONCE = 4
# How often at most a run's other registry entry makes the cache read the registry again.
REREAD_SECONDS = 2.0
# Seconds since the served collection's last list, event or bookmark.
AGE_HEADER = "X-Lens-Watch-Cache-Age"


@dataclass
class _Collection:
    config: ClusterConfig
    reflector: Reflector[bytes]
    stop: threading.Event
    thread: threading.Thread
    asked_at: float


@dataclass
class _Pages:
    kept: Kept[bytes] | Arriving[bytes]
    taken_at: float
    reflector: Reflector[bytes]
    cluster: str
    path: str


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


class WatchCache:
    """The kept collections of every cluster of `clusters`, by (cluster, path)."""

    def __init__(
        self,
        clusters: Mapping[str, ClusterConfig],
        *,
        registry: Callable[[], Mapping[str, ClusterConfig]] | None = None,
        watch_seconds: int = CACHE_WATCH_SECONDS,
        idle_seconds: float = IDLE_SECONDS,
        reader: Callable[[ClusterConfig], KubeReader] = KubeReader,
        clock: Callable[[], float] = time.time,
        tokens: Sequence[str] = (),
        max_wait_seconds: float = MAX_WAIT_SECONDS,
        warm: Sequence[str] = (),
        warm_at_once: int = WARM_AT_ONCE,
    ) -> None:
        if warm_at_once < 1:
            raise ValueError("warm_at_once must be 1 or more")
        self.warm = warm_paths(warm)
        self.warm_at_once = warm_at_once
        self._to_warm: deque[tuple[str, ClusterConfig, str]] = deque()
        self._warming = False
        self._closed = threading.Event()
        self.clusters = dict(clusters)
        self.max_wait_seconds = max_wait_seconds
        self._tokens = [token for token in tokens if token]
        self.refused = 0
        self.not_served = 0  # collections kept from the start that their cluster does not serve (404, 403)
        self._registry = registry
        self._registry_read_at = 0.0
        self.watch_seconds = watch_seconds
        self.max_age = 2 * watch_seconds + 30
        self.idle_seconds = idle_seconds
        self._reader = reader
        self._clock = clock
        self._lock = threading.Lock()
        self._collections: dict[tuple[str, str], _Collection] = {}
        self._pages: dict[str, _Pages] = {}
        self._next_pages = 0
        # Continue tokens name their pages by this process's prefix and a number: a token of an
        # earlier `lens watch` finds no pages (410), not another list's.
        self._pages_prefix = secrets.token_hex(4)
        with self._lock:
            self._warm_up(self.clusters)

    def authorized(self, authorization: str) -> bool:
        """Whether a request with this `Authorization` header may read objects (any, without
        tokens); a refusal is counted."""
        if bearer.accepts(authorization, self._tokens):
            return True
        with self._lock:
            self.refused += 1
        return False

    def answer(self, cluster: str, path: str, query: Mapping[str, list[str]]) -> Answer:
        """One GET below `/clusters/<cluster>`: a page of a kept collection, or why not."""
        entry = (query.get(ENTRY_PARAMETER) or [""])[-1]
        config = self._config(cluster, entry)
        if config is None:
            return _status(404, f"no cluster {cluster!r} in the watch cache's registry", "NotFound")
        if entry and entry_digest(config) != entry:
            return _status(
                503,
                "the watch cache's registry entry for the cluster is not the run's: the registry changed",
                "ServiceUnavailable",
            )
        if not cacheable(path):
            return _status(404, f"the watch cache does not keep {path}", "NotFound")
        asked = {key for key, values in query.items() if values and values[-1] not in ("", "0")}
        if asked - {"limit", "continue", "resourceVersion", ENTRY_PARAMETER, WAIT_PARAMETER}:
            return _status(400, f"the watch cache serves whole lists only, not {sorted(asked)}", "BadRequest")
        token = (query.get("continue") or [""])[-1]
        limit = _limit(query)
        # How long the run would wait for a page of a list under way (cold, or again after 410):
        # one deadline for the whole request, whatever it waits for.
        wait = min(_wait(query), self.max_wait_seconds)
        deadline = time.monotonic() + wait
        now = self._clock()
        if token:
            pages_id = token.split(":", 1)[0]
            with self._lock:
                self._prune(now)
                pages = self._pages.get(pages_id)
            if pages is None or (pages.cluster, pages.path) != (cluster, path):
                return _status(410, "the watch cache no longer holds this list's pages", "Expired")
            return self._page(pages, pages_id, _offset(token), limit, deadline)
        with self._lock:
            self._prune(now)
            config = self.clusters.get(cluster, config)  # the entry as it is now
            if entry and entry_digest(config) != entry:
                return _status(503, "the registry changed meanwhile", "ServiceUnavailable")
            collection = self._collections.get((cluster, path))
            if collection is not None and (
                not same_kube_entry(collection.config, config) or collection.reflector.absent
            ):
                # Kept with an older entry; or kept from the start, and its list found the kind not
                # served (the run's discovery says it is now: a CRD installed meanwhile).
                self._collections.pop((cluster, path)).stop.set()
                collection = None
            created = collection is None
            if collection is None:
                collection = self._keep(config, path, now)
            collection.asked_at = now
        reflector = collection.reflector
        kept = reflector.snapshot()
        why = _not_served(kept, now, self.max_age)
        source: Kept[bytes] | Arriving[bytes] = kept
        if why:
            # Being listed: its pages are served as they arrive, rather than the run listing the
            # API server beside the cache.
            arriving = reflector.arriving(wait) if wait > 0 else None
            if arriving is not None:
                source = arriving
            else:  # listed meanwhile, failed, or not (yet) under way
                source = kept = reflector.snapshot()
                why = _not_served(kept, self._clock(), self.max_age)
                if why:
                    if reflector.listing:
                        why = (
                            f"the first page of its list did not arrive in {wait:g} s"
                            if wait > 0
                            else f"{'not kept before: ' if created else ''}it is being listed now"
                        )
                    return _status(503, f"{path}: {why}", "ServiceUnavailable")
        with self._lock:
            self._next_pages += 1
            pages_id = f"{self._pages_prefix}{self._next_pages}"
            pages = self._pages[pages_id] = _Pages(source, now, reflector, cluster, path)
        return self._page(pages, pages_id, 0, limit, deadline)

    def _page(self, pages: _Pages, pages_id: str, offset: int, limit: int | None, deadline: float) -> Answer:
        """The page from `offset` of a list's snapshot, or of a list under way as far as it arrived
        by `deadline` (time.monotonic())."""
        source = pages.kept
        if isinstance(source, Arriving):
            wanted = offset + limit if limit is not None else sys.maxsize
            pages.reflector.wait_for(source, wanted, max(0.0, deadline - time.monotonic()))
            ended = source.ended  # read before the items: once ended, they are all there
            available = len(source.items)
            answer = None
            if source.restarted:  # the run lists again, from the list that replaced it
                answer = _status(410, f"the list being served stopped: {source.failed}", "Expired")
            elif source.failed:  # the run lists from the API server
                answer = _status(503, f"the watch cache's list failed: {source.failed}", "ServiceUnavailable")
            elif available <= offset and not ended:
                answer = _status(503, "no more of the list arrived in time", "ServiceUnavailable")
            if answer is not None:
                with self._lock:  # a list no one will read further is let go now, not at the prune
                    self._pages.pop(pages_id, None)
                return answer
            end = available if limit is None else min(available, offset + limit)
            items = [item for _, item in source.items[offset:end]]
            last, remaining, age = ended and end >= available, None, 0.0
        else:
            end = len(source.items) if limit is None else min(len(source.items), offset + limit)
            items = source.items[offset:end]
            last, remaining = end >= len(source.items), len(source.items) - end
            age = self._clock() - source.synced_at if source.synced_at is not None else 0.0
        metadata: dict[str, Any] = {
            "resourceVersion": source.version if isinstance(source, Arriving) else source.resource_version
        }
        if not last:
            metadata["continue"] = f"{pages_id}:{end}"
            if remaining is not None:
                metadata["remainingItemCount"] = remaining
        else:  # the last page: the snapshot is let go
            with self._lock:
                self._pages.pop(pages_id, None)
        body = b"".join(
            (
                b'{"kind":"List","apiVersion":"v1","metadata":',
                orjson.dumps(metadata),
                b',"items":[',
                b",".join(items),
                b"]}",
            )
        )
        return Answer(200, body, {AGE_HEADER: f"{age:.1f}"})

    def metrics(self) -> str:
        """The Prometheus text exposition of every kept collection's state."""
        now = self._clock()
        with self._lock:
            collections = list(self._collections.items())
            queued = len(self._to_warm)
        lines = [
            "# HELP lens_watch_cache_served Whether the collection is served (1) or answers 503 (0).",
            "# TYPE lens_watch_cache_served gauge",
            "# HELP lens_watch_cache_age_seconds Seconds since the collection's last list, event or bookmark.",
            "# TYPE lens_watch_cache_age_seconds gauge",
            "# HELP lens_watch_cache_objects Objects kept.",
            "# TYPE lens_watch_cache_objects gauge",
            "# HELP lens_watch_cache_events_total Watch events applied, by type.",
            "# TYPE lens_watch_cache_events_total counter",
            "# HELP lens_watch_cache_lists_total LISTs made (the first, and again after 410 Gone or 504 Too large resource version).",
            "# TYPE lens_watch_cache_lists_total counter",
            "# HELP lens_watch_cache_failures_total Lists and watches that failed.",
            "# TYPE lens_watch_cache_failures_total counter",
            "# HELP lens_watch_cache_unauthorized_total Requests for objects refused: no or a wrong bearer token.",
            "# TYPE lens_watch_cache_unauthorized_total counter",
            f"lens_watch_cache_unauthorized_total {self.refused}",
            "# HELP lens_watch_cache_warm_queued Collections to keep from the start not yet being listed.",
            "# TYPE lens_watch_cache_warm_queued gauge",
            f"lens_watch_cache_warm_queued {queued}",
            "# HELP lens_watch_cache_not_served_total Collections kept from the start that their cluster "
            "does not serve (404: no such kind there) or lets us not list (403), let go.",
            "# TYPE lens_watch_cache_not_served_total counter",
            f"lens_watch_cache_not_served_total {self.not_served}",
        ]
        for (cluster, path), collection in sorted(collections, key=lambda item: item[0]):
            if collection.reflector.absent:  # not served by its cluster: about to be let go
                continue
            kept = collection.reflector.status()
            stats = collection.reflector.stats
            labels = f'cluster="{cluster}",path="{path}"'
            age = now - kept.synced_at if kept.synced_at is not None else float("nan")
            lines += [
                f"lens_watch_cache_served{{{labels}}} {0 if _not_served(kept, now, self.max_age) else 1}",
                f"lens_watch_cache_age_seconds{{{labels}}} {age:.3f}",
                f"lens_watch_cache_objects{{{labels}}} {len(collection.reflector)}",
                f"lens_watch_cache_lists_total{{{labels}}} {stats.lists}",
                f"lens_watch_cache_failures_total{{{labels}}} {stats.failures}",
            ]
            lines += [
                f'lens_watch_cache_events_total{{{labels},type="{kind}"}} {count}'
                for kind, count in sorted(collection.reflector.events().items())
            ]
        return "\n".join(lines) + "\n"

    def _config(self, cluster: str, entry: str) -> ClusterConfig | None:
        """The cluster's registry entry; read the registry again first when the run's entry is
        another (at most every `REREAD_SECONDS`): what the cache serves was read with the run's."""
        config = self.clusters.get(cluster)
        mismatch = config is None or (entry and entry_digest(config) != entry)
        now = self._clock()
        if mismatch and self._registry is not None and now - self._registry_read_at >= REREAD_SECONDS:
            self._registry_read_at = now
            try:
                self.set_clusters(self._registry())
            except Exception:  # a registry being rewritten: the entry as it was
                log.exception("the registry could not be read again")
            config = self.clusters.get(cluster)
        return config

    def set_clusters(self, clusters: Mapping[str, ClusterConfig]) -> None:
        """The registry as it now is: a cluster gone or changed (a new token, a new server; not an
        edit of its Prometheus or exporters alone: `KUBE_FIELDS`) stops its collections. They are
        kept again, with the new entry, when next asked for; the `warm` ones of a cluster new or
        changed at once."""
        with self._lock:
            self._prune(self._clock())  # also what no run asks for (runs not using the cache)
            joined = {
                name: c for name, c in clusters.items() if not same_kube_entry(self.clusters.get(name), c)
            }
            self.clusters = dict(clusters)
            for key in [
                k
                for k in self._collections
                if not same_kube_entry(self.clusters.get(k[0]), self._collections[k].config)
            ]:
                self._collections.pop(key).stop.set()
                log.info("cluster %s: registry changed, %s no longer watched with the old entry", *key)
            self._warm_up(joined)

    def _warm_up(self, clusters: Mapping[str, ClusterConfig]) -> None:
        """Keep the `warm` collections of `clusters` (with the lock held): queued, and listed
        `warm_at_once` at a time by a thread of their own; one a run asks for meanwhile is kept at
        once, as always. Once kept, they are let go like any other when no run asks for them in
        `idle_seconds`."""
        # Path by path: every cluster's nodes and pods before any cluster's owner kinds.
        self._to_warm.extend((name, config, path) for path in self.warm for name, config in clusters.items())
        if self._to_warm and not self._warming:
            self._warming = True
            threading.Thread(target=self._warmer, name="lens-watch-warm", daemon=True).start()

    def _warmer(self) -> None:
        try:
            self._warm_queued()
        except Exception:  # said, and the next cluster to join starts another warmer
            log.exception("keeping the collections of the registry from the start failed")
            with self._lock:
                self._warming = False

    def _warm_queued(self) -> None:
        in_flight: dict[tuple[str, str], _Collection] = {}
        while True:
            with self._lock:  # no longer kept (the registry changed): its list will not end
                in_flight = {key: c for key, c in in_flight.items() if self._collections.get(key) is c}
            in_flight = {key: c for key, c in in_flight.items() if c.reflector.listing}
            with self._lock:
                while self._to_warm and len(in_flight) < self.warm_at_once and not self._closed.is_set():
                    name, config, path = self._to_warm.popleft()
                    if (
                        not same_kube_entry(self.clusters.get(name), config)
                        or (name, path) in self._collections
                    ):
                        continue  # gone, or changed (queued again with its new entry), or asked for
                    in_flight[(name, path)] = self._keep(config, path, self._clock(), warm=True)
                if self._closed.is_set() or not (self._to_warm or in_flight):
                    # Decided with the lock held: work queued after this starts another warmer.
                    self._warming = False
                    return
            self._closed.wait(0.2)

    def close(self) -> None:
        """Stop every watch (each ends at its next event, bookmark or timeout)."""
        self._closed.set()
        with self._lock:
            collections = list(self._collections.values())
            self._collections.clear()
            self._to_warm.clear()
        for collection in collections:
            collection.stop.set()

    def _keep(self, config: ClusterConfig, path: str, now: float, *, warm: bool = False) -> _Collection:
        """Start keeping `path` of the cluster. `warm`: kept from the start, not asked for by a run:
        but for what every run lists, a kind the cluster does not serve or lets us not list is
        let go (`Reflector.absent`: `_let_go`)."""
        cut = CUT.get(path, without_unread_fields)

        def keep(obj: Any) -> bytes:
            return orjson.dumps(cut(obj))

        reflector = Reflector(
            self._reader(config),
            path,
            keep,
            watch_seconds=self.watch_seconds,
            absent_ok=warm and path not in EVERY_RUN,
        )
        stop = threading.Event()
        thread = threading.Thread(
            target=reflector.run, args=(stop,), name=f"lens-watch {config.name}{path}", daemon=True
        )
        collection = self._collections[(config.name, path)] = _Collection(
            config, reflector, stop, thread, now
        )
        reflector.on_absent = lambda: self._let_go((config.name, path), collection)
        thread.start()
        log.info("cluster %s: keeping %s by list and watch", config.name, path)
        return collection

    def _let_go(self, key: tuple[str, str], collection: _Collection) -> None:
        """A collection kept on a guess that its cluster does not serve (its reflector's thread,
        as it ends): nothing to keep, unless a run has asked for it since (then replaced)."""
        with self._lock:
            if self._collections.get(key) is collection:
                del self._collections[key]
                self.not_served += 1

    def _prune(self, now: float) -> None:
        for pages_id in [k for k, pages in self._pages.items() if now - pages.taken_at > PAGES_SECONDS]:
            del self._pages[pages_id]
        for key in [k for k, c in self._collections.items() if now - c.asked_at > self.idle_seconds]:
            self._collections.pop(key).stop.set()
            log.info("cluster %s: %s not asked for in %.0f s, no longer watched", *key, self.idle_seconds)


def warm_paths(paths: Sequence[str]) -> tuple[str, ...]:
    """`paths` as collections to keep from the start, or ValueError naming those the cache may not
    keep (filtered, or Secrets and ConfigMaps: `cacheable`)."""
    not_kept = [path for path in paths if not cacheable(path)]
    if not_kept:
        raise ValueError(f"the watch cache cannot keep {', '.join(not_kept)}")
    return tuple(paths)


def without_unread_fields(obj: Any) -> Any:
    """The object without what no collector reads (`without_unread_metadata`: managedFields and
    kubectl's last-applied annotation); anything else as it came."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict):
        return obj
    kept = without_unread_metadata(metadata)
    return obj if kept is metadata else {**obj, "metadata": kept}


def _not_served(kept: Kept[bytes], now: float, max_age: float) -> str:
    if kept.synced_at is None:
        return f"not listed yet{': ' + kept.error if kept.error else ''}"
    if kept.error:
        return f"not current, the API server failed: {kept.error}"
    if now - kept.synced_at > max_age:
        return f"no sign of life from its watch for {now - kept.synced_at:.0f} s"
    return ""


def _limit(query: Mapping[str, list[str]]) -> int | None:
    try:
        limit = int((query.get("limit") or ["0"])[-1] or 0)
    except ValueError:
        return None
    return limit if limit > 0 else None


def _wait(query: Mapping[str, list[str]]) -> float:
    """The seconds the run said it would wait for a collection being listed (none: 0)."""
    try:
        wait = float((query.get(WAIT_PARAMETER) or ["0"])[-1] or 0)
    except ValueError:
        return 0.0
    return wait if math.isfinite(wait) and wait > 0 else 0.0


def _offset(token: str) -> int:
    try:
        return max(0, int(token.split(":", 1)[1]))
    except (IndexError, ValueError):
        return 0


def _status(code: int, message: str, reason: str) -> Answer:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    return Answer(code, orjson.dumps({**body, "message": message, "reason": reason, "code": code}))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: WatchCacheServer

    def do_GET(self) -> None:
        split = urlsplit(self.path)
        parts = split.path.split("/", 3)  # "", "clusters", name, rest
        if split.path == "/healthz":
            answer = Answer(200, b"ok\n")
        elif split.path == "/metrics":
            answer = Answer(200, self.server.cache.metrics().encode())
        elif len(parts) == 4 and parts[1] == "clusters" and self.server.serves_objects:
            if not self.server.cache.authorized(self.headers.get("Authorization", "")):
                answer = _status(401, "missing or wrong bearer token", "Unauthorized")
                answer.headers["WWW-Authenticate"] = "Bearer"
                self._send(answer, split.path)
                return
            query = parse_qs(split.query, keep_blank_values=True)
            answer = self.server.cache.answer(parts[2], "/" + parts[3], query)
        else:
            answer = _status(404, f"nothing at {split.path}", "NotFound")
        self._send(answer, split.path)

    def _send(self, answer: Answer, path: str) -> None:
        self.send_response(answer.status)
        content_type = "text/plain; version=0.0.4" if path == "/metrics" else "application/json"
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        for key, value in answer.headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(answer.body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)


def serve(
    registry: Callable[[], Mapping[str, ClusterConfig]],
    host: str,
    port: int,
    metrics_port: int = 0,
    reload_seconds: float = 30.0,
    tokens: Sequence[str] = (),
    clusters: Mapping[str, ClusterConfig] | None = None,
    warm: Sequence[str] = WARM,
) -> int:
    """`lens watch`: serve until SIGTERM or Ctrl-C, reading the registry again every `reload_seconds`;
    with `metrics_port`, /metrics and /healthz on that port too; with `tokens`, objects only to a
    request bearing one of them. `clusters`: the registry as just read (else it is read first);
    `warm`: the collections of every cluster kept from the start."""
    cache = WatchCache(
        registry() if clusters is None else clusters, registry=registry, tokens=tokens, warm=warm
    )
    httpd = WatchCacheServer(cache, host, port)
    stopped = threading.Event()
    if metrics_port:
        metrics = WatchCacheServer(cache, host, metrics_port, serves_objects=False)
        threading.Thread(target=metrics.serve_forever, name="lens-watch-metrics", daemon=True).start()

    def reload() -> None:
        while not stopped.wait(reload_seconds):
            try:
                cache.set_clusters(registry())
            except Exception:  # a registry being rewritten: the last good one stays
                log.exception("the registry could not be read again; keeping the clusters as they were")

    threading.Thread(target=reload, name="lens-watch-registry", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=httpd.shutdown, daemon=True).start())
    also = f", keeping {', '.join(warm)} of each from the start" if warm else ""
    also += f", /metrics on port {metrics_port}" if metrics_port else ""
    also += "" if tokens else "; no bearer token asked (set $LENS_WATCH_CACHE_TOKEN)"
    print(f"lens watch on {httpd.url} for {len(cache.clusters)} cluster(s){also}", flush=True)
    try:
        httpd.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stopped.set()
        cache.close()
        httpd.server_close()
    return 0


class WatchCacheServer(ThreadingHTTPServer):
    """Serves the kept objects (and /metrics, /healthz); with `serves_objects=False`, /metrics and
    /healthz only: a port that may be opened wider than the objects' (they are the clusters' pods,
    whose specs may hold what only the API server's access control should hand out)."""

    daemon_threads = True

    def __init__(
        self, cache: WatchCache, host: str = "127.0.0.1", port: int = 0, *, serves_objects: bool = True
    ) -> None:
        super().__init__((host, port), _Handler)
        self.cache = cache
        self.serves_objects = serves_objects

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), int(self.server_address[1])
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://{host}:{port}"
