"""pod_resource.bound_at: GPUs are held from the pod's binding to a node, not its creation

Revision ID: 0007_lens
Revises: 0006_lens
Create Date: 2026-11-25 05:10:00.000000

Filled by the next `gpu_pods` run for live pods; pods already gone keep NULL (no allocated time is
counted for them rather than a guess).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import lens_pipeline.store.types

revision: str = "0007_lens"
down_revision: str | None = "0006_lens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pod_resource") as batch:
        batch.add_column(
            sa.Column("bound_at", lens_pipeline.store.types.UTCDateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("pod_resource") as batch:
        batch.drop_column("bound_at")
