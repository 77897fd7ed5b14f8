"""container event log: the ingest sidecar's append-only log and the processing watermark

Revision ID: 0002
Revises: 0001_lens
Create Date: 2026-11-22 06:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

import lens_pipeline.store.types

revision: str = "0002"
down_revision: str | None = "0001_lens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "container_event_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("cluster_name", sa.String(length=100), nullable=False),
        sa.Column("event_key", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("container_id", sa.String(length=128), nullable=False),
        sa.Column("node_name", sa.String(length=253), nullable=False),
        sa.Column("event_id", sa.String(length=128), nullable=True),
        sa.Column("needs_processing", sa.Boolean(), nullable=False),
        sa.Column(
            "payload", sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb"), nullable=False
        ),
        sa.Column("payload_format", sa.String(length=8), nullable=False),
        sa.Column("received_at", lens_pipeline.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_container_event_log")),
        sa.UniqueConstraint("cluster_name", "event_key", name=op.f("uq_container_event_log_key")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("container_event_log", schema=None) as batch_op:
        batch_op.create_index("ix_container_event_log_cluster_id", ["cluster_name", "id"], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        # Events of a few KB stay in the row, uncompressed: TOAST's compression of every payload
        # over 2 KB cost about 40% of the log's insert rate (docs/BENCHMARKS.md).
        op.execute("ALTER TABLE container_event_log SET (toast_tuple_target = 8160)")

    op.create_table(
        "container_event_progress",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster_name", sa.String(length=100), nullable=False),
        sa.Column("last_log_id", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", lens_pipeline.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_container_event_progress")),
        sa.UniqueConstraint("cluster_name", name=op.f("uq_container_event_progress_key")),
    )


def downgrade() -> None:
    op.drop_table("container_event_progress")
    with op.batch_alter_table("container_event_log", schema=None) as batch_op:
        batch_op.drop_index("ix_container_event_log_cluster_id")
    op.drop_table("container_event_log")
