"""The container event log: appended by `lens ingest`, read by the `container_events` asset and its
sensor, with the per-cluster watermark of what has been processed.

Each group commit writes, per cluster, one segment row holding all its new events packed one after
another (a fixed header and the event's fields; the whole `ContainerEvent` as received for gRPC),
and one narrow key row per event that makes a replay a no-op. On PostgreSQL the segment goes in by
binary COPY (no hex escaping of megabytes) and its payload is compressed by the server (lz4) where
available: the log costs one wide row per round instead of one row and one index entry per event.

Writers serialize their commits (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: a transaction-scoped
advisory lock; MySQL/MariaDB: a named lock held over the transaction), so segment ids become
visible in increasing order, a reader's "everything after id N" never skips a late commit, and
"which of these keys are logged" is answered without a race.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import chain
from typing import Any

import orjson
from google.protobuf import struct_pb2
from sqlalchemy import Connection, Engine, delete, func, insert, select, text

from lens_pipeline.protowire import length_delimited_fields
from lens_pipeline.store.schema import (
    container_event_dead_letter,
    container_event_key,
    container_event_progress,
    container_event_segment,
)
from lens_pipeline.store.upsert import bulk_upsert

_LOCK_KEY = zlib.crc32(b"lens-pipeline-container-event-log")
_MYSQL_LOCK = "lens_container_event_log"

# A segment: one version byte, then records. A record: this header, then event type, container id,
# node name, event id and payload, back to back. Times are microseconds since the epoch.
SEGMENT_VERSION = b"\x01"
_RECORD = struct.Struct(
    "<qBBBBHHHI"
)  # received_at, source, format, needs_processing, len(event_id)+1 (0: none), lengths
SOURCES = ("k8s", "docker")
PAYLOAD_FORMATS = ("struct", "json", "event")
# `ContainerEvent.data` (exporter.proto): the only field the log reads back from a whole event.
CONTAINER_EVENT_DATA_FIELD = 3  # Struct bytes; JSON object; the whole ContainerEvent
# Bounds of one segment: a round with more is cut into several (MariaDB's packet limit, and the
# asset reads whole segments).
SEGMENT_MAX_EVENTS = 5000
SEGMENT_MAX_BYTES = 8 << 20
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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


def append_events(conn: Connection, rows: Sequence[dict], quarantined: list | None = None) -> int:
    """Log the events of `rows` (as `lens_pipeline.ingest.events` makes them) that are not logged yet
    (same cluster and `event_key`: a replay, skipped); returns how many were new. Call it inside
    `log_transaction`, which makes the check and the insert one step for every writer.

    An event the log format cannot hold goes to the dead-letter table instead, in the same
    transaction: it never holds back the others, nor is it retried forever."""
    fresh: dict[tuple[str, bytes], dict] = {}
    unloggable = []
    micros: dict[datetime, int] = {}  # the events of one message share their receive time
    for row in rows:
        try:
            record = record_parts(row, micros)
        except (struct.error, ValueError, KeyError, TypeError, UnicodeError) as exc:
            unloggable.append((row, f"the log format cannot hold this event: {type(exc).__name__}: {exc}"))
            continue
        key = (row["cluster_name"], row["event_key"])
        if key not in fresh:
            row["record"] = record  # kept on the row (not a copy of it): tens of thousands a second
            fresh[key] = row
    if unloggable:
        quarantine(conn, "log", [(received_dead_letter_row(row), reason) for row, reason in unloggable])
        if quarantined is not None:
            quarantined.extend(unloggable)
    by_cluster: dict[str, list[dict]] = {}
    for (cluster, _), row in fresh.items():
        by_cluster.setdefault(cluster, []).append(row)
    append = _append_postgresql if conn.dialect.name == "postgresql" else _append_portable
    return sum(
        append(conn, cluster, segment)
        for cluster, cluster_rows in by_cluster.items()
        for segment in _segments(cluster_rows)
    )


def _segments(rows: list[dict]) -> Iterator[list[dict]]:
    start, size = 0, 0
    for index, row in enumerate(rows):
        size += len(row["payload"])
        if index > start and (index - start >= SEGMENT_MAX_EVENTS or size > SEGMENT_MAX_BYTES):
            yield rows[start:index]
            start, size = index, len(row["payload"])
    if start < len(rows):
        yield rows[start:]


def _append_portable(conn: Connection, cluster: str, rows: list[dict]) -> int:
    known = _known_keys(conn, cluster, [row["event_key"] for row in rows])
    rows = [row for row in rows if row["event_key"] not in known]
    if not rows:
        return 0
    values = _segment_values(cluster, rows)
    values["payload"] = b"".join(values["payload"])
    inserted = conn.execute(insert(container_event_segment).values(values)).inserted_primary_key
    assert inserted is not None  # an INSERT of one row always says its key
    segment_id = int(inserted[0])
    conn.execute(
        insert(container_event_key),
        [{"cluster_name": cluster, "event_key": row["event_key"], "segment_id": segment_id} for row in rows],
    )
    return len(rows)


def _append_postgresql(conn: Connection, cluster: str, rows: list[dict]) -> int:
    """PostgreSQL: the keys in one statement that also says which are new (all keys travel as one
    bytea, not an array of thousands of escaped values), then the segment by binary COPY."""
    # The added keys come back only when some were already logged (a replay): usually none.
    segment_id, added, added_keys = conn.exec_driver_sql(
        "WITH segment AS (SELECT nextval(pg_get_serial_sequence('container_event_segment', 'id')) AS id), "
        "added AS (INSERT INTO container_event_key (cluster_name, event_key, segment_id) "
        "SELECT %(cluster)s, substring(%(keys)s::bytea FROM i * 32 + 1 FOR 32), segment.id "
        "FROM generate_series(0, %(n)s - 1) AS i, segment "
        "ON CONFLICT (cluster_name, event_key) DO NOTHING RETURNING event_key), "
        "counted AS (SELECT count(*) AS n FROM added) "
        "SELECT (SELECT id FROM segment), counted.n, "
        "CASE WHEN counted.n < %(n)s THEN (SELECT array_agg(event_key) FROM added) END FROM counted",
        {"cluster": cluster, "keys": b"".join(row["event_key"] for row in rows), "n": len(rows)},
    ).one()
    if added < len(rows):
        fresh = {bytes(key) for key in added_keys or ()}
        rows = [row for row in rows if row["event_key"] in fresh]
    if not rows:
        return 0
    segment_id = int(segment_id)
    _copy_segment(conn, segment_id, _segment_values(cluster, rows))
    return len(rows)


def _segment_values(cluster: str, rows: list[dict]) -> dict:
    return {
        "cluster_name": cluster,
        "events": len(rows),
        "to_process": sum(1 for row in rows if row["needs_processing"]),
        "received_at": max(row["received_at"] for row in rows),
        "payload": [SEGMENT_VERSION, *chain.from_iterable(row["record"] for row in rows)],
    }


def encode_record(row: dict) -> bytes:
    """One event's record of a segment."""
    return b"".join(record_parts(row))


