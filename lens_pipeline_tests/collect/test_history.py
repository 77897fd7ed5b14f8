"""One GPU hour computed by hand: what held GPUs at each step, how busy, and every table's figures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lens_pipeline.collect.history import (
    Dimensions,
    HeldPod,
    HourInputs,
    PodMemory,
    WorkloadInfo,
    hour_tables,
    step_count,
)
from lens_pipeline.collect.statistics import PodSeries

START = 1_800_000_000.0  # an hour's start
STEP = 600.0  # six steps: t0 .. t5
T = [START + k * STEP for k in range(6)]
TRAIN = WorkloadInfo("w-train", "PyTorchJob", "ml", "train", "", {"team": "nlp"}, {"project": "llm"})
AGENT = WorkloadInfo("w-agent", "DaemonSet", "kube-system", "agent", "", {}, {})


def series(util: dict[float, list[float]], idle_below: float = 5.0) -> PodSeries:
    """A pod's per-step sums from its GPUs' utilization at each step."""
    return PodSeries(
        sums={t: sum(v) for t, v in util.items()},
        counts={t: float(len(v)) for t, v in util.items()},
        idle={
            t: float(sum(x < idle_below for x in v))
            for t, v in util.items()
            if any(x < idle_below for x in v)
        },
    )


def inputs(**changes) -> HourInputs:
    pods = [
        # Holds 2 GPUs the whole hour.
        HeldPod("p1", "ml", "train-master-0", 2, START - 7200, None, "w-train"),
        # Bound at t2 (between steps: from t3 on), ended exactly at t5 (not holding at t5).
        HeldPod("p2", "ml", "train-worker-0", 2, T[2] + 1, T[5], "w-train"),
        # A bare pod, no workload.
        HeldPod("p3", "ml", "debug", 1, START, T[1], None),
        # A system pod: counted for the cluster, left out of namespaces and workloads.
        HeldPod("p4", "kube-system", "agent-x", 1, START, None, "w-agent"),
    ]
    utilization = {
        ("ml", "train-master-0"): series({t: [50.0, 70.0] for t in T}),
        ("ml", "train-worker-0"): series({T[3]: [10.0, 2.0], T[4]: [20.0, 20.0], T[5]: [99.0, 99.0]}),
        ("ml", "debug"): series({T[0]: [80.0]}),
        ("kube-system", "agent-x"): series({t: [0.0] for t in T}),
    }
    memory = {
        ("ml", "train-master-0"): PodMemory(
            {t: 2048.0 * 2 for t in T}, {t: 8192.0 * 2 for t in T}, {t: 2.0 for t in T}
        )
    }
    values = {
        "cluster": "c",
        "start": START,
        "step_seconds": STEP,
        "capacity": {t: 16.0 for t in T[:5]},  # the last step had no series
        "utilization": utilization,
        "memory": memory,
        "pods": pods,
        "workloads": {"w-train": TRAIN, "w-agent": AGENT},
        **changes,
    }
    return HourInputs(**values)


def test_the_cluster_hour_is_the_mean_over_its_steps():
    tables = hour_tables(inputs(), Dimensions(snapshot_seconds=1200))
    # Allocated per step: p1 2 + p3 1 (t0) + p4 1 + p2 2 (t3, t4).
    allocated = [4, 3, 3, 5, 5, 3]
    # Utilization per step over the held GPUs with a number (p2's t5 point is after its end).
    per_step = [
        (120 + 80 + 0) / 4,
        (120 + 0) / 3,
        (120 + 0) / 3,
        (120 + 12 + 0) / 5,
        (120 + 40 + 0) / 5,
        (120 + 0) / 3,
    ]
    cluster = tables.cluster
    assert cluster["allocated_gpu_count"] == pytest.approx(sum(allocated) / 6)
    assert cluster["total_gpu_capacity"] == 16.0  # over the steps that had series
    assert cluster["allocation_rate"] == pytest.approx(100 * sum(allocated) / 6 / 16)
    assert cluster["sample_count"] == 6
    assert cluster["avg_utilization"] == pytest.approx(np.mean(per_step))
    assert (cluster["min_utilization"], cluster["max_utilization"]) == (min(per_step), max(per_step))
    # Percentiles interpolate between the nearest samples (numpy's, Prometheus' quantile_over_time).
    assert cluster["p50_utilization"] == pytest.approx(np.percentile(per_step, 50))
    assert cluster["p95_utilization"] == pytest.approx(np.percentile(per_step, 95))


def test_namespaces_workloads_and_labels():
    tables = hour_tables(inputs(), Dimensions(label_keys=("team", "app"), annotation_keys=("project",)))
    (ml,) = tables.namespaces  # kube-system is left out by default
    assert ml["namespace"] == "ml"
    assert ml["allocated_gpu_count"] == pytest.approx((3 + 2 + 2 + 4 + 4 + 2) / 6)
    assert ml["active_workload_count"] == pytest.approx(1.0)  # the bare pod is no workload
    (train,) = tables.workloads
    assert train["workload_uid"] == "w-train" and train["workload_type"] == "PyTorchJob"
    util = [60.0, 60.0, 60.0, (120 + 12) / 4, (120 + 40) / 4, 60.0]
    assert train["sample_count"] == 6 and train["total_sum"] == pytest.approx(sum(util))
    assert train["avg_utilization"] == pytest.approx(np.mean(util))
    assert train["p90_utilization"] == pytest.approx(np.percentile(util, 90))
    assert (train["min_replica_count"], train["max_replica_count"]) == (1, 2)
    assert train["avg_replica_count"] == pytest.approx(8 / 6)
    assert train["allocated_gpu_seconds"] == pytest.approx((2 * 6 + 2 * 2) * STEP)
    assert train["idle_gpu_seconds"] == pytest.approx(1 * STEP)  # p2's 2 % GPU at t3
    # Memory per GPU, GiB, from the GPUs that report it.
    assert (train["avg_gpu_memory_used"], train["avg_gpu_memory_total"]) == (2.0, 8.0)
    assert train["workload_status"] == "Running" and train["labels"] == {"team": "nlp"}
    values = {(r["dimension_type"], r["dimension_key"], r["dimension_value"]): r for r in tables.labels}
    assert set(values) == {
        ("label", "team", "nlp"),
        ("label", "team", "unknown"),  # the system DaemonSet has no team
        ("label", "app", "unknown"),
        ("annotation", "project", "llm"),
        ("annotation", "project", "unknown"),
    }
    assert values[("label", "team", "unknown")]["avg_utilization"] == 0.0
    assert values[("label", "app", "unknown")]["allocated_gpu_count"] == pytest.approx(
        (3 + 3 + 3 + 5 + 5 + 3) / 6
    )


def test_snapshots_every_few_minutes_with_what_each_namespace_held():
    snapshots = hour_tables(inputs(), Dimensions(snapshot_seconds=1800)).snapshots
    assert [s["snapshot_time"] for s in snapshots] == [T[0], T[3]]
    late = snapshots[1]
    assert (late["total_gpu_capacity"], late["allocated_gpu_count"]) == (16, 5)
    ml = late["allocation_details"]["namespaces"]["ml"]
    assert ml["allocatedGpu"] == 4 and ml["workloadCount"] == 1
    assert ml["workloads"] == [
        {
            "uid": "w-train",
            "name": "train",
            "namespace": "ml",
            "kind": "PyTorchJob",
            "allocatedGpu": 4,
            "utilization": 33.0,
        }
    ]


def test_an_hour_without_pods_or_series_is_unknown_not_zero():
    empty = hour_tables(inputs(capacity={}, utilization={}, memory={}, pods=[]))
    assert empty.cluster == {
        "total_gpu_capacity": None,
        "allocated_gpu_count": 0.0,
        "allocation_rate": None,
        "avg_utilization": None,
        "min_utilization": None,
        "max_utilization": None,
        "p50_utilization": None,
        "p95_utilization": None,
        "sample_count": 0,
    }
    assert not (empty.namespaces or empty.labels or empty.workloads)
    assert len(empty.snapshots) == 6 and all(s["allocated_gpu_count"] == 0 for s in empty.snapshots)


def test_a_gpu_without_a_number_is_no_sample():
    nan_only = {("ml", "train-master-0"): PodSeries({}, {}, {})}
    tables = hour_tables(inputs(utilization=nan_only, pods=inputs().pods[:1], memory={}))
    assert tables.cluster["sample_count"] == 0 and tables.cluster["avg_utilization"] is None
    (train,) = tables.workloads
    assert train["avg_utilization"] is None and train["avg_gpu_memory_used"] is None
    assert not math.isnan(train["total_sum"])


@pytest.mark.parametrize("step", [0, 7, 3601])
def test_the_step_must_divide_an_hour(step):
    with pytest.raises(ValueError, match="must divide an hour"):
        step_count(step)
