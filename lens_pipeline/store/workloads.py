"""Writing `gpu_workload`, `workload_pod_reference` and `gpu_workload_snapshot` for one cluster."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from lens_pipeline.store.pods import SnapshotWriter, latest_versions
from lens_pipeline.store.schema import gpu_workload, gpu_workload_snapshot, workload_pod_reference
from lens_pipeline.store.upsert import bulk_upsert, read_rows, sync_snapshot

Row = dict[str, Any]
ACTIVE = frozenset({"Running", "Pending"})
# What a workload's row takes from the pods below it and from other objects, not from its own object:
# compared every run, also for a workload whose object did not change.
DYNAMIC_COLUMNS = ("parent_uid", "gpu_request", "status", "end_at")


def stored_workloads(conn: Connection, cluster_name: str) -> dict[str, Row]:
    """uid -> (group_version, kind, status, end_at) of every stored workload of the cluster."""
    query = select(
        gpu_workload.c.uid,
        gpu_workload.c.group_version,
        gpu_workload.c.kind,
        gpu_workload.c.status,
        gpu_workload.c.end_at,
    ).where(gpu_workload.c.cluster_name == cluster_name)
    names = [c.name for c in query.selected_columns]
    return {r[0]: dict(zip(names, r, strict=True)) for r in read_rows(conn, query)}


def current_workloads(stored: Mapping[str, Row], versions: Mapping[str, int]) -> dict[str, str]:
    """uid -> resourceVersion (as Kubernetes writes it) of the workloads whose stored row was built
    from the object of their newest snapshot and not marked Deleted since: listed at that version,
    an owner is that same object, and only its row's `DYNAMIC_COLUMNS` can have changed."""
    return {
        uid: str(versions[uid])
        for uid, row in stored.items()
        if row["status"] != "Deleted" and uid in versions
    }


def workload_versions(conn: Connection, cluster_name: str) -> dict[str, int]:
    """The newest stored snapshot's resourceVersion per workload."""
    return latest_versions(conn, gpu_workload_snapshot, cluster_name, "uid")


def end_time(status: str, before: Row | None, now: datetime) -> datetime | None:
    """`end_at`: set once, when a workload stops being Running/Pending (kept from an earlier run if it
    had already ended), and cleared if it comes back (pods return to a Done Deployment)."""
    if status in ACTIVE:
        return None
    if before is not None and before["end_at"] is not None and before["status"] not in ACTIVE:
        return before["end_at"]
    return now


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
    unchanged: Mapping[str, tuple] | None = None,
) -> dict[str, Any]:
    """Make the cluster's workloads equal `workloads`; the ones whose object is gone become Deleted.
    `snapshots` (opened on `conn`) has taken the workloads' snapshots. `unchanged` are the
    workloads whose object did not change since their row was built (`current_workloads`): uid ->
    their `DYNAMIC_COLUMNS` but `end_at`, the only values of their rows compared.
    """
    scope = {"cluster_name": cluster_name}
    # Snapshots first: on PostgreSQL they are most of the database's work, done behind
    # (write-behind) while the workloads and their pod references are compared here.
    snapshots_written = snapshots.close()
    rows = [
        {**scope, **row, "end_at": end_time(row["status"], stored.get(row["uid"]), now)} for row in workloads
    ]
    dynamic = None
    if unchanged is not None:
        dynamic = {
            (cluster_name, uid): (*values, end_time(values[2], stored.get(uid), now))
            for uid, values in unchanged.items()
        }
    result = sync_snapshot(
        conn,
        gpu_workload,
        scope,
        rows,
        now=now,
        on_vanish=lambda record: {"status": "Deleted", "end_at": record["end_at"] or now},
        may_vanish=gpu_workload.c.status.is_distinct_from("Deleted"),
        extra_columns=("end_at",),
        protect=[(cluster_name, uid) for uid in unreadable],
        unchanged=dynamic,
        unchanged_columns=DYNAMIC_COLUMNS,
    )
    known_pairs = set(
        read_rows(
            conn,
            select(workload_pod_reference.c.workload_uid, workload_pod_reference.c.pod_uid).where(
                workload_pod_reference.c.cluster_name == cluster_name
            ),
        )
    )
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
