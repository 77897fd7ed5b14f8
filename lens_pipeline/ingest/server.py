"""`lens ingest`: the original's `ExporterService` over gRPC and the later HTTP form, both writing
one event log, plus gRPC health and reflection and `/metrics`.

One asyncio loop serves both transports; one writer thread group-commits the log. A stream is
answered with cumulative acknowledgements (`type="ack"`, `sequence=N`: every event up to the
Nth of this stream is committed) and one `type="error"` reply per refused event; an original
agent ignores both. Requests are read raw and decoded per event, so a message that is not a
valid `ContainerEvent` (bad protobuf, invalid UTF-8, over the size limit) is refused alone and
the stream goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from lens_pipeline.ingest import exporter_pb2
from lens_pipeline.ingest.config import IngestConfig, Unauthenticated
from lens_pipeline.ingest.events import ContainerEvent, Origin, Refused, from_grpc, metadata_node, split_batch
from lens_pipeline.ingest.http import IngestHttpApp
from lens_pipeline.ingest.log_writer import LogWriter, Producer
from lens_pipeline.ingest.metrics import IngestMetrics, observe_many
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.migrate import ensure_schema

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)

SERVICE = exporter_pb2.DESCRIPTOR.services_by_name["ExporterService"].full_name
METHOD_SOURCES = {"StreamContainerEvents": "k8s", "StreamDockerContainerEvents": "docker"}
BATCH_METHOD = "StreamContainerEventBatches"


class _Stream:
    """The reply side of one stream: acknowledgements and errors, in the order they arise."""

    def __init__(self, metrics: IngestMetrics, source: str) -> None:
        self.replies: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.acked = 0
        self.final_seq: int | None = None
        self._histogram = metrics.processing.labels(source)

    def committed(self, seq: int, received: list[tuple[float, int]]) -> None:
        now = time.monotonic()
        for t, events in received:
            observe_many(self._histogram, now - t, events)
        if seq > self.acked:
            self.acked = seq
            self.replies.put_nowait(ContainerEvent(type="ack", sequence=seq).SerializeToString())
        self._maybe_end()

    def refused(self, seq: int, exc: Refused) -> None:
        self.replies.put_nowait(
            ContainerEvent(type="error", sequence=seq, error=str(exc)).SerializeToString()
        )

    def end_of_input(self, seq: int) -> None:
        self.final_seq = seq
        self._maybe_end()

    def _maybe_end(self) -> None:
        if self.final_seq is not None and self.acked >= self.final_seq:
            self.replies.put_nowait(None)


@dataclass(frozen=True)
class WorkerSlot:
    """What one of the `lens ingest --workers N` processes shares with its siblings
    (`lens_pipeline.ingest.workers`): the gRPC port (each binds it with SO_REUSEPORT), the HTTP
    listening socket (inherited from the supervisor) and the metrics directory."""

    index: int
    http_socket: socket.socket
    metrics_dir: str
    metrics_socket: socket.socket | None = None  # of `--metrics-port`, listening already


class IngestServer:
    def __init__(self, config: IngestConfig, worker: WorkerSlot | None = None) -> None:
        self.config = config
        self.worker = worker
        self.metrics = IngestMetrics(multiprocess_dir=worker.metrics_dir if worker else None)
        self.healthy = False
        self.grpc_port = 0
        self.http_port = 0
        self.metrics_port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: LogWriter | None = None
        self._grpc: grpc.aio.Server | None = None
        self._health = health_aio.HealthServicer()
        self._http = None
        self._metrics_http = None
        self._received: dict[tuple[str, str], object] = {}

    # Lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        engine = get_engine(self.config.database_url)
        await asyncio.to_thread(ensure_schema, engine, "lens")
        self._writer = LogWriter(
            engine,
            linger_seconds=self.config.linger_seconds,
            max_pending_rows=self.config.max_pending_rows,
            on_health=self._set_health_threadsafe,
            on_quarantine=lambda row, _reason: self.count_refused(
                row.get("source") or "", row.get("cluster_name") or "", "quarantined"
            ),
        )
        self._writer.start()
        await self._start_grpc()
        await self._start_http()
        await self._set_health(True)
        log.info("lens ingest: gRPC on port %d, HTTP on port %d", self.grpc_port, self.http_port)

    async def stop(self) -> None:
        """Refuse new streams, let open ones finish for the grace period, commit what is queued."""
        await self._health.enter_graceful_shutdown()
        if self._grpc is not None:
            await self._grpc.stop(self.config.shutdown_grace_seconds)
        # Side by side: each may take the grace period, and the pod's is not twice that.
        await asyncio.gather(
            *(http.shutdown() for http in (self._http, self._metrics_http) if http is not None)
        )
        if self._writer is not None:
            await asyncio.to_thread(self._writer.stop)

    async def _start_grpc(self) -> None:
        limit = self.config.transport_limit
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                # Alone, a port in use is an error, not a silent share; workers share on purpose
                # (the supervisor checked that the port was free and holds it).
                ("grpc.so_reuseport", 1 if self.worker else 0),
            ]
        )
        handlers = {
            method: grpc.stream_stream_rpc_method_handler(self._handler(source))
            for method, source in METHOD_SOURCES.items()
        }
        handlers[BATCH_METHOD] = grpc.stream_stream_rpc_method_handler(self._handler("k8s", batches=True))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server,
        )
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host  # IPv6: bracketed
        address = f"{host}:{self.config.grpc_port}"
        if self.config.tls:
            credentials = grpc.ssl_server_credentials(
                [(Path(self.config.tls_key).read_bytes(), Path(self.config.tls_cert).read_bytes())],
                root_certificates=Path(self.config.tls_client_ca).read_bytes()
                if self.config.tls_client_ca
                else None,
                require_client_auth=bool(self.config.tls_client_ca),
            )
            self.grpc_port = server.add_secure_port(address, credentials)
        else:
            self.grpc_port = server.add_insecure_port(address)
        await server.start()
        self._grpc = server

    async def _start_http(self) -> None:
        # A worker's is listening already: the workers accept from one queue.
        sock = self.worker.http_socket if self.worker is not None else self._bound(self.config.http_port)
        self.http_port = sock.getsockname()[1]
        self._http = await self._serve_http(IngestHttpApp(self), sock, tls=self.config.tls)
        metrics_sock = self.worker.metrics_socket if self.worker is not None else None
        if metrics_sock is None and self.worker is None and self.config.metrics_port:
            metrics_sock = self._bound(self.config.metrics_port)
        if metrics_sock is not None:
            self.metrics_port = metrics_sock.getsockname()[1]
            self._metrics_http = await self._serve_http(
                IngestHttpApp(self, events=False), metrics_sock, tls=False
            )

    def _bound(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET6 if ":" in self.config.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.config.host, port))
        sock.set_inheritable(True)
        return sock

    async def _serve_http(self, app: IngestHttpApp, sock: socket.socket, *, tls: bool) -> uvicorn.Server:
        import uvicorn

        uv_config = uvicorn.Config(
            app,
            lifespan="off",
            log_level="warning",
            access_log=False,
            ssl_certfile=self.config.tls_cert if tls else None,
            ssl_keyfile=self.config.tls_key if tls else None,
            ssl_ca_certs=self.config.tls_client_ca if tls else None,
            ssl_cert_reqs=2 if tls and self.config.tls_client_ca else 0,
            timeout_graceful_shutdown=int(self.config.shutdown_grace_seconds),
        )
        uv_config.load()
        server = uvicorn.Server(uv_config)
        server.lifespan = uv_config.lifespan_class(uv_config)
        await server.startup(sockets=[sock])
        return server

    async def _set_health(self, serving: bool) -> None:
        self.healthy = serving
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", SERVICE):
            await self._health.set(service, status)

    def _set_health_threadsafe(self, serving: bool) -> None:
        if serving != self.healthy and self._loop is not None:
            self.healthy = serving
            with contextlib.suppress(RuntimeError):  # the loop is gone: shutting down
                asyncio.run_coroutine_threadsafe(self._set_health(serving), self._loop)

    # Shared by both transports ----------------------------------------------------------------

    def producer(self, on_commit: Callable[[int, list[tuple[float, int]]], None]) -> Producer:
        """A queue into the log whose commit notice runs `on_commit` on the event loop."""
        loop = self._loop
        assert loop is not None

        def notify(seq: int, received: list[tuple[float, int]]) -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(on_commit, seq, received)

        return Producer(on_commit=notify)

    def offer(self, producer: Producer, rows: list[dict], seq: int, received: float) -> None:
        assert self._writer is not None
        self._writer.offer(producer, rows, seq, received)

    async def room(self) -> None:
        """Wait while the writer is too far behind (back-pressure on the agents)."""
        assert self._writer is not None
        while self._writer.pending_rows > self.config.max_pending_rows:
            await asyncio.sleep(0.005)

    def count_received(self, source: str, cluster: str, events: int = 1) -> None:
        child = self._received.get((source, cluster))
        if child is None:
            child = self._received[(source, cluster)] = self.metrics.received.labels(source, cluster)
        child.inc(events)  # type: ignore[attr-defined]

    def count_refused(self, source: str, cluster: str, reason: str) -> None:
        self.metrics.errors.labels(source, cluster, reason).inc()

    # gRPC -------------------------------------------------------------------------------------

    def _handler(
        self, source: str, *, batches: bool = False
    ) -> Callable[[object, grpc.aio.ServicerContext], Awaitable[None]]:
        async def handle(_requests: object, context: grpc.aio.ServicerContext) -> None:
            await self._serve_stream(source, context, batches)

        return handle

    async def _serve_stream(self, source: str, context: grpc.aio.ServicerContext, batches: bool) -> None:
        metadata = {key.lower(): value for key, value in (context.invocation_metadata() or ())}
        try:
            token_cluster = self.config.tokens.cluster_of(metadata.get("authorization"))
        except Unauthenticated as exc:
            self.count_refused(source, "", "unauthenticated")
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            return
        try:
            node = metadata_node(metadata.get("node_name", ""))
        except Refused as exc:  # checked at the edge, as an event's own `node` is
            self.count_refused(source, token_cluster or self.config.default_cluster or "", exc.reason)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        origin = Origin(source, token_cluster, self.config.default_cluster, node)
        stream = _Stream(self.metrics, source)
        producer = self.producer(stream.committed)
        addr = context.peer() or "unknown"
        self.metrics.stream_opened(addr, source)
        reader = asyncio.create_task(self._read_stream(context, origin, stream, producer, batches))
        # A reader that fails (the peer went away, or a bug) must not leave the replies waiting.
        reader.add_done_callback(
            lambda task: task.cancelled() or task.exception() is None or stream.replies.put_nowait(None)
        )
        try:
            while (reply := await stream.replies.get()) is not None:
                await context.write(reply)
            await reader
        finally:
            reader.cancel()
            self.metrics.stream_closed(addr, source)

    async def _read_stream(
        self,
        context: grpc.aio.ServicerContext,
        origin: Origin,
        stream: _Stream,
        producer: Producer,
        batches: bool,
    ) -> None:
        seq = 0
        fallback_cluster = origin.token_cluster or origin.default_cluster
        while (message := await context.read()) is not grpc.aio.EOF:
            received = time.monotonic()
            events, message_origin = [message], origin
            if batches:
                try:
                    events, source = split_batch(message)
                except Refused as exc:  # the batch itself is unreadable: it counts as one event
                    seq += 1
                    self._refuse(origin, fallback_cluster, stream, seq, exc)
                    self.offer(producer, [], seq, received)
                    continue
                if source != origin.source:
                    message_origin = replace(origin, source=source)
            now = datetime.now(UTC)
            rows = []
            for raw in events:
                seq += 1
                try:
                    rows.append(from_grpc(raw, message_origin, now, self.config.max_event_bytes))
                except Refused as exc:
                    self._refuse(message_origin, fallback_cluster, stream, seq, exc)
            if rows:
                cluster = rows[0]["cluster_name"]
                if all(row["cluster_name"] == cluster for row in rows):
                    self.count_received(message_origin.source, cluster, len(rows))
                else:
                    for row in rows:
                        self.count_received(message_origin.source, row["cluster_name"])
            # One offer per message: the sequence moves past its refused events too.
            self.offer(producer, rows, seq, received)
            if self._writer is not None and self._writer.pending_rows > self.config.max_pending_rows:
                await self.room()
        stream.end_of_input(seq)

    def _refuse(
        self,
        origin: Origin,
        cluster: str,
        stream: _Stream,
        seq: int,
        exc: Refused,
    ) -> None:
        self.count_received(origin.source, cluster)
        self.count_refused(origin.source, cluster, exc.reason)
        stream.refused(seq, exc)


def serve_forever(config: IngestConfig, worker: WorkerSlot | None = None) -> int:
    """Run until SIGTERM or SIGINT, then stop gracefully (what `lens ingest` does, and each of
    its workers)."""

    async def main() -> None:
        server = IngestServer(config, worker)
        await server.start()
        # What the start loaded (modules, the schema, gRPC, SQLAlchemy) lives as long as the process:
        # out of the collector's full passes, which otherwise walk it again and again under load
        # (docs/BENCHMARKS.md, twenty-second pass: ~1.5 µs of CPU per event).
        gc.freeze()
        if worker is None:
            print(
                f"lens ingest: gRPC on {config.host}:{server.grpc_port}"
                f"{' (TLS)' if config.tls else ''}, HTTP on {config.host}:{server.http_port}"
                f"{f', metrics on {config.host}:{server.metrics_port}' if server.metrics_port else ''}; "
                f"{'per-cluster tokens' if config.tokens.required else f'default cluster {config.default_cluster!r}'}",
                flush=True,
            )
        else:
            print(f"lens ingest: worker {worker.index} (pid {os.getpid()}) serving", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        who = "lens ingest" if worker is None else f"lens ingest: worker {worker.index}"
        print(f"{who}: stopping (finishing open streams, committing queued events)", flush=True)
        await server.stop()

    asyncio.run(main())
    return 0


class RunningServer:
    """An `IngestServer` on its own loop in a background thread (tests, benchmarks, the demo)."""

    def __init__(self, config: IngestConfig) -> None:
        self.server = IngestServer(config)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lens-ingest", daemon=True)

    def __enter__(self) -> IngestServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(60)
        return self.server

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
