"""The clusters' Prometheus as the read API asks it: each cluster's URL from the registry
(`LENS_CLUSTERS_FILE`), its exporter dialect learned as the collectors learn it (`prom/dialect.py`)
and kept for a few minutes, and the PromQL of the API's series built from the vendor profiles.

Series finer than an hour come from here; what is stored in the Lens tables is read from there.
Every failure is an `ApiError` 503 naming the cluster and the cause (no registry, no
`prometheus_url`, Prometheus not answering), never a 500.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from prometheus_client import Counter, Histogram

from lens_pipeline.api.common import ApiError, TimeRange
from lens_pipeline.clusters import ClusterNotFound, PrometheusHttp, Registry
from lens_pipeline.collect.nodes import NodeIndex
from lens_pipeline.prom.dialect import read_dialect
from lens_pipeline.prom.reader import PromError, PromReader, Sample, Series
from lens_pipeline.vendors import Dialect, ExporterOverrides

T = TypeVar("T")
# The dialect is learned again after this long (an exporter upgraded, a relabelling changed), and
# the registry file read again (a cluster added): a few requests every few minutes.
DIALECT_SECONDS = 300.0
REGISTRY_SECONDS = 60.0
# The API answers people: a Prometheus slower than this is reported, not waited for.
log = logging.getLogger(__name__)
TIMEOUT_SECONDS = 10.0
# A route's queries are asked at once, a few at a time: its answer waits for the slowest, not the sum.
_ASKING = ThreadPoolExecutor(max_workers=4, thread_name_prefix="api-prometheus")
# Pods per selector: their names are one regular expression, kept well under URL limits.
PODS_PER_QUERY = 150


@dataclass
class _Known:
    reader: PromReader
    dialect: Dialect | None = None
    learned_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


class ClusterPrometheus:
    """Per cluster, a reader of its Prometheus and its dialect. Thread-safe: the API's routes run
    in a thread pool and share the readers (and their connections)."""

    def __init__(
        self,
        load_registry: Callable[[], Registry] | None,
        errors: Counter | None = None,
        latency: Histogram | None = None,
    ) -> None:
        self._load = load_registry
        self._registry: Registry | None = None
        self._loaded_at = 0.0
        self._known: dict[str, _Known] = {}
        self._lock = threading.Lock()
        self._errors = errors
        self.latency = latency

    def _registry_now(self) -> Registry | None:
        if self._load is None:
            return None
        with self._lock:
            if self._registry is None or time.monotonic() - self._loaded_at > REGISTRY_SECONDS:
                self._registry, self._loaded_at = self._load(), time.monotonic()
            return self._registry

    def registered(self) -> set[str] | None:
        """The clusters the registry lists now; None without a registry, or when it cannot be read
        (whatever the loader raised: `/metrics` must answer)."""
        try:
            registry = self._registry_now()
        except Exception:
            log.exception("the cluster registry cannot be loaded: /metrics exports every cluster")
            return None
        return registry.listed() if registry is not None else None

    def vendor(self, cluster: str) -> str | None:
        """The vendor the registry names for the cluster; None when it says `auto` or nothing."""
        registry = self._registry_now()
        config = registry.clusters.get(cluster) if registry is not None else None
        return config.vendor if config is not None and config.vendor != "auto" else None

    def _cluster_url(self, cluster: str) -> tuple[str, PrometheusHttp, str, ExporterOverrides]:
        if self._load is None:
            raise ApiError(
                503, f"cluster {cluster!r}: no cluster registry (LENS_CLUSTERS_FILE), so no Prometheus to ask"
            )
        registry = self._registry_now()
        assert registry is not None
        try:
            config = registry.get(cluster)
        except ClusterNotFound as exc:
            raise ApiError(503, f"no Prometheus for {exc}") from None
        if not config.prometheus_url:
            raise ApiError(
                503, f"cluster {cluster!r} has no prometheus_url in the registry ({registry.source})"
            )
        return config.prometheus_url, config.prometheus_http, config.vendor, config.exporter_overrides

    def _entry(self, cluster: str) -> tuple[_Known, str, ExporterOverrides]:
        url, http, vendor, overrides = self._cluster_url(cluster)
        with self._lock:
            known = self._known.get(cluster)
            # A registry that changed how to reach the cluster's Prometheus gets a new reader.
            if known is None or (known.reader.url, known.reader.http) != (url, http):
                known = self._known[cluster] = _Known(
                    PromReader(cluster, url, timeout_seconds=TIMEOUT_SECONDS, retries=1, http=http)
                )
        return known, vendor, overrides

    def for_cluster(self, cluster: str) -> ClusterSeries:
        """The cluster's reader and dialect (learned now when older than `DIALECT_SECONDS`)."""
        known, vendor, overrides = self._entry(cluster)
        with known.lock:
            if known.dialect is None or time.monotonic() - known.learned_at > DIALECT_SECONDS:
                try:
                    known.dialect = read_dialect(known.reader, vendor, overrides)
                except PromError as exc:
                    raise self.unavailable(exc) from None
                known.learned_at = time.monotonic()
            dialect = known.dialect
        return ClusterSeries(self, known.reader, dialect)

    def unavailable(self, exc: PromError) -> ApiError:
        if self._errors is not None:
            self._errors.inc()
        return ApiError(503, f"Prometheus unavailable: {exc}")


