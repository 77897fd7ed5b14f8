"""container events that cannot be logged or applied go to a dead-letter table

Revision ID: 0006_lens
Revises: 0005_lens
Create Date: 2026-11-25 05:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

import lens_pipeline.store.types

revision: str = "0006_lens"
down_revision: str | None = "0005_lens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "container_event_dead_letter",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("cluster_name", sa.String(length=100), nullable=False),
        sa.Column("stage", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.String(length=1024), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=True),
        sa.Column("event_type", sa.String(length=256), nullable=True),
        sa.Column("container_id", sa.String(length=1024), nullable=True),
        sa.Column("node_name", sa.String(length=1024), nullable=True),
        sa.Column("event_id", sa.String(length=1024), nullable=True),
        sa.Column("log_segment_id", sa.BigInteger(), nullable=True),
        sa.Column(
            "payload", sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb"), nullable=False
        ),
        sa.Column("received_at", lens_pipeline.store.types.UTCDateTime(timezone=True), nullable=True),
        sa.Column("created_at", lens_pipeline.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_container_event_dead_letter")),
        sa.UniqueConstraint("cluster_name", "id", name=op.f("uq_container_event_dead_letter_key")),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("container_event_dead_letter")
