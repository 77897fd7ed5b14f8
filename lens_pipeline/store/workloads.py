"""Writing `gpu_workload`, `workload_pod_reference` and `gpu_workload_snapshot` for one cluster."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from lens_pipeline.store.pods import SnapshotWriter
from lens_pipeline.store.schema import gpu_workload, workload_pod_reference
from lens_pipeline.store.upsert import bulk_upsert, sync_snapshot

Row = dict[str, Any]
ACTIVE = frozenset({"Running", "Pending"})


def stored_workloads(conn: Connection, cluster_name: str) -> dict[str, Row]:
    """uid -> (group_version, kind, status, end_at) of every stored workload of the cluster."""
    query = select(
        gpu_workload.c.uid,
        gpu_workload.c.group_version,
        gpu_workload.c.kind,
        gpu_workload.c.status,
        gpu_workload.c.end_at,
    ).where(gpu_workload.c.cluster_name == cluster_name)
    return {r.uid: dict(r._mapping) for r in conn.execute(query)}


def write_workloads(
    conn: Connection,
    cluster_name: str,
    *,
    workloads: Sequence[Row],
    references: Iterable[tuple[str, str]],
    snapshots: SnapshotWriter,
    stored: dict[str, Row],
    now: datetime,
    unreadable: Iterable[str] = (),
) -> dict[str, Any]:
    """Make the cluster's workloads equal `workloads`; the ones whose object is gone become Deleted.
    `snapshots` (opened on `conn`) has taken the workloads' snapshots.

    `end_at` is set once, when a workload stops being Running/Pending (kept from an earlier run if
    it already ended), and cleared if it comes back (pods return to a Done Deployment).
    """
    scope = {"cluster_name": cluster_name}
    # Snapshots first: on PostgreSQL they are most of the database's work, done behind
    # (write-behind) while the workloads and their pod references are compared here.
    snapshots_written = snapshots.close()
    rows = []
    for row in workloads:
        before = stored.get(row["uid"])
        if row["status"] in ACTIVE:
            end_at = None
        elif before is not None and before["end_at"] is not None and before["status"] not in ACTIVE:
            end_at = before["end_at"]
        else:
            end_at = now
        rows.append({**scope, **row, "end_at": end_at})
    result = sync_snapshot(
        conn,
        gpu_workload,
        scope,
        rows,
        now=now,
        on_vanish=lambda record: {"status": "Deleted", "end_at": record["end_at"] or now},
        vanish_filter=lambda record: record["status"] != "Deleted",
        extra_columns=("end_at",),
        protect=[(cluster_name, uid) for uid in unreadable],
    )
    known_pairs = {
        (r.workload_uid, r.pod_uid)
        for r in conn.execute(
            select(workload_pod_reference.c.workload_uid, workload_pod_reference.c.pod_uid).where(
                workload_pod_reference.c.cluster_name == cluster_name
            )
        )
    }
    new_pairs = sorted(set(references) - known_pairs)
    bulk_upsert(
        conn,
        workload_pod_reference,
        [{**scope, "workload_uid": w, "pod_uid": p, "created_at": now} for w, p in new_pairs],
        update_columns=[],
        new=True,
    )
    return {
        "gpu_workload": result,
        "workload_pod_reference": len(new_pairs),
        "gpu_workload_snapshot": snapshots_written,
    }
