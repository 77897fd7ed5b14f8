"""`/v1/gpu-aggregation/*`: the hourly history's tables (spec §1.19, §7), as the original's routes
served them: the clusters, the namespaces, label and annotation keys and values seen in a time
range, each table's hourly rows paged and sorted, and the allocation snapshots.

Times are RFC 3339 (`2026-11-25T14:00:00Z`); a range is `start_time` to `end_time`, both included,
and at most a year (snapshots: a week). Every bad parameter is a 400 naming it, in the API's
envelope; nothing is read unbounded: rows come a page at a time (`page_size` at most 1,000;
snapshots, which list every namespace's workloads, 100).
"""

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query
from fastapi.responses import Response
from sqlalchemy import ColumnElement, Connection, Table, func, select

from lens_pipeline.api import queries
from lens_pipeline.api.common import (
    MAX_PAGE_NUM,
    MAX_PAGE_SIZE,
    ApiError,
    Routes,
    checked,
    envelope,
    require_cluster,
)
from lens_pipeline.store.schema import (
    cluster_gpu_hourly_stats,
    gpu_allocation_snapshots,
    label_gpu_hourly_stats,
    namespace_gpu_hourly_stats,
    workload_gpu_hourly_stats,
)

Row = dict[str, Any]
PREFIX = "/v1/gpu-aggregation"
MAX_RANGE = timedelta(days=366)
MAX_SNAPSHOT_RANGE = timedelta(days=7)
DEFAULT_PAGE_SIZE = 20
DIMENSION_TYPES = ("label", "annotation")
# A label or annotation key: an optional DNS-subdomain prefix and a name (Kubernetes' syntax).
DIMENSION_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,315}[A-Za-z0-9])?$")
ORDER = {"time": "stat_hour", "utilization": "avg_utilization", "allocated_gpu_count": "allocated_gpu_count"}

Time = Annotated[str | None, Query(description="RFC 3339, e.g. 2026-11-25T14:00:00Z")]
PageNumber = Annotated[int, Query(ge=1, le=MAX_PAGE_NUM, description="from 1")]
PageSize = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)]
# A snapshot lists every namespace's workloads: at the envelope hundreds of KiB each.
DEFAULT_SNAPSHOT_PAGE_SIZE, MAX_SNAPSHOT_PAGE_SIZE = 12, 100
SnapshotPageSize = Annotated[int, Query(ge=1, le=MAX_SNAPSHOT_PAGE_SIZE)]


def time_range(
    start_time: str | None, end_time: str | None, longest: timedelta = MAX_RANGE
) -> tuple[datetime, datetime]:
    start, end = _parsed(start_time, "start_time"), _parsed(end_time, "end_time")
    if start > end:
        raise ApiError(400, f"start_time {start_time} is after end_time {end_time}")
    if end - start > longest:
        raise ApiError(400, f"start_time to end_time spans more than {longest.days} days")
    return start, end


def _parsed(text: str | None, name: str) -> datetime:
    if not text:
        raise ApiError(400, f"query parameter {name} is required (RFC 3339)")
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ApiError(400, f"query parameter {name} {text[:40]!r} is not an RFC 3339 time") from None
    if value.tzinfo is None:
        raise ApiError(400, f"query parameter {name} {text[:40]!r} has no time zone (RFC 3339: Z or +hh:mm)")
    return value.astimezone(UTC)


def dimension(dimension_type: str | None, dimension_key: str | None = "", required_key: bool = False) -> None:
    if dimension_type not in DIMENSION_TYPES:
        raise ApiError(400, f"query parameter dimension_type is one of {', '.join(DIMENSION_TYPES)}")
    if required_key and not dimension_key:
        raise ApiError(400, "query parameter dimension_key is required")
    if dimension_key and not DIMENSION_KEY.fullmatch(dimension_key):
        raise ApiError(400, f"query parameter dimension_key {dimension_key[:80]!r} is not a label key")


def known_key(conn: Connection, cluster: str, dimension_type: str, key: str) -> None:
    """An unknown key is a 400 naming the keys the cluster's hours have (not an empty answer)."""
    if not history_keys(conn, cluster, dimension_type, [key]):
        keys = history_keys(conn, cluster, dimension_type)
        raise ApiError(
            400,
            f"dimension_key {key[:80]!r} is no {dimension_type} the hourly history is cut by; "
            f"known: {', '.join(keys[:20]) or 'none'}",
        )


def ordering(order_by: str | None, order_direction: str | None, allowed: Sequence[str]) -> tuple[str, bool]:
    if order_by is not None and order_by not in allowed:
        raise ApiError(400, f"query parameter order_by is one of {', '.join(allowed)}")
    if order_direction is not None and order_direction not in ("asc", "desc"):
        raise ApiError(400, "query parameter order_direction is asc or desc")
    return ORDER[order_by or "time"], order_direction == "desc"


