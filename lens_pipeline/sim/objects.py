"""In-memory store of one Kubernetes kind for a simulated cluster: objects kept as their serialized
JSON (a parsed pod costs three times its bytes), immutable list snapshots that back continue tokens,
and the recent changes that back watches."""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson


def to_json(obj: Any) -> bytes:
    """orjson's bytes keep the capacity its writer grew to (16 KiB for a 3 KiB pod); a copy is exact,
    which at 150,000 pods is the difference between 2.4 GiB and 0.5 GiB."""
    return memoryview(orjson.dumps(obj)).tobytes()


def _at_version(raw: bytes, resource_version: int) -> bytes:
    """A deleted object's last state as a watch reports it, at the deletion's resourceVersion."""
    try:
        obj = orjson.loads(raw)
        obj["metadata"]["resourceVersion"] = str(resource_version)
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return raw  # an object injected malformed goes out as it was served
    return to_json(obj)


class StoredObject:
    """One object as served. Never mutated: a change stores a new StoredObject, so snapshots taken
    earlier keep serving the old version, as etcd's MVCC does."""

    __slots__ = ("key", "raw")

    def __init__(self, key: str, raw: bytes) -> None:
        self.key = key
        self.raw = raw

    @property
    def obj(self) -> Any:
        """A fresh parse on every call: callers may change it without touching the stored object."""
        return orjson.loads(self.raw)


@dataclass
class ListSnapshot:
    """The whole kind in key order at one resourceVersion."""

    id: int
    resource_version: int
    keys: list[str]
    entries: list[StoredObject]
    last_used: float


# How many changes of one kind a watch can start behind: kube-apiserver keeps a bounded window of
# recent changes too (its watch cache; etcd compacts older revisions), and a watch from before it
# gets 410 Gone, after which the client must list again.
WATCH_HISTORY = 5_000


@dataclass(frozen=True, slots=True)
class Change:
    """One change of one object, as a watch reports it: ADDED, MODIFIED or DELETED, with the
    object as it was after the change (for DELETED: its last state, at the deletion's version)."""

    resource_version: int
    type: str
    key: str
    raw: bytes


class ObjectStore:
    """Objects of one kind by key (`name` or `namespace/name`); not thread-safe, the cluster locks."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._by_key: dict[str, StoredObject] = {}
        # New keys are appended and sorted when next needed: timsort of a sorted run plus a few
        # appended keys is linear, and bulk generation does not pay an insort per object.
        self._keys: list[str] = []
        self._keys_sorted = True
        self._snapshots: dict[int, ListSnapshot] = {}
        self._current: ListSnapshot | None = None
        self._snapshot_ids = itertools.count(1)
        self._history: deque[Change] = deque()
        self.history_limit = WATCH_HISTORY
        # A watch may start at any resourceVersion from here on: every change after it is kept.
        self.oldest_watchable = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def get(self, key: str) -> StoredObject | None:
        return self._by_key.get(key)

    def ordered_keys(self) -> list[str]:
        """Current keys in order (a copy)."""
        return list(self._sorted_keys())

    def put(self, key: str, raw: bytes, resource_version: int | None = None) -> None:
        """Store `raw` at `key`; with `resource_version` (the change's), watches are told of it.
        Without one (a bulk load no watch can see), watches must start after it."""
        added = key not in self._by_key
        if added:
            if self._keys_sorted and self._keys and key < self._keys[-1]:
                self._keys_sorted = False
            self._keys.append(key)
        self._by_key[key] = StoredObject(key, raw)
        self._current = None
        if resource_version is not None:
            self._record(Change(resource_version, "ADDED" if added else "MODIFIED", key, raw))

    def remove(self, key: str, resource_version: int | None = None) -> StoredObject | None:
        entry = self._by_key.pop(key, None)
        if entry is not None:
            keys = self._sorted_keys()
            del keys[bisect_left(keys, key)]
            self._current = None
            if resource_version is not None:
                self._record(
                    Change(resource_version, "DELETED", key, _at_version(entry.raw, resource_version))
                )
        return entry

    def forget_history(self, resource_version: int) -> None:
        """Changes up to `resource_version` were made without being recorded: no watch may start
        before it."""
        self._history.clear()
        self.oldest_watchable = resource_version

    def changes_since(self, resource_version: int) -> list[Change] | None:
        """The changes after `resource_version`, oldest first; None when some of them are no longer
        kept (the watch must answer 410 Gone)."""
        if resource_version < self.oldest_watchable:
            return None
        newer: list[Change] = []
        for change in reversed(self._history):
            if change.resource_version <= resource_version:
                break
            newer.append(change)
        newer.reverse()
        return newer

    def trim_history(self) -> None:
        while len(self._history) > self.history_limit:
            self.oldest_watchable = self._history.popleft().resource_version

    def _record(self, change: Change) -> None:
        self._history.append(change)
        self.trim_history()

    def objects(self) -> list[Any]:
        """Current objects in key order, parsed."""
        return [self._by_key[key].obj for key in self._sorted_keys()]

    def _sorted_keys(self) -> list[str]:
        if not self._keys_sorted:
            self._keys.sort()
            self._keys_sorted = True
        return self._keys

    def snapshot(self, resource_version: int, now: float, ttl: float) -> ListSnapshot:
        """The snapshot of the current state, shared by every list until the next change."""
        current = self._current
        if current is None or current.resource_version != resource_version:
            keys = list(self._sorted_keys())
            by_key = self._by_key
            current = ListSnapshot(
                id=next(self._snapshot_ids),
                resource_version=resource_version,
                keys=keys,
                entries=[by_key[key] for key in keys],
                last_used=now,
            )
            self._current = current
            self._snapshots[current.id] = current
            self._prune(now, ttl)
        current.last_used = now
        return current

    def find_snapshot(self, snapshot_id: int, now: float, ttl: float) -> ListSnapshot | None:
        self._prune(now, ttl)
        snap = self._snapshots.get(snapshot_id)
        if snap is not None:
            snap.last_used = now
        return snap

    def expire_snapshots(self) -> None:
        self._snapshots.clear()
        self._current = None

    def _prune(self, now: float, ttl: float) -> None:
        stale = [sid for sid, snap in self._snapshots.items() if now - snap.last_used > ttl]
        for sid in stale:
            del self._snapshots[sid]
            if self._current is not None and self._current.id == sid:
                self._current = None