def record_parts(row: dict, micros: dict[datetime, int] | None = None) -> tuple[bytes, ...]:
    """One event's record of a segment, in pieces: joined once per segment, not once per event (the
    whole event, kilobytes, is one of them). `micros` remembers the times already converted."""
    event_id = row["event_id"]
    id_bytes = event_id.encode() if event_id else b""
    event_type, container_id, node = (
        row["event_type"].encode(),
        row["container_id"].encode(),
        row["node_name"].encode(),
    )
    payload = row["payload"]
    received_at = row["received_at"]
    received = micros.get(received_at) if micros is not None else None
    if received is None:
        received = _microseconds(received_at - _EPOCH)
        if micros is not None:
            micros[received_at] = received
    header = _RECORD.pack(
        received,
        SOURCES.index(row["source"]),
        PAYLOAD_FORMATS.index(row["payload_format"]),
        bool(row["needs_processing"]),
        len(id_bytes) + 1 if event_id else 0,
        len(event_type),
        len(container_id),
        len(node),
        len(payload),
    )
    return (header, event_type, container_id, node, id_bytes, payload)


def _microseconds(delta: timedelta) -> int:
    """A time since an epoch in whole microseconds, exactly (no float on the way)."""
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def dead_letter_row(cluster: str, event: LoggedEvent) -> dict:
    """A logged event as a dead-letter row (its payload as it was logged)."""
    return {
        "cluster_name": cluster,
        "source": event.source,
        "event_type": event.event_type,
        "container_id": event.container_id,
        "node_name": event.node_name,
        "event_id": event.event_id,
        "log_segment_id": event.id,
        "payload": bytes(event.payload),
        "received_at": event.received_at,
    }


