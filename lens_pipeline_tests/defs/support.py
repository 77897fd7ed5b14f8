"""Helpers the Dagster-level tests share."""

from __future__ import annotations


def failure_message(result: object) -> str:
    """Every message of the first step failure's error chain (retries wrap the real error)."""
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    error, parts = failure.event_specific_data.error, []
    while error is not None:
        parts.append(error.message)
        error = error.cause
    return "\n".join(parts)
