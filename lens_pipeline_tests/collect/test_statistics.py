"""collect/statistics.py against the original's rules (spec §4.8): the ten-bucket histogram with
values clamped to [0, 100] and 100 in the last bucket, percentiles read by linear interpolation in
the bucket where the cumulative count reaches ceil(total x p / 100) (a single sample: its bucket's
midpoint), and incremental figures that equal those computed from all samples at once."""

from __future__ import annotations

import math
import random

import pytest

from lens_pipeline.collect.statistics import (
    PodSeries,
    Step,
    Window,
    accumulate,
    add_to_histogram,
    instant_utilization,
    percentile,
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
