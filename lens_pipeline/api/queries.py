"""The read API's SQL: every filter a bound parameter, every sort column from an allow-list."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_, bindparam, case, func, literal, or_, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ColumnElement

from lens_pipeline.collect.overview import (
    OVERVIEW_FIGURES,
    overview_row,
    readable_nodes,
    weighted_utilization,
)
from lens_pipeline.store.db import refresh_planner_statistics
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
    workload_gpu_hourly_stats,
    workload_pod_reference,
    workload_statistic,
)
from lens_pipeline.store.statistics import referenced
from lens_pipeline.vendors import PROFILES

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
    # Plain tuples zipped with the column names: a third of the time of `.mappings()` per row,
    # which counts at 5,000 nodes.
    result = conn.execute(query)
    keys = list(result.keys())
    return [dict(zip(keys, row, strict=True)) for row in result]


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
        try:
            if self._connection is None:
                self._connection = self._connect()
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


class OverviewCopy:
    """Every cluster's cached overview, held in this process and kept in step with
    `cluster_overview_cache` by a background thread: the API's hot path is a dictionary lookup, no
    database round trip (PostgreSQL's cost the issue named).

    Every `refresh_seconds` the thread reads each row's `updated_at` (one small query), then the
    whole rows of those that changed, appeared or went away (every write of the overview sets
    `updated_at`, whatever order transactions commit in). An answer is therefore at most
    `refresh_seconds` plus one read behind the table. When the copy has not been refreshed for
    `STALE_AFTER` intervals (the database is down, the thread died), it is not used: the request
    reads the row itself (`reader`), and a database error is the API's 503, never old figures.
    The same thread keeps SQLite's planner statistics (`refresh_planner_statistics`) for the
    API's other reads."""

    STALE_AFTER = 3
    # SQLite's planner statistics are taken again this often (the tables grow from empty).
    PLANNER_SECONDS = 1800.0
    CHANGED_BY_NAME = 200  # more changed rows than this: all rows are read again

    def __init__(self, engine: Engine, reader: OverviewReader, refresh_seconds: float = 1.0) -> None:
        self.engine, self.reader, self.refresh_seconds = engine, reader, refresh_seconds
        self.columns = ("cluster_name", *OVERVIEW_FIGURES)
        self._rows: dict[str, Row] = {}
        self._stamps: dict[str, datetime] = {}
        self._refreshed = 0.0  # monotonic time of the last successful refresh (0: never)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def __call__(self, cluster: str) -> Row | None:
        if not self.fresh():
            self.start()
            return self.reader(cluster)
        return self._rows.get(cluster)

    def fresh(self) -> bool:
        """Whether the copy answers from memory (else a call reads the table: the database)."""
        return time.monotonic() - self._refreshed <= self.STALE_AFTER * self.refresh_seconds

    def start(self) -> None:
        """Follow the table from now on (at the app's start; again if the thread died)."""
        if self._thread is not None and self._thread.is_alive():
            return
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._follow, name="overview-copy", daemon=True)
                self._thread.start()

    def _follow(self) -> None:
        planned = -self.PLANNER_SECONDS
        failing = False
        while not self._stop.is_set():
            try:
                self.refresh()
                if time.monotonic() - planned >= self.PLANNER_SECONDS:
                    planned = time.monotonic()
                    refresh_planner_statistics(self.engine)
                failing = False
            except Exception:  # the next round tries again; meanwhile requests read the table
                if not failing:  # said once per outage, not every second
                    logging.getLogger(__name__).warning("overview copy: refresh failed", exc_info=True)
                failing = True
            self._stop.wait(self.refresh_seconds)

    def refresh(self) -> None:
        """Bring the copy in step with the table (what the thread does every interval)."""
        table = cluster_overview_cache
        with self.engine.connect() as conn:
            stamps = {c: t for c, t in conn.execute(select(table.c.cluster_name, table.c.updated_at))}
            changed = [c for c, stamp in stamps.items() if self._stamps.get(c) != stamp]
            query = select(*(table.c[c] for c in self.columns), table.c.updated_at)
            if len(changed) <= self.CHANGED_BY_NAME:
                query = query.where(table.c.cluster_name.in_(changed))
            fresh = {r["cluster_name"]: r for r in _rows(conn, query)} if changed else {}
        rows = {c: r for c, r in self._rows.items() if c in stamps and c not in fresh}
        rows.update({c: {k: r[k] for k in self.columns} for c, r in fresh.items()})
        self._stamps = {c: (fresh[c]["updated_at"] if c in fresh else stamps[c]) for c in rows}
        self._rows = rows  # one assignment: a reader sees the old copy or the new one
        self._refreshed = time.monotonic()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.reader.close()


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


