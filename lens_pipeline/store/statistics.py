"""Reads and writes of the workload statistics, the GPU consumers and the SaFE statistics."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Join, Table, and_, func, select, text

from lens_pipeline.store.schema import (
    gpu_consumers,
    gpu_pods,
    gpu_workload,
    node,
    node_statistic,
    safe_workload_statistic,
    workload_gpu_hourly_stats,
    workload_pod_reference,
    workload_statistic,
)
from lens_pipeline.store.upsert import SyncResult, bulk_upsert, sync_snapshot

Row = dict[str, Any]
ACTIVE = ("Running", "Pending")
WORKLOAD_COLUMNS = (
    "uid",
    "group_version",
    "kind",
    "namespace",
    "name",
    "parent_uid",
    "gpu_request",
    "status",
    "source",
    "labels",
    "annotations",
    "end_at",
)


def _rows(conn: Connection, query: Any) -> list[Row]:
    return [dict(r) for r in conn.execute(query).mappings()]


def active_workloads(conn: Connection, cluster_name: str) -> list[Row]:
    """The cluster's workloads that have not ended (spec §4.8's candidates)."""
    query = select(*(gpu_workload.c[c] for c in WORKLOAD_COLUMNS)).where(
        gpu_workload.c.cluster_name == cluster_name, gpu_workload.c.end_at.is_(None)
    )
    return _rows(conn, query)


def referenced(pods: Table) -> Join:
    """`workload_pod_reference` joined to a table of pods (`gpu_pods`, `pod_resource`) by pod uid."""
    return workload_pod_reference.join(
        pods,
        and_(
            pods.c.cluster_name == workload_pod_reference.c.cluster_name,
            pods.c.uid == workload_pod_reference.c.pod_uid,
        ),
    )


def running_pods_by_workload(conn: Connection, cluster_name: str) -> dict[str, list[Row]]:
    """Each workload's running pods (namespace, name, GPUs), through `workload_pod_reference`."""
    query = (
        select(
            workload_pod_reference.c.workload_uid,
            gpu_pods.c.namespace,
            gpu_pods.c.name,
            gpu_pods.c.gpu_allocated,
        )
        .select_from(referenced(gpu_pods))
        .where(
            workload_pod_reference.c.cluster_name == cluster_name,
            gpu_pods.c.running.is_(True),
            gpu_pods.c.deleted.is_not(True),
        )
    )
    pods: dict[str, list[Row]] = {}
    for row in conn.execute(query).mappings():
        pods.setdefault(row["workload_uid"], []).append(dict(row))
    return pods


def gpu_pod_names(conn: Connection, cluster_name: str) -> set[tuple[str, str]]:
    """(namespace, name) of every GPU pod the cluster has had: running, pending, terminating (which
    still hold their GPUs) or ended, with a workload or without."""
    query = select(gpu_pods.c.namespace, gpu_pods.c.name).where(gpu_pods.c.cluster_name == cluster_name)
    return {(row.namespace, row.name) for row in conn.execute(query)}


def stored_statistics(conn: Connection, cluster_name: str) -> dict[str, Row]:
    query = select(workload_statistic).where(workload_statistic.c.cluster_name == cluster_name)
    return {row["uid"]: row for row in _rows(conn, query)}


def statistics_cursor(conn: Connection, cluster_name: str) -> datetime | None:
    """Up to when the cluster's utilization has been read: the newest `last_query_time`."""
    return conn.scalar(
        select(func.max(workload_statistic.c.last_query_time)).where(
            workload_statistic.c.cluster_name == cluster_name
        )
    )


