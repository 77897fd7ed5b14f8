"""What every route module of the read API shares: the original's envelope, errors, paging, name
checks, the time range of the history routes, and `Routes` (the database, the token check, the
cluster resolution and the clusters' Prometheus of one app)."""

from __future__ import annotations

import contextvars
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import orjson
from fastapi import Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from sqlalchemy import Connection, Engine

from lens_pipeline.api import queries
from lens_pipeline.api.queries import Page

if TYPE_CHECKING:
    from lens_pipeline.api.prometheus import ClusterPrometheus

MAX_PAGE_SIZE = 1000
# Pages past this are refused (400), not computed: an offset stays far from any integer limit.
MAX_PAGE_NUM = 1_000_000
# Kubernetes names, kinds and UIDs: anything else in those parameters is a 400.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")

# The history routes' bounds: a range of at most a year, at most as many points per series as
# Prometheus itself answers (11,000), and at most this many points in one answer (series x points),
# so that no request makes an unbounded query or answer. Times are unix seconds up to 2100.
MAX_RANGE_SECONDS = 366 * 86_400
MAX_POINTS_PER_SERIES = 11_000
MAX_POINTS_PER_ANSWER = 250_000
MAX_TIMESTAMP = 4_102_444_800


# The request's trace, as W3C trace context has it: the caller's trace id (its `traceparent`
# header), else a new one, and a span id of this answer. The envelope's `tracing` and the access
# log carry it, so that a line of one and an answer of the other are found together.
TRACE: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("lens_api_trace", default=None)
# Version 00 has exactly these four fields; a later version may add more after them.
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def trace_of(traceparent: str | None) -> dict[str, str]:
    """The trace of a request with this `traceparent` header (none, or one W3C trace context
    calls invalid: version ff, an all-zero trace or parent id: a new trace)."""
    found = _TRACEPARENT.match(traceparent.strip()) if traceparent else None
    valid = (
        found is not None
        and found[1] != "ff"
        and not (found[1] == "00" and found[5])
        and set(found[2]) != {"0"}
        and set(found[3]) != {"0"}
    )
    trace_id = found[2] if valid and found is not None else os.urandom(16).hex()
    return {"trace_id": trace_id, "span_id": os.urandom(8).hex()}


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def envelope(data: Any, status: int = 200, message: str = "OK") -> Response:
    """The original's envelope; errors carry the HTTP status times ten in `meta.code`."""
    code = 2000 if status == 200 else status * 10
    body = orjson.dumps({"meta": {"code": code, "message": message}, "data": data, "tracing": TRACE.get()})
    return Response(body, status_code=status, media_type="application/json")


def paged(rows: list[Any], total: int) -> Response:
    return envelope({"data": rows, "total": total})


def page(
    page_num: Annotated[int, Query(ge=1, le=MAX_PAGE_NUM)] = 1,
    page_size: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 10,
) -> Page:
    return Page(page_num, page_size)


Paging = Annotated[Page, Depends(page)]


def require_cluster(conn: Connection, cluster: str, total: int) -> None:
    """An empty answer is a 404 when the database knows nothing of the cluster."""
    if not total and not queries.cluster_exists(conn, cluster):
        raise ApiError(404, f"cluster {cluster!r} not found")


def sortable(order_by: str | None, allowed: Mapping[str, Any]) -> None:
    """Sorting only through allow-listed columns: anything else is a 400, never SQL."""
    if order_by is not None and order_by not in allowed:
        raise ApiError(400, f"cannot order by {order_by[:40]!r}; one of {', '.join(allowed)}")


def checked(value: str | None, what: str) -> str | None:
    """`value` when it is a Kubernetes name (None when empty); anything else is a 400."""
    if value is not None and value != "" and not NAME.fullmatch(value):
        raise ApiError(400, f"invalid {what} {value[:80]!r}")
    return value or None


