"""Reading what the overview is made of, and writing `cluster_overview_cache` (one row per cluster)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from lens_pipeline.store.schema import asset_freshness, cluster_overview_cache, node, storage
from lens_pipeline.store.upsert import bulk_upsert

NODE_COLUMNS = ("name", "gpu_count", "gpu_allocation", "gpu_utilization", "status", "taints")


def overview_nodes(conn: Connection, cluster_name: str) -> list[dict[str, Any]]:
    """The cluster's `node` rows, with the columns the overview needs."""
    query = select(*(node.c[c] for c in NODE_COLUMNS)).where(node.c.cluster_name == cluster_name)
    return [dict(row._mapping) for row in conn.execute(query)]


def storage_volumes(conn: Connection, cluster_name: str, kind: str) -> list[str]:
    """Names of the cluster's live storage backends of one kind (the JuiceFS volume names)."""
    query = select(storage.c.name).where(
        storage.c.cluster_name == cluster_name, storage.c.kind == kind, storage.c.deleted_at.is_(None)
    )
    return sorted(conn.scalars(query))


def stored_overview(conn: Connection, cluster_name: str) -> dict[str, Any] | None:
    row = conn.execute(
        select(cluster_overview_cache).where(cluster_overview_cache.c.cluster_name == cluster_name)
    ).first()
    return dict(row._mapping) if row is not None else None


def kept_figures(previous: Mapping[str, Any] | None, names: tuple[str, ...]) -> dict[str, Any]:
    """The last stored value of each figure, for a turn whose Prometheus did not answer; unknown
    (NULL) when there is no stored row yet."""
    previous = previous or {}
    return {name: previous.get(name) for name in names}


def write_overview(conn: Connection, cluster_name: str, figures: dict[str, float], *, now: datetime) -> None:
    """Upsert the cluster's row; `created_at` stays the first computation's time."""
    row = {"cluster_name": cluster_name, **figures, "created_at": now, "updated_at": now}
    bulk_upsert(conn, cluster_overview_cache, [row])


def record_materialized(conn: Connection, cluster_name: str, assets: list[str], *, now: datetime) -> None:
    """The cluster's `assets` were materialized at `now` (its turn's end)."""
    rows = [{"cluster_name": cluster_name, "asset": asset, "materialized_at": now} for asset in assets]
    bulk_upsert(conn, asset_freshness, rows)


def materialized_times(conn: Connection, assets: Sequence[str]) -> dict[str, dict[str, datetime]]:
    """Per cluster, when each of `assets` was last materialized (as recorded by the clusters' turns)."""
    fresh = asset_freshness.c
    times: dict[str, dict[str, datetime]] = {}
    query = select(fresh.cluster_name, fresh.asset, fresh.materialized_at).where(fresh.asset.in_(assets))
    for cluster, asset, when in conn.execute(query):
        times.setdefault(cluster, {})[asset] = when
    return times
