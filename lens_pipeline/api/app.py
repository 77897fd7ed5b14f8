"""The read API (`lens api`): the original's `/v1` routes over the Lens database.

Every answer is the original's envelope, `{"meta": {"code": 2000, "message": "OK"}, "data": ...}`;
errors carry the HTTP status times ten in `meta.code` (400 -> 4000). `GET /v1/clusters/overview`
is one read of `cluster_overview_cache` by its unique index, computed live from the `node` table
when the cache has no row. Filters are bound parameters, sorting is through allow-listed columns,
and a bearer token guards `/v1` when one is configured. The OpenAPI description is at
`/openapi.json` (and `/docs`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from lens_pipeline import bearer, settings
from lens_pipeline.api import aggregation, clusters, nodes, queries, workloads
from lens_pipeline.api.common import (
    MAX_PAGE_NUM,
    MAX_PAGE_SIZE,
    TRACE,
    ApiError,
    Paging,
    Routes,
    checked,
    envelope,
    paged,
    require_cluster,
    sortable,
    trace_of,
)
from lens_pipeline.api.prometheus import ClusterPrometheus
from lens_pipeline.api.queries import NODE_ORDER, WORKLOAD_ORDER
from lens_pipeline.clusters import Registry, load_registry
from lens_pipeline.collect.overview import api_overview
from lens_pipeline.store.db import database_unavailable, get_engine, get_read_engine
from lens_pipeline.store.event_log import Backlog
from lens_pipeline.store.migrate import ensure_schema

log = logging.getLogger(__name__)
# One JSON line per request (`_Instrumented`); `lens api` writes it to its standard output unless
# `$LENS_API_ACCESS_LOG` is "0" (`--no-access-log`).
ACCESS_LOG = logging.getLogger("lens.api.access")

__all__ = ["MAX_PAGE_NUM", "MAX_PAGE_SIZE", "MAX_QUERY_BYTES", "ApiError", "create_app", "envelope"]

STATUS_COLOR = {"Ready": "green", "NotReady": "red", "Unknown": "yellow"}
WORKLOAD_STATUS_COLOR = {
    "Running": "green",
    "Pending": "yellow",
    "Done": "blue",
    "Failed": "red",
    "Deleted": "gray",
}
NODE_STATUSES = frozenset(STATUS_COLOR)
WORKLOAD_STATUSES = frozenset(WORKLOAD_STATUS_COLOR)
# A query string longer than this, or with a NUL anywhere (which PostgreSQL text refuses and SQLite
# would compare oddly), is a 400 before any route sees it.
MAX_QUERY_BYTES = 8192
# Swagger UI's script and style, served by the API itself: /docs works with no internet.
SWAGGER_ASSETS = files("fastapi_offline") / "static"


class _Unhandled:
    """ASGI middleware: an exception no handler took (a bug of ours) is answered here, a 500 in the
    envelope naming its type and nothing it says, with the request's trace ids and, being inside
    the CORS middleware, readable by an allowed page; its traceback is logged once. (Starlette's
    own handler of last resort sits outside every middleware, and raises it again to the server,
    which logs it a second time, text included.) Once an answer has started, it is the server's."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if started:
                raise
            log.error("%s %s: unhandled error", scope.get("method"), scope.get("path"), exc_info=exc)
            await envelope(None, 500, f"internal error: {type(exc).__name__}")(scope, receive, send)