def claim_statistics_window(conn: Connection, cluster_name: str, cursor: datetime | None) -> bool:
    """Inside the write transaction: serialize the cluster's statistics writers and tell whether the
    cursor is still the one this run read (else another run already added the window: writing it
    again would count it twice). SQLite's write transactions are exclusive already; PostgreSQL takes
    a transaction-scoped advisory lock per cluster; MySQL/MariaDB lock the cluster's rows (and the
    index gap where there are none yet) until commit."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        conn.execute(
            text("SELECT pg_advisory_xact_lock(hashtext(:k))"), {"k": f"lens-statistics:{cluster_name}"}
        )
    elif dialect in ("mysql", "mariadb"):
        conn.execute(
            select(workload_statistic.c.id)
            .where(workload_statistic.c.cluster_name == cluster_name)
            .with_for_update()
        ).all()
    return statistics_cursor(conn, cluster_name) == cursor


def ended_workload_status(conn: Connection, cluster_name: str, uids: Iterable[str]) -> dict[str, Row]:
    """Status and end of workloads that have ended, for the statistics rows still saying Running."""
    uids = list(uids)
    out: dict[str, Row] = {}
    for start in range(0, len(uids), 500):
        query = select(gpu_workload.c.uid, gpu_workload.c.status, gpu_workload.c.end_at).where(
            gpu_workload.c.cluster_name == cluster_name, gpu_workload.c.uid.in_(uids[start : start + 500])
        )
        out.update({row["uid"]: row for row in _rows(conn, query)})
    return out


def stored_hours(
    conn: Connection, cluster_name: str, since: datetime, uids: Iterable[str] | None = None
) -> dict[tuple[str, datetime], Row]:
    """The hourly rows of the cluster from `since` on, by (workload uid, hour)."""
    query = select(workload_gpu_hourly_stats).where(
        workload_gpu_hourly_stats.c.cluster_name == cluster_name,
        workload_gpu_hourly_stats.c.stat_hour >= since,
    )
    wanted = set(uids) if uids is not None else None
    return {
        (row["workload_uid"], row["stat_hour"]): row
        for row in _rows(conn, query)
        if wanted is None or row["workload_uid"] in wanted
    }


def write_statistics(conn: Connection, rows: Sequence[Row]) -> None:
    bulk_upsert(conn, workload_statistic, rows)


def write_consumers(
    conn: Connection, cluster_name: str, rows: Sequence[Row], *, now: datetime, unreadable: Iterable[str] = ()
) -> SyncResult:
    """The cluster's consumers become `rows`; consumers that ended lose their row, those whose stored
    rows could not be read this run (`unreadable` uids) keep theirs."""
    return sync_snapshot(
        conn,
        gpu_consumers,
        {"cluster_name": cluster_name},
        [{"cluster_name": cluster_name, **row} for row in rows],
        now=now,
        on_vanish="delete",
        protect=[(cluster_name, uid) for uid in unreadable],
    )


def gpu_node_utilization(conn: Connection, cluster_name: str) -> list[Row]:
    """Every GPU node of the cluster with its utilization, for SaFE's node statistic."""
    query = select(node.c.name, node.c.gpu_utilization).where(
        node.c.cluster_name == cluster_name, node.c.gpu_count > 0
    )
    return _rows(conn, query)


def write_node_statistics(
    conn: Connection, cluster: str, rows: Sequence[Row], *, now: datetime
) -> SyncResult:
    """SaFE `node_statistic` by (cluster, node_name): nodes that left are soft-deleted, and a node
    that comes back is live again."""
    return sync_snapshot(
        conn,
        node_statistic,
        {"cluster": cluster},
        [{"cluster": cluster, **row, "deleted_at": None} for row in rows],
        now=now,
        compare=("gpu_utilization", "deleted_at"),
        on_vanish={"deleted_at": now},
        may_vanish=node_statistic.c.deleted_at.is_(None),
    )


def write_workload_statistics(conn: Connection, rows: Sequence[Row], *, now: datetime) -> int:
    """SaFE `workload_statistic` by (workload_id, statistic_type); `created_at` stays the first one."""
    return bulk_upsert(
        conn, safe_workload_statistic, [{**row, "created_at": now, "updated_at": now} for row in rows]
    )
