"""One collection of one cluster kept current by list and watch, as client-go's Reflector does.

A paged LIST gives the objects and the version of their snapshot; a watch from that version then
gives every change after it, and the next watch starts from the last version seen (an event's, or
a bookmark's). When the server no longer keeps the changes after that version (410 Gone, as an HTTP
status or an ERROR event), or has not reached it (504, "Too large resource version": a server
behind the one listed from, or etcd restored), the collection is listed again and what was kept is
replaced whole. A
watch that fails otherwise (the connection dropped, the server restarting) is retried from the same
version after a backoff; a list that fails leaves the collection unsynced until one succeeds.

What is kept is `project(object)` per object, by `namespace/name` (how the API server names
objects in a watch, including DELETED ones); an item that has no name is kept under its JSON, so
that a malformed object listed is still handed on (to be counted where it is read) until the next
list. Not thread-safe for writers: one thread runs `run`; readers take `snapshot`, and may read a
list under way as its pages arrive (`arriving`, `wait_for`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson

from lens_pipeline.kube.reader import KubeError, KubeReader
from lens_pipeline.retry import Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")

# A watch asks the server to end it after this long (the server may end it sooner); the next one
# starts from the last version seen.
WATCH_SECONDS = 300
# Waits after a failed list or watch.
WATCH_RETRY = Backoff(first=0.5, factor=2.0, cap=30.0)


@dataclass
class ReflectorStats:
    lists: int = 0
    watches: int = 0
    expired: int = 0  # 410 Gone, or a version the server has not reached (504): listed again
    failures: int = 0  # lists and watches that failed otherwise
    events: dict[str, int] = field(default_factory=dict)
    last_error: str = ""


@dataclass(frozen=True)
class Kept(Generic[T]):
    """What a reflector holds at one moment."""

    keys: list[str]  # `object_key` of each item, in order (a LIST's order)
    items: list[T]
    resource_version: str
    # time.time() of the last sign the collection was current: a list, an event (bookmarks count),
    # the end of a watch the server kept; None: never listed.
    synced_at: float | None
    error: str  # why the last list or watch failed, "" when the last one did not


@dataclass
class Arriving(Generic[T]):
    """A list under way, as its pages arrive: what a reader can serve before the list is done."""

    items: list[tuple[str, T]]  # (key, item) in the API server's order; grows page by page
    version: str  # the resourceVersion of the list's snapshot
    ended: bool = False  # the list is done: `items` is all of it
    # Why no more will come: the list failed, or (with `restarted`) its continue token expired and
    # another list grows instead.
    failed: str = ""
    restarted: bool = False


def _too_large(exc: KubeError) -> bool:
    """The server has not reached the version asked for (504, "Too large resource version"): it is
    behind the one the list came from, or etcd was restored. client-go lists again; so does this."""
    return exc.status == 504 and "Too large resource version" in exc.reason


def object_key(obj: Any) -> str:
    """`namespace/name` (`name` for a cluster-scoped object); the JSON of an object without a name."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        return "\x00" + orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()
    namespace = metadata.get("namespace")  # type: ignore[union-attr]
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


