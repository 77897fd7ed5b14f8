"""overview figures that may be unknown are nullable: utilization and storage capacities

Revision ID: 0005_lens
Revises: 0004_lens
Create Date: 2026-11-25 04:00:00.000000

A cluster whose Prometheus has no GPU series has no utilization, and a JuiceFS volume without a
quota has no capacity: the overview stores NULL for them instead of a false 0.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_lens"
down_revision: str | None = "0004_lens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UNKNOWABLE = (
    "utilization",
    "storage_total_space",
    "storage_usage_percentage",
    "storage_total_inodes",
    "storage_inodes_usage_percentage",
)


def upgrade() -> None:
    with op.batch_alter_table("cluster_overview_cache") as batch:
        for column in _UNKNOWABLE:
            batch.alter_column(column, existing_type=sa.Float(), nullable=True, existing_server_default=sa.text("0"))


def downgrade() -> None:
    op.execute(
        sa.text(
            "UPDATE cluster_overview_cache SET "
            + ", ".join(f"{c} = COALESCE({c}, 0)" for c in _UNKNOWABLE)
        )
    )
    with op.batch_alter_table("cluster_overview_cache") as batch:
        for column in _UNKNOWABLE:
            batch.alter_column(column, existing_type=sa.Float(), nullable=False, existing_server_default=sa.text("0"))
