"""The sidecar's Prometheus metrics, under the original's names (spec §2.1).

Labels: `source` ("k8s" | "docker") as the original, plus `cluster` (one sidecar serves many
clusters here) and `reason` on errors. `upstream_connected` is per peer address, and a peer's
series is removed when its last stream closes. Each server owns its registry, so several servers
in one process (tests) do not collide.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# 1 ms x 2^k, 15 buckets: the original's exponential buckets.
PROCESSING_BUCKETS = tuple(0.001 * 2**k for k in range(15))


class IngestMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.received = Counter(
            "primus_lens_jobs_container_event_recv",
            "Container events received from node agents.",
            ("source", "cluster"),
            registry=self.registry,
        )
        self.errors = Counter(
            "primus_lens_jobs_container_event_error",
            "Container events refused (malformed, oversized, unauthenticated, ...).",
            ("source", "cluster", "reason"),
            registry=self.registry,
        )
        self.connected = Gauge(
            "primus_lens_jobs_upstream_connected",
            "Open event streams from node agents.",
            ("addr", "source"),
            registry=self.registry,
        )
        self.processing = Histogram(
            "primus_lens_jobs_event_processing_duration_seconds",
            "From receiving an event to its commit in the event log (its acknowledgement).",
            ("source",),
            buckets=PROCESSING_BUCKETS,
            registry=self.registry,
        )
        self._streams: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def stream_opened(self, addr: str, source: str) -> None:
        with self._lock:
            key = (addr, source)
            self._streams[key] = self._streams.get(key, 0) + 1
            self.connected.labels(addr, source).set(self._streams[key])

    def stream_closed(self, addr: str, source: str) -> None:
        with self._lock:
            key = (addr, source)
            left = self._streams.get(key, 1) - 1
            if left > 0:
                self._streams[key] = left
                self.connected.labels(addr, source).set(left)
            else:
                self._streams.pop(key, None)
                self.connected.remove(addr, source)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
