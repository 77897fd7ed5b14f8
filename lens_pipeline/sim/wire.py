"""Request and response records passed from the simulator's HTTP server to its API handlers, and
the per-cluster log of the requests answered."""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qs

import orjson


@dataclass(frozen=True)
class SimRequest:
    method: str
    # Path below the cluster's base URL, e.g. "/api/v1/nodes".
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes = b""
    # The CN of a client certificate signed by the simulator's CA, when the client sent one.
    client_cn: str | None = None

    def param(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else default

    def form(self) -> dict[str, list[str]]:
        """Query parameters merged with a form-encoded body (Prometheus accepts both on POST)."""
        merged = {key: list(values) for key, values in self.query.items()}
        content_type = self.headers.get("content-type", "")
        if self.body and content_type.startswith("application/x-www-form-urlencoded"):
            for key, values in parse_qs(self.body.decode("utf-8"), keep_blank_values=True).items():
                merged.setdefault(key, []).extend(values)
        return merged


@dataclass(frozen=True)
class SimResponse:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    # A response sent as it is produced (a watch), chunked, instead of `body`.
    stream: Stream | None = None


class Stream(Protocol):
    """A response that goes on as the cluster changes (a watch). The request's own thread writes
    `opening()`; then the server's one streaming thread (`lens_pipeline.sim.streams`) calls `step`
    whenever `subscribe`'s callback says there may be something new, and at `due()` at the latest."""

    def opening(self) -> Iterable[bytes]:
        """What is sent at once (a watch's ADDED events of the objects there are)."""
        ...

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Have `wake` called (from any thread, quickly) at each change that may concern this
        stream; returns what cancels it."""
        ...

    def step(self, now: float) -> tuple[bytes, bool]:
        """What to send now (b"" for nothing), and whether the stream has ended."""
        ...

    def due(self) -> float:
        """The monotonic time by which `step` must be called even without a change (a bookmark,
        the end of the watch)."""
        ...


def http_chunk(data: bytes | bytearray) -> bytes:
    """`data` as one chunk of a chunked HTTP/1.1 body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def json_response(status: int, payload: object) -> SimResponse:
    return SimResponse(status, orjson.dumps(payload))


class RequestLog:
    """Requests one cluster answered: counts per (method, path) and the last lines, for tests that
    assert how many calls a collection run made."""

    def __init__(self, size: int = 5000) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._recent: deque[str] = deque(maxlen=size)

    def record(self, method: str, path: str, query: str, status: int) -> None:
        line = f"{method} {path}{'?' + query if query else ''} {status}"
        with self._lock:
            self._counts[(method, path)] += 1
            self._recent.append(line)

    def count(self, path_prefix: str | None = None, method: str | None = None) -> int:
        with self._lock:
            return sum(
                n
                for (m, path), n in self._counts.items()
                if (path_prefix is None or path.startswith(path_prefix)) and (method is None or m == method)
            )

    def as_json(self) -> dict[str, object]:
        with self._lock:
            return {
                "total": sum(self._counts.values()),
                "counts": {f"{m} {path}": n for (m, path), n in sorted(self._counts.items())},
                "recent": list(self._recent),
            }

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._recent.clear()
