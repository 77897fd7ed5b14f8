"""The simulator's HTTP server: every cluster of a fleet under `/clusters/<name>`, serving the
Kubernetes API, Prometheus, the exporters' /metrics, and the simulator's own `/_...` endpoints."""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from lens_pipeline.sim.faults import ConnectionDropped
from lens_pipeline.sim.fleet import CONTROL_ACTIONS, SimCluster, SimFleet
from lens_pipeline.sim.kubeapi import handle_kube, status_response
from lens_pipeline.sim.promapi import exposition, handle_prometheus
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.serviceproxy import handle_service_proxy, service_proxy_route
from lens_pipeline.sim.streams import WatchStreams
from lens_pipeline.sim.tls import ServerCertificate, make_certificate
from lens_pipeline.sim.truth import cluster_truth
from lens_pipeline.sim.wire import SimRequest, SimResponse, Stream, http_chunk, json_response

__all__ = ["SimServer", "handle_simulator", "write_registry"]

log = logging.getLogger(__name__)


def handle_simulator(cluster: SimCluster, req: SimRequest) -> SimResponse:
    """The simulator's own endpoints (`/_truth`, `/_control`, `/_requests`); never faulted or logged."""
    if req.path == "/_truth" and req.method == "GET":
        return json_response(200, cluster_truth(cluster))
    if req.path == "/_requests" and req.method == "GET":
        return json_response(200, cluster.request_log.as_json())
    if req.path == "/_requests/reset" and req.method == "POST":
        cluster.request_log.reset()
        return json_response(200, {"ok": True})
    if req.path == "/_control" and req.method == "POST":
        return _control(cluster, req.body)
    return json_response(404, {"ok": False, "error": f"no simulator endpoint {req.method} {req.path}"})


