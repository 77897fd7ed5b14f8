"""collect/safe.py: SaFE's percentages and a SaFE Workload's three-hour figures (spec §6.2)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from lens_pipeline.collect.problems import MalformedObject
from lens_pipeline.collect.safe import (
    node_statistic_row,
    percent,
    usage_within_bounds,
    workload_statistic_row,
)

WORKLOAD = {"name": "train-7", "uid": "u7", "namespace": "team-a", "labels": {"primus-safe.cluster.id": "x1"}}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (float("nan"), None),
        (1e6, None),
        (-0.5, None),
        (0.0, Decimal("0.00")),
        (33.335, Decimal("33.34")),
    ],
)
def test_percent_is_what_decimal_5_2_holds_or_unknown(value, expected):
    assert percent(value) == expected


def test_the_three_hour_average_weighs_hours_by_their_samples():
    hours = [
        {"sample_count": 120, "total_sum": 120 * 90.0, "max_utilization": 95.0},
        {"sample_count": 1, "total_sum": 10.0, "max_utilization": 10.0},  # one sample: weighs one
        {"sample_count": 0, "total_sum": 0.0, "max_utilization": None},  # an hour without samples
    ]
    row = workload_statistic_row(WORKLOAD, hours, "fallback")
    assert row is not None
    assert row["avg_gpu_usage_3h"] == Decimal("89.34")  # the original's mean of means: 50.00
    assert row["max_gpu_usage_3h"] == Decimal("95.00") and row["data_points_count"] == 121
    assert (row["workload_id"], row["cluster"], row["workspace"]) == ("train-7", "x1", "team-a")
    assert usage_within_bounds(row)
    unlabelled = {**WORKLOAD, "labels": {}}
    assert workload_statistic_row(unlabelled, hours, "fallback")["cluster"] == "fallback"  # type: ignore[index]
    assert workload_statistic_row(WORKLOAD, [], "c") is None  # no utilization yet: SaFE shows -1


def test_figures_no_percentage_can_hold_are_out_of_bounds_not_an_exception():
    row = workload_statistic_row(
        WORKLOAD, [{"sample_count": 2, "total_sum": 1e9, "max_utilization": 5e8}], "c"
    )
    assert row is not None and row["avg_gpu_usage_3h"] is None and not usage_within_bounds(row)
    with pytest.raises(MalformedObject, match="max_utilization"):
        workload_statistic_row(
            WORKLOAD, [{"sample_count": 2, "total_sum": 10.0, "max_utilization": None}], "c"
        )


def test_a_node_row_carries_its_utilization_or_says_it_is_malformed():
    assert node_statistic_row({"name": "n1", "gpu_utilization": 42.0}) == {
        "node_name": "n1",
        "gpu_utilization": Decimal("42.00"),
    }
    assert node_statistic_row({"name": "n1", "gpu_utilization": None})["gpu_utilization"] is None
    with pytest.raises(MalformedObject):
        node_statistic_row({"name": "n1", "gpu_utilization": "busy"})
