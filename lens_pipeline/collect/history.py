"""One cluster's GPU hour (spec §4.9), pure: the rows of `cluster_gpu_hourly_stats`,
`namespace_gpu_hourly_stats`, `label_gpu_hourly_stats`, `workload_gpu_hourly_stats` and
`gpu_allocation_snapshots` from what held GPUs at each step of the hour and how busy they were.

Inputs are plain: the pods that held GPUs at some time in the hour with their lives (bound, ended)
and top-level workload, from the Lens tables; per pod and step the utilization sums and GPU counts
the exporters' series give (grouped by pod, `lens_pipeline.defs.derived.statistics.read_pod_series`);
per step the GPUs the exporters report. A pod holds its GPUs at a step t when bound_at <= t < end_at.

At each step: allocated GPUs are the GPUs of the pods holding then; utilization is the mean over
the GPUs those pods hold that report a number. Per hour: allocation is the mean over every step
of the hour, utilization figures are over the steps that had a number (none: NULL), percentiles
interpolate linearly between the two nearest samples (what numpy, pandas and Prometheus'
`quantile_over_time` compute; the original took the sample at a rounded-up index).

pandas does the grouping (`lens_pipeline.collect.hour_frames`, imported by `hour_tables` when an
hour is first computed: numpy and pandas cost a run process most of a second to import, and only
the hourly history's runs use them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lens_pipeline.collect.statistics import PodKey, PodSeries

Row = dict[str, Any]
HOUR = 3600.0
MIB_PER_GIB = 1024.0
# The original left these out of the namespace and workload figures unless asked (§4.9).
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
LABEL_VALUE_LENGTH = 255
RUNNING, ENDED = "Running", "Ended"
UTILIZATION = {"avg": "mean", "min": "min", "max": "max"}
PERCENTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95}


@dataclass(frozen=True)
class HeldPod:
    """A pod that held GPUs at some time in the hour (unix seconds; `end_at` None: not ended)."""

    uid: str
    namespace: str
    name: str
    gpus: int
    bound_at: float
    end_at: float | None
    workload: str | None  # uid of its top-level workload, if it has one


@dataclass(frozen=True)
class WorkloadInfo:
    uid: str
    kind: str
    namespace: str
    name: str
    parent_uid: str
    labels: Mapping[str, Any]
    annotations: Mapping[str, Any]


@dataclass
class PodMemory:
    """One pod's GPUs at each step (unix time): memory used and in total (MiB), GPUs reporting it."""

    used: dict[float, float] = field(default_factory=dict)
    total: dict[float, float] = field(default_factory=dict)
    gpus: dict[float, float] = field(default_factory=dict)


@dataclass(frozen=True)
class HourInputs:
    cluster: str
    start: float  # unix seconds of the hour's first step
    step_seconds: float
    capacity: Mapping[float, float]  # GPUs the exporters report, at each step that had series
    utilization: Mapping[PodKey, PodSeries]
    memory: Mapping[PodKey, PodMemory]
    pods: Sequence[HeldPod]
    workloads: Mapping[str, WorkloadInfo]


@dataclass(frozen=True)
class Dimensions:
    """What the hour is cut by, as the original's `gpu_aggregation` configuration (§4.9)."""

    label_keys: tuple[str, ...] = ("app", "team", "env")
    annotation_keys: tuple[str, ...] = ("project", "cost-center")
    default_value: str = "unknown"  # a workload without the label or annotation
    excluded_namespaces: frozenset[str] = SYSTEM_NAMESPACES
    snapshot_seconds: float = 300.0  # an allocation snapshot every so often


@dataclass
class HourTables:
    cluster: Row
    namespaces: list[Row]
    labels: list[Row]
    workloads: list[Row]
    snapshots: list[Row]


def step_count(step_seconds: float) -> int:
    """Steps of one hour: t = start, start + step, ..., start + 3600 - step."""
    if step_seconds <= 0 or (HOUR / step_seconds) % 1:
        raise ValueError(f"the step ({step_seconds} s) must divide an hour")
    return int(HOUR / step_seconds)


def hour_tables(inputs: HourInputs, dimensions: Dimensions = Dimensions()) -> HourTables:
    """Every table's rows for the hour (without `cluster_name`, `stat_hour` and timestamps)."""
    from lens_pipeline.collect.hour_frames import tables

    return tables(inputs, dimensions)
