"""The sidecar's Prometheus metrics, under the original's names (spec §2.1).

Labels: `source` ("k8s" | "docker") as the original, plus `cluster` (one sidecar serves many
clusters here) and `reason` on errors. `upstream_connected` is per peer address, and a peer's
series is removed when its last stream closes. Each server owns its registry, so several servers
in one process (tests) do not collide.

The workers of `lens ingest --workers N` count in prometheus_client's multiprocess mode (each
process writes its values to files in one directory; `PROMETHEUS_MULTIPROC_DIR` must be set before
prometheus_client is imported) and any of them answers `/metrics` with every worker's sums under the
same names: counters and the histogram add up (a dead worker's counts stay), `upstream_connected`
sums the live workers' streams (`livesum`; the supervisor drops a dead worker's file).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

# 1 ms x 2^k, 15 buckets: the original's exponential buckets.
PROCESSING_BUCKETS = tuple(0.001 * 2**k for k in range(15))


CONNECTED = "primus_lens_jobs_upstream_connected"


class IngestMetrics:
    def __init__(self, multiprocess_dir: str | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
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
            CONNECTED,
            "Open event streams from node agents.",
            ("addr", "source"),
            registry=self.registry,
            multiprocess_mode="livesum",
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
                # Workers: the value stays in this process's file, so it must read 0 there.
                self.connected.labels(addr, source).set(0)
                self.connected.remove(addr, source)

    def exposition(self) -> bytes:
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_AllWorkers(self.multiprocess_dir))
        return generate_latest(registry)


def observe_many(histogram: Histogram, seconds: float, count: int) -> None:
    """`count` observations of `seconds` (the events of one message) at the cost of one.

    prometheus_client has no bulk observe; one `observe` per event cost 4 µs in multiprocess mode
    (each bucket and the sum are written to the worker's file under a lock), 6 % of a worker's CPU
    per event. This writes what `count` calls of `observe` would: the sum, and the first bucket
    whose bound is not below the value (cumulative counts are summed at exposition)."""
    if count == 1:
        histogram.observe(seconds)
        return
    histogram._sum.inc(seconds * count)  # type: ignore[attr-defined]
    histogram._buckets[bisect_left(histogram._upper_bounds, seconds)].inc(count)  # type: ignore[attr-defined]


class _AllWorkers:
    """Every worker's metrics, summed; a peer no worker has a stream from is left out of
    `upstream_connected`, as one process removes its series."""

    def __init__(self, path: str) -> None:
        self._collector = MultiProcessCollector(None, path=path)

    def collect(self) -> Iterator[Metric]:
        for family in self._collector.collect():
            if family.name == CONNECTED:
                family.samples = [sample for sample in family.samples if sample.value]
            yield family
