"""Kubernetes resource quantities ("8", "192", "127500m", "2113Gi") as numbers."""

from __future__ import annotations

import math

from kubernetes.utils import parse_quantity

from lens_pipeline.collect.problems import MalformedObject


def whole_units(value: object, what: str) -> int:
    """A quantity rounded down to whole units (CPUs, GPUs); a malformed one names `what`."""
    if isinstance(value, str) and value.isdigit():  # "8", "192": nearly every GPU and CPU count
        return int(value)
    if isinstance(value, bool):
        raise MalformedObject(f"{what} should be a quantity, got {value!r}")
    try:
        number = parse_quantity(value)
    except (ValueError, TypeError, ArithmeticError):
        raise MalformedObject(f"{what} should be a quantity, got {value!r:.40}") from None
    if not number.is_finite() or number < 0:
        raise MalformedObject(f"{what} should be a non-negative quantity, got {value!r:.40}")
    return math.floor(number)
