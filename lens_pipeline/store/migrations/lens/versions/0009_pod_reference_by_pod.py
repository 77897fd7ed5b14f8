"""workload_pod_reference by pod: the workloads of the pods on a node, without a scan

Revision ID: 0009_lens_pod_reference
Revises: 0008_lens
Create Date: 2026-11-26 03:30:00.000000

The read API's `/v1/nodes/{name}/workloads` and `/workloadsHistory` go from pods to their
workloads; the unique key starts with the workload.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009_lens_pod_reference"
down_revision: str | None = "0008_lens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_workload_pod_reference_pod", "workload_pod_reference", ["cluster_name", "pod_uid"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_workload_pod_reference_pod", table_name="workload_pod_reference")
