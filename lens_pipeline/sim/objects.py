"""In-memory store of one Kubernetes kind for a simulated cluster: objects kept as their serialized
JSON (a parsed pod costs three times its bytes), and immutable list snapshots that back continue tokens."""

from __future__ import annotations

import itertools
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

import orjson


def to_json(obj: Any) -> bytes:
    """orjson's bytes keep the capacity its writer grew to (16 KiB for a 3 KiB pod); a copy is exact,
    which at 150,000 pods is the difference between 2.4 GiB and 0.5 GiB."""
    return memoryview(orjson.dumps(obj)).tobytes()


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

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def get(self, key: str) -> StoredObject | None:
        return self._by_key.get(key)

    def ordered_keys(self) -> list[str]:
        """Current keys in order (a copy)."""
        return list(self._sorted_keys())

    def put(self, key: str, raw: bytes) -> None:
        if key not in self._by_key:
            if self._keys_sorted and self._keys and key < self._keys[-1]:
                self._keys_sorted = False
            self._keys.append(key)
        self._by_key[key] = StoredObject(key, raw)
        self._current = None

    def remove(self, key: str) -> StoredObject | None:
        entry = self._by_key.pop(key, None)
        if entry is not None:
            keys = self._sorted_keys()
            del keys[bisect_left(keys, key)]
            self._current = None
        return entry

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
