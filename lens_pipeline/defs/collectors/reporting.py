"""What every collector puts in its run metadata: counts, problems, a markdown sample of rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dagster import MetadataValue

from lens_pipeline.collect.problems import Problem
from lens_pipeline.kube.reader import ListStats
from lens_pipeline.store.upsert import SyncResult

MAX_LISTED = 20
TABLE_ROWS = 50


def markdown_table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    limit: int = TABLE_ROWS,
    total: int | None = None,
) -> MetadataValue:
    """The first `limit` rows as a markdown table; `total` counts the rows when `rows` are only
    the first ones."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows[:limit]:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    total = len(rows) if total is None else total
    if total > limit:
        lines.append(f"\n{total - limit} more rows not shown")
    return MetadataValue.md("\n".join(lines))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    return "" if value is None else str(value).replace("|", "\\|")


def sync_metadata(result: SyncResult) -> dict[str, Any]:
    return {
        "rows_inserted": len(result.inserted),
        "rows_updated": len(result.updated),
        "rows_unchanged": result.unchanged,
        "rows_vanished": len(result.vanished),
    }


def read_metadata(stats: ListStats, prom_queries: int) -> dict[str, Any]:
    read: dict[str, Any] = {
        "kubernetes_requests": stats.requests,
        "kubernetes_pages": stats.pages,
        "kubernetes_list_restarts": stats.restarts,
        "kubernetes_retries": stats.retries,
        "prometheus_queries": prom_queries,
    }
    if stats.sources:  # a watch cache is configured: where each list came from, and why
        read["kubernetes_lists_from_watch_cache"] = sum(s == "watch cache" for s in stats.sources.values())
        read["kubernetes_list_sources"] = MetadataValue.json(dict(sorted(stats.sources.items())))
    return read


def problems_metadata(problems: Sequence[Problem]) -> dict[str, Any]:
    listed = [str(p) for p in problems[:MAX_LISTED]]
    if len(problems) > MAX_LISTED:
        listed.append(f"... and {len(problems) - MAX_LISTED} more")
    return {"malformed_objects": len(problems), "malformed_examples": MetadataValue.json(listed)}
