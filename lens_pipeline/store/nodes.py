"""Writing the `node` table for one cluster."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from lens_pipeline.store.schema import node
from lens_pipeline.store.upsert import SyncResult, sync_snapshot


def write_gpu_nodes(
    conn: Connection,
    cluster_name: str,
    rows: Sequence[dict[str, Any]],
    *,
    now: datetime,
    unreadable: Iterable[str] = (),
) -> SyncResult:
    """Make the cluster's `node` rows equal `rows`. Nodes gone from the cluster are deleted (as the
    original's orphan cleanup did); nodes that were listed but unreadable keep their stored row."""
    full_rows = [{"cluster_name": cluster_name, **row} for row in rows]
    return sync_snapshot(
        conn,
        node,
        {"cluster_name": cluster_name},
        full_rows,
        now=now,
        on_vanish="delete",
        protect=[(cluster_name, name) for name in unreadable],
    )


def stored_utilization(conn: Connection, cluster_name: str) -> dict[str, float | None]:
    """Each stored node's last GPU utilization: kept when Prometheus cannot answer this run."""
    query = select(node.c.name, node.c.gpu_utilization).where(node.c.cluster_name == cluster_name)
    return {name: value for name, value in conn.execute(query)}