class Reflector(Generic[T]):
    """`project(object)` of every object of the collection at `path`, kept current."""

    def __init__(
        self,
        reader: KubeReader,
        path: str,
        project: Callable[[Any], T],
        *,
        watch_seconds: int = WATCH_SECONDS,
        backoff: Backoff = WATCH_RETRY,
        clock: Callable[[], float] = time.time,
        absent_ok: bool = False,
    ) -> None:
        """`absent_ok`: a collection kept on a guess (`lens watch --warm`): if its first list
        answers 404 (the cluster does not serve that kind: no such CRD) or 403 (its credentials may
        not list it), `run` ends and `absent` says so, rather than trying again and counting
        failures."""
        self.reader, self.path, self.project = reader, path, project
        self.absent_ok = absent_ok
        self.absent = False
        self.on_absent: Callable[[], None] | None = None  # called as `run` ends for `absent`
        self.watch_seconds = watch_seconds
        self.backoff = backoff
        self.stats = ReflectorStats()
        self._clock = clock
        self._lock = threading.Lock()
        # Told at each page of a list, and when it ends, done or failed (`arriving`, `wait_for`).
        self._arrived = threading.Condition(self._lock)
        self._listing = False
        self._arriving: Arriving[T] | None = None
        self._items: dict[str, T] = {}
        self._version = ""
        self._synced_at: float | None = None
        self._error = ""

    def snapshot(self) -> Kept[T]:
        with self._lock:
            keys = sorted(self._items)
            items = [self._items[key] for key in keys]
            return Kept(keys, items, self._version, self._synced_at, self._error)

    def status(self) -> Kept[T]:
        """`snapshot` without its keys and items (for metrics: no sort of the whole collection)."""
        with self._lock:
            return Kept([], [], self._version, self._synced_at, self._error)

    def events(self) -> dict[str, int]:
        """Watch events applied so far, by type (a copy)."""
        with self._lock:
            return dict(self.stats.events)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def listing(self) -> bool:
        """Whether a list is under way, or about to be (never listed, and no failure yet)."""
        with self._lock:
            return self._under_way()

    def _under_way(self) -> bool:  # `listing`, with the lock held
        return self._listing or (self._synced_at is None and not self._error)

    def arriving(self, timeout: float) -> Arriving[T] | None:
        """The list under way once its first page has arrived, waiting up to `timeout` seconds
        while the collection is being listed (or about to be: never listed, no failure yet); None
        when no list is under way (or its first page has not come in time)."""
        with self._arrived:
            self._arrived.wait_for(lambda: self._arriving is not None or not self._under_way(), timeout)
            return self._arriving

    def wait_for(self, arriving: Arriving[T], count: int, timeout: float) -> bool:
        """Wait up to `timeout` seconds until `arriving` holds `count` items or will hold no more;
        whether it did."""
        with self._arrived:
            return self._arrived.wait_for(
                lambda: len(arriving.items) >= count or arriving.ended or bool(arriving.failed), timeout
            )

    def run(self, stop: threading.Event) -> None:
        """List, then watch, until `stop` is set; never raises for the cluster's sake (failures are
        counted, logged and kept as `error` until a list or watch succeeds)."""
        try:
            self._run(stop)
        finally:
            self.reader.close()  # its connections, and a watch under way with them

    def _run(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            listing = not self._version
            try:
                if listing:
                    self.relist()
                    listing = False  # a 410 of the watch that follows is the watch's
                started = time.monotonic()
                self.watch_once(stop)
                failures = 0
                if time.monotonic() - started < 1.0:  # ended at once: not a loop of requests
                    stop.wait(self.backoff.delay(1))
                continue
            except KubeError as exc:
                if self.absent:
                    log.info("%s: kept on a guess, let go: %s", self.reader.cluster.name, exc)
                    if self.on_absent is not None:
                        self.on_absent()
                    return
                gone = exc.status == 410 or _too_large(exc)
                if gone and not listing:
                    self.stats.expired += 1
                    log.info("%s: %s; listing again", self.reader.cluster.name, exc)
                    with self._lock:  # what is kept misses changes until the list: not current
                        self._version = ""  # list again at once: the server has just answered
                        self._error = f"listing again: {exc.reason}"
                        self._listing = True  # a reader now waits for that list's pages
                    continue
                message = str(exc)
            except Exception as exc:  # a bug here must not end the watch for good: said, and tried again
                log.exception("%s: keeping %s failed", self.reader.cluster.name, self.path)
                message = f"{self.path}: {type(exc).__name__}: {exc}"
            failures += 1
            self._failed(message)
            stop.wait(self.backoff.delay(failures))
            self.reader.reset()  # try again for real, with the token file read again

    def relist(self) -> None:
        """Replace what is kept by a LIST; readers may serve its pages as they arrive (`arriving`)."""
        with self._lock:
            self._listing = True
        try:
            items, version = self.reader.list_versioned(
                self.path, lambda obj: (object_key(obj), self.project(obj)), progress=self._page_arrived
            )
        except BaseException as exc:
            with self._lock:  # who waits for the list learns why it failed, not only that it ended
                self._listing = False
                self._error = str(exc) or type(exc).__name__
                # Set with the end of the list, under the lock: who sees it ended sees this too.
                self.absent = (
                    self.absent_ok
                    and self._synced_at is None
                    and isinstance(exc, KubeError)
                    and exc.status in (403, 404)
                )
                if self._arriving is not None:
                    self._arriving.failed = self._error
                    self._arriving = None
                self._arrived.notify_all()
            raise
        self.stats.lists += 1
        with self._lock:
            self._items = dict(items)
            self._version = version
            self._synced_at = self._clock()
            self._error = ""
            self._listing = False
            if self._arriving is not None:
                self._arriving.ended = True
                self._arriving = None
            self._arrived.notify_all()

    def _page_arrived(self, items: list[tuple[str, T]], version: str) -> None:
        with self._lock:
            if self._arriving is None or self._arriving.items is not items:
                if self._arriving is not None:  # its list was restarted: its pages are no snapshot's
                    self._arriving.failed = "the list was restarted (its continue token expired)"
                    self._arriving.restarted = True
                self._arriving = Arriving(items, version)
            self._arrived.notify_all()

    def watch_once(self, stop: threading.Event) -> None:
        """One watch from the version kept, applying each event, until the server ends it or
        `stop` is set (seen at the next event or bookmark)."""
        self.stats.watches += 1
        events = self.reader.watch(self.path, self._version, timeout_seconds=self.watch_seconds)
        try:
            for event in events:
                self._apply(event)
                if stop.is_set():
                    return
        finally:
            events.close()
        with self._lock:  # the server ended the watch it kept until now: current until now
            self._synced_at = self._clock()
            self._error = ""

    def _apply(self, event: dict[str, Any]) -> None:
        kind, obj = event["type"], event["object"]
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
        with self._lock:
            self.stats.events[kind] = self.stats.events.get(kind, 0) + 1
            if kind == "DELETED":
                self._items.pop(object_key(obj), None)
            elif kind != "BOOKMARK":
                self._items[object_key(obj)] = self.project(obj)
            if isinstance(version, str) and version:
                self._version = version
            self._synced_at = self._clock()
            self._error = ""

    def _failed(self, message: str) -> None:
        self.stats.failures += 1
        self.stats.last_error = message
        with self._lock:
            self._error = message
        log.warning("%s", message)
