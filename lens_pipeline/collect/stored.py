"""Stored rows as the views read them back. A value that is not what its column should hold (a row
written by hand, by an older version, or through SQLite's loose typing) makes the row malformed,
named by its column, so that the view skips and counts that one row instead of failing the
cluster's view on every run."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any, TypeVar

from lens_pipeline.collect.problems import MalformedObject, Problem
from lens_pipeline.collect.quantity import INT32_MAX

T = TypeVar("T")


def stored_count(row: Mapping[str, Any], column: str) -> int:
    """A count column (GPUs, samples): an integer in 0..2^31-1; NULL is 0."""
    value = row.get(column)
    if value is None:
        return 0
    if value.__class__ is not int or not 0 <= value <= INT32_MAX:
        raise MalformedObject(f"{column} should be a count, got {value!r:.40}")
    return value


def stored_figure(
    row: Mapping[str, Any], column: str, low: float = -math.inf, high: float = math.inf
) -> float | None:
    """A figure column: a finite number within [low, high], or NULL (unknown)."""
    value = row.get(column)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise MalformedObject(f"{column} should be a number, got {value!r:.40}")
    number = float(value)
    if not (math.isfinite(number) and low <= number <= high):
        raise MalformedObject(f"{column} should be a finite number in [{low:g}, {high:g}], got {number!r}")
    return number


def stored_text(row: Mapping[str, Any], column: str) -> str:
    """A text column; NULL is ''."""
    value = row.get(column)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedObject(f"{column} should be text, got {type(value).__name__}")
    return value


def stored_mapping(row: Mapping[str, Any], column: str) -> dict:
    """A JSON object column (labels, taints); NULL is {}."""
    value = row.get(column)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedObject(f"{column} should be a JSON object, got {type(value).__name__}")
    return value


def readable_rows(
    rows: Iterable[Mapping[str, Any]], read: Callable[[Mapping[str, Any]], T], kind: str, key: str
) -> tuple[list[T], list[Problem]]:
    """`read` of every row that can be read, and a `Problem` (named by the row's `key` column) for
    each that cannot."""
    readable: list[T] = []
    problems: list[Problem] = []
    for row in rows:
        try:
            readable.append(read(row))
        except MalformedObject as exc:
            problems.append(Problem(kind, str(row.get(key))[:300], str(exc)))
    return readable, problems