def node_addresses(conn: Connection, cluster: str) -> list[Row]:
    """Every GPU node's name and address: what a series' node label may say, resolved to a node."""
    return _rows(conn, select(node.c.name, node.c.address).where(node.c.cluster_name == cluster))


def node_allocations(conn: Connection, cluster: str, vendor: str | None) -> list[tuple[str, int, int, str]]:
    """Per node with GPUs: (name, capacity, GPUs allocated, vendor: the registry's when it names
    one, else the vendor whose product label the node carries). Tuples: 5,000 of them per answer."""
    if vendor is None:
        which: Any = case(
            *((node.c.labels[p.product_label].as_string().is_not(None), p.name) for p in PROFILES.values()),
            else_=literal(""),
        )
    else:
        which = literal(vendor)
    query = (
        select(node.c.name, node.c.gpu_count, func.coalesce(node.c.gpu_allocation, 0), which)
        .where(node.c.cluster_name == cluster, node.c.gpu_count > 0)
        .order_by(node.c.name)
    )
    return [tuple(row) for row in conn.execute(query)]  # type: ignore[misc]


def _resources_of_pod() -> ColumnElement[bool]:
    """`pod_resource` joined to `gpu_pods`: the same pod."""
    return and_(pod_resource.c.cluster_name == gpu_pods.c.cluster_name, pod_resource.c.uid == gpu_pods.c.uid)


def _statistic_of_workload() -> ColumnElement[bool]:
    """`workload_statistic` joined to `gpu_workload`: the same workload."""
    return and_(
        workload_statistic.c.cluster_name == gpu_workload.c.cluster_name,
        workload_statistic.c.uid == gpu_workload.c.uid,
    )


def _top_level() -> ColumnElement[bool]:
    return or_(gpu_workload.c.parent_uid.is_(None), gpu_workload.c.parent_uid == "")


def _top_level_owners(conn: Connection, cluster: str, pod_uids: Sequence[str]) -> dict[str, list[Row]]:
    """Per pod, its top-level workloads (kind, name, namespace, uid), by uid: the references by
    pod first (their index), then those workloads, so that no query scans the cluster's workloads."""
    if not pod_uids:
        return {}
    refs = workload_pod_reference.c
    owners_of: dict[str, list[str]] = {}
    for pod_uid, workload_uid in conn.execute(
        select(refs.pod_uid, refs.workload_uid).where(
            refs.cluster_name == cluster, refs.pod_uid.in_(pod_uids)
        )
    ):
        owners_of.setdefault(pod_uid, []).append(workload_uid)
    wanted = sorted({w for owners in owners_of.values() for w in owners})
    columns = (gpu_workload.c.kind, gpu_workload.c.name, gpu_workload.c.namespace, gpu_workload.c.uid)
    tops = (
        {
            r["uid"]: r
            for r in _rows(
                conn,
                select(*columns).where(
                    gpu_workload.c.cluster_name == cluster, gpu_workload.c.uid.in_(wanted), _top_level()
                ),
            )
        }
        if wanted
        else {}
    )
    return {
        pod: sorted((tops[w] for w in owners if w in tops), key=lambda r: r["uid"])
        for pod, owners in owners_of.items()
    }