def _control(cluster: SimCluster, body: bytes) -> SimResponse:
    try:
        command: Any = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as exc:
        return json_response(400, {"ok": False, "error": f"body is not JSON: {exc}"})
    if not isinstance(command, dict):
        return json_response(400, {"ok": False, "error": "body must be a JSON object"})
    action = command.pop("action", None)
    if action not in CONTROL_ACTIONS:
        return json_response(
            400, {"ok": False, "error": f"action must be one of {sorted(CONTROL_ACTIONS)}, got {action!r}"}
        )
    try:
        result = getattr(cluster, action)(**command)
    except LookupError as exc:
        return json_response(404, {"ok": False, "error": str(exc)})
    except (TypeError, ValueError) as exc:
        return json_response(400, {"ok": False, "error": f"{action}: {exc}"})
    return json_response(200, {"ok": True, "result": result})


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps connections alive, which clients paging through large lists depend on.
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle each response would stall ~40 ms.
    disable_nagle_algorithm = True
    server: _FleetHTTPServer

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, open_=True)

    def handle(self) -> None:
        if isinstance(self.connection, ssl.SSLSocket):
            # The handshake runs here, in this connection's thread, not in the accepting one.
            try:
                self.connection.do_handshake()
            except (ssl.SSLError, OSError):
                self.close_connection = True
                return
        super().handle()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, open_=False)

    def _dispatch(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        split = urlsplit(self.path)
        try:
            response = self._route(split.path, split.query, body)
        except ConnectionDropped as dropped:
            self._drop(dropped.mode)
            return
        except Exception as exc:  # a bug in the simulator must answer 500, not kill the connection
            log.exception("simulator failed on %s %s", self.command, self.path)
            response = json_response(500, {"error": f"simulator error: {type(exc).__name__}: {exc}"})
        self._send(response)

    def _client_common_name(self) -> str | None:
        """The common name of the client certificate the TLS handshake verified against the
        simulator's CA (kube-apiserver's `--client-ca-file` authentication: the CN is the user)."""
        if not isinstance(self.connection, ssl.SSLSocket):
            return None
        certificate = self.connection.getpeercert() or {}
        for attributes in certificate.get("subject", ()):
            for key, value in attributes:
                if key == "commonName":
                    return str(value)
        return None

    def _route(self, path: str, query: str, body: bytes) -> SimResponse:
        fleet = self.server.fleet
        parts = path.split("/", 3)  # "", "clusters", name, rest
        if path in ("", "/"):
            return json_response(
                200,
                {
                    "clusters": [
                        {"name": c.name, "vendor": c.vendor, "base_url": self.server.base_url(c.name)}
                        for c in fleet
                    ]
                },
            )
        if len(parts) < 3 or parts[1] != "clusters" or unquote(parts[2]) not in fleet:
            return status_response(404, f"no simulated cluster at {path}")
        cluster = fleet.cluster(unquote(parts[2]))
        rest = "/" + parts[3] if len(parts) > 3 else "/"
        req = SimRequest(
            method=self.command,
            path=unquote(rest),
            query=parse_qs(query, keep_blank_values=True),
            headers={key.lower(): value for key, value in self.headers.items()},
            body=body,
            client_cn=self._client_common_name(),
        )
        if rest.startswith("/_"):
            return handle_simulator(cluster, req)
        if rest == "/metrics" or rest.startswith("/metrics/"):
            response = exposition(cluster, unquote(rest))
        elif rest == "/prometheus" or rest.startswith("/prometheus/"):
            self._apply_faults(cluster, "prometheus", req, query)
            if cluster.prometheus_allows(req.headers, req.client_cn):
                response = handle_prometheus(cluster, req, req.path.removeprefix("/prometheus"))
            else:  # what the authenticating proxy in front answers (plain text, no Prometheus JSON)
                response = SimResponse(401, b"Unauthorized\n", "text/plain; charset=utf-8")
        else:
            self._apply_faults(cluster, "kube", req, query)
            proxied = service_proxy_route(req.path)
            if proxied is not None:
                response = handle_service_proxy(cluster, req, proxied)
            else:
                response = handle_kube(cluster, req)
        cluster.request_log.record(self.command, req.path, query, response.status)
        return response

    def _apply_faults(self, cluster: SimCluster, target: str, req: SimRequest, query: str) -> None:
        """Apply the target's connection and delay faults (its status fault is the handler's)."""
        faults = cluster.faults(target)
        if faults.connection is not None:
            cluster.request_log.record(self.command, req.path, query, 0)
            raise ConnectionDropped(faults.connection)
        if faults.delay:
            time.sleep(faults.delay)

    def _drop(self, mode: str) -> None:
        """Close the connection without answering; "reset" aborts it (RST) instead of closing (FIN)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            if mode == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # The socket closes for real only once the request's read buffer lets go of it.
            self.rfile.close()
            self.connection.close()

    def _send(self, response: SimResponse) -> None:
        if response.stream is not None:
            self._send_stream(response)
            return
        try:
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            for key, value in response.headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(response.body)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (timeout, Ctrl-C); nothing left to tell it.
            self.close_connection = True

    def _send_stream(self, response: SimResponse) -> None:
        """A response written as it is produced, in chunks (a watch): its headers and opening from
        this thread, the rest from the server's streaming thread (`WatchStreams`), which closes the
        connection when the stream ends, the client goes or the server stops."""
        stream = response.stream
        assert stream is not None
        try:
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Transfer-Encoding", "chunked")
            for key, value in response.headers.items():
                self.send_header(key, value)
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in _in_chunks(stream.opening(), OPENING_CHUNK):
                self.wfile.write(chunk)
        except OSError:  # the client went away
            self.close_connection = True
            return
        self.close_connection = True
        self.server.adopt(self.connection, stream)


# The opening events of a watch (every object, without a resourceVersion) go out in chunks of this.
OPENING_CHUNK = 256 << 10


def _in_chunks(events: Iterable[bytes], size: int) -> Iterator[bytes]:
    """`events` joined into HTTP chunks of about `size` bytes each."""
    pending = bytearray()
    for event in events:
        pending += event
        if len(pending) >= size:
            yield http_chunk(pending)
            pending.clear()
    if pending:
        yield http_chunk(pending)


class _FleetHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], fleet: SimFleet, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(address, _Handler)
        self.fleet = fleet
        self.tls = tls
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self.watches = WatchStreams()
        self._adopted: set[socket.socket] = set()

    def adopt(self, connection: socket.socket, stream: Stream) -> None:
        """Hand `connection` to the streaming thread: the request's thread ends without closing it."""
        with self._connections_lock:
            self._adopted.add(connection)
        self.watches.adopt(connection, stream)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            if request in self._adopted:
                self._adopted.discard(request)
                return
        super().shutdown_request(request)

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = super().get_request()
        if self.tls is not None:
            connection = self.tls.wrap_socket(connection, server_side=True, do_handshake_on_connect=False)
        return connection, address

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        # Bound to every interface, the server is still reached locally through the loopback address.
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"{'https' if self.tls is not None else 'http'}://{host}:{port}"

    def base_url(self, name: str) -> str:
        return f"{self.url}/clusters/{name}"

    def track(self, connection: socket.socket, open_: bool) -> None:
        with self._connections_lock:
            if open_:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close_connections(self) -> None:
        """Wake handler threads parked on idle keep-alive connections so they exit."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class SimServer:
    """Serves a SimFleet over HTTP (or HTTPS with `tls=True`, from a fresh CA) from a background thread."""

    def __init__(self, fleet: SimFleet, host: str = "127.0.0.1", port: int = 0, tls: bool = False) -> None:
        self.fleet = fleet
        self.host = host
        self.port = port
        # The CA clients must trust (kubeconfigs carry it); None when serving plain HTTP.
        self.certificate: ServerCertificate | None = None
        if tls:
            hosts = tuple(dict.fromkeys(("127.0.0.1", "localhost", host)))
            self.certificate = make_certificate(tuple(h for h in hosts if h not in ("0.0.0.0", "::", "")))
        self._httpd: _FleetHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> SimServer:
        if self._httpd is not None:
            return self
        context = self.certificate.server_context() if self.certificate is not None else None
        self._httpd = _FleetHTTPServer((self.host, self.port), self.fleet, context)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            # A short poll interval keeps stop() fast; an idle poll costs next to nothing.
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="lens-sim-http",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.watches.stop()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("SimServer is not started")
        return self._httpd.url

    def base_url(self, cluster_name: str) -> str:
        """`http://host:port/clusters/<name>`: the cluster's Kubernetes API server URL."""
        self.fleet.cluster(cluster_name)
        return f"{self.url}/clusters/{cluster_name}"

    def prometheus_url(self, cluster_name: str) -> str:
        return f"{self.base_url(cluster_name)}/prometheus"
