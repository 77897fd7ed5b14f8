"""The read API's SQL: every filter a bound parameter, every sort column from an allow-list."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_, bindparam, func, or_, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ColumnElement

from lens_pipeline.collect.overview import (
    OVERVIEW_FIGURES,
    overview_row,
    readable_nodes,
    weighted_utilization,
)
from lens_pipeline.store.event_log import Backlog, backlog
from lens_pipeline.store.overview import overview_nodes
from lens_pipeline.store.schema import (
    asset_freshness,
    cluster_overview_cache,
    container_event_dead_letter,
    gpu_consumers,
    gpu_device,
    gpu_pods,
    gpu_workload,
    node,
    pod_resource,
    workload_pod_reference,
    workload_statistic,
)
from lens_pipeline.store.statistics import referenced

Row = dict[str, Any]

# Sortable columns: the API's name -> the column. Anything else is a 400, never SQL.
NODE_ORDER = {
    "name": node.c.name,
    "gpu_name": node.c.gpu_name,
    "gpu_count": node.c.gpu_count,
    "gpu_allocation": node.c.gpu_allocation,
    "gpu_utilization": node.c.gpu_utilization,
    "status": node.c.status,
    "ip": node.c.address,
    "created_at": node.c.created_at,
}
WORKLOAD_ORDER = {
    "start_at": gpu_workload.c.created_at,
    "end_at": gpu_workload.c.end_at,
    "created_at": gpu_workload.c.created_at,
    "name": gpu_workload.c.name,
    "kind": gpu_workload.c.kind,
    "namespace": gpu_workload.c.namespace,
    "status": gpu_workload.c.status,
    "gpu_request": gpu_workload.c.gpu_request,
}


@dataclass(frozen=True)
class Page:
    number: int
    size: int

    @property
    def offset(self) -> int:
        return (self.number - 1) * self.size


def _like(value: str) -> str:
    """A LIKE pattern matching `value` anywhere, its own % and _ taken literally."""
    escaped = value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _rows(conn: Connection, query: Any) -> list[Row]:
    return [dict(r) for r in conn.execute(query).mappings()]


class OverviewReader:
    """The cluster's cached overview: one read of the unique index on `cluster_name` (the API's hot
    path). The SQL is compiled once for the engine's dialect and sent straight to the driver on a
    connection of its own in autocommit mode: one round trip per request, no pool checkout and
    no rollback on return. Called from the event loop only; a broken connection is replaced on
    the next request."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.columns = ("cluster_name", *OVERVIEW_FIGURES)
        query = select(*(cluster_overview_cache.c[c] for c in self.columns)).where(
            cluster_overview_cache.c.cluster_name == bindparam("cluster")
        )
        self.sql = str(query.compile(dialect=engine.dialect))
        self.named = engine.dialect.paramstyle in ("named", "pyformat")
        self._connection: Any = None

    def _connect(self) -> Any:
        pooled = self.engine.raw_connection()
        pooled.detach()  # ours for good: never returned to the pool, never rolled back
        connection = pooled.dbapi_connection
        assert connection is not None  # a live pooled connection has its driver connection
        dialect = self.engine.dialect.name
        if dialect == "sqlite":
            connection.isolation_level = None
        elif dialect in ("mysql", "mariadb"):
            connection.autocommit(True)
        else:
            connection.autocommit = True
        return connection

    def __call__(self, cluster: str) -> Row | None:
        params: Any = {"cluster": cluster} if self.named else (cluster,)
        if self._connection is None:
            self._connection = self._connect()
        try:
            cursor = self._connection.cursor()
            cursor.execute(self.sql, params)
            row = cursor.fetchone()
            cursor.close()
        except self.engine.dialect.loaded_dbapi.Error as exc:
            self.close()
            raise DBAPIError.instance(self.sql, params, exc, self.engine.dialect.loaded_dbapi.Error) from exc
        return dict(zip(self.columns, row, strict=True)) if row is not None else None

    def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.close()
            self._connection = None


def live_overview(conn: Connection, cluster: str) -> Row | None:
    """The overview computed from the `node` table now (the cache missed); None for a cluster the
    database does not know. Utilization is the nodes' GPU-weighted mean; storage and RDMA figures
    need Prometheus and are unknown (null) until the asset has run."""
    stored = overview_nodes(conn, cluster)
    if not stored:
        return None
    nodes, _malformed = readable_nodes(stored)  # the asset's check names them
    return overview_row(nodes, utilization=weighted_utilization(nodes))


