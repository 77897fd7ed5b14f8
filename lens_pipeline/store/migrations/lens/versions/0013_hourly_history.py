"""hourly history: cluster, namespace, label and workload GPU hours, allocation snapshots

Revision ID: 0013_lens
Revises: 0012_lens
Create Date: 2026-11-26 03:30:00.000000

`workload_gpu_hourly_stats` gets the original's columns and one writer, the hourly history assets,
which recompute whole hours of top-level workloads from Prometheus. Its rows so far were added up
minute by minute by `workload_gpu_statistics`, for workloads of every level: the table is made anew
(empty), and the hourly automation backfills the last days from Prometheus.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import lens_pipeline.store.types

revision: str = "0013_lens"
down_revision: str | None = "0012_lens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
ZERO = sa.text("0")


def _time(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, lens_pipeline.store.types.UTCDateTime(timezone=True), nullable=nullable)


def _base() -> list:
    return [
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster_name", sa.String(length=100), nullable=False),
    ]


def _stamps() -> list:
    return [_time("created_at"), _time("updated_at")]


def _figure(name: str, type_: sa.types.TypeEngine = sa.Float()) -> sa.Column:
    return sa.Column(name, type_, server_default=ZERO, nullable=False)


def _utilization(*names: str) -> list:
    return [sa.Column(f"{n}_utilization", sa.Float(), nullable=True) for n in names]


def upgrade() -> None:
    op.create_table(
        "cluster_gpu_hourly_stats",
        *_base(),
        _time("stat_hour"),
        sa.Column("total_gpu_capacity", sa.Float(), nullable=True),
        _figure("allocated_gpu_count"),
        sa.Column("allocation_rate", sa.Float(), nullable=True),
        *_utilization("avg", "max", "min", "p50", "p95"),
        _figure("sample_count", sa.Integer()),
        *_stamps(),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cluster_gpu_hourly_stats")),
        sa.UniqueConstraint("cluster_name", "stat_hour", name=op.f("uq_cluster_gpu_hourly_stats_key")),
    )
    op.create_index("ix_cluster_gpu_hourly_stats_hour", "cluster_gpu_hourly_stats", ["stat_hour"])
    op.create_table(
        "namespace_gpu_hourly_stats",
        *_base(),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        _time("stat_hour"),
        sa.Column("total_gpu_capacity", sa.Float(), nullable=True),
        sa.Column("allocation_rate", sa.Float(), nullable=True),
        _figure("allocated_gpu_count"),
        *_utilization("avg", "max", "min"),
        _figure("active_workload_count"),
        _figure("sample_count", sa.Integer()),
        *_stamps(),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_namespace_gpu_hourly_stats")),
        sa.UniqueConstraint(
            "cluster_name", "namespace", "stat_hour", name=op.f("uq_namespace_gpu_hourly_stats_key")
        ),
    )
    op.create_index(
        "ix_namespace_gpu_hourly_stats_hour", "namespace_gpu_hourly_stats", ["cluster_name", "stat_hour"]
    )
    op.create_table(
        "label_gpu_hourly_stats",
        *_base(),
        sa.Column("dimension_type", sa.String(length=20), nullable=False),
        sa.Column("dimension_key", sa.String(length=317), nullable=False),
        sa.Column("dimension_value", sa.String(length=255), nullable=False),
        _time("stat_hour"),
        _figure("allocated_gpu_count"),
        *_utilization("avg", "max", "min"),
        _figure("active_workload_count"),
        _figure("sample_count", sa.Integer()),
        *_stamps(),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_label_gpu_hourly_stats")),
        sa.UniqueConstraint(
            "cluster_name",
            "dimension_type",
            "dimension_key",
            "dimension_value",
            "stat_hour",
            name=op.f("uq_label_gpu_hourly_stats_key"),
        ),
    )
    op.create_index("ix_label_gpu_hourly_stats_hour", "label_gpu_hourly_stats", ["cluster_name", "stat_hour"])
    op.create_table(
        "gpu_allocation_snapshots",
        *_base(),
        _time("snapshot_time"),
        sa.Column("dimension_type", sa.String(length=20), nullable=False),
        sa.Column("dimension_key", sa.String(length=317), nullable=True),
        sa.Column("dimension_value", sa.String(length=255), nullable=True),
        _figure("total_gpu_capacity", sa.Integer()),
        _figure("allocated_gpu_count", sa.Integer()),
        sa.Column("allocation_details", JSON, nullable=False),
        _time("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_allocation_snapshots")),
        sa.UniqueConstraint(
            "cluster_name", "dimension_type", "snapshot_time", name=op.f("uq_gpu_allocation_snapshots_key")
        ),
    )
    op.create_index(
        "ix_gpu_allocation_snapshots_time", "gpu_allocation_snapshots", ["cluster_name", "snapshot_time"]
    )
    op.create_index("ix_pod_resource_end", "pod_resource", ["cluster_name", "end_at"])

    op.drop_index("ix_workload_gpu_hourly_stats_hour", table_name="workload_gpu_hourly_stats")
    op.drop_table("workload_gpu_hourly_stats")
    op.create_table(
        "workload_gpu_hourly_stats",
        *_base(),
        sa.Column("workload_uid", sa.String(length=255), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("workload_name", sa.String(length=253), nullable=False),
        sa.Column("workload_type", sa.String(length=50), nullable=False),
        _time("stat_hour"),
        _figure("allocated_gpu_count"),
        _figure("requested_gpu_count"),
        *_utilization("avg", "max", "min", "p50", "p90", "p95"),
        sa.Column("avg_gpu_memory_used", sa.Float(), nullable=True),
        sa.Column("max_gpu_memory_used", sa.Float(), nullable=True),
        sa.Column("avg_gpu_memory_total", sa.Float(), nullable=True),
        _figure("avg_replica_count"),
        _figure("max_replica_count", sa.Integer()),
        _figure("min_replica_count", sa.Integer()),
        sa.Column("workload_status", sa.String(length=50), nullable=True),
        _figure("sample_count", sa.Integer()),
        sa.Column("owner_uid", sa.String(length=255), nullable=True),
        sa.Column("owner_name", sa.String(length=255), nullable=True),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        _figure("total_sum"),
        _figure("allocated_gpu_seconds"),
        _figure("idle_gpu_seconds"),
        *_stamps(),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workload_gpu_hourly_stats")),
        sa.UniqueConstraint(
            "cluster_name", "workload_uid", "stat_hour", name=op.f("uq_workload_gpu_hourly_stats_key")
        ),
    )
    op.create_index(
        "ix_workload_gpu_hourly_stats_hour",
        "workload_gpu_hourly_stats",
        ["cluster_name", "namespace", "workload_name", "stat_hour"],
    )
    op.create_index(
        "ix_workload_gpu_hourly_stats_cluster_hour", "workload_gpu_hourly_stats", ["cluster_name", "stat_hour"]
    )


def downgrade() -> None:
    op.drop_table("workload_gpu_hourly_stats")
    op.create_table(
        "workload_gpu_hourly_stats",
        *_base(),
        sa.Column("workload_uid", sa.String(length=255), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("workload_name", sa.String(length=253), nullable=False),
        sa.Column("workload_type", sa.String(length=50), nullable=False),
        _time("stat_hour"),
        *(
            _figure(c)
            for c in (
                "allocated_gpu_count",
                "avg_utilization",
                "max_utilization",
                "min_utilization",
                "p50_utilization",
                "p90_utilization",
                "p95_utilization",
                "total_sum",
                "allocated_gpu_seconds",
                "idle_gpu_seconds",
            )
        ),
        _figure("sample_count", sa.Integer()),
        sa.Column("histogram", JSON, nullable=True),
        sa.Column("workload_status", sa.String(length=50), nullable=True),
        *_stamps(),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workload_gpu_hourly_stats")),
        sa.UniqueConstraint(
            "cluster_name", "workload_uid", "stat_hour", name=op.f("uq_workload_gpu_hourly_stats_key")
        ),
    )
    op.create_index(
        "ix_workload_gpu_hourly_stats_hour",
        "workload_gpu_hourly_stats",
        ["cluster_name", "namespace", "workload_name", "stat_hour"],
    )
    op.drop_index("ix_pod_resource_end", table_name="pod_resource")
    for table in (
        "gpu_allocation_snapshots",
        "label_gpu_hourly_stats",
        "namespace_gpu_hourly_stats",
        "cluster_gpu_hourly_stats",
    ):
        op.drop_table(table)