def received_dead_letter_row(row: dict) -> dict:
    """An event as received (a row of `lens_pipeline.ingest.events`) as a dead-letter row."""
    return {
        "cluster_name": row.get("cluster_name", ""),
        "source": row.get("source"),
        "event_type": row.get("event_type"),
        "container_id": row.get("container_id"),
        "node_name": row.get("node_name"),
        "event_id": row.get("event_id"),
        "payload": row.get("payload") or b"",
        "received_at": row.get("received_at"),
    }


def quarantine(conn: Connection, stage: str, events: Sequence[tuple[dict, str]]) -> int:
    """Keep `events` ((dead-letter row, reason) pairs) in `container_event_dead_letter`: what was
    received, whole, with where and why it could not go on. Text is cut to the columns' sizes and
    cleared of NUL (which PostgreSQL text refuses), so the quarantine itself cannot fail on it."""
    if not events:
        return 0
    now = datetime.now(UTC)
    rows = []
    for row, reason in events:
        clean = {
            key: _printable(value, container_event_dead_letter.c[key].type.length)
            if isinstance(value, str)
            else value
            for key, value in row.items()
        }
        rows.append({**clean, "stage": stage, "reason": _printable(reason, 1024), "created_at": now})
    conn.execute(insert(container_event_dead_letter), rows)
    return len(rows)


def _printable(text: str, limit: int | None) -> str:
    text = text.replace("\x00", "\\0")
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def dead_letters(conn: Connection, cluster: str | None = None) -> list[dict]:
    """The quarantined events (of one cluster), oldest first."""
    query = select(container_event_dead_letter).order_by(container_event_dead_letter.c.id)
    if cluster is not None:
        query = query.where(container_event_dead_letter.c.cluster_name == cluster)
    return [dict(row) for row in conn.execute(query).mappings()]


def _copy_segment(conn: Connection, segment_id: int, values: dict) -> None:
    """The segment by binary COPY: megabytes of payload go as they are, in one buffer, not hex-escaped."""
    received = values["received_at"] - datetime(2000, 1, 1, tzinfo=UTC)  # PostgreSQL's epoch
    payload = values["payload"]
    size = sum(map(len, payload))
    fields = (
        struct.pack("!q", segment_id),
        values["cluster_name"].encode(),
        struct.pack("!i", values["events"]),
        struct.pack("!i", values["to_process"]),
        struct.pack("!q", _microseconds(received)),
    )
    parts = [b"PGCOPY\n\xff\r\n\x00", struct.pack("!iih", 0, 0, len(fields) + 1)]
    for field in fields:
        parts += (struct.pack("!i", len(field)), field)
    parts += (struct.pack("!i", size), *payload, struct.pack("!h", -1))
    stream = io.BytesIO(b"".join(parts))
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.copy_expert(
            "COPY container_event_segment (id, cluster_name, events, to_process, received_at, payload) "
            "FROM STDIN WITH (FORMAT binary)",
            stream,
            size=len(stream.getbuffer()),
        )
    finally:
        cursor.close()


def _known_keys(conn: Connection, cluster: str, keys: list[bytes]) -> set[bytes]:
    k = container_event_key.c
    known: set[bytes] = set()
    for start in range(0, len(keys), 500):
        query = select(k.event_key).where(
            k.cluster_name == cluster, k.event_key.in_(keys[start : start + 500])
        )
        known.update(bytes(key) for key in conn.scalars(query))
    return known


