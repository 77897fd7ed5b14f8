"""Kubernetes timestamps (RFC 3339, e.g. "2026-11-01T12:00:00Z") as timezone-aware UTC datetimes."""

from __future__ import annotations

from datetime import UTC, datetime

from lens_pipeline.collect.problems import MalformedObject


def parse_time(value: object, what: str) -> datetime | None:
    """None for an absent time; a malformed one names `what`."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise MalformedObject(f"{what} should be an RFC 3339 time, got {type(value).__name__}")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise MalformedObject(f"{what} should be an RFC 3339 time, got {value!r:.40}") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