def known_clusters(conn: Connection) -> list[str]:
    query = select(cluster_overview_cache.c.cluster_name).union(select(node.c.cluster_name).distinct())
    return sorted(conn.scalars(query))


def cluster_exists(conn: Connection, cluster: str) -> bool:
    for table in (cluster_overview_cache, node, gpu_workload):
        if conn.scalar(select(table.c.id).where(table.c.cluster_name == cluster).limit(1)) is not None:
            return True
    return False


def consumers(conn: Connection, cluster: str, page: Page) -> tuple[list[Row], int]:
    where = gpu_consumers.c.cluster_name == cluster
    total = conn.scalar(select(func.count()).select_from(gpu_consumers).where(where)) or 0
    query = (
        select(gpu_consumers)
        .where(where)
        .order_by(gpu_consumers.c.gpu_allocated.desc(), gpu_consumers.c.uid)
        .offset(page.offset)
        .limit(page.size)
    )
    return _rows(conn, query), total


def nodes(
    conn: Connection,
    cluster: str,
    page: Page,
    *,
    name: str | None,
    gpu_name: str | None,
    statuses: Sequence[str],
    order_by: str | None,
    descending: bool,
) -> tuple[list[Row], int]:
    conditions: list[ColumnElement[bool]] = [node.c.cluster_name == cluster]
    if name:
        conditions.append(node.c.name.like(_like(name), escape="\\"))
    if gpu_name:
        conditions.append(node.c.gpu_name.like(_like(gpu_name), escape="\\"))
    if statuses:
        conditions.append(node.c.status.in_(list(statuses)))
    where = and_(*conditions)
    total = conn.scalar(select(func.count()).select_from(node).where(where)) or 0
    column = NODE_ORDER[order_by or "name"]
    query = (
        select(node)
        .where(where)
        .order_by(column.desc() if descending else column.asc(), node.c.name)
        .offset(page.offset)
        .limit(page.size)
    )
    return _rows(conn, query), total


def node_row(conn: Connection, cluster: str, name: str) -> Row | None:
    row = conn.execute(select(node).where(node.c.cluster_name == cluster, node.c.name == name)).first()
    return dict(row._mapping) if row is not None else None


def gpu_devices(conn: Connection, cluster: str, node_name: str) -> list[Row]:
    query = (
        select(gpu_device)
        .where(gpu_device.c.cluster_name == cluster, gpu_device.c.node_name == node_name)
        .order_by(gpu_device.c.gpu_id)
    )
    return _rows(conn, query)


def workloads(
    conn: Connection,
    cluster: str,
    page: Page,
    *,
    name: str | None,
    kind: str | None,
    namespace: str | None,
    status: str | None,
    order_by: str | None,
    descending: bool,
) -> tuple[list[Row], int]:
    """Top-level workloads (no parent) with their statistics row, when there is one."""
    conditions: list[ColumnElement[bool]] = [
        gpu_workload.c.cluster_name == cluster,
        or_(gpu_workload.c.parent_uid.is_(None), gpu_workload.c.parent_uid == ""),
    ]
    if name:
        conditions.append(gpu_workload.c.name.like(_like(name), escape="\\"))
    if kind:
        conditions.append(gpu_workload.c.kind == kind)
    if namespace:
        conditions.append(gpu_workload.c.namespace == namespace)
    if status:
        conditions.append(gpu_workload.c.status == status)
    where = and_(*conditions)
    total = conn.scalar(select(func.count()).select_from(gpu_workload).where(where)) or 0
    column = WORKLOAD_ORDER[order_by or "created_at"]
    statistic = workload_statistic
    query = (
        select(
            gpu_workload,
            *(
                statistic.c[c].label(c)
                for c in (
                    "instant_gpu_utilization",
                    "avg_gpu_utilization",
                    "p50_gpu_utilization",
                    "p90_gpu_utilization",
                    "p95_gpu_utilization",
                    "idle_gpu_seconds",
                    "allocated_gpu_seconds",
                )
            ),
        )
        .outerjoin(
            statistic,
            and_(
                statistic.c.cluster_name == gpu_workload.c.cluster_name, statistic.c.uid == gpu_workload.c.uid
            ),
        )
        .where(where)
        .order_by(column.desc() if descending else column.asc(), gpu_workload.c.uid)
        .offset(page.offset)
        .limit(page.size)
    )
    return _rows(conn, query), total


def workload_row(conn: Connection, cluster: str, uid: str) -> Row | None:
    row = conn.execute(
        select(gpu_workload).where(gpu_workload.c.cluster_name == cluster, gpu_workload.c.uid == uid)
    ).first()
    return dict(row._mapping) if row is not None else None