def node_workloads(conn: Connection, cluster: str, node_name: str, page: Page) -> tuple[list[Row], int]:
    """The top-level workloads of the pods running on a node, each with the GPUs all its running
    pods hold and those on this node (spec §7 `/v1/nodes/:name/workloads`). A node runs a few
    workloads: they are paged here, after three indexed reads."""
    running = list(
        conn.scalars(
            select(gpu_pods.c.uid).where(
                gpu_pods.c.cluster_name == cluster,
                gpu_pods.c.node_name == node_name,
                gpu_pods.c.running.is_(True),
            )
        )
    )
    tops = {r["uid"]: r for owners in _top_level_owners(conn, cluster, running).values() for r in owners}
    ordered = sorted(tops.values(), key=lambda r: (r["namespace"] or "", r["name"] or "", r["uid"]))
    rows = [dict(r) for r in ordered[page.offset : page.offset + page.size]]
    held: dict[str, tuple[int, int]] = {}
    if rows:
        here = case((gpu_pods.c.node_name == node_name, gpu_pods.c.gpu_allocated), else_=0)
        sums = (
            select(
                workload_pod_reference.c.workload_uid,
                func.coalesce(func.sum(gpu_pods.c.gpu_allocated), 0),
                func.coalesce(func.sum(here), 0),
            )
            .select_from(referenced(gpu_pods))
            .where(
                workload_pod_reference.c.cluster_name == cluster,
                workload_pod_reference.c.workload_uid.in_([r["uid"] for r in rows]),
                gpu_pods.c.running.is_(True),
            )
            .group_by(workload_pod_reference.c.workload_uid)
        )
        held = {uid: (int(everywhere), int(on)) for uid, everywhere, on in conn.execute(sums)}
    for row in rows:
        row["gpu_allocated"], row["gpu_allocated_node"] = held.get(row["uid"], (0, 0))
    return rows, len(ordered)


def node_pod_history(conn: Connection, cluster: str, node_name: str, page: Page) -> tuple[list[Row], int]:
    """The GPU pods that ran on a node and ended (not running, not pending), newest first, each
    with its top-level workload when it has one and when it started and ended."""
    where = and_(
        gpu_pods.c.cluster_name == cluster,
        gpu_pods.c.node_name == node_name,
        gpu_pods.c.running.is_not(True),
        or_(gpu_pods.c.phase.is_(None), gpu_pods.c.phase != "Pending"),
    )
    total = conn.scalar(select(func.count()).select_from(gpu_pods).where(where)) or 0
    ended = pod_resource.c.end_at
    query = (
        select(
            gpu_pods.c.uid,
            gpu_pods.c.name,
            gpu_pods.c.namespace,
            gpu_pods.c.gpu_allocated,
            gpu_pods.c.created_at,
            func.coalesce(ended, gpu_pods.c.updated_at).label("ended_at"),
        )
        .outerjoin(
            pod_resource,
            _resources_of_pod(),
        )
        .where(where)
        .order_by(gpu_pods.c.created_at.desc(), gpu_pods.c.uid)
        .offset(page.offset)
        .limit(page.size)
    )
    rows = _rows(conn, query)
    owners = _top_level_owners(conn, cluster, [r["uid"] for r in rows])
    for row in rows:
        found = owners.get(row["uid"])
        row["workload"] = found[0] if found else None  # a bare pod has no workload
    return rows, total


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
            _statistic_of_workload(),
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


def workload_summary(conn: Connection, cluster: str, low_below: float) -> Row:
    """Over the running top-level workloads not ended: how many, their mean GPU request, the mean
    of their instant utilization (those with statistics), how many average under `low_below` %."""
    statistic = workload_statistic
    query = (
        select(
            func.count(),
            func.avg(gpu_workload.c.gpu_request),
            func.avg(statistic.c.instant_gpu_utilization),
            func.count(case((statistic.c.avg_gpu_utilization < low_below, 1))),
        )
        .select_from(
            gpu_workload.outerjoin(
                statistic,
                _statistic_of_workload(),
            )
        )
        .where(
            gpu_workload.c.cluster_name == cluster,
            _top_level(),
            gpu_workload.c.status == "Running",
            gpu_workload.c.end_at.is_(None),
        )
    )
    count, request, instant, low = conn.execute(query).one()
    return {
        "running_workloads_count": int(count),
        "avg_gpu_allocated": float(request or 0.0),
        # Of the workloads whose utilization is known; None when none is.
        "avg_gpu_utilization": float(instant) if instant is not None else None,
        "low_utilization_workloads_count": int(low),
    }


