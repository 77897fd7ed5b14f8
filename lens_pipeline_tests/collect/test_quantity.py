"""Counts read from Kubernetes objects are bounded: what no integer column holds is a malformed object."""

from __future__ import annotations

import pytest

from lens_pipeline.collect.objects import resource_version
from lens_pipeline.collect.problems import MalformedObject
from lens_pipeline.collect.quantity import MAX_COUNT, whole_units


@pytest.mark.parametrize(
    ("value", "integer", "expected"),
    [
        ("8", True, 8),
        (8, True, 8),
        ("127500m", False, 127),  # CPUs: rounded down
        ("2k", True, 2000),
        (str(MAX_COUNT), True, MAX_COUNT),
    ],
)
def test_counts_in_range_are_read(value, integer, expected):
    assert whole_units(value, "x", integer=integer) == expected


@pytest.mark.parametrize(
    ("value", "integer", "message"),
    [
        ("99999999999999999999", True, "between 0 and 65536"),
        ("9" * 10_000, True, "between 0 and 65536"),
        ("1e20", True, "between 0 and 65536"),
        (str(MAX_COUNT + 1), True, "between 0 and 65536"),
        (1e20, False, "between 0 and 65536"),
        ("-1", True, "non-negative"),
        ("1500m", True, "whole number"),  # the API server refuses fractional GPUs
        ("0.5", True, "whole number"),
        ("\u0663", True, "a quantity"),  # Arabic-Indic three: Decimal reads it, Kubernetes does not
        ("\u00b2", True, "a quantity"),  # superscript two: str.isdigit() says yes, int() refuses
        ("eight", True, "a quantity"),
        (True, True, "a quantity"),
        (None, True, "a quantity"),
    ],
)
def test_counts_out_of_range_are_malformed_and_name_the_field(value, integer, message):
    with pytest.raises(MalformedObject, match=message) as raised:
        whole_units(value, "status.capacity['amd.com/gpu']", integer=integer)
    assert "status.capacity['amd.com/gpu']" in str(raised.value)


@pytest.mark.parametrize("value", ["", "abc", "-1", "9" * 25, str(1 << 63), "\u0663", 1.5, True, None])
def test_resource_versions_past_what_a_bigint_holds_are_malformed(value):
    with pytest.raises(MalformedObject, match="resourceVersion"):
        resource_version({"resourceVersion": value})


def test_resource_versions_are_read():
    assert resource_version({"resourceVersion": str((1 << 63) - 1)}) == (1 << 63) - 1
    assert resource_version({"resourceVersion": "68"}) == 68
