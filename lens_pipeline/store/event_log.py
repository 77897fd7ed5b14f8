"""The container event log: appended by `lens ingest`, read by the `container_events` asset and its
sensor, with the per-cluster watermark of what has been processed.

Writers serialize their commits (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: a transaction-scoped
advisory lock; MySQL/MariaDB: a named lock held over the transaction), so ids become visible in
increasing order and a reader's "everything after id N" never skips a late commit.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from google.protobuf import struct_pb2
from sqlalchemy import Connection, Engine, case, func, select, text

from lens_pipeline.store.schema import container_event_log, container_event_progress
from lens_pipeline.store.upsert import bulk_upsert

_LOCK_KEY = zlib.crc32(b"lens-pipeline-container-event-log")
_MYSQL_LOCK = "lens_container_event_log"


@contextmanager
def log_transaction(engine: Engine) -> Iterator[Connection]:
    """One append transaction, committed in id order with every other writer's."""
    with engine.connect() as conn:
        dialect = conn.dialect.name
        if dialect in ("mysql", "mariadb"):
            conn.execute(text("SELECT GET_LOCK(:k, 60)"), {"k": _MYSQL_LOCK})
            conn.commit()  # the named lock outlives transactions; end the one the SELECT began
        try:
            with conn.begin():
                if dialect == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
                yield conn
        finally:
            if dialect in ("mysql", "mariadb"):
                conn.execute(text("SELECT RELEASE_LOCK(:k)"), {"k": _MYSQL_LOCK})
                conn.commit()


def append_events(conn: Connection, rows: Sequence[dict]) -> int:
    """Insert log rows; a row whose (cluster, event_key) is already logged is skipped (a replay)."""
    return bulk_upsert(conn, container_event_log, rows, update_columns=[])


@dataclass(frozen=True)
class ClusterNews:
    """What the log holds for one cluster after a cursor."""

    cluster: str
    last_id: int
    events: int
    to_process: int


def news_after(conn: Connection, after_id: int) -> list[ClusterNews]:
    """Per cluster: the newest id, how many events, and how many need processing, after `after_id`."""
    log = container_event_log.c
    to_process = func.sum(case((log.needs_processing.is_(True), 1), else_=0))
    query = (
        select(log.cluster_name, func.max(log.id), func.count(), to_process)
        .where(log.id > after_id)
        .group_by(log.cluster_name)
        .order_by(log.cluster_name)
    )
    return [ClusterNews(c, int(last), int(n), int(p or 0)) for c, last, n, p in conn.execute(query)]


@dataclass(frozen=True)
class LoggedEvent:
    id: int
    source: str
    event_type: str
    container_id: str
    node_name: str
    payload: bytes
    payload_format: str
    received_at: datetime

    def data(self) -> dict[str, Any]:
        """The event's data as plain JSON values, whichever transport brought it."""
        if self.payload_format == "json":
            return orjson.loads(self.payload)
        return _struct_to_dict(struct_pb2.Struct.FromString(self.payload))


def _struct_to_dict(struct: struct_pb2.Struct) -> dict[str, Any]:
    return {key: _value(value) for key, value in struct.fields.items()}


def _value(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        number = value.number_value
        return int(number) if number.is_integer() and abs(number) < 2**63 else number
    if kind == "struct_value":
        return _struct_to_dict(value.struct_value)
    if kind == "list_value":
        return [_value(item) for item in value.list_value.values]
    if kind == "bool_value":
        return value.bool_value
    return None


def read_events(
    conn: Connection, cluster: str, after_id: int, up_to_id: int, limit: int
) -> list[LoggedEvent]:
    """The cluster's events in (`after_id`, `up_to_id`] that need processing, oldest first."""
    log = container_event_log.c
    query = (
        select(
            log.id,
            log.source,
            log.event_type,
            log.container_id,
            log.node_name,
            log.payload,
            log.payload_format,
            log.received_at,
        )
        .where(
            log.cluster_name == cluster,
            log.id > after_id,
            log.id <= up_to_id,
            log.needs_processing.is_(True),
        )
        .order_by(log.id)
        .limit(limit)
    )
    return [LoggedEvent(*row) for row in conn.execute(query)]


def last_id(conn: Connection, cluster: str) -> int:
    """The cluster's newest log id (0 when it has none)."""
    log = container_event_log.c
    return int(conn.execute(select(func.max(log.id)).where(log.cluster_name == cluster)).scalar() or 0)


def processed_up_to(conn: Connection, cluster: str, *, lock: bool = False) -> int:
    """The cluster's watermark: every log id up to it has been processed (0: none yet).

    `lock` holds the watermark row until the transaction ends, so two runs of one cluster never
    process the same events at once (SQLite's write transactions are serialized anyway).
    """
    progress = container_event_progress.c
    query = select(progress.last_log_id).where(progress.cluster_name == cluster)
    if lock:
        # A row to lock, even before the first run: inserting it is a no-op when it exists.
        bulk_upsert(
            conn,
            container_event_progress,
            [{"cluster_name": cluster, "last_log_id": 0, "updated_at": datetime.now(UTC)}],
            update_columns=[],
        )
        if conn.dialect.name != "sqlite":
            query = query.with_for_update()
    return int(conn.execute(query).scalar() or 0)


def set_processed_up_to(conn: Connection, cluster: str, log_id: int, now: datetime) -> None:
    bulk_upsert(
        conn, container_event_progress, [{"cluster_name": cluster, "last_log_id": log_id, "updated_at": now}]
    )
