"""Writing the `storage` table for one cluster: vanished backends are soft-deleted (`deleted_at`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from lens_pipeline.store.schema import storage
from lens_pipeline.store.upsert import SyncResult, sync_snapshot


def write_storage(
    conn: Connection,
    cluster_name: str,
    rows: Sequence[dict[str, Any]],
    *,
    now: datetime,
    keep_all: bool = False,
) -> SyncResult:
    """`keep_all`: some backend could not be read this run, so absence proves nothing; mark none deleted."""
    scope = {"cluster_name": cluster_name}
    return sync_snapshot(
        conn,
        storage,
        scope,
        [{**scope, **r} for r in rows],
        now=now,
        on_vanish="keep" if keep_all else {"deleted_at": now},
        may_vanish=storage.c.deleted_at.is_(None),
    )
