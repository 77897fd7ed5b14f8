"""overview storage usage, bandwidth and RDMA figures are nullable: unknown is NULL, not 0

Revision ID: 0011_lens
Revises: 0010_lens
Create Date: 2026-11-26 03:00:00.000000

A cluster whose Prometheus has no node_infiniband_port_* series has no RDMA figure, a JuiceFS volume
without series has no used space or traffic, and a first overview made without Prometheus knows none
of them: the overview stores NULL for them instead of a false 0 (0005 did so for utilization and
capacities).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_lens"
down_revision: str | None = "0010_lens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UNKNOWABLE = (
    "storage_used_space",
    "storage_used_inodes",
    "storage_read_bandwidth",
    "storage_write_bandwidth",
    "rdma_total_tx",
    "rdma_total_rx",
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