def workload_metadata(conn: Connection, cluster: str) -> tuple[list[str], list[str]]:
    """The namespaces of every workload, and the kinds of the top-level ones."""
    where = gpu_workload.c.cluster_name == cluster
    namespaces = conn.scalars(
        select(gpu_workload.c.namespace).distinct().where(where, gpu_workload.c.namespace.is_not(None))
    )
    kinds = conn.scalars(
        select(gpu_workload.c.kind).distinct().where(where, _top_level(), gpu_workload.c.kind.is_not(None))
    )
    return sorted(namespaces), sorted(kinds)


def workload_by_name(
    conn: Connection, cluster: str, kind: str, name: str, namespace: str | None
) -> Row | None:
    """The workload of that kind and name (in `namespace` when given); the newest when several
    match (the same name in two namespaces, or made again after an earlier one ended)."""
    conditions = [
        gpu_workload.c.cluster_name == cluster,
        gpu_workload.c.kind == kind,
        gpu_workload.c.name == name,
    ]
    if namespace:
        conditions.append(gpu_workload.c.namespace == namespace)
    query = (
        select(gpu_workload)
        .where(*conditions)
        .order_by(gpu_workload.c.created_at.desc(), gpu_workload.c.uid)
        .limit(1)
    )
    row = conn.execute(query).first()
    return dict(row._mapping) if row is not None else None


def workload_pods_between(
    conn: Connection, cluster: str, uid: str, start: datetime, end: datetime
) -> list[Row]:
    """(namespace, name, node) of the workload's pods that held GPUs at some time in [start, end]:
    bound before its end and not ended before its start (whose series can be in the range)."""
    query = (
        select(gpu_pods.c.namespace, gpu_pods.c.name, gpu_pods.c.node_name)
        .select_from(
            referenced(gpu_pods).join(
                pod_resource,
                _resources_of_pod(),
            )
        )
        .where(
            workload_pod_reference.c.cluster_name == cluster,
            workload_pod_reference.c.workload_uid == uid,
            pod_resource.c.bound_at.is_not(None),
            pod_resource.c.bound_at <= end,
            or_(pod_resource.c.end_at.is_(None), pod_resource.c.end_at >= start),
        )
        .order_by(gpu_pods.c.namespace, gpu_pods.c.name)
    )
    return _rows(conn, query)


def workload_hours(conn: Connection, cluster: str, uid: str, start: datetime, end: datetime) -> list[Row]:
    """The workload's hourly utilization rows (`workload_gpu_hourly_stats`) whose hour starts in
    [start, end]."""
    hourly = workload_gpu_hourly_stats.c
    query = (
        select(hourly.stat_hour, hourly.avg_utilization, hourly.sample_count)
        .where(
            hourly.cluster_name == cluster,
            hourly.workload_uid == uid,
            hourly.stat_hour >= start,
            hourly.stat_hour <= end,
        )
        .order_by(hourly.stat_hour)
    )
    return _rows(conn, query)


@dataclass(frozen=True)
class MetricsRows:
    """What `/metrics` reads from the database at each scrape."""

    rates: list[Row]
    consumers: list[Row]
    quarantined: list[Row]
    freshness: list[Row]
    backlog: list[Backlog]


# The GPU node counts of the overview, by the state `/metrics` names (`<state>_nodes` columns):
# healthy or faulty, and each healthy node in one of the three idle buckets.
NODE_STATES = ("healthy", "faulty", "fully_idle", "partially_idle", "busy")


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
                *(cluster_overview_cache.c[f"{state}_nodes"] for state in NODE_STATES),
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