def gpu_allocation(conn: Connection, cluster: str, uids: Sequence[str], now: datetime | None = None) -> dict:
    """Per workload: GPUs its pods were allocated, and GPU-hours per GPU model (spec §7)."""
    now = now or datetime.now(UTC)
    out: dict[str, dict[str, Any]] = {uid: {"gpus": 0, "hours": {}} for uid in uids}
    if not uids:
        return out
    query = (
        select(
            workload_pod_reference.c.workload_uid,
            pod_resource.c.gpu_model,
            pod_resource.c.gpu_allocated,
            pod_resource.c.bound_at,
            pod_resource.c.end_at,
        )
        .select_from(referenced(pod_resource))
        .where(
            workload_pod_reference.c.cluster_name == cluster, workload_pod_reference.c.workload_uid.in_(uids)
        )
    )
    for row in conn.execute(query).mappings():
        entry = out[row["workload_uid"]]
        gpus = row["gpu_allocated"] or 0
        if row["bound_at"] is not None:  # a pod never scheduled held no GPU
            entry["gpus"] += gpus
            seconds = max(((row["end_at"] or now) - row["bound_at"]).total_seconds(), 0.0)
            model = row["gpu_model"] or "unknown"
            entry["hours"][model] = entry["hours"].get(model, 0.0) + seconds * gpus / 3600
    return out


def workload_pods(conn: Connection, cluster: str, uid: str) -> list[Row]:
    query = (
        select(gpu_pods.c.node_name, gpu_pods.c.namespace, gpu_pods.c.name)
        .select_from(referenced(gpu_pods))
        .where(gpu_pods.c.cluster_name == cluster, workload_pod_reference.c.workload_uid == uid)
        .order_by(gpu_pods.c.namespace, gpu_pods.c.name)
    )
    return _rows(conn, query)


def workload_tree(conn: Connection, cluster: str, uid: str) -> Row | None:
    """The workload and everything under it through `parent_uid`, as nested dicts."""
    columns = (gpu_workload.c.kind, gpu_workload.c.name, gpu_workload.c.namespace, gpu_workload.c.uid)
    root = workload_row(conn, cluster, uid)
    if root is None:
        return None
    children: dict[str, list[Row]] = {}
    query = select(*columns, gpu_workload.c.parent_uid).where(
        gpu_workload.c.cluster_name == cluster,
        gpu_workload.c.parent_uid.is_not(None),
        gpu_workload.c.parent_uid != "",
    )
    for row in conn.execute(query).mappings():
        children.setdefault(row["parent_uid"], []).append(dict(row))

    def build(item: Row, seen: frozenset[str]) -> Row:
        kids = [k for k in children.get(item["uid"], []) if k["uid"] not in seen]
        return {
            "kind": item["kind"],
            "name": item["name"],
            "namespace": item["namespace"],
            "uid": item["uid"],
            "children": [
                build(k, seen | {k["uid"]}) for k in sorted(kids, key=lambda k: (k["kind"], k["name"]))
            ],
        }

    return build(root, frozenset({uid}))


@dataclass(frozen=True)
class MetricsRows:
    """What `/metrics` reads from the database at each scrape."""

    rates: list[Row]
    consumers: list[Row]
    quarantined: list[Row]
    freshness: list[Row]
    backlog: list[Backlog]


def metrics_rows(engine: Engine) -> MetricsRows:
    """Every cluster's allocation rate and utilization, every consumer, the quarantined container events per
    cluster and stage, when each asset of each cluster was last materialized, and each cluster's
    container events waiting to be applied, for `/metrics`."""
    letters = container_event_dead_letter.c
    with engine.connect() as conn:
        rates = _rows(
            conn,
            select(
                cluster_overview_cache.c.cluster_name,
                cluster_overview_cache.c.allocation_rate,
                cluster_overview_cache.c.utilization,
            ),
        )
        consumer_rows = _rows(conn, select(gpu_consumers))
        quarantined = _rows(
            conn,
            select(letters.cluster_name, letters.stage, func.count().label("events")).group_by(
                letters.cluster_name, letters.stage
            ),
        )
        freshness = _rows(
            conn,
            select(
                asset_freshness.c.cluster_name, asset_freshness.c.asset, asset_freshness.c.materialized_at
            ),
        )
        waiting = backlog(conn)
    return MetricsRows(rates, consumer_rows, quarantined, freshness, waiting)


def unix(value: datetime | None) -> int:
    return int(value.timestamp()) if value is not None else 0
