"""container event log in segments: one row per cluster and group commit, replay keys apart

Revision ID: 0004_lens
Revises: 0003_lens
Create Date: 2026-11-22 07:00:00.000000

Every row of `container_event_log` becomes a segment of one event with the row's id, so the
processing watermarks (`container_event_progress.last_log_id`) and the sensor's cursor keep their
meaning; new segments get larger ids. The packing below is the first segment format of
`lens_pipeline/store/event_log.py`, copied so this migration never changes with that module.
"""

import struct
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

import lens_pipeline.store.types

revision: str = "0004_lens"
down_revision: str | None = "0003_lens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RECORD = struct.Struct("<qBBBBHHHI")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SOURCES = ("k8s", "docker")
_FORMATS = ("struct", "json", "event")
_BATCH = 1000


def upgrade() -> None:
    bind = op.get_bind()
    segment = op.create_table(
        "container_event_segment",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("cluster_name", sa.String(length=100), nullable=False),
        sa.Column("events", sa.Integer(), nullable=False),
        sa.Column("to_process", sa.Integer(), nullable=False),
        sa.Column("received_at", lens_pipeline.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column(
            "payload", sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb"), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_container_event_segment")),
        sa.UniqueConstraint("cluster_name", "id", name=op.f("uq_container_event_segment_key")),
        sqlite_autoincrement=True,
    )
    if bind.dialect.name == "postgresql" and _has_lz4(bind):
        # Segments are megabytes of similar events: lz4 in the server is cheap and cuts the WAL.
        op.execute("ALTER TABLE container_event_segment ALTER COLUMN payload SET COMPRESSION lz4")
    key = op.create_table(
        "container_event_key",
        sa.Column("cluster_name", sa.String(length=100), nullable=False),
        sa.Column(
            "event_key",
            sa.LargeBinary(length=32).with_variant(mysql.BINARY(length=32), "mysql", "mariadb"),
            nullable=False,
        ),
        sa.Column("segment_id", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("cluster_name", "event_key", name=op.f("uq_container_event_key_key")),
    )
    op.create_index("ix_container_event_key_segment", "container_event_key", ["segment_id"], unique=False)

    log = sa.table(
        "container_event_log",
        *(sa.column(name) for name in ("id", "cluster_name", "event_key", "source", "event_type")),
        *(sa.column(name) for name in ("container_id", "node_name", "event_id", "needs_processing")),
        sa.column("payload", sa.LargeBinary()),
        sa.column("payload_format"),
        sa.column("received_at", lens_pipeline.store.types.UTCDateTime(timezone=True)),
    )
    after = 0
    while rows := bind.execute(sa.select(log).where(log.c.id > after).order_by(log.c.id).limit(_BATCH)).all():
        op.bulk_insert(segment, [_segment(row) for row in rows], multiinsert=True)
        op.bulk_insert(
            key,
            [
                {"cluster_name": r.cluster_name, "event_key": bytes.fromhex(r.event_key), "segment_id": r.id}
                for r in rows
            ],
            multiinsert=True,
        )
        after = rows[-1].id
    if after and bind.dialect.name == "postgresql":
        op.execute(
            sa.text("SELECT setval(pg_get_serial_sequence('container_event_segment', 'id'), :n)").bindparams(
                n=after
            )
        )
    with op.batch_alter_table("container_event_log", schema=None) as batch_op:
        batch_op.drop_index("ix_container_event_log_cluster_id")
    op.drop_table("container_event_log")


def _has_lz4(bind: sa.Connection) -> bool:
    lz4 = "SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)"
    return bind.execute(sa.text(lz4)).first() is not None


def _segment(row: sa.Row) -> dict:
    event_id = (row.event_id or "").encode()
    parts = (row.event_type.encode(), row.container_id.encode(), row.node_name.encode(), event_id, row.payload)
    received = row.received_at - _EPOCH
    header = _RECORD.pack(
        (received.days * 86_400 + received.seconds) * 1_000_000 + received.microseconds,
        _SOURCES.index(row.source),
        _FORMATS.index(row.payload_format),
        bool(row.needs_processing),
        len(event_id) + 1 if row.event_id else 0,
        len(parts[0]),
        len(parts[1]),
        len(parts[2]),
        len(parts[4]),
    )
    return {
        "id": row.id,
        "cluster_name": row.cluster_name,
        "events": 1,
        "to_process": int(bool(row.needs_processing)),
        "received_at": row.received_at,
        "payload": b"".join((b"\x01", header, *parts)),
    }


def downgrade() -> None:
    raise NotImplementedError(
        "0004_lens cannot be downgraded: the log's ids change meaning; restore a backup from before it"
    )