def equal_to(filters: Sequence[tuple[Any, str | None, str]]) -> list[ColumnElement[bool]]:
    """`column == value` for each optional filter given (names checked: anything else is a 400)."""
    return [column == value for column, value, what in filters if checked(value, what)]


@dataclass(frozen=True)
class HoursAsked:
    """What every hourly-stats route is asked: whose hours, which, which page, in which order."""

    cluster: str
    start: datetime
    end: datetime
    page: int
    page_size: int
    order_by: str | None
    order_direction: str | None


def add_routes(app: FastAPI, ctx: Routes) -> None:
    app.include_router(aggregation_router(ctx))


def aggregation_router(ctx: Routes) -> APIRouter:
    """The routes, sharing the API's database, token check and cluster resolution. (Annotations are
    evaluated as the routes are made: FastAPI reads the closure's dependency from them.)"""
    router = APIRouter(prefix=PREFIX, dependencies=ctx.guarded, tags=["GPU aggregation"])

    def paged(
        table: Table,
        cluster: str,
        where: list[ColumnElement[bool]],
        order: tuple[str, bool],
        page: int,
        size: int,
    ) -> Response:
        with ctx.engine.connect() as conn:
            total, rows = hourly_rows(conn, table, where, order, page, size)
            require_cluster(conn, cluster, total)
        body = {"total": total, "page": page, "page_size": size, "total_pages": math.ceil(total / size)}
        return envelope(body | {"data": [_item(r) for r in rows]})

    @router.get("/clusters", summary="The clusters the Lens database knows")
    def clusters() -> Response:
        with ctx.engine.connect() as conn:
            return envelope(queries.known_clusters(conn))

    @router.get("/namespaces", summary="Namespaces with GPU hours in the range")
    def namespaces(start_time: Time = None, end_time: Time = None, cluster: str | None = None) -> Response:
        start, end = time_range(start_time, end_time)
        name = ctx.resolve(cluster)
        with ctx.engine.connect() as conn:
            return envelope(distinct(conn, namespace_gpu_hourly_stats.c.namespace, name, start, end))

    @router.get("/dimension-keys", summary="Label or annotation keys with GPU hours in the range")
    def dimension_keys(
        dimension_type: str | None = None,
        start_time: Time = None,
        end_time: Time = None,
        cluster: str | None = None,
    ) -> Response:
        dimension(dimension_type)
        start, end = time_range(start_time, end_time)
        t, name = label_gpu_hourly_stats, ctx.resolve(cluster)
        with ctx.engine.connect() as conn:
            return envelope(
                distinct(conn, t.c.dimension_key, name, start, end, t.c.dimension_type == dimension_type)
            )

    @router.get("/dimension-values", summary="Values of a label or annotation key in the range")
    def dimension_values(
        dimension_type: str | None = None,
        dimension_key: str | None = None,
        start_time: Time = None,
        end_time: Time = None,
        cluster: str | None = None,
    ) -> Response:
        dimension(dimension_type, dimension_key, required_key=True)
        start, end = time_range(start_time, end_time)
        t, name = label_gpu_hourly_stats, ctx.resolve(cluster)
        same_key = [t.c.dimension_type == dimension_type, t.c.dimension_key == dimension_key]
        with ctx.engine.connect() as conn:
            known_key(conn, name, str(dimension_type), str(dimension_key))
            return envelope(distinct(conn, t.c.dimension_value, name, start, end, *same_key))

    def hours(
        start_time: Time = None,
        end_time: Time = None,
        cluster: str | None = None,
        page: PageNumber = 1,
        page_size: PageSize = DEFAULT_PAGE_SIZE,
        order_by: str | None = None,
        order_direction: str | None = None,
    ) -> HoursAsked:
        start, end = time_range(start_time, end_time)
        return HoursAsked(ctx.resolve(cluster), start, end, page, page_size, order_by, order_direction)

    Asked = Annotated[HoursAsked, Depends(hours)]

    def hourly(
        table: Table, asked: HoursAsked, sorts: Sequence[str], *where: ColumnElement[bool]
    ) -> Response:
        order = ordering(asked.order_by, asked.order_direction, sorts)
        conditions = [*_in_range(table, asked.cluster, asked.start, asked.end), *where]
        return paged(table, asked.cluster, conditions, order, asked.page, asked.page_size)

    @router.get("/cluster/hourly-stats", summary="The cluster's GPU hours")
    def cluster_hours(asked: Asked) -> Response:
        return hourly(cluster_gpu_hourly_stats, asked, ("time", "utilization"))

    @router.get("/namespaces/hourly-stats", summary="Each namespace's GPU hours (or one namespace's)")
    def namespace_hours(asked: Asked, namespace: str | None = None) -> Response:
        t = namespace_gpu_hourly_stats
        return hourly(t, asked, ("time", "utilization"), *equal_to([(t.c.namespace, namespace, "namespace")]))

    @router.get("/labels/hourly-stats", summary="GPU hours of each value of a label or annotation key")
    def label_hours(
        asked: Asked,
        dimension_type: str | None = None,
        dimension_key: str | None = None,
        dimension_value: str | None = None,
    ) -> Response:
        dimension(dimension_type, dimension_key, required_key=True)
        t = label_gpu_hourly_stats
        with ctx.engine.connect() as conn:
            known_key(conn, asked.cluster, str(dimension_type), str(dimension_key))
        where = [t.c.dimension_type == dimension_type, t.c.dimension_key == dimension_key]
        where += [t.c.dimension_value == value[:255] for value in (dimension_value,) if value]
        return hourly(t, asked, tuple(ORDER), *where)

    @router.get("/workloads/hourly-stats", summary="Each top-level workload's GPU hours")
    def workload_hours(
        asked: Asked,
        namespace: str | None = None,
        workload_name: str | None = None,
        workload_type: str | None = None,
    ) -> Response:
        t = workload_gpu_hourly_stats
        filters = [
            (t.c.namespace, namespace, "namespace"),
            (t.c.workload_name, workload_name, "workload_name"),
            (t.c.workload_type, workload_type, "workload_type"),
        ]
        return hourly(t, asked, tuple(ORDER), *equal_to(filters))

    @router.get("/snapshots/latest", summary="The cluster's newest allocation snapshot")
    def latest_snapshot(cluster: str | None = None) -> Response:
        name = ctx.resolve(cluster)
        t = gpu_allocation_snapshots
        query = select(t).where(t.c.cluster_name == name).order_by(t.c.snapshot_time.desc()).limit(1)
        with ctx.engine.connect() as conn:
            rows = [_item(dict(r)) for r in conn.execute(query).mappings()]
        for row in rows:
            return envelope(row)
        raise ApiError(404, f"no allocation snapshot of cluster {name!r}")

    @router.get(
        "/snapshots", summary="The cluster's allocation snapshots in the range (default: the last day)"
    )
    def snapshots(
        start_time: Time = None,
        end_time: Time = None,
        cluster: str | None = None,
        page: PageNumber = 1,
        page_size: SnapshotPageSize = DEFAULT_SNAPSHOT_PAGE_SIZE,
    ) -> Response:
        now = datetime.now(UTC)
        start, end = time_range(
            start_time or _text(now - timedelta(days=1)), end_time or _text(now), MAX_SNAPSHOT_RANGE
        )
        t, name = gpu_allocation_snapshots, ctx.resolve(cluster)
        where = [t.c.cluster_name == name, t.c.snapshot_time >= start, t.c.snapshot_time <= end]
        return paged(t, name, where, ("snapshot_time", False), page, page_size)

    return router


