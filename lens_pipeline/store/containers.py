"""Reading and writing `node_container`, `node_container_devices` and `node_container_event`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, select

from lens_pipeline.collect.containers import CONTAINER_COLUMNS, ContainerRows
from lens_pipeline.store.schema import node_container, node_container_devices, node_container_event
from lens_pipeline.store.upsert import BATCH_ROWS, bulk_upsert


def stored_containers(
    conn: Connection, cluster: str, container_ids: Iterable[str]
) -> dict[str, dict[str, Any]]:
    """The stored rows of these containers, by container id."""
    ids = sorted(set(container_ids))
    columns = [node_container.c[c] for c in (*CONTAINER_COLUMNS, "updated_at")]
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(ids), BATCH_ROWS):
        query = select(*columns).where(
            node_container.c.cluster_name == cluster,
            node_container.c.container_id.in_(ids[start : start + BATCH_ROWS]),
        )
        for row in conn.execute(query).mappings():
            found[row["container_id"]] = dict(row)
    return found


def write_container_rows(conn: Connection, cluster: str, rows: ContainerRows) -> dict[str, int]:
    """Upsert what the events left behind; event rows already written are left alone (a replay)."""
    containers = [{"cluster_name": cluster, **row} for row in rows.containers.values()]
    devices = [{"cluster_name": cluster, **row} for row in rows.devices.values()]
    events = [{"cluster_name": cluster, **row} for row in rows.events.values()]
    bulk_upsert(conn, node_container, containers)
    bulk_upsert(conn, node_container_devices, devices)
    bulk_upsert(conn, node_container_event, events, update_columns=[])
    return {"containers": len(containers), "devices": len(devices), "events": len(events)}


def container_column_widths() -> dict[str, int]:
    """The text columns of the container tables and their widths in characters, for `apply_events`
    to set aside an event whose values would not fit."""
    widths: dict[str, int] = {}
    for table in (node_container, node_container_devices):
        for column in table.c:
            length = getattr(column.type, "length", None)
            if isinstance(length, int) and column.name != "cluster_name":
                widths[column.name] = min(length, widths.get(column.name, length))
    return widths
