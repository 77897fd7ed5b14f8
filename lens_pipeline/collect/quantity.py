"""Kubernetes resource quantities ("8", "192", "127500m", "2113Gi") and counts as bounded numbers."""

from __future__ import annotations

import math

from lens_pipeline.collect.problems import MalformedObject

# The most GPUs (or CPUs) one object may count. Counts land in 32-bit INTEGER columns (PostgreSQL,
# MariaDB) and are summed per node, workload and cluster, so an unbounded one stops the whole
# cluster's collection. The largest real counts are far below: 8 GPUs of 8 partitions each (AMD
# CPX mode) or of 7 MIG instances, time-slicing replicas in the hundreds, about a thousand CPUs.
# 2^16 leaves a wide margin and still lets 32,767 counts at the bound sum within 2^31 - 1.
MAX_COUNT = 1 << 16
# What the database's integer columns hold.
INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1


def bounded_count(count: int, what: str, limit: int = MAX_COUNT) -> int:
    """`count` itself, or a malformed object naming `what` when it is outside 0..limit."""
    if not 0 <= count <= limit:
        raise MalformedObject(f"{what} should be between 0 and {limit}, got {count}")
    return count


def whole_units(value: object, what: str, *, integer: bool = False) -> int:
    """A quantity rounded down to whole units (CPUs, GPUs), at most MAX_COUNT; a malformed one names
    `what`. With `integer`, a fraction is malformed too: the API server refuses fractional extended
    resources (GPUs), so one here is an object it never validated."""
    if isinstance(value, str) and value.isascii() and value.isdigit():  # "8", "192": nearly every count
        if len(value) > 12:  # int() of a 10,000-digit string costs; anything this long is too big
            raise MalformedObject(f"{what} should be between 0 and {MAX_COUNT}, got {value!r:.40}")
        return bounded_count(int(value), what)
    # Quantities are ASCII (Python's Decimal would also read other scripts' digits).
    if isinstance(value, bool) or (isinstance(value, str) and not value.isascii()):
        raise MalformedObject(f"{what} should be a quantity, got {value!r}")
    # The official client's parser, imported here: the rare quantity that is not a plain number is
    # read in a run that has imported the client anyway (a run that reads no cluster never does).
    from kubernetes.utils import parse_quantity

    try:
        number = parse_quantity(value)
    except (ValueError, TypeError, ArithmeticError):
        raise MalformedObject(f"{what} should be a quantity, got {value!r:.40}") from None
    if not number.is_finite() or number < 0:
        raise MalformedObject(f"{what} should be a non-negative quantity, got {value!r:.40}")
    if number > MAX_COUNT:
        raise MalformedObject(f"{what} should be between 0 and {MAX_COUNT}, got {value!r:.40}")
    if integer and number != number.to_integral_value():
        raise MalformedObject(f"{what} should be a whole number, got {value!r:.40}")
    return math.floor(number)
