"""Writing `gpu_pods`, `pod_resource`, `pod_snapshot` and `gpu_pods_event` for one cluster."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, func, select

from lens_pipeline.store.schema import gpu_pods, gpu_pods_event, pod_resource, pod_snapshot
from lens_pipeline.store.upsert import SyncResult, bulk_upsert, sync_snapshot

Row = dict[str, Any]


def latest_versions(conn: Connection, table: Any, cluster_name: str, uid_column: str) -> dict[str, int]:
    """The newest stored resource_version per object: a snapshot is written only when it moved."""
    uid = table.c[uid_column]
    query = (
        select(uid, func.max(table.c.resource_version))
        .where(table.c.cluster_name == cluster_name)
        .group_by(uid)
    )
    return {row[0]: row[1] for row in conn.execute(query)}


def insert_new_snapshots(
    conn: Connection,
    table: Any,
    cluster_name: str,
    uid_column: str,
    snapshots: Sequence[Row],
    *,
    now: datetime,
) -> tuple[list[Row], set[str]]:
    """Insert the snapshots whose resourceVersion is newer than the object's last stored one.
    Returns them, and the uids of the objects that had no snapshot stored before."""
    known = latest_versions(conn, table, cluster_name, uid_column)
    fresh = [
        {"cluster_name": cluster_name, **s, "created_at": now}
        for s in snapshots
        if s["resource_version"] > known.get(s[uid_column], -1)
    ]
    bulk_upsert(conn, table, fresh, update_columns=[], new=True)
    return fresh, {s[uid_column] for s in fresh if s[uid_column] not in known}


def write_pods(
    conn: Connection,
    cluster_name: str,
    *,
    pods: Sequence[Row],
    resources: Sequence[Row],
    snapshots: Sequence[Row],
    events_of: Any,
    now: datetime,
    unreadable: Iterable[str] = (),
) -> dict[str, Any]:
    """One cluster's GPU pods, as one transaction's worth of writes.

    Pods gone from the cluster are marked `deleted`, not running, and their `pod_resource` gets an
    `end_at`; nothing is dropped. A snapshot (and the condition events it brings) is written only
    for pods whose resourceVersion is newer than the last stored one. `events_of(uid)` gives the
    event rows of a pod whose snapshot is new.
    """
    scope = {"cluster_name": cluster_name}
    protect = [(cluster_name, uid) for uid in unreadable]
    # Snapshots and events first: on PostgreSQL they are most of the database's work, done behind
    # (write-behind) while the pods and their resources are compared here.
    new_snapshots, first_seen = insert_new_snapshots(
        conn, pod_snapshot, cluster_name, "pod_uid", snapshots, now=now
    )
    # The events of a pod seen for the first time are new (PostgreSQL COPYs them straight into the
    # table); a pod seen before may bring again a condition already stored, which is left alone.
    first_events, other_events = [], []
    for s in new_snapshots:
        uid = s["pod_uid"]
        (first_events if uid in first_seen else other_events).extend({**scope, **e} for e in events_of(uid))
    bulk_upsert(conn, gpu_pods_event, first_events, update_columns=[], new=True)
    bulk_upsert(conn, gpu_pods_event, other_events, update_columns=[])
    counts = {"pod_snapshot": len(new_snapshots), "gpu_pods_event": len(first_events) + len(other_events)}
    del new_snapshots, first_events, other_events  # sent: not kept while the pods are compared
    pods_result: SyncResult = sync_snapshot(
        conn,
        gpu_pods,
        scope,
        [{**scope, **r} for r in pods],
        now=now,
        on_vanish={"deleted": True, "running": False},
        # Pods marked gone stay stored for good; they are not read back on every run.
        settled=and_(gpu_pods.c.deleted.is_(True), gpu_pods.c.running.is_not(True)),
        protect=protect,
    )
    resources_result = sync_snapshot(
        conn,
        pod_resource,
        scope,
        [{**scope, **r} for r in resources],
        now=now,
        on_vanish={"end_at": now},
        vanish_filter=lambda stored: stored["end_at"] is None,
        protect=protect,
    )
    return {
        "gpu_pods": pods_result,
        "pod_resource": resources_result,
        **counts,
    }