def _text(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _item(row: Mapping[str, Any]) -> Row:
    """A row as the original's models wrote it: snake_case columns, times in RFC 3339 (UTC, Z). (Column
    names come as SQLAlchemy's str subclass, which orjson refuses as keys.)"""
    return {str(k): _text(v) if isinstance(v, datetime) else v for k, v in row.items()}


def _in_range(table: Table, cluster: str, start: datetime, end: datetime) -> list[ColumnElement[bool]]:
    return [table.c.cluster_name == cluster, table.c.stat_hour >= start, table.c.stat_hour <= end]


def hourly_rows(
    conn: Connection,
    table: Table,
    where: Sequence[ColumnElement[bool]],
    order: tuple[str, bool],
    page: int,
    size: int,
) -> tuple[int, list[Row]]:
    """One page of a table's hourly rows, and how many there are."""
    total = conn.scalar(select(func.count()).select_from(table).where(*where)) or 0
    column, descending = table.c[order[0]], order[1]
    # Ties (several namespaces in an hour) in a fixed order, so pages never overlap.
    query = (
        select(table)
        .where(*where)
        .order_by(column.desc() if descending else column.asc(), table.c.id)
        .offset((page - 1) * size)
        .limit(size)
    )
    return total, [dict(r) for r in conn.execute(query).mappings()]


def distinct(
    conn: Connection, column: Any, cluster: str, start: datetime, end: datetime, *where: ColumnElement[bool]
) -> list[str]:
    """The distinct values of `column` in the cluster's hours of the range, sorted."""
    table = column.table
    query = select(column).where(*_in_range(table, cluster, start, end), *where).distinct().order_by(column)
    return list(conn.scalars(query))


def history_keys(
    conn: Connection, cluster: str, dimension_type: str, keys: Sequence[str] | None = None
) -> list[str]:
    """The label (or annotation) keys the cluster's hours are cut by (those of `keys`, when given)."""
    t = label_gpu_hourly_stats
    where = [t.c.cluster_name == cluster, t.c.dimension_type == dimension_type]
    if keys is not None:
        return [k for k in keys if conn.scalar(select(t.c.id).where(*where, t.c.dimension_key == k).limit(1))]
    return list(conn.scalars(select(t.c.dimension_key).where(*where).distinct().order_by(t.c.dimension_key)))
