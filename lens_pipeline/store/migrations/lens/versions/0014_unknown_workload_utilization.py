"""a workload's utilization figures may be unknown: nullable, and NULL where there was no sample

Revision ID: 0014_lens
Revises: 0013_lens
Create Date: 2026-12-01 23:55:00.000000

A workload whose GPUs no exporter series has named yet (just started, or dcgm-exporter without pod
attribution) had 0 % stored for every figure: a busy job looked idle, was counted as a low
utilization workload and exported `consumer_pod_gpu_usage 0`. Its figures are now NULL until a
sample comes, and its instant utilization is NULL while no series names its GPUs.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_lens"
down_revision: str | None = "0013_lens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FROM_SAMPLES = ("avg", "p50", "p90", "p95", "max", "min")
STATISTIC_FIGURES = tuple(f"{name}_gpu_utilization" for name in ("instant", *FROM_SAMPLES))


def _nullable(nullable: bool) -> None:
    for table, columns in (("workload_statistic", STATISTIC_FIGURES), ("gpu_consumers", ("gpu_utilization",))):
        with op.batch_alter_table(table) as batch:
            for column in columns:
                batch.alter_column(
                    column, existing_type=sa.Float(), nullable=nullable, existing_server_default=sa.text("0")
                )


def upgrade() -> None:
    _nullable(True)
    # The 0s of rows without a sample were never measured. (An instant 0 cannot be told from a
    # measured one: it stays, and the next run writes what it sees.)
    op.execute(
        sa.text(
            "UPDATE workload_statistic SET "
            + ", ".join(f"{name}_gpu_utilization = NULL" for name in FROM_SAMPLES)
            + " WHERE sample_count = 0"
        )
    )


def downgrade() -> None:
    op.execute(
        sa.text("UPDATE workload_statistic SET " + ", ".join(f"{c} = COALESCE({c}, 0)" for c in STATISTIC_FIGURES))
    )
    op.execute(sa.text("UPDATE gpu_consumers SET gpu_utilization = COALESCE(gpu_utilization, 0)"))
    _nullable(False)
