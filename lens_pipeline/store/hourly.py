"""Reads and writes of the hourly history: which pods held GPUs in a past hour (their lives in
`pod_resource`, names in `gpu_pods`, top-level workloads through `workload_pod_reference`), and
the hour's rows, replaced whole."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Table, and_, delete, or_, select

from lens_pipeline.collect.history import HourTables
from lens_pipeline.store.schema import (
    cluster_gpu_hourly_stats,
    gpu_allocation_snapshots,
    gpu_pods,
    gpu_workload,
    label_gpu_hourly_stats,
    namespace_gpu_hourly_stats,
    pod_resource,
    workload_gpu_hourly_stats,
    workload_pod_reference,
)
from lens_pipeline.store.upsert import bulk_upsert

Row = dict[str, Any]
# Each hourly table and the column that places a row in its hour.
HOURLY_TABLES: dict[str, tuple[Table, str]] = {
    t.name: (t, column)
    for t, column in (
        (cluster_gpu_hourly_stats, "stat_hour"),
        (namespace_gpu_hourly_stats, "stat_hour"),
        (label_gpu_hourly_stats, "stat_hour"),
        (workload_gpu_hourly_stats, "stat_hour"),
        (gpu_allocation_snapshots, "snapshot_time"),
    )
}


def _held_between(cluster_name: str, start: datetime, end: datetime) -> Any:
    """GPU pods bound before `end` and not ended by `start` (a pod never bound held nothing)."""
    return and_(
        pod_resource.c.cluster_name == cluster_name,
        pod_resource.c.bound_at.is_not(None),
        pod_resource.c.bound_at < end,
        or_(pod_resource.c.end_at.is_(None), pod_resource.c.end_at > start),
        pod_resource.c.gpu_allocated > 0,
    )


def _same(table: Table, column: str, other: Table, other_column: str) -> Any:
    """The join of two of the cluster's tables on one column (within the same cluster)."""
    return and_(table.c.cluster_name == other.c.cluster_name, table.c[column] == other.c[other_column])


# The pods' lives with their names, and the workloads that reference them.
PODS = pod_resource.join(gpu_pods, _same(gpu_pods, "uid", pod_resource, "uid"))
REFERENCED_PODS = workload_pod_reference.join(
    PODS, _same(pod_resource, "uid", workload_pod_reference, "pod_uid")
)


def pods_holding(conn: Connection, cluster_name: str, start: datetime, end: datetime) -> list[Row]:
    """Every pod that held GPUs at some time in [start, end): uid, namespace, name, GPUs, bound_at,
    end_at, and `workload`, the uid of its top-level workload (None when it has none)."""
    held = _held_between(cluster_name, start, end)
    pods = (
        select(
            pod_resource.c.uid,
            gpu_pods.c.namespace,
            gpu_pods.c.name,
            pod_resource.c.gpu_allocated.label("gpus"),
            pod_resource.c.bound_at,
            pod_resource.c.end_at,
        )
        .select_from(PODS)
        .where(held)
    )
    tops = (
        select(workload_pod_reference.c.pod_uid, workload_pod_reference.c.workload_uid)
        .select_from(
            REFERENCED_PODS.join(
                gpu_workload, _same(gpu_workload, "uid", workload_pod_reference, "workload_uid")
            )
        )
        .where(held, or_(gpu_workload.c.parent_uid.is_(None), gpu_workload.c.parent_uid == ""))
    )
    top_of: dict[str, str] = {}
    for row in conn.execute(tops):
        # A pod has one top-level workload; should two claim it, the same one always wins.
        top_of[row.pod_uid] = min(top_of.get(row.pod_uid, row.workload_uid), row.workload_uid)
    return [{**row, "workload": top_of.get(row["uid"])} for row in conn.execute(pods).mappings()]


def pods_of_workloads_between(
    conn: Connection, cluster_name: str, start: datetime, end: datetime
) -> dict[str, list[Row]]:
    """Each workload's pods (namespace, name), at every level above them, that held GPUs at some
    time in [start, end), through `workload_pod_reference`."""
    query = (
        select(workload_pod_reference.c.workload_uid, gpu_pods.c.namespace, gpu_pods.c.name)
        .select_from(REFERENCED_PODS)
        .where(_held_between(cluster_name, start, end))
    )
    pods: dict[str, list[Row]] = {}
    for row in conn.execute(query).mappings():
        pods.setdefault(row["workload_uid"], []).append({"namespace": row["namespace"], "name": row["name"]})
    return pods


def workloads_by_uid(conn: Connection, cluster_name: str, uids: Sequence[str]) -> dict[str, Row]:
    """The stored `gpu_workload` rows of `uids`: kind, namespace, name, parent, labels, annotations."""
    wanted = sorted(set(uids))
    out: dict[str, Row] = {}
    columns = [
        gpu_workload.c[c] for c in ("uid", "kind", "namespace", "name", "parent_uid", "labels", "annotations")
    ]
    for first in range(0, len(wanted), 500):
        query = select(*columns).where(
            gpu_workload.c.cluster_name == cluster_name, gpu_workload.c.uid.in_(wanted[first : first + 500])
        )
        out.update({row["uid"]: dict(row) for row in conn.execute(query).mappings()})
    return out


def replace_hour_tables(
    conn: Connection, cluster_name: str, hour: datetime, tables: HourTables, now: datetime
) -> dict[str, int]:
    """Every hourly table's rows of the (cluster, hour) become those `tables` computed: rows written
    per table."""
    stamps = {"cluster_name": cluster_name, "stat_hour": hour, "created_at": now, "updated_at": now}
    rows = {
        cluster_gpu_hourly_stats: [stamps | tables.cluster],
        namespace_gpu_hourly_stats: [stamps | r for r in tables.namespaces],
        label_gpu_hourly_stats: [stamps | r for r in tables.labels],
        workload_gpu_hourly_stats: [stamps | r for r in tables.workloads],
        gpu_allocation_snapshots: [
            {"cluster_name": cluster_name, "created_at": now}
            | r
            | {"snapshot_time": datetime.fromtimestamp(r["snapshot_time"], UTC)}
            for r in tables.snapshots
        ],
    }
    end = hour + timedelta(hours=1)
    return {
        table.name: replace_hour(conn, table, cluster_name, hour, end, table_rows)
        for table, table_rows in rows.items()
    }


def replace_hour(
    conn: Connection,
    table: Table,
    cluster_name: str,
    start: datetime,
    end: datetime,
    rows: Sequence[Mapping[str, Any]],
) -> int:
    """The cluster's rows of `table` in [start, end) become `rows`: rows of the hour that no longer
    apply go, so a re-materialized hour is exactly what it computed. Returns the rows written."""
    column = table.c[HOURLY_TABLES[table.name][1]]
    conn.execute(delete(table).where(table.c.cluster_name == cluster_name, column >= start, column < end))
    return bulk_upsert(conn, table, list(rows))
