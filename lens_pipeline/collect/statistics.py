"""Workload GPU statistics (spec §4.8), pure: per-pod utilization series rolled up to workloads, and
the incremental figures of a `workload_statistic` row (sample count and sum, min, max, a ten-bucket
histogram and the percentiles read from it), plus the allocated and idle GPU-seconds.

The exporters label each allocated GPU with the pod (and namespace) holding it, so a query grouped
by pod gives, at each step, the sum of the pod's GPUs' utilization, how many GPUs it holds and how
many of those sit under the idle threshold. A workload's utilization at a step is the mean over all
GPUs of its running pods, so a workload of many pods weighs every GPU once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lens_pipeline.collect.problems import MalformedObject
from lens_pipeline.collect.stored import stored_count, stored_figure, stored_text

BUCKET_WIDTH = 10.0
BUCKETS = 10
PodKey = tuple[str, str]  # (namespace, pod name)


@dataclass
class PodSeries:
    """One pod's GPUs at each step (unix time): utilization sum, GPU count, GPUs under the threshold."""

    sums: dict[float, float] = field(default_factory=dict)
    counts: dict[float, float] = field(default_factory=dict)
    idle: dict[float, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    time: float  # unix seconds
    utilization: float  # mean over the GPUs held
    gpus: float  # GPUs held
    idle_gpus: float  # of which under the idle threshold


@dataclass(frozen=True)
class Window:
    """A workload's new steps, each `step_seconds` long."""

    steps: list[Step]
    step_seconds: float

    @property
    def utilization(self) -> list[float]:
        return [s.utilization for s in self.steps]

    @property
    def allocated_gpu_seconds(self) -> float:
        return sum(s.gpus for s in self.steps) * self.step_seconds

    @property
    def idle_gpu_seconds(self) -> float:
        return sum(s.idle_gpus for s in self.steps) * self.step_seconds


def workload_window(pods: Iterable[PodSeries], step_seconds: float) -> Window:
    """Roll the series of a workload's pods up to the workload: at each step, the mean utilization
    over every GPU its pods hold."""
    sums: dict[float, float] = {}
    counts: dict[float, float] = {}
    idle: dict[float, float] = {}
    for pod in pods:
        for into, series in ((sums, pod.sums), (counts, pod.counts), (idle, pod.idle)):
            for t, value in series.items():
                into[t] = into.get(t, 0.0) + value
    steps = [
        Step(t, sums.get(t, 0.0) / counts[t], counts[t], idle.get(t, 0.0))
        for t in sorted(counts)
        if counts[t] > 0
    ]
    return Window(steps, step_seconds)


def instant_utilization(pods: Iterable[tuple[float, float]]) -> float | None:
    """A workload's utilization now from its pods' (sum, count); None when no GPU reports."""
    total = count = 0.0
    for pod_sum, pod_count in pods:
        total, count = total + pod_sum, count + pod_count
    return total / count if count else None


def empty_histogram() -> dict[str, list[dict[str, float]]]:
    return {
        "buckets": [
            {"lower": i * BUCKET_WIDTH, "upper": (i + 1) * BUCKET_WIDTH, "count": 0} for i in range(BUCKETS)
        ]
    }


def _stored_buckets(histogram: Any) -> list[dict[str, Any]]:
    """A stored histogram's buckets; a new empty set for none, or for one of another shape; an error
    for buckets that are not objects with a count."""
    if histogram is None:
        return empty_histogram()["buckets"]
    buckets = histogram.get("buckets") if isinstance(histogram, dict) else None
    if not isinstance(buckets, list):
        raise MalformedObject("histogram should be an object with a list of buckets")
    if len(buckets) != BUCKETS:
        return empty_histogram()["buckets"]
    for bucket in buckets:
        if not isinstance(bucket, dict):
            raise MalformedObject("histogram.buckets should be objects")
        stored_count(bucket, "count")
        if stored_figure(bucket, "lower") is None or stored_figure(bucket, "upper") is None:
            raise MalformedObject("histogram.buckets should each have a lower and an upper bound")
    return [dict(b) for b in buckets]


def add_to_histogram(histogram: Mapping[str, Any] | None, values: Iterable[float]) -> dict[str, Any]:
    """A new histogram with `values` added: clamped to [0, 100], 100 in the last bucket."""
    buckets = _stored_buckets(histogram)
    for value in values:
        clamped = min(max(value, 0.0), 100.0)
        buckets[min(int(clamped // BUCKET_WIDTH), BUCKETS - 1)]["count"] += 1
    return {"buckets": buckets}


def percentile(histogram: Mapping[str, Any], p: float) -> float:
    """The p-th percentile read from the histogram: linear inside the bucket where the cumulative
    count reaches ceil(total * p / 100); a single sample is its bucket's midpoint."""
    buckets = histogram["buckets"]
    total = sum(b["count"] for b in buckets)
    if total == 0:
        return 0.0
    if total == 1:
        only = next(b for b in buckets if b["count"])
        return (only["lower"] + only["upper"]) / 2
    target = max(1, math.ceil(total * p / 100))
    cumulative = 0
    for bucket in buckets:
        if bucket["count"] and cumulative + bucket["count"] >= target:
            inside = (target - cumulative) / bucket["count"]
            return bucket["lower"] + inside * (bucket["upper"] - bucket["lower"])
        cumulative += bucket["count"]
    return buckets[-1]["upper"]


FIGURES = ("avg", "min", "max", "p50", "p90", "p95")


def accumulate(stored: Mapping[str, Any] | None, window: Window) -> dict[str, Any]:
    """A `workload_statistic` row's figures after adding a window to what is stored."""
    column = "{}_gpu_utilization"
    previous = stored or {}
    # What is stored is read back checked: a malformed row fails here, naming its column.
    count = stored_count(previous, "sample_count")
    values: Sequence[float] = window.utilization
    histogram = add_to_histogram(previous.get("histogram"), values)
    new_count = count + len(values)
    new_total = (stored_figure(previous, "total_sum", 0.0) or 0.0) + math.fsum(values)
    figures: dict[str, float | None] = dict.fromkeys(FIGURES)  # unknown until a first sample
    if new_count:
        low, high = min(values, default=math.inf), max(values, default=-math.inf)
        if count:
            low = min(low, _stored_bound(previous, column.format("min")))
            high = max(high, _stored_bound(previous, column.format("max")))
        figures = {
            "avg": new_total / new_count,
            "min": low,
            "max": high,
            **{f"p{p}": percentile(histogram, p) for p in (50, 90, 95)},
        }
    return {
        "sample_count": new_count,
        "total_sum": new_total,
        "histogram": histogram,
        "allocated_gpu_seconds": (stored_figure(previous, "allocated_gpu_seconds", 0.0) or 0.0)
        + window.allocated_gpu_seconds,
        "idle_gpu_seconds": (stored_figure(previous, "idle_gpu_seconds", 0.0) or 0.0)
        + window.idle_gpu_seconds,
        **{column.format(name): value for name, value in figures.items()},
    }


def _stored_bound(row: Mapping[str, Any], column: str) -> float:
    value = stored_figure(row, column)
    if value is None:
        raise MalformedObject(f"{column} should be a number: the row has samples")
    return value


def window_bounds(
    cursor: float | None,
    now: float,
    first_window_seconds: float,
    max_window_seconds: float,
    resolution: float,
    oldest: float,
) -> tuple[float, float]:
    """(first, last) unix times of the points a statistics run reads: it continues where the last
    run stopped (`cursor`), on multiples of `resolution`, so that no point is read twice or skipped,
    however long ago that was (back to `oldest`, beyond which Prometheus keeps nothing); a run reads
    at most `max_window_seconds` of it and the next runs go on, so an outage leaves no gap. A first
    run reads `first_window_seconds` back. Nothing new yet when last < first."""
    start = max(cursor if cursor is not None else now - first_window_seconds, oldest)
    first = math.floor(start / resolution) * resolution + resolution
    points = max(1, int(max_window_seconds // resolution))
    last = min(math.floor(now / resolution) * resolution, first + (points - 1) * resolution)
    return first, last


def utc_time(t: float) -> datetime:
    """A unix time as an aware UTC datetime."""
    return datetime.fromtimestamp(t, UTC)


@dataclass(frozen=True)
class Span:
    """The window a statistics run read: its first and last points (unix times), whether Prometheus
    answered for it, and the run's time."""

    first: float
    last: float
    queried: bool
    now: datetime


def statistic_row(
    cluster: str,
    workload: dict[str, Any],
    previous: dict[str, Any] | None,
    window: Window,
    instant: float | None,
    span: Span,
) -> dict[str, Any]:
    """The workload's `workload_statistic` row with the window added (MalformedObject when a stored
    value it reads is not what its column holds)."""
    figures = accumulate(previous, window)
    began = (
        previous["stat_start_time"]
        if previous
        else utc_time(window.steps[0].time if window.steps else span.first)
    )
    return {
        "cluster_name": cluster,
        "uid": workload["uid"],
        "namespace": stored_text(workload, "namespace"),
        "workload_name": stored_text(workload, "name"),
        "workload_type": stored_text(workload, "kind"),
        "instant_gpu_utilization": instant,  # None while no series names the workload's GPUs
        **figures,
        "stat_start_time": began,
        "stat_end_time": utc_time(span.last)
        if span.queried
        else (previous or {}).get("stat_end_time", span.now),
        "allocated_gpu_count": float(stored_count(workload, "gpu_request")),
        "workload_status": stored_text(workload, "status"),
        "labels": workload["labels"] or {},
        "annotations": workload["annotations"] or {},
        "created_at": span.now,
        "updated_at": span.now,
        "last_query_time": utc_time(span.last) if span.queried else (previous or {}).get("last_query_time"),
    }


def consumer_row(
    workload: dict[str, Any], pods: list[dict[str, Any]], stat: dict[str, Any]
) -> dict[str, Any]:
    """A running top-level workload's `gpu_consumers` row from its running pods and its statistic."""
    return {
        "uid": workload["uid"],
        "group_version": workload["group_version"],
        "kind": stored_text(workload, "kind"),
        "namespace": stored_text(workload, "namespace"),
        "name": stored_text(workload, "name"),
        "gpu_allocated": sum(stored_count(p, "gpu_allocated") for p in pods),
        "gpu_utilization": stored_figure(stat, "instant_gpu_utilization"),  # None while unknown
        "active_pods": len(pods),
        "idle_gpu_seconds": stored_figure(stat, "idle_gpu_seconds", 0.0) or 0.0,
        "source": workload["source"],
    }