@dataclass(frozen=True)
class TimeRange:
    """`start`..`end` (unix seconds, both included) every `step` seconds, as Prometheus' range
    queries take them."""

    start: int
    end: int
    step: int

    @property
    def points(self) -> int:
        return (self.end - self.start) // self.step + 1

    @property
    def start_time(self) -> datetime:
        return datetime.fromtimestamp(self.start, UTC)

    @property
    def end_time(self) -> datetime:
        return datetime.fromtimestamp(self.end, UTC)

    def bound_answer(self, series: int) -> None:
        """A 400 when `series` series of this range would make an answer over the limit."""
        if series * self.points > MAX_POINTS_PER_ANSWER:
            wanted = -(-(self.end - self.start) * series // MAX_POINTS_PER_ANSWER)
            raise ApiError(
                400,
                f"step {self.step} s gives {series} series of {self.points} points, over the limit of "
                f"{MAX_POINTS_PER_ANSWER:,} points in one answer: use step >= {max(wanted, 1)}",
            )


def time_range(
    start: Annotated[int, Query(description="unix seconds")],
    end: Annotated[int, Query(description="unix seconds, not before start")],
    step: Annotated[int, Query(description="seconds between points")] = 60,
) -> TimeRange:
    """The range of a history route, refused with a 400 naming the parameter when it is out of
    bounds: a time before 1970 or after 2100, start after end, more than a year, a step that is
    not positive or gives more than 11,000 points per series."""
    for name, value in (("start", start), ("end", end)):
        if not 0 <= value <= MAX_TIMESTAMP:
            raise ApiError(
                400, f"query parameter {name} {value} is not unix seconds between 0 and {MAX_TIMESTAMP}"
            )
    if start > end:
        raise ApiError(400, f"query parameter start ({start}) is after end ({end})")
    if end - start > MAX_RANGE_SECONDS:
        raise ApiError(
            400, f"end - start is {end - start} s, over the limit of {MAX_RANGE_SECONDS} s (366 days)"
        )
    if not 1 <= step <= MAX_RANGE_SECONDS:
        raise ApiError(400, f"query parameter step {step} is not between 1 and {MAX_RANGE_SECONDS} seconds")
    span = TimeRange(start, end, step)
    if span.points > MAX_POINTS_PER_SERIES:
        smallest = -(-(end - start) // (MAX_POINTS_PER_SERIES - 1))
        raise ApiError(
            400,
            f"query parameter step {step} gives {span.points:,} points per series, over the limit of "
            f"{MAX_POINTS_PER_SERIES:,}: use step >= {smallest}",
        )
    return span


Span = Annotated[TimeRange, Depends(time_range)]


@dataclass(frozen=True)
class Routes:
    """What every route of one app shares: the database, the token check, the cluster resolution,
    the cached overviews and the clusters' Prometheus."""

    engine: Engine
    authorize: Callable[[Request], Awaitable[None]]
    resolve: Callable[[str | None], str]
    cached_overview: queries.OverviewCopy
    prometheus: ClusterPrometheus

    @property
    def guarded(self) -> list[Any]:
        return [Depends(self.authorize)]

    def known(self, cluster: str | None) -> str:
        """The resolved cluster; a 404 when the database knows nothing of it (before any
        Prometheus is asked: an unknown cluster is not an unavailable one)."""
        name = self.resolve(cluster)
        with self.engine.connect() as conn:
            if not queries.cluster_exists(conn, name):
                raise ApiError(404, f"cluster {name!r} not found")
        return name

    async def resolve_off_loop(self, cluster: str | None) -> str:
        """`resolve` for the routes served on the event loop: a cluster named is only checked;
        otherwise the clusters known may be read from the database, which is done on a worker
        thread (a database that hangs must not stop every other request)."""
        if cluster:
            return self.resolve(cluster)
        return await run_in_threadpool(self.resolve, cluster)

    async def overview_row_off_loop(self, cluster: str) -> dict:
        """`overview_row` for the routes served on the event loop: the copy's row at once; the
        database (the copy stale, a database outage most likely, or a cluster not in it yet) read
        on a worker thread."""
        if self.cached_overview.fresh() and (row := self.cached_overview(cluster)) is not None:
            return row
        return await run_in_threadpool(self.overview_row, cluster)

    async def cached_overview_off_loop(self, cluster: str) -> Any:
        """`cached_overview`, reading the table on a worker thread when the copy is stale."""
        if self.cached_overview.fresh():
            return self.cached_overview(cluster)
        return await run_in_threadpool(self.cached_overview, cluster)

    def overview_row(self, cluster: str) -> dict:
        """The cluster's overview: the cached row, else computed from the `node` table; a 404 for a
        cluster the database does not know. It may read the database: the routes served on the
        event loop call it through `overview_row_off_loop`."""
        row = self.cached_overview(cluster)
        if row is None:
            with self.engine.connect() as conn:
                row = queries.live_overview(conn, cluster)
        if row is None:
            raise ApiError(404, f"cluster {cluster!r} not found")
        return row

    def node(self, cluster: str | None, name: str) -> tuple[str, dict]:
        """(cluster, the node's row); a 404 when the cluster has no such node."""
        checked(name, "node name")
        cluster_name = self.resolve(cluster)
        with self.engine.connect() as conn:
            row = queries.node_row(conn, cluster_name, name)
        if row is None:
            raise ApiError(404, f"node {name!r} not found in cluster {cluster_name!r}")
        return cluster_name, row

    def workload(self, cluster: str | None, uid: str) -> tuple[str, dict]:
        """(cluster, the workload's row); a 404 when the cluster has no such workload."""
        checked(uid, "uid")
        cluster_name = self.resolve(cluster)
        with self.engine.connect() as conn:
            row = queries.workload_row(conn, cluster_name, uid)
        if row is None:
            raise ApiError(404, f"workload {uid!r} not found in cluster {cluster_name!r}")
        return cluster_name, row
