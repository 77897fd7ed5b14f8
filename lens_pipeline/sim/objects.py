"""In-memory store of one Kubernetes kind for a simulated cluster: objects kept as dicts with their
serialized JSON cached, and immutable list snapshots that back continue tokens."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import orjson


class StoredObject:
    """One object as served. Never mutated after creation: a change stores a new StoredObject, so
    snapshots taken earlier keep serving the old version, as etcd's MVCC does."""

    __slots__ = ("_raw", "key", "obj")

    def __init__(self, key: str, obj: dict[str, Any]) -> None:
        self.key = key
        self.obj = obj
        self._raw: bytes | None = None

    @property
    def raw(self) -> bytes:
        # Two threads may serialize at once; both get identical bytes, so no lock.
        if self._raw is None:
            self._raw = orjson.dumps(self.obj)
        return self._raw


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
        self._snapshots: dict[int, ListSnapshot] = {}
        self._current: ListSnapshot | None = None
        self._snapshot_ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def get(self, key: str) -> StoredObject | None:
        return self._by_key.get(key)

    def put(self, key: str, obj: dict[str, Any]) -> None:
        self._by_key[key] = StoredObject(key, obj)
        self._current = None

    def remove(self, key: str) -> dict[str, Any] | None:
        entry = self._by_key.pop(key, None)
        if entry is not None:
            self._current = None
        return entry.obj if entry is not None else None

    def objects(self) -> list[dict[str, Any]]:
        """Current objects in key order."""
        return [self._by_key[key].obj for key in sorted(self._by_key)]

    def snapshot(self, resource_version: int, now: float, ttl: float) -> ListSnapshot:
        """The snapshot of the current state, shared by every list until the next change."""
        current = self._current
        if current is None or current.resource_version != resource_version:
            keys = sorted(self._by_key)
            current = ListSnapshot(
                id=next(self._snapshot_ids),
                resource_version=resource_version,
                keys=keys,
                entries=[self._by_key[key] for key in keys],
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
