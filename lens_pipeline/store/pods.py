"""Writing `gpu_pods`, `pod_resource`, `pod_snapshot` and `gpu_pods_event` for one cluster."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, func, not_, select

from lens_pipeline.store.schema import gpu_pods, gpu_pods_event, pod_resource, pod_snapshot
from lens_pipeline.store.upsert import SyncResult, bulk_upsert, read_rows, sync_snapshot

Row = dict[str, Any]
# Snapshots sent per batch: on PostgreSQL each batch of new rows is a few COPY chunks and their
# savepoints (upsert.CHUNK_BYTES), so batches must stay large enough to keep the savepoints of one
# transaction few (at 150k pods, 6 batches).
SNAPSHOT_BATCH_ROWS = 20_000
# Pods marked gone (deleted and not running) stay stored for good; they are not read back every run.
SETTLED_PODS = and_(gpu_pods.c.deleted.is_(True), gpu_pods.c.running.is_not(True))


def latest_versions(conn: Connection, table: Any, cluster_name: str, uid_column: str) -> dict[str, int]:
    """The newest stored resource_version per object: a snapshot is written only when it moved."""
    uid = table.c[uid_column]
    query = (
        select(uid, func.max(table.c.resource_version))
        .where(table.c.cluster_name == cluster_name)
        .group_by(uid)
    )
    return dict(read_rows(conn, query))


@dataclass(frozen=True)
class StoredPods:
    """What is stored of a cluster's pods, read before they are listed."""

    versions: dict[str, int] = field(default_factory=dict)  # newest snapshot's resourceVersion per pod
    # The pods whose rows hold what their newest snapshot's object says (rows not marked gone, both
    # stored): that resourceVersion as Kubernetes writes it, and the GPUs the rows say it holds.
    current: dict[str, tuple[str, int]] = field(default_factory=dict)


def stored_pods(conn: Connection, cluster_name: str) -> StoredPods:
    """The cluster's stored pod versions: a pod listed at the version its rows were built from is
    the same object (Kubernetes gives every change a new resourceVersion), with nothing to rebuild."""
    versions = latest_versions(conn, pod_snapshot, cluster_name, "pod_uid")
    query = (
        select(gpu_pods.c.uid, gpu_pods.c.gpu_allocated)
        .join(
            pod_resource,
            and_(
                pod_resource.c.cluster_name == gpu_pods.c.cluster_name, pod_resource.c.uid == gpu_pods.c.uid
            ),
        )
        .where(gpu_pods.c.cluster_name == cluster_name, not_(SETTLED_PODS))
    )
    current: dict[str, tuple[str, int]] = {}
    for uid, gpus in read_rows(conn, query):
        version = versions.get(uid)
        if version is not None and gpus:
            current[uid] = (str(version), gpus)
    return StoredPods(versions, current)


class SnapshotWriter:
    """Snapshots written as they are built, in batches, each only when the object's resourceVersion
    is newer than its last stored one: on PostgreSQL the database stores the first batches
    (write-behind) while the collector still builds the others.

    Open it on the collector's write transaction; `close` sends what is left."""

    def __init__(
        self,
        conn: Connection,
        table: Any,
        cluster_name: str,
        uid_column: str,
        *,
        now: datetime,
        versions: dict[str, int] | None = None,
        batch_rows: int = SNAPSHOT_BATCH_ROWS,
    ) -> None:
        """`versions`: the newest stored resourceVersion per object, when the caller read them."""
        self._conn, self._table, self._uid = conn, table, uid_column
        self._fixed = {"cluster_name": cluster_name, "created_at": now}
        self._known = (
            versions if versions is not None else latest_versions(conn, table, cluster_name, uid_column)
        )
        self._batch_rows = batch_rows
        self._pending: list[Row] = []
        self.written = 0
        self.first_seen: set[str] = set()  # objects with no snapshot stored before

    def moved(self, uid: str, version: int) -> bool:
        """Whether a snapshot at `version` is newer than the object's last stored one."""
        return version > self._known.get(uid, -1)

    def add(self, snapshot: Row) -> None:
        """Queue the snapshot if it moved."""
        uid = snapshot[self._uid]
        if not self.moved(uid, snapshot["resource_version"]):
            return
        if uid not in self._known:
            self.first_seen.add(uid)
        self._pending.append({**snapshot, **self._fixed})
        if len(self._pending) >= self._batch_rows:
            self._send()

    def close(self) -> int:
        """Send what is left; the number of snapshots written."""
        self._send()
        return self.written

    def _send(self) -> None:
        bulk_upsert(self._conn, self._table, self._pending, update_columns=[], new=True)
        self.written += len(self._pending)
        self._pending = []


def write_pods(
    conn: Connection,
    cluster_name: str,
    *,
    pods: Sequence[Row],
    resources: Sequence[Row],
    snapshots: SnapshotWriter,
    events: Iterable[Row],
    now: datetime,
    unreadable: Iterable[str] = (),
    unchanged: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One cluster's GPU pods, as one transaction's worth of writes, on the transaction `snapshots`
    was opened on.

    Pods gone from the cluster are marked `deleted`, not running, and their `pod_resource` gets an
    `end_at`; nothing is dropped. A snapshot (and the condition events it brings) is written only
    for pods whose resourceVersion is newer than the last stored one: `events` are the condition
    events of the pods whose snapshot `snapshots` took. `unchanged` (uid -> the GPU model of its
    node) are the pods listed at the version their stored rows were built from: `pods` and
    `resources` hold the rows of the others, and of these only the GPU model is compared.
    """
    scope = {"cluster_name": cluster_name}
    protect = [(cluster_name, uid) for uid in unreadable]
    # Snapshots and events first: on PostgreSQL they are most of the database's work, done behind
    # (write-behind) while the pods and their resources are compared here.
    snapshots_written = snapshots.close()
    # The events of a pod seen for the first time are new (PostgreSQL COPYs them straight into the
    # table); a pod seen before may bring again a condition already stored, which is left alone.
    first_events: list[Row] = []
    other_events: list[Row] = []
    for event in events:
        (first_events if event["pod_uuid"] in snapshots.first_seen else other_events).append(
            {**scope, **event}
        )
    bulk_upsert(conn, gpu_pods_event, first_events, update_columns=[], new=True)
    bulk_upsert(conn, gpu_pods_event, other_events, update_columns=[])
    counts = {"pod_snapshot": snapshots_written, "gpu_pods_event": len(first_events) + len(other_events)}
    del first_events, other_events  # sent: not kept while the pods are compared
    same = None if unchanged is None else {(cluster_name, uid): () for uid in unchanged}
    pods_result: SyncResult = sync_snapshot(
        conn,
        gpu_pods,
        scope,
        [{**scope, **r} for r in pods],
        now=now,
        on_vanish={"deleted": True, "running": False},
        settled=SETTLED_PODS,
        protect=protect,
        unchanged=same,
    )
    del same
    resources_result = sync_snapshot(
        conn,
        pod_resource,
        scope,
        [{**scope, **r} for r in resources],
        now=now,
        on_vanish={"end_at": now},
        may_vanish=pod_resource.c.end_at.is_(None),
        protect=protect,
        unchanged=None if unchanged is None else {(cluster_name, u): (m,) for u, m in unchanged.items()},
        unchanged_columns=("gpu_model",),
    )
    return {
        "gpu_pods": pods_result,
        "pod_resource": resources_result,
        **counts,
    }
