"""indexes of the read API: references by pod, workloads by time, parent, status, namespace, kind and name

Revision ID: 0012_lens
Revises: 0011_lens
Create Date: 2026-11-26 03:30:00.000000

The read API's `/v1/nodes/{name}/workloads` and `/workloadsHistory` go from pods to their
workloads (the unique key starts with the workload); its workload lists read the newest first, the
top-level ones, the namespaces and kinds there are, a workload by kind and name: at 150,000 pods
each was a scan of the cluster's workloads.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012_lens"
down_revision: str | None = "0011_lens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


WORKLOAD_INDEXES = {
    "ix_gpu_workload_created": ["cluster_name", "created_at"],
    "ix_gpu_workload_top": ["cluster_name", "parent_uid", "kind"],
    "ix_gpu_workload_status": ["cluster_name", "status", "parent_uid"],
    "ix_gpu_workload_namespace": ["cluster_name", "namespace"],
    "ix_gpu_workload_kind_name": ["cluster_name", "kind", "name"],
}


def upgrade() -> None:
    for name, columns in WORKLOAD_INDEXES.items():
        op.create_index(name, "gpu_workload", columns, unique=False)
    op.create_index(
        "ix_workload_pod_reference_pod",
        "workload_pod_reference",
        ["cluster_name", "pod_uid", "workload_uid"],  # covering: the workload is read from the index
        unique=False,
    )


def downgrade() -> None:
    for name in WORKLOAD_INDEXES:
        op.drop_index(name, table_name="gpu_workload")
    op.drop_index("ix_workload_pod_reference_pod", table_name="workload_pod_reference")