@dataclass(frozen=True)
class ClusterNews:
    """What the log holds for one cluster after a cursor."""

    cluster: str
    last_id: int
    events: int
    to_process: int


def news_after(conn: Connection, after_id: int) -> list[ClusterNews]:
    """Per cluster: the newest segment id, how many events, and how many need processing, after `after_id`."""
    seg = container_event_segment.c
    query = (
        select(seg.cluster_name, func.max(seg.id), func.sum(seg.events), func.sum(seg.to_process))
        .where(seg.id > after_id)
        .group_by(seg.cluster_name)
        .order_by(seg.cluster_name)
    )
    return [ClusterNews(c, int(last), int(n), int(p or 0)) for c, last, n, p in conn.execute(query)]


def pending_clusters(conn: Connection) -> dict[str, int]:
    """Per cluster with events to process past its watermark: its newest such segment id. Only the
    segments past each watermark are read (the unique (cluster_name, id) index serves the range)."""
    seg, progress = container_event_segment.c, container_event_progress.c
    query = (
        select(seg.cluster_name, func.max(seg.id))
        .select_from(
            container_event_segment.outerjoin(
                container_event_progress, progress.cluster_name == seg.cluster_name
            )
        )
        .where(seg.id > func.coalesce(progress.last_log_id, 0), seg.to_process > 0)
        .group_by(seg.cluster_name)
    )
    return {cluster: int(newest) for cluster, newest in conn.execute(query)}


@dataclass(frozen=True)
class Backlog:
    """One cluster's logged events that need processing and are not applied yet."""

    cluster: str
    events: int
    oldest_received_at: datetime | None  # of the oldest segment holding them (None: caught up)
    newest_received_at: datetime | None = None  # of the newest one


def backlog(conn: Connection) -> list[Backlog]:
    """Per cluster with events or a watermark: what waits beyond its watermark (the ingest lag of
    `/metrics`). One grouped query over the segments past each cluster's watermark, which the
    (cluster, id) index bounds; segments whose events need no processing are not waiting (no run
    is started for them)."""
    seg, progress = container_event_segment.c, container_event_progress.c
    pending = (
        select(
            seg.cluster_name, func.sum(seg.to_process), func.min(seg.received_at), func.max(seg.received_at)
        )
        .select_from(
            container_event_segment.outerjoin(
                container_event_progress, progress.cluster_name == seg.cluster_name
            )
        )
        .where(seg.id > func.coalesce(progress.last_log_id, 0), seg.to_process > 0)
        .group_by(seg.cluster_name)
    )
    found = {
        cluster: Backlog(cluster, int(n), oldest, newest)
        for cluster, n, oldest, newest in conn.execute(pending)
    }
    for cluster in conn.scalars(select(progress.cluster_name)):
        found.setdefault(cluster, Backlog(cluster, 0, None))
    return [found[cluster] for cluster in sorted(found)]


@dataclass(frozen=True)
class LoggedEvent:
    id: int  # of the segment that holds it
    index: int  # its place in the segment
    cluster: str
    source: str
    event_type: str
    container_id: str
    node_name: str
    event_id: str | None
    needs_processing: bool
    payload: bytes
    payload_format: str
    received_at: datetime

    def data(self) -> dict[str, Any]:
        """The event's data as plain JSON values, whichever transport brought it."""
        if self.payload_format == "json":
            return orjson.loads(self.payload)
        if self.payload_format == "event":
            # The whole ContainerEvent as the agent sent it: its `data` (field 3, a Struct), merged
            # as protobuf merges a repeated message field, without the generated class.
            data = struct_pb2.Struct()
            for number, value in length_delimited_fields(bytes(self.payload), skip_scalars=True):
                if number == CONTAINER_EVENT_DATA_FIELD:
                    data.MergeFromString(value)
            return _struct_to_dict(data)
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