@dataclass(frozen=True)
class ClusterSeries:
    """One cluster's Prometheus for one request: its queries, each failure a 503."""

    source: ClusterPrometheus
    reader: PromReader
    dialect: Dialect

    def _timed(self, ask: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return ask()
        except PromError as exc:
            raise self.source.unavailable(exc) from None
        finally:
            if self.source.latency is not None:
                self.source.latency.observe(time.perf_counter() - started)

    def vector(self, query: str) -> list[Sample]:
        return self._timed(lambda: self.reader.vector(query))

    def matrix(self, query: str, span: TimeRange) -> list[Series]:
        return self._timed(lambda: self.reader.matrix(query, span.start_time, span.end_time, span.step))

    def vectors(self, queries: Sequence[str]) -> list[list[Sample]]:
        """Instant queries asked together, answered in their order."""
        return [f.result() for f in [_ASKING.submit(self.vector, q) for q in queries]]

    def matrices(self, queries: Sequence[str], span: TimeRange) -> list[list[Series]]:
        """Range queries asked together, answered in their order."""
        return [f.result() for f in [_ASKING.submit(self.matrix, q, span) for q in queries]]


def node_index(nodes: Iterable[Mapping[str, str | None]]) -> NodeIndex:
    """What a series' node label may say (a name, an address, `instance`), from `node` rows."""
    return NodeIndex(
        {
            "metadata": {"name": n["name"]},
            "status": {"addresses": [{"address": n["address"]}] if n["address"] else []},
        }
        for n in nodes
    )


# -- PromQL text ----------------------------------------------------------------------------------


def quoted(value: str) -> str:
    """`value` as a PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def any_of(values: Iterable[str]) -> str:
    """A regular expression matching exactly one of `values` (PromQL anchors it)."""
    return "|".join(re.escape(v) for v in sorted(set(values)))


def node_matcher(label: str, name: str, address: str | None) -> str:
    """A matcher for the series of one node, whichever way the scrape names it: by its name, or
    by its address, bare or as `instance`'s `<address>:<port>` (`[<IPv6>]:<port>`)."""
    hosts = [re.escape(name)]
    if address:
        hosts += [re.escape(address), re.escape(f"[{address}]")]
    return f"{label}=~{quoted('(?:' + '|'.join(hosts) + ')(?::[0-9]+)?')}"


def pod_matchers(namespace_label: str, pod_label: str, pods: Iterable[tuple[str, str]]) -> list[str]:
    """Matchers for the series of `pods` ((namespace, name) pairs), a few hundred pods each."""
    by_namespace: dict[str, list[str]] = {}
    for namespace, name in sorted(set(pods)):
        by_namespace.setdefault(namespace, []).append(name)
    out = []
    for namespace, names in by_namespace.items():
        for first in range(0, len(names), PODS_PER_QUERY):
            chunk = names[first : first + PODS_PER_QUERY]
            out.append(f"{namespace_label}={quoted(namespace)}, {pod_label}=~{quoted(any_of(chunk))}")
    return out


# -- series arithmetic --------------------------------------------------------------------------

Points = dict[int, float]  # unix second -> value


def points_by(
    series: Iterable[Series], key: Callable[[Mapping[str, str]], str | None], into: dict[str, Points]
) -> dict[str, Points]:
    """Add each series' points into `into[key(labels)]` (series whose key is None are left out)."""
    for item in series:
        name = key(item.labels)
        if name is None:
            continue
        target = into.setdefault(name, {})
        for t, value in item.points:
            target[int(t)] = target.get(int(t), 0.0) + value
    return into


def by_node(
    series: Iterable[Series], label: str, nodes: NodeIndex, into: dict[str, Points]
) -> dict[str, Points]:
    """Add each series' points into `into[<the node its label names>]` (the label's own value when
    it names no known node)."""
    return points_by(
        series, lambda labels: nodes.resolve(labels.get(label)) or labels.get(label) or None, into
    )


def summed(*answers: Iterable[Series]) -> Points:
    """Every point of every series of the answers added up by time: one series."""
    return points_by((s for answer in answers for s in answer), lambda _labels: "", {}).get("", {})


def ratio(
    numerator: Points, denominator: Points, scale: float = 1.0, *, zero_when_absent: bool = False
) -> Points:
    """numerator / denominator at each time the denominator is positive; a time without a
    numerator is 0 when `zero_when_absent` (a count of nothing is no series in PromQL)."""
    out = {}
    for t, below in denominator.items():
        above = numerator.get(t)
        if above is None and zero_when_absent:
            above = 0.0
        if above is not None and below > 0:
            out[t] = scale * above / below
    return out


def time_points(points: Points) -> list[dict[str, float]]:
    """The original's `[{timestamp, value}]`, in time order."""
    return [{"timestamp": t, "value": points[t]} for t in sorted(points)]


def graph(series: Sequence[tuple[dict[str, str], Points]], unit: str, serial: int = 0) -> dict:
    """The original's `MetricsGraph`: `{serial, series: [{labels, values}], config: {y_axis_unit}}`."""
    return {
        "serial": serial,
        "series": [{"labels": labels, "values": time_points(points)} for labels, points in series if points],
        "config": {"y_axis_unit": unit},
    }


def unix(value: datetime) -> int:
    return int(value.timestamp())
