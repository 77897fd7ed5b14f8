"""Retention of the Lens history tables that only grow with churn.

What goes, when older than the cutoff:
- snapshots superseded by a newer one of the same object (`pod_snapshot`, `gpu_workload_snapshot`).
  An object's newest snapshot always stays: the collectors compare resourceVersions with it to
  write a snapshot only on change, and without it they would write the object again;
- `node_device_changelog` rows (an audit log: nothing is computed from old entries);
- `gpu_pods_event` rows of pods that are gone (`gpu_pods.deleted` and their GPUs let go before the
  cutoff, or no row left): a live pod's events stay whatever their age, since its conditions are
  still True and the collector would write them again with their old times.

And, by a cutoff of their own (`prune_hourly`), the hourly history's rows of hours before it: the
five tables of `hourly_history`, by their hour.

Deleted in batches of ids, each batch its own transaction, so a first pruning of months of history
neither holds locks for long nor builds one huge transaction; a batch is chosen with a plain
SELECT, which MySQL allows on the table a DELETE then names (a DELETE with a subquery on its own
table it refuses).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine, Select, Table, delete, exists, or_, select

from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.hourly import HOURLY_TABLES
from lens_pipeline.store.schema import (
    gpu_pods,
    gpu_pods_event,
    gpu_workload_snapshot,
    node_device_changelog,
    pod_resource,
    pod_snapshot,
)

BATCH = 5000
# Snapshot tables and the column naming the object a snapshot is of.
SNAPSHOTS: tuple[tuple[Table, str], ...] = ((pod_snapshot, "pod_uid"), (gpu_workload_snapshot, "uid"))


def prune_history(engine: Engine, older_than: datetime, *, batch: int = BATCH) -> dict[str, int]:
    """Delete the history rows older than `older_than` that nothing needs; rows deleted per table."""
    deleted: dict[str, int] = {}
    for table, object_column in SNAPSHOTS:
        newer = table.alias("newer")
        superseded = exists().where(
            newer.c.cluster_name == table.c.cluster_name,
            newer.c[object_column] == table.c[object_column],
            newer.c.resource_version > table.c.resource_version,
        )
        deleted[table.name] = _delete_in_batches(
            engine, table, select(table.c.id).where(table.c.created_at < older_than, superseded), batch
        )
    deleted[node_device_changelog.name] = _delete_in_batches(
        engine,
        node_device_changelog,
        select(node_device_changelog.c.id).where(node_device_changelog.c.created_at < older_than),
        batch,
    )
    # A pod is gone when it is marked deleted and its GPUs were let go before the cutoff (a pod
    # stuck Terminating is marked deleted too, but still holds them: its events stay), or when the
    # Lens tables no longer know it.
    ended_before = exists().where(
        pod_resource.c.cluster_name == gpu_pods.c.cluster_name,
        pod_resource.c.uid == gpu_pods.c.uid,
        pod_resource.c.end_at < older_than,
    )
    known_live = exists().where(
        gpu_pods.c.cluster_name == gpu_pods_event.c.cluster_name,
        gpu_pods.c.uid == gpu_pods_event.c.pod_uuid,
        or_(gpu_pods.c.deleted.isnot(True), ~ended_before),
    )
    deleted[gpu_pods_event.name] = _delete_in_batches(
        engine,
        gpu_pods_event,
        select(gpu_pods_event.c.id).where(gpu_pods_event.c.created_at < older_than, ~known_live),
        batch,
    )
    return deleted


def prune_hourly(engine: Engine, before: datetime, *, batch: int = BATCH) -> dict[str, int]:
    """Delete the hourly history's rows of the hours before `before`; rows deleted per table. One
    cluster at a time, so that each batch is found through the (cluster, hour) index (MariaDB
    otherwise walks the primary key of the whole table for each batch)."""
    deleted: dict[str, int] = {}
    for table, column in HOURLY_TABLES.values():
        with engine.connect() as conn:
            clusters = list(conn.execute(select(table.c.cluster_name).distinct()).scalars())
        deleted[table.name] = sum(
            _delete_in_batches(
                engine,
                table,
                select(table.c.id).where(table.c.cluster_name == cluster, table.c[column] < before),
                batch,
                ordered=False,
            )
            for cluster in clusters
        )
    return deleted


def _delete_in_batches(engine: Engine, table: Table, ids: Select, batch: int, *, ordered: bool = True) -> int:
    total = 0
    while True:
        with write_transaction(engine) as conn:
            chosen = list(conn.execute((ids.order_by(table.c.id) if ordered else ids).limit(batch)).scalars())
            if chosen:
                conn.execute(delete(table).where(table.c.id.in_(chosen)))
        total += len(chosen)
        if len(chosen) < batch:
            return total