class QueryGuard:
    """ASGI middleware: a path or query string with a NUL (raw or %00), or a query string over
    `MAX_QUERY_BYTES`, is
    answered 400 in the API's envelope, whatever the route: bad input never reaches the database."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            query: bytes = scope.get("query_string", b"")
            problem = None
            if "\x00" in scope.get("path", ""):
                problem = "the path contains a NUL character"
            elif len(query) > MAX_QUERY_BYTES:
                problem = f"query string of {len(query)} bytes is over the limit of {MAX_QUERY_BYTES}"
            elif b"\x00" in query or b"%00" in query.lower():
                name = next(
                    (p.split(b"=", 1)[0] for p in query.split(b"&") if b"\x00" in p or b"%00" in p.lower()),
                    b"?",
                )
                problem = f"query parameter {name.decode('latin-1')[:40]!r} contains a NUL character"
            if problem is not None:
                await envelope(None, 400, f"bad request: {problem}")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    engine: Engine,
    *,
    token: str | None = None,
    default_cluster: str | None = None,
    registry: Callable[[], Registry] | None = None,
    cors_origins: Sequence[str] = (),
) -> FastAPI:
    """The API over `engine`'s Lens database; `registry` loads the cluster registry, whose
    Prometheus URLs the routes of series finer than an hour ask (none: those routes answer 503).
    Pages of `cors_origins` (`*`: any) may read it from a browser, with a bearer token."""
    overview = queries.OverviewCopy(engine, queries.OverviewReader(engine))

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        overview.start()
        yield
        overview.close()

    app = FastAPI(
        title="lens-pipeline read API",
        version="1",
        description=__doc__,
        default_response_class=Response,
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    metrics = CollectorRegistry()
    requests = Counter("lens_api_requests_total", "API requests", ("route", "code"), registry=metrics)
    errors = Counter(
        "lens_api_database_errors_total", "Database unavailable: requests answered 503", registry=metrics
    )
    prometheus_errors = Counter(
        "lens_api_prometheus_errors_total", "Prometheus queries that failed, answered 503", registry=metrics
    )
    latency = Histogram(
        "lens_api_request_duration_seconds",
        "Time to answer",
        ("route",),
        registry=metrics,
        buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5),
    )
    app.add_middleware(QueryGuard)
    _offline_docs(app)

    # Several tokens, comma-separated, are all accepted during a rotation.
    accepted = bearer.split_tokens(token)

    async def authorize(request: Request) -> None:
        if not bearer.accepts(request.headers.get("authorization"), accepted):
            raise ApiError(401, "missing or wrong bearer token")

    def resolve(cluster: str | None) -> str:
        """`cluster`, else the configured default, else the only cluster there is."""
        cluster = checked(cluster, "cluster") or default_cluster
        if cluster is not None:
            return cluster
        with engine.connect() as conn:
            known = queries.known_clusters(conn)
        if len(known) == 1:
            return known[0]
        raise ApiError(400, f"query parameter cluster is required ({len(known)} clusters are known)")

    prometheus_latency = Histogram(
        "lens_api_prometheus_query_seconds",
        "Time each Prometheus query of the series routes took (request and parsing of the answer)",
        registry=metrics,
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
    )
    prometheus = ClusterPrometheus(registry, prometheus_errors, prometheus_latency)
    metrics.register(_FleetCollector(engine, prometheus.registered))
    ctx = Routes(engine, authorize, resolve, overview, prometheus)
    _error_handlers(app, errors)
    _cluster_routes(app, ctx, metrics)
    # Before `/v1/nodes/{name}` and `/v1/workloads/{uid}`: `gpuAllocation`, `statistic`... are
    # routes, not names (Kubernetes names are lower case, UIDs are UUIDs).
    for module in (clusters, nodes, workloads, aggregation):
        module.add_routes(app, ctx)
    _node_routes(app, ctx)
    _workload_routes(app, ctx)
    app.add_middleware(_Unhandled)  # inside CORS, so that a 500 carries its headers too
    if cors_origins:
        # Outside the routes: a browser's preflight (OPTIONS, no token) is answered here. The token
        # travels in a header, never a cookie: no credentials mode.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET"],
            allow_headers=["Authorization", "traceparent", "tracestate"],
            max_age=600,
        )
    app.add_middleware(_Instrumented, requests=requests, latency=latency)
    return app


def _offline_docs(app: FastAPI) -> None:
    """`/docs` (Swagger UI) and `/redoc` from files the API serves itself (a package's copy), no CDN."""
    app.mount("/docs-assets", StaticFiles(directory=str(SWAGGER_ASSETS)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}/docs-assets/swagger-ui-bundle.js",
            swagger_css_url=f"{root}/docs-assets/swagger-ui.css",
            swagger_favicon_url=f"{root}/docs-assets/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}/docs-assets/redoc.standalone.js",
            redoc_favicon_url=f"{root}/docs-assets/favicon.png",
            with_google_fonts=False,
        )


def _error_handlers(app: FastAPI, errors: Counter) -> None:
    """Every error in the API's envelope; a database that is unavailable is a 503, counted."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> Response:
        return envelope(None, exc.status, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}" for e in exc.errors())
        return envelope(None, 400, f"bad request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> Response:
        return envelope(None, exc.status_code, str(exc.detail))

    @app.exception_handler(SQLAlchemyError)
    async def _database_error(request: Request, exc: SQLAlchemyError) -> Response:
        if database_unavailable(exc):  # down, unreachable, overloaded, the connection lost
            errors.inc()
            return envelope(None, 503, f"database unavailable: {type(exc).__name__}")
        # Every parameter is bounded and typed before a query is made, so a statement the database
        # refuses is a bug of ours, not bad input, and the database is not "unavailable".
        log.error("%s %s: database error", request.method, request.url.path, exc_info=exc)
        return envelope(None, 500, f"internal error: {type(exc).__name__}")


def _cluster_routes(app: FastAPI, ctx: Routes, metrics: CollectorRegistry) -> None:
    @app.get("/livez", summary="Liveness: the process answers; touches nothing")
    async def livez() -> Response:
        # On the event loop: a loop stuck fails it. Not the database: an outage makes the pods
        # unready (`/healthz`), and restarting them would not bring it back.
        return envelope({"status": "alive"})

    @app.get("/healthz", summary="Readiness: the database answers")
    def healthz() -> Response:
        with ctx.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return envelope({"status": "ok"})

    @app.get("/metrics", summary="Prometheus metrics: allocation rate and GPU consumers per cluster")
    def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    @app.get(
        "/v1/clusters/overview",
        summary="The cluster overview (spec §3)",
        openapi_extra={
            "parameters": [
                {"name": "cluster", "in": "query", "required": False, "schema": {"type": "string"}}
            ]
        },
    )
    async def overview(request: Request) -> Response:
        # The hot path: no dependency solving, no thread hop, one indexed read (microseconds).
        await ctx.authorize(request)
        name = await ctx.resolve_off_loop(request.query_params.get("cluster"))
        return envelope(api_overview(await ctx.overview_row_off_loop(name)))

    @app.get("/v1/clusters/consumers", dependencies=ctx.guarded, summary="Running top-level GPU consumers")
    def consumers(paging: Paging, cluster: str | None = None) -> Response:
        name = ctx.resolve(cluster)
        with ctx.engine.connect() as conn:
            rows, total = queries.consumers(conn, name, paging)
            require_cluster(conn, name, total)
        return paged(
            [
                {
                    "kind": r["kind"],
                    "name": r["name"],
                    "namespace": r["namespace"],
                    "uid": r["uid"],
                    "stat": {"gpu_request": r["gpu_allocated"], "gpu_utilization": r["gpu_utilization"]},
                    "pods": None,
                    "active_pods": r["active_pods"],
                    "idle_gpu_seconds": r["idle_gpu_seconds"],
                    "source": r["source"],
                }
                for r in rows
            ],
            total,
        )


def _node_routes(app: FastAPI, ctx: Routes) -> None:
    @app.get("/v1/nodes", dependencies=ctx.guarded, summary="GPU nodes, filtered, sorted and paged")
    def nodes(
        paging: Paging,
        cluster: str | None = None,
        name: str | None = None,
        gpu_name: str | None = None,
        status: str | None = None,
        order_by: str | None = None,
        desc: bool = False,
    ) -> Response:
        statuses = [s.strip() for s in (status or "").split(",") if s.strip()]
        if bad := [s for s in statuses if s not in NODE_STATUSES]:
            raise ApiError(400, f"unknown status {bad[0][:40]!r}; one of {', '.join(sorted(NODE_STATUSES))}")
        sortable(order_by, NODE_ORDER)
        name_ = ctx.resolve(cluster)
        with ctx.engine.connect() as conn:
            rows, total = queries.nodes(
                conn,
                name_,
                paging,
                name=name,
                gpu_name=gpu_name,
                statuses=statuses,
                order_by=order_by,
                descending=desc,
            )
            require_cluster(conn, name_, total)
        return paged(
            [
                {
                    "name": r["name"],
                    "ip": r["address"],
                    "gpu_name": r["gpu_name"],
                    "gpu_count": r["gpu_count"],
                    "gpu_allocation": r["gpu_allocation"],
                    "gpu_utilization": r["gpu_utilization"],
                    "status": r["status"],
                    "status_color": STATUS_COLOR.get(r["status"], "yellow"),
                }
                for r in rows
            ],
            total,
        )

    @app.get("/v1/nodes/{name}", dependencies=ctx.guarded, summary="One node's details")
    def node_detail(name: str, cluster: str | None = None) -> Response:
        _, row = ctx.node(cluster, name)
        return envelope(
            {
                "name": row["name"],
                "health": row["status"],
                "cpu": f"{row['cpu_count'] or 0} X {row['cpu'] or ''}".strip(),
                "memory": row["memory"],
                "os": row["os"],
                "gpu_driver_version": row["driver_version"],
                "static_gpu_details": f"{row['gpu_count'] or 0} X {row['gpu_name'] or ''}".strip(),
                "kubelet_version": row["kubelet_version"],
                "containerd_version": row["containerd_version"],
            }
        )

    @app.get("/v1/nodes/{name}/gpuDevices", dependencies=ctx.guarded, summary="A node's GPUs by index")
    def node_gpus(name: str, cluster: str | None = None) -> Response:
        cluster_name, _ = ctx.node(cluster, name)
        with ctx.engine.connect() as conn:
            devices = queries.gpu_devices(conn, cluster_name, name)
        return envelope(
            [
                {
                    "deviceId": d["gpu_id"],
                    "model": d["gpu_model"],
                    "memory": f"{round((d['memory'] or 0) / 1024)}GB",
                    "utilization": d["utilization"],
                    "temperature": d["temperature"],
                    "power": d["power"],
                    "serial": d["serial"],
                }
                for d in devices
            ]
        )


def _workload_routes(app: FastAPI, ctx: Routes) -> None:
    @app.get("/v1/workloads", dependencies=ctx.guarded, summary="Top-level workloads with GPU statistics")
    def workloads(
        paging: Paging,
        cluster: str | None = None,
        name: str | None = None,
        kind: str | None = None,
        namespace: str | None = None,
        status: str | None = None,
        order_by: str | None = None,
        order: str | None = None,
    ) -> Response:
        checked(kind, "kind")
        checked(namespace, "namespace")
        if status is not None and status not in WORKLOAD_STATUSES:
            raise ApiError(
                400, f"unknown status {status[:40]!r}; one of {', '.join(sorted(WORKLOAD_STATUSES))}"
            )
        sortable(order_by, WORKLOAD_ORDER)
        if order is not None and order.lower() not in ("asc", "desc"):
            raise ApiError(400, "order is asc or desc")
        # As the original: newest first unless asked otherwise.
        descending = order is None or order.lower() == "desc"
        cluster_name = ctx.resolve(cluster)
        with ctx.engine.connect() as conn:
            rows, total = queries.workloads(
                conn,
                cluster_name,
                paging,
                name=name,
                kind=kind,
                namespace=namespace,
                status=status,
                order_by=order_by,
                descending=descending,
            )
            require_cluster(conn, cluster_name, total)
            allocation = queries.gpu_allocation(conn, cluster_name, [r["uid"] for r in rows])
        return paged([_workload_item(r, allocation[r["uid"]]) for r in rows], total)

    @app.get("/v1/workloads/{uid}", dependencies=ctx.guarded, summary="One workload and its pods")
    def workload_detail(uid: str, cluster: str | None = None) -> Response:
        cluster_name, row = ctx.workload(cluster, uid)
        with ctx.engine.connect() as conn:
            pods = queries.workload_pods(conn, cluster_name, uid)
            allocation = queries.gpu_allocation(conn, cluster_name, [uid])[uid]
        return envelope(
            {
                "apiVersion": row["group_version"],
                "kind": row["kind"],
                "name": row["name"],
                "namespace": row["namespace"],
                "uid": row["uid"],
                "status": row["status"],
                "gpu_allocated": allocation["gpus"],
                "gpu_allocation": allocation["hours"],
                "pods": [
                    {"nodeName": p["node_name"], "podNamespace": p["namespace"], "podName": p["name"]}
                    for p in pods
                ],
                "startTime": queries.unix(row["created_at"]),
                "endTime": queries.unix(row["end_at"]),
                "source": row["source"],
            }
        )

    @app.get(
        "/v1/workloads/{uid}/hierarchy", dependencies=ctx.guarded, summary="A workload's tree of children"
    )
    def workload_hierarchy(uid: str, cluster: str | None = None) -> Response:
        cluster_name, _ = ctx.workload(cluster, uid)
        with ctx.engine.connect() as conn:
            tree = queries.workload_tree(conn, cluster_name, uid)
        return envelope(tree)


def _workload_item(row: dict, allocation: dict) -> dict:
    running = row["status"] == "Running"
    return {
        "kind": row["kind"],
        "name": row["name"],
        "namespace": row["namespace"],
        "uid": row["uid"],
        "gpu_allocated": allocation["gpus"],
        "gpu_allocation": allocation["hours"],
        "status": row["status"],
        "status_color": WORKLOAD_STATUS_COLOR.get(row["status"], "gray"),
        "start_at": queries.unix(row["created_at"]),
        "end_at": queries.unix(row["end_at"]),
        "source": row["source"],
        "instant_gpu_utilization": row["instant_gpu_utilization"] if running else None,
        "avg_gpu_utilization": row["avg_gpu_utilization"],
        "p50_gpu_utilization": row["p50_gpu_utilization"],
        "p90_gpu_utilization": row["p90_gpu_utilization"],
        "p95_gpu_utilization": row["p95_gpu_utilization"],
        "allocated_gpu_seconds": row["allocated_gpu_seconds"],
        "idle_gpu_seconds": row["idle_gpu_seconds"],
    }


class _Instrumented:
    """Counts and times every request by route template, gives it its trace (`common.TRACE`), and
    writes its access log line: one JSON object (plain ASGI: no per-request task)."""

    def __init__(self, app: Any, *, requests: Counter, latency: Histogram) -> None:
        self.app, self.requests, self.latency = app, requests, latency

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.perf_counter()
        traceparent = next((v for k, v in scope.get("headers", ()) if k == b"traceparent"), None)
        trace = trace_of(traceparent.decode("latin-1") if traceparent is not None else None)
        traced = TRACE.set(trace)

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            TRACE.reset(traced)
            route = getattr(scope.get("route"), "path", "unmatched")
            seconds = time.perf_counter() - started
            self.latency.labels(route).observe(seconds)
            self.requests.labels(route, str(status)).inc()
            if ACCESS_LOG.isEnabledFor(logging.INFO):
                client = scope.get("client")
                line = {
                    "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                    "method": scope.get("method"),
                    "path": scope.get("path"),
                    "route": route,
                    "status": status,
                    "duration_ms": round(seconds * 1000, 3),
                    "client": client[0] if client else None,
                    **trace,
                }
                ACCESS_LOG.info(orjson.dumps(line).decode())


# How long after its last event a cluster the registry does not list still counts as sending.
STRAYS_RECENT = timedelta(hours=1)


class _FleetCollector:
    """The allocation rate and consumer gauges, read from the database at every scrape: a consumer
    that ended has no row, so it has no series (the original's gauges never forgot one). A cluster
    the registry no longer lists keeps its rows but has no gauge (its collection stopped on
    purpose: no staleness alert for it, no frozen allocation rate); `lens_clusters_unregistered`
    counts them. Without a registry, or when it cannot be read, every cluster is exported."""

    def __init__(self, engine: Engine, registered: Callable[[], set[str] | None] = lambda: None) -> None:
        self.engine = engine
        self.registered = registered

    def collect(self) -> Any:
        read = queries.metrics_rows(self.engine)
        listed = self.registered()
        in_db = {row["cluster_name"] for row in (*read.rates, *read.freshness)}
        unregistered = GaugeMetricFamily(
            "lens_clusters_unregistered",
            "Clusters with rows in the Lens database that the registry no longer lists: their gauges "
            "are not exported (their rows stay)",
        )
        unregistered.add_metric([], float(len(in_db - listed)) if listed is not None else 0.0)
        yield unregistered

        def ours(rows: list[Any]) -> list[Any]:
            return rows if listed is None else [row for row in rows if row["cluster_name"] in listed]

        rates, consumers, quarantined, freshness = (
            ours(read.rates),
            ours(read.consumers),
            read.quarantined,  # a counter, alerted on its increase: kept for the record
            ours(read.freshness),
        )
        backlog = read.backlog if listed is None else [b for b in read.backlog if b.cluster in listed]
        # Events still coming for a cluster the registry does not list: no container_events run
        # applies them (node agents that name no cluster, under lens ingest's --default-cluster; a
        # cluster disabled or misnamed). Said, not hidden with the retired clusters' gauges; a
        # cluster retired on purpose, whose agents sent their last events, stops counting an hour
        # after the last (its leftovers stay in the log).
        strays = GaugeMetricFamily(
            "lens_container_events_unregistered",
            "Container events waiting in the ingest log for a cluster the registry does not list "
            "(or disables), of clusters that sent one in the last hour: never applied while it does not",
            labels=["cluster"],
        )
        recent = datetime.now(UTC) - STRAYS_RECENT
        for item in read.backlog:
            if listed is None or item.cluster in listed or not item.events:
                continue
            if item.newest_received_at is not None and item.newest_received_at >= recent:
                strays.add_metric([item.cluster], float(item.events))
        yield strays
        collected = GaugeMetricFamily(
            "lens_cluster_last_collected_timestamp_seconds",
            "When each asset of each cluster was last materialized (unix seconds): alert on time() minus this",
            labels=["cluster", "asset"],
        )
        for row in freshness:
            collected.add_metric([row["cluster_name"], row["asset"]], row["materialized_at"].timestamp())
        yield collected
        letters = CounterMetricFamily(
            "lens_container_events_quarantined",
            "Container events set aside in container_event_dead_letter (could not be logged or applied)",
            labels=["cluster", "stage"],
        )
        for row in quarantined:
            letters.add_metric([row["cluster_name"], row["stage"]], float(row["events"]))
        yield letters
        yield from _ingest_lag(backlog)
        rate = GaugeMetricFamily(
            "gpu_allocation_rate", "Allocated GPUs of healthy GPU nodes, percent (0-100)", labels=["cluster"]
        )
        ratio = GaugeMetricFamily(
            "lens_gpu_allocation_ratio",
            "Allocated GPUs of healthy GPU nodes, as a ratio (0-1, the base unit)",
            labels=["cluster"],
        )
        utilization = GaugeMetricFamily(
            "lens_gpu_utilization_ratio",
            "Mean utilization of the cluster's GPUs, as a ratio (0-1); no series while it is unknown",
            labels=["cluster"],
        )
        nodes = GaugeMetricFamily(
            "lens_cluster_gpu_nodes",
            "GPU nodes of the cluster by state: healthy or faulty (not Ready, no GPUs, or a NoSchedule/"
            "NoExecute taint other than the GPU resource's own), and each healthy one fully_idle, "
            "partially_idle or busy",
            labels=["cluster", "state"],
        )
        for row in rates:
            for state in queries.NODE_STATES:
                nodes.add_metric([row["cluster_name"], state], float(row[f"{state}_nodes"]))
            rate.add_metric([row["cluster_name"]], row["allocation_rate"])
            ratio.add_metric([row["cluster_name"]], row["allocation_rate"] / 100.0)
            if row["utilization"] is not None:
                utilization.add_metric([row["cluster_name"]], float(row["utilization"]) / 100.0)
        yield nodes
        yield rate
        yield ratio
        yield utilization
        labels = ["cluster", "kind", "name", "namespace", "uid"]
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "gpu_utilization": GaugeMetricFamily(
                "consumer_pod_gpu_usage", "Mean utilization of the consumer's GPUs, percent", labels=labels
            ),
            "gpu_allocated": GaugeMetricFamily(
                "consumer_pod_gpu_allocated", "GPUs held by the consumer's running pods", labels=labels
            ),
            "active_pods": GaugeMetricFamily(
                "consumer_pod_active", "The consumer's running GPU pods", labels=labels
            ),
            "idle_gpu_seconds": CounterMetricFamily(
                "consumer_pod_gpu_idle_seconds",
                "GPU-seconds the consumer held under the idle threshold",
                labels=labels,
            ),
        }
        usage_ratio = GaugeMetricFamily(
            "lens_consumer_gpu_utilization_ratio",
            "Mean utilization of the consumer's GPUs, as a ratio (0-1, the base unit)",
            labels=labels,
        )
        for row in consumers:
            values = [row["cluster_name"], row["kind"], row["name"], row["namespace"], row["uid"]]
            for column, family in families.items():
                if row[column] is not None:  # an unknown utilization has no series, never a 0
                    family.add_metric(values, float(row[column]))
            if row["gpu_utilization"] is not None:
                usage_ratio.add_metric(values, float(row["gpu_utilization"]) / 100.0)
        yield from families.values()
        yield usage_ratio


def _ingest_lag(waiting: list[Backlog]) -> Iterator[GaugeMetricFamily]:
    """Per cluster: the container events logged but not applied yet, and for how long the oldest
    has waited (0 when caught up): ingest works but container_events does not keep up, or stopped."""
    events = GaugeMetricFamily(
        "lens_container_events_unprocessed",
        "Container events in the ingest log that need processing and are not applied yet",
        labels=["cluster"],
    )
    lag = GaugeMetricFamily(
        "lens_container_events_lag_seconds",
        "How long the oldest container event not applied yet has waited in the ingest log (0: caught up)",
        labels=["cluster"],
    )
    now = datetime.now(UTC)
    for item in waiting:
        events.add_metric([item.cluster], float(item.events))
        waited = (now - item.oldest_received_at).total_seconds() if item.oldest_received_at else 0.0
        lag.add_metric([item.cluster], max(waited, 0.0))
    yield events
    yield lag


def _log_access_to_stdout() -> None:
    if not any(getattr(h, "lens_access", False) for h in ACCESS_LOG.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.lens_access = True  # type: ignore[attr-defined]
        ACCESS_LOG.addHandler(handler)
    ACCESS_LOG.setLevel(logging.INFO)
    ACCESS_LOG.propagate = False


def app_from_environment() -> FastAPI:
    """The app `lens api` serves: the Lens database, token, default cluster and cluster registry
    (`LENS_CLUSTERS_FILE`, for the clusters' Prometheus) from the environment."""
    if settings.api_access_log():
        _log_access_to_stdout()
    ensure_schema(get_engine(settings.lens_database_url()), "lens")
    engine = get_read_engine(settings.lens_database_url())
    registry_file = settings.clusters_file()
    return create_app(
        engine,
        token=os.environ.get(settings.LENS_API_TOKEN) or None,
        default_cluster=os.environ.get(settings.LENS_API_DEFAULT_CLUSTER) or None,
        registry=(lambda: load_registry(registry_file)) if registry_file else None,
        cors_origins=settings.api_cors_origins(),
    )
