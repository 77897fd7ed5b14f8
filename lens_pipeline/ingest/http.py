"""The HTTP side of `lens ingest`: the later original's `POST /v1/container-events[/batch]`
(spec §2.2), plus `/metrics`, `/livez` (the process answers) and `/healthz` (its log writer commits). A bare ASGI app served by uvicorn on the server's loop.

Answers: 200 when every event is committed, 206 when some were refused (partial), 400 when none
was taken, always with `{"total","success","error"}` (and `errors` saying which and why); 401 for a
missing or wrong token, 413 for a body over the limit. The response is sent only after commit.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from lens_pipeline.ingest.config import Unauthenticated
from lens_pipeline.ingest.events import Origin, Refused, from_json
from lens_pipeline.ingest.metrics import observe_many

if TYPE_CHECKING:
    from lens_pipeline.ingest.server import IngestServer

EVENTS_PATH = "/v1/container-events"
BATCH_PATH = "/v1/container-events/batch"


class IngestHttpApp:
    """The HTTP port; with `events=False` the metrics port (`--metrics-port`): the same /metrics,
    /livez and /healthz, and no events."""

    def __init__(self, server: IngestServer, *, events: bool = True) -> None:
        self.server = server
        self.events = events

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"].rstrip("/") or "/"
        if path == "/metrics" and method == "GET":
            await _respond(send, 200, self.server.metrics.exposition(), b"text/plain; version=0.0.4")
        elif path == "/livez" and method == "GET":  # the loop answers; the database is /healthz's
            await _json(send, 200, {"status": "alive"})
        elif path == "/healthz" and method == "GET":
            healthy = self.server.healthy
            await _json(send, 200 if healthy else 503, {"status": "SERVING" if healthy else "NOT_SERVING"})
        elif path in (EVENTS_PATH, BATCH_PATH) and self.events:
            if method != "POST":
                await _json(send, 405, {"error": f"{path} takes POST"})
                return
            await self._events(scope, receive, send, batch=path == BATCH_PATH)
        else:
            await _json(send, 404, {"error": f"no route {method} {path}"})

    async def _events(self, scope: dict, receive: Any, send: Any, *, batch: bool) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            token_cluster = self.server.config.tokens.cluster_of(headers.get("authorization"))
        except Unauthenticated as exc:
            self.server.count_refused("", "", "unauthenticated")
            await _json(send, 401, {"error": str(exc)}, extra=[(b"www-authenticate", b"Bearer")])
            return
        limit = self.server.config.transport_limit
        body = await _read_body(receive, limit)
        if body is None:
            self.server.count_refused("", token_cluster or "", "oversized")
            await _json(send, 413, {"error": f"request body over {limit} bytes"})
            return
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            self.server.count_refused("", token_cluster or "", "malformed")
            await _json(send, 400, {"error": f"body is not JSON (or not UTF-8): {exc}"})
            return
        if batch:
            events = document.get("events") if isinstance(document, dict) else None
            if not isinstance(events, list):
                await _json(send, 400, {"error": 'a batch body is {"events": [...]}'})
                return
        else:
            events = [document]
        status, answer = await self._commit(
            events, Origin("k8s", token_cluster, self.server.config.default_cluster)
        )
        await _json(send, status, answer)

    async def _commit(self, events: list[Any], origin: Origin) -> tuple[int, dict]:
        server = self.server
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        histograms = server.metrics.processing

        def committed(seq: int, received: list[tuple[float, int]]) -> None:
            now = time.monotonic()
            for t, count in received:
                observe_many(histograms.labels(origin.source), now - t, count)
            if seq >= last_offered and not done.done():
                done.set_result(seq)

        producer = server.producer(committed)
        errors, accepted, last_offered = [], 0, 0
        max_bytes = server.config.max_event_bytes
        cluster = origin.token_cluster or origin.default_cluster
        for index, event in enumerate(events):
            received = time.monotonic()
            source = event.get("source") if isinstance(event, dict) else None
            label = source if source in ("k8s", "docker") else ""
            try:
                row = from_json(event, origin, datetime.now(UTC), max_bytes)
            except Refused as exc:
                server.count_received(label, cluster)
                server.count_refused(label, cluster, exc.reason)
                errors.append({"index": index, "reason": exc.reason, "message": str(exc)})
                continue
            server.count_received(row["source"], row["cluster_name"])
            last_offered = index + 1
            server.offer(producer, [row], last_offered, received)
            accepted += 1
        if accepted:
            await server.room()
            await done
        answer: dict[str, Any] = {"total": len(events), "success": accepted, "error": len(errors)}
        if errors:
            answer["errors"] = errors
        if not errors:
            return 200, answer
        return (206 if accepted else 400), answer


async def _read_body(receive: Any, limit: int) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _json(send: Any, status: int, document: Any, extra: list | None = None) -> None:
    await _respond(send, status, orjson.dumps(document), b"application/json", extra)


async def _respond(
    send: Any, status: int, body: bytes, content_type: bytes, extra: list | None = None
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
