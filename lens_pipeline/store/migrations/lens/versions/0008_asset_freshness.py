"""asset_freshness: when each asset of each cluster was last materialized

Revision ID: 0008_lens
Revises: 0007_lens
Create Date: 2026-11-25 05:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import lens_pipeline.store.types

revision: str = "0008_lens"
down_revision: str | None = "0007_lens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "asset_freshness",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster_name", sa.String(length=100), nullable=False),
        sa.Column("asset", sa.String(length=128), nullable=False),
        sa.Column("materialized_at", lens_pipeline.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_asset_freshness")),
        sa.UniqueConstraint("cluster_name", "asset", name=op.f("uq_asset_freshness_key")),
    )


def downgrade() -> None:
    op.drop_table("asset_freshness")
