"""collect/statistics.py against the original's rules (spec §4.8): the ten-bucket histogram with
values clamped to [0, 100] and 100 in the last bucket, percentiles read by linear interpolation in
the bucket where the cumulative count reaches ceil(total x p / 100) (a single sample: its bucket's
midpoint), and incremental figures that equal those computed from all samples at once."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime

import pytest

from lens_pipeline.collect.problems import MalformedObject
from lens_pipeline.collect.statistics import (
    PodSeries,
    Span,
    Step,
    Window,
    accumulate,
    add_to_histogram,
    consumer_row,
    instant_utilization,
    percentile,
    statistic_row,
    utc_time,
    workload_window,
)


def _counts(histogram: dict) -> list[int]:
    return [b["count"] for b in histogram["buckets"]]


def test_values_are_clamped_and_100_goes_to_the_last_bucket():
    histogram = add_to_histogram(None, [-5.0, 0.0, 9.99, 10.0, 55.0, 99.9, 100.0, 250.0])
    assert _counts(histogram) == [3, 1, 0, 0, 0, 1, 0, 0, 0, 3]
    again = add_to_histogram(histogram, [15.0])
    assert _counts(again)[1] == 2 and _counts(histogram)[1] == 1  # a new histogram; the old one stays


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([42.0], 50, 45.0),  # one sample: the midpoint of its bucket
        ([], 95, 0.0),
        ([5.0, 15.0], 50, 10.0),  # target ceil(1) = 1: the whole first bucket
        ([5.0, 15.0], 95, 20.0),  # target 2: the end of the second bucket
        ([51.0, 52.0, 53.0, 54.0], 50, 55.0),  # target 2 of 4 in one bucket: halfway through it
        ([51.0, 52.0, 53.0, 54.0], 95, 60.0),
    ],
)
def test_percentiles_interpolate_inside_the_bucket(values, p, expected):
    assert percentile(add_to_histogram(None, values), p) == pytest.approx(expected)


def test_adding_windows_one_by_one_gives_the_figures_of_all_samples_at_once():
    rng = random.Random(7)
    samples = [rng.uniform(0, 100) for _ in range(300)]
    windows = [samples[i : i + 37] for i in range(0, len(samples), 37)]
    stored = None
    for chunk in windows:
        stored = accumulate(stored, Window([Step(t, v, 2, 0) for t, v in enumerate(chunk)], 30.0))
    whole = accumulate(None, Window([Step(t, v, 2, 0) for t, v in enumerate(samples)], 30.0))
    assert stored is not None
    for key in ("sample_count", "avg_gpu_utilization", "min_gpu_utilization", "max_gpu_utilization"):
        assert stored[key] == pytest.approx(whole[key])
    assert stored["histogram"] == whole["histogram"]
    assert stored["p95_gpu_utilization"] == whole["p95_gpu_utilization"]
    assert stored["avg_gpu_utilization"] == pytest.approx(math.fsum(samples) / len(samples))
    assert stored["allocated_gpu_seconds"] == pytest.approx(2 * 30.0 * len(samples))


def test_a_window_without_samples_keeps_what_is_stored():
    stored = accumulate(None, Window([Step(0, 80.0, 1, 0)], 30.0))
    after = accumulate(stored, Window([], 30.0))
    assert after["sample_count"] == 1 and after["avg_gpu_utilization"] == 80.0
    assert after["max_gpu_utilization"] == 80.0 and after["p50_gpu_utilization"] == 85.0


def test_a_workload_weighs_every_gpu_of_its_pods_once_and_counts_idle_gpu_time():
    big = PodSeries(sums={0: 400.0, 30: 0.0}, counts={0: 8, 30: 8}, idle={0: 0, 30: 8})  # 8 GPUs at 50 %
    small = PodSeries(sums={0: 100.0}, counts={0: 1}, idle={0: 0})  # 1 GPU at 100 %, gone at 30
    window = workload_window([big, small], step_seconds=30.0)
    assert [(s.time, s.utilization, s.gpus, s.idle_gpus) for s in window.steps] == [
        (0, 500.0 / 9, 9, 0),
        (30, 0.0, 8, 8),
    ]
    assert window.allocated_gpu_seconds == 17 * 30.0 and window.idle_gpu_seconds == 8 * 30.0
    assert instant_utilization([(400.0, 8), (100.0, 1)]) == pytest.approx(500.0 / 9)
    assert instant_utilization([]) is None


WORKLOAD = {
    "uid": "u-1",
    "namespace": "team",
    "name": "train",
    "kind": "PyTorchJob",
    "group_version": "kubeflow.org/v1",
    "gpu_request": 8,
    "status": "Running",
    "labels": None,
    "annotations": {"owner": "a"},
    "source": "k8s",
}
NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def test_a_first_statistic_row_starts_at_its_first_point_and_ends_at_the_window():
    window = Window([Step(600.0, 40.0, 8, 0), Step(630.0, 60.0, 8, 8)], 30.0)
    row = statistic_row("c1", WORKLOAD, None, window, 55.0, Span(600.0, 630.0, True, NOW))
    assert row["stat_start_time"] == utc_time(600.0) and row["stat_end_time"] == utc_time(630.0)
    assert row["last_query_time"] == utc_time(630.0)
    assert (row["cluster_name"], row["workload_name"], row["workload_type"]) == ("c1", "train", "PyTorchJob")
    assert row["avg_gpu_utilization"] == 50.0 and row["instant_gpu_utilization"] == 55.0
    assert row["allocated_gpu_count"] == 8.0 and row["idle_gpu_seconds"] == 8 * 30.0
    assert row["labels"] == {} and row["annotations"] == {"owner": "a"}


def test_a_window_prometheus_did_not_answer_keeps_the_stored_ends():
    first = statistic_row(
        "c1", WORKLOAD, None, Window([Step(600.0, 40.0, 8, 0)], 30.0), None, Span(600.0, 600.0, True, NOW)
    )
    later = datetime(2026, 11, 26, 12, 5, tzinfo=UTC)
    row = statistic_row("c1", WORKLOAD, first, Window([], 30.0), None, Span(630.0, 900.0, False, later))
    assert row["stat_start_time"] == first["stat_start_time"]
    assert row["stat_end_time"] == first["stat_end_time"] == utc_time(600.0)
    assert row["last_query_time"] == utc_time(600.0)  # the next run reads the window again
    # No series names its GPUs now: its instant utilization is unknown, not 0.
    assert row["sample_count"] == 1 and row["instant_gpu_utilization"] is None
    assert row["avg_gpu_utilization"] == 40.0
    assert row["updated_at"] == later


def test_a_stored_workload_value_of_the_wrong_type_is_malformed_not_a_crash():
    with pytest.raises(MalformedObject, match="gpu_request"):
        statistic_row(
            "c1",
            {**WORKLOAD, "gpu_request": "eight"},
            None,
            Window([], 30.0),
            None,
            Span(0.0, 0.0, False, NOW),
        )


def test_a_consumer_holds_its_running_pods_gpus_and_its_statistics_figures():
    pods = [{"gpu_allocated": 8}, {"gpu_allocated": 4}]
    stat = {"instant_gpu_utilization": 72.5, "idle_gpu_seconds": 120.0}
    row = consumer_row(WORKLOAD, pods, stat)
    assert (row["gpu_allocated"], row["active_pods"]) == (12, 2)
    assert (row["gpu_utilization"], row["idle_gpu_seconds"]) == (72.5, 120.0)
    assert (row["group_version"], row["source"]) == ("kubeflow.org/v1", "k8s")
    # No statistic yet (a workload seen for the first time): no GPU time counted, its utilization
    # unknown (NULL: a 0 would show a busy job as idle), not 0.
    empty = consumer_row(WORKLOAD, [], {})
    assert (empty["gpu_allocated"], empty["gpu_utilization"], empty["idle_gpu_seconds"]) == (0, None, 0.0)