def decode_segment(segment_id: int, cluster: str, payload: bytes) -> list[LoggedEvent]:
    """The events a segment holds, in the order they were logged."""
    payload = bytes(payload)
    if payload[:1] != SEGMENT_VERSION:
        raise ValueError(f"log segment {segment_id} of cluster {cluster}: unknown format {payload[:1]!r}")
    events, at, end, index = [], 1, len(payload), 0
    while at < end:
        micros, source, fmt, needs, id_len, type_len, cid_len, node_len, size = _RECORD.unpack_from(
            payload, at
        )
        at += _RECORD.size
        fields = []
        for length in (type_len, cid_len, node_len, max(id_len - 1, 0)):
            fields.append(payload[at : at + length].decode())
            at += length
        events.append(
            LoggedEvent(
                segment_id,
                index,
                cluster,
                SOURCES[source],
                fields[0],
                fields[1],
                fields[2],
                fields[3] if id_len else None,
                bool(needs),
                payload[at : at + size],
                PAYLOAD_FORMATS[fmt],
                _EPOCH + timedelta(microseconds=micros),
            )
        )
        at += size
        index += 1
    return events


@dataclass(frozen=True)
class LogChunk:
    events: list[LoggedEvent]  # those that need processing, oldest first
    up_to_id: int  # every segment up to this id has been read


def read_events(conn: Connection, cluster: str, after_id: int, up_to_id: int, limit: int) -> LogChunk:
    """The cluster's events in segments (`after_id`, `up_to_id`] that need processing, oldest first,
    whole segments until at least `limit` events (or the end)."""
    seg = container_event_segment.c
    in_range = (seg.cluster_name == cluster, seg.id > after_id, seg.id <= up_to_id, seg.to_process > 0)
    # Each of these segments has something to process: `limit` of them are always enough.
    chosen, total = [], 0
    for segment_id, to_process in conn.execute(
        select(seg.id, seg.to_process).where(*in_range).order_by(seg.id).limit(limit)
    ):
        chosen.append(segment_id)
        total += to_process
        if total >= limit:
            break
    events: list[LoggedEvent] = []
    if chosen:
        query = select(seg.id, seg.payload).where(seg.id.in_(chosen)).order_by(seg.id)
        for segment_id, payload in conn.execute(query):
            events.extend(e for e in decode_segment(segment_id, cluster, payload) if e.needs_processing)
    return LogChunk(events, chosen[-1] if total >= limit else up_to_id)


def logged_events(conn: Connection) -> list[LoggedEvent]:
    """Every event in the log, in log order (tests, benchmarks, small logs only)."""
    seg = container_event_segment.c
    query = select(seg.id, seg.cluster_name, seg.payload).order_by(seg.id)
    return [event for row in conn.execute(query) for event in decode_segment(*row)]


def count_events(conn: Connection) -> int:
    """How many events the log holds."""
    return int(conn.scalar(select(func.coalesce(func.sum(container_event_segment.c.events), 0))) or 0)


def last_id(conn: Connection, cluster: str) -> int:
    """The cluster's newest segment id (0 when it has none)."""
    seg = container_event_segment.c
    return int(conn.execute(select(func.max(seg.id)).where(seg.cluster_name == cluster)).scalar() or 0)


def prune(conn: Connection, cluster: str, processed_id: int, older_than: datetime) -> int:
    """Retention: drop the cluster's segments (and their replay keys) that are processed (id up to
    `processed_id`) and whose newest event was received before `older_than`; returns how many events.
    A replay of a dropped event is logged again."""
    seg = container_event_segment.c
    doomed = conn.execute(
        select(seg.id, seg.events).where(
            seg.cluster_name == cluster, seg.id <= processed_id, seg.received_at < older_than
        )
    ).all()
    ids = [segment_id for segment_id, _ in doomed]
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        conn.execute(delete(container_event_key).where(container_event_key.c.segment_id.in_(chunk)))
        conn.execute(delete(container_event_segment).where(seg.id.in_(chunk)))
    return sum(events for _, events in doomed)


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
