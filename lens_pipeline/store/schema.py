"""The Lens and SaFE table definitions (spec §1), with `cluster_name` everywhere and real unique keys.

Column names follow the original. Each table's logical key, which the original enforced only by
"find then create" in application code, is a real unique constraint here (`uq_<table>_key`); every
upsert targets exactly that constraint. `LOGICAL_KEYS` maps table name to its key columns.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Table,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects import mysql

from lens_pipeline.store.types import JSONDocument, UTCDateTime

# Short, predictable names: MySQL refuses identifiers over 64 characters. Each table has one
# unique constraint (its logical key), so `uq_<table>_key` is enough; indexes are named by hand.
NAMING = {
    "uq": "uq_%(table_name)s_key",
    "pk": "pk_%(table_name)s",
}

lens_metadata = MetaData(naming_convention=NAMING)
safe_metadata = MetaData(naming_convention=NAMING)

# Kubernetes object names may be 253 characters; the original's varchar(64) truncated or failed.
K8S_NAME = 253
CLUSTER = 100


def _id() -> Column:
    return Column("id", Integer, primary_key=True, autoincrement=True)


def _cluster() -> Column:
    return Column("cluster_name", String(CLUSTER), nullable=False)


# §1.1
node = Table(
    "node",
    lens_metadata,
    _id(),
    _cluster(),
    Column("name", String(K8S_NAME), nullable=False),
    Column("address", String(64)),
    Column("gpu_name", String(128)),
    Column("gpu_allocation", Integer),
    Column("gpu_count", Integer),
    Column("gpu_utilization", Float),
    Column("status", String(64)),
    Column("created_at", UTCDateTime()),
    Column("updated_at", UTCDateTime()),
    Column("cpu", String(64)),
    Column("cpu_count", Integer),
    Column("memory", String(64)),
    Column("k8s_version", String(64)),
    Column("k8s_status", String(64)),
    Column("kubelet_version", String(64)),
    Column("containerd_version", String(64)),
    Column("os", String(64)),
    Column("driver_version", String(64)),
    Column("taints", JSONDocument),
    Column("labels", JSONDocument),
    Column("annotations", JSONDocument),
    UniqueConstraint("cluster_name", "name"),
)

# §1.2 (node_name added: the key is (cluster, node, gpu_id), independent of the node row's id)
gpu_device = Table(
    "gpu_device",
    lens_metadata,
    _id(),
    _cluster(),
    Column("node_id", Integer),
    Column("node_name", String(K8S_NAME), nullable=False),
    Column("gpu_id", Integer, nullable=False),
    Column("gpu_model", String(128)),
    Column("memory", Integer),
    Column("utilization", Float),
    Column("temperature", Float),
    Column("power", Float),
    Column("serial", String(128)),
    Column("rdma_device_name", String(64)),
    Column("rdma_guid", String(64)),
    Column("rdma_lid", String(64)),
    Column("created_at", UTCDateTime()),
    Column("updated_at", UTCDateTime()),
    Column("numa_node", Integer),
    Column("numa_affinity", Integer),
    UniqueConstraint("cluster_name", "node_name", "gpu_id"),
)

# §1.3 (keyed by node and device name: node_exporter's infiniband collector names devices, not GUIDs)
rdma_device = Table(
    "rdma_device",
    lens_metadata,
    _id(),
    _cluster(),
    Column("node_id", Integer),
    Column("node_name", String(K8S_NAME), nullable=False),
    Column("ifname", String(256), nullable=False),
    Column("node_guid", String(256)),
    Column("if_index", Integer),
    Column("fw", String(64)),
    Column("node_type", String(64)),
    Column("created_at", UTCDateTime()),
    Column("updated_at", UTCDateTime()),
    Column("deleted_at", UTCDateTime()),
    UniqueConstraint("cluster_name", "node_name", "ifname"),
)

# §1.4: append-only audit; the key makes a replayed change a no-op.
node_device_changelog = Table(
    "node_device_changelog",
    lens_metadata,
    _id(),
    _cluster(),
    Column("node_id", Integer),
    Column("node_name", String(K8S_NAME), nullable=False),
    Column("device_type", String(32), nullable=False),
    Column("device_name", String(256)),
    Column("device_uuid", String(256), nullable=False),
    Column("op", String(32), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    UniqueConstraint("cluster_name", "node_name", "device_type", "device_uuid", "op", "created_at"),
)

# §1.5
gpu_workload = Table(
    "gpu_workload",
    lens_metadata,
    _id(),
    _cluster(),
    Column("group_version", String(128)),
    Column("kind", String(64)),
    Column("namespace", String(K8S_NAME)),
    Column("name", String(K8S_NAME)),
    Column("uid", String(128), nullable=False),
    Column("parent_uid", String(128)),
    Column("gpu_request", Integer),
    Column("created_at", UTCDateTime()),
    Column("updated_at", UTCDateTime()),
    Column("deleted_at", UTCDateTime()),
    Column("end_at", UTCDateTime()),
    Column("status", String(64)),
    Column("source", String(64)),
    Column("labels", JSONDocument),
    Column("annotations", JSONDocument),
    UniqueConstraint("cluster_name", "uid"),
    # The read API's lists: newest first, the top-level ones (and their kinds), by status, by
    # namespace, by kind and name (migration 0009).
    Index("ix_gpu_workload_created", "cluster_name", "created_at"),
    Index("ix_gpu_workload_top", "cluster_name", "parent_uid", "kind"),
    Index("ix_gpu_workload_status", "cluster_name", "status", "parent_uid"),
    Index("ix_gpu_workload_namespace", "cluster_name", "namespace"),
    Index("ix_gpu_workload_kind_name", "cluster_name", "kind", "name"),
)

# §1.6
gpu_workload_snapshot = Table(
    "gpu_workload_snapshot",
    lens_metadata,
    _id(),
    _cluster(),
    Column("uid", String(128), nullable=False),
    Column("group_version", String(128)),
    Column("kind", String(64)),
    Column("name", String(K8S_NAME)),
    Column("namespace", String(K8S_NAME)),
    Column("metadata", JSONDocument),
    Column("detail", JSONDocument),
    Column("resource_version", BigInteger, nullable=False),
    Column("created_at", UTCDateTime()),
    UniqueConstraint("cluster_name", "uid", "resource_version"),
)

# §1.7
gpu_pods = Table(
    "gpu_pods",
    lens_metadata,
    _id(),
    _cluster(),
    Column("namespace", String(K8S_NAME)),
    Column("name", String(K8S_NAME)),
    Column("node_name", String(K8S_NAME)),
    Column("uid", String(128), nullable=False),
    Column("gpu_allocated", Integer),
    Column("phase", String(64)),
    Column("deleted", Boolean),
    Column("created_at", UTCDateTime()),
    Column("updated_at", UTCDateTime()),
    Column("owner_uid", String(128)),
    Column("running", Boolean),
    Column("ip", String(64)),
    UniqueConstraint("cluster_name", "uid"),
    Index("ix_gpu_pods_node_running", "cluster_name", "node_name", "running"),
)

# §1.8
gpu_pods_event = Table(
    "gpu_pods_event",
    lens_metadata,
    _id(),
    _cluster(),
    Column("pod_uuid", String(128), nullable=False),
    Column("pod_phase", String(64)),
    Column("event_type", String(64), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("restart_count", Integer),
    UniqueConstraint("cluster_name", "pod_uuid", "event_type", "created_at"),
)

# §1.9
pod_snapshot = Table(
    "pod_snapshot",
    lens_metadata,
    _id(),
    _cluster(),
    Column("pod_uid", String(128), nullable=False),
    Column("pod_name", String(K8S_NAME)),
    Column("namespace", String(K8S_NAME)),
    Column("spec", JSONDocument),
    Column("metadata", JSONDocument),
    Column("status", JSONDocument),
    Column("created_at", UTCDateTime()),
    Column("resource_version", BigInteger, nullable=False),
    UniqueConstraint("cluster_name", "pod_uid", "resource_version"),
)

# §1.10
pod_resource = Table(
    "pod_resource",
    lens_metadata,
    _id(),
    _cluster(),
    Column("uid", String(128), nullable=False),
    Column("gpu_model", String(128)),
    Column("gpu_allocated", Integer),
    Column("created_at", UTCDateTime()),
    # When the pod was bound to a node (its GPUs held from then): NULL for one never scheduled.
    Column("bound_at", UTCDateTime()),
    Column("end_at", UTCDateTime()),
    UniqueConstraint("cluster_name", "uid"),
    # The pods that held GPUs in a past hour (ended after its start, or not ended).
    Index("ix_pod_resource_end", "cluster_name", "end_at"),
)

# §1.11: a set, not the original's multiset.
workload_pod_reference = Table(
    "workload_pod_reference",
    lens_metadata,
    _id(),
    _cluster(),
    Column("workload_uid", String(128), nullable=False),
    Column("pod_uid", String(128), nullable=False),
    Column("created_at", UTCDateTime()),
    UniqueConstraint("cluster_name", "workload_uid", "pod_uid"),
    Index("ix_workload_pod_reference_pod", "cluster_name", "pod_uid", "workload_uid"),
)

# §1.12
node_container = Table(
    "node_container",
    lens_metadata,
    _id(),
    _cluster(),
    Column("container_id", String(128), nullable=False),
    Column("container_name", String(128)),
    Column("pod_uid", String(128)),
    Column("pod_name", String(K8S_NAME)),
    Column("pod_namespace", String(K8S_NAME)),
    Column("status", String(128)),
    Column("created_at", UTCDateTime()),
    Column("updated_at", UTCDateTime()),
    Column("node_name", String(K8S_NAME)),
    Column("source", String(128)),
    UniqueConstraint("cluster_name", "container_id"),
)

# §1.13
node_container_devices = Table(
    "node_container_devices",
    lens_metadata,
    _id(),
    _cluster(),
    Column("container_id", String(128), nullable=False),
    Column("device_type", String(64)),
    Column("device_name", String(128)),
    Column("device_no", Integer),
    Column("device_uuid", String(128), nullable=False),
    Column("created_at", UTCDateTime()),
    Column("restart_count", Integer),
    Column("updated_at", UTCDateTime()),
    UniqueConstraint("cluster_name", "container_id", "device_uuid"),
)

# §1.14
node_container_event = Table(
    "node_container_event",
    lens_metadata,
    _id(),
    _cluster(),
    Column("container_id", String(128), nullable=False),
    Column("event_type", String(64), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    UniqueConstraint("cluster_name", "container_id", "event_type", "created_at"),
)

# The ingest sidecar's append-only event log (spec §2): `lens ingest` acknowledges an event only
# once it is committed here; `container_events` turns the log into the three tables above. One
# segment row per cluster and group commit holds all of its events (`store/event_log.py` says how
# they are packed): PostgreSQL then writes one wide row per round instead of thousands. Segment
# ids only grow (AUTOINCREMENT on SQLite, and writers serialize their commits), so a cursor on `id`
# sees every event once.
container_event_segment = Table(
    "container_event_segment",
    lens_metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    _cluster(),
    Column("events", Integer, nullable=False),
    Column("to_process", Integer, nullable=False),  # events the original did not ignore (I13)
    Column("received_at", UTCDateTime(), nullable=False),  # of its newest event (for retention)
    Column("payload", LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb"), nullable=False),
    UniqueConstraint("cluster_name", "id"),
    sqlite_autoincrement=True,
)

# What makes a replay a no-op: each logged event's key (SHA-256 of its id, else of its content),
# with the segment that holds it, so retention drops both together.
container_event_key = Table(
    "container_event_key",
    lens_metadata,
    _cluster(),
    Column(
        "event_key",
        LargeBinary(32).with_variant(mysql.BINARY(32), "mysql", "mariadb"),
        nullable=False,
    ),
    Column("segment_id", BigInteger, nullable=False),
    UniqueConstraint("cluster_name", "event_key"),
    Index("ix_container_event_key_segment", "segment_id"),
)

# How far `container_events` has processed each cluster's log, written in the same transaction as
# the rows it derived: a failed run leaves both as they were.
container_event_progress = Table(
    "container_event_progress",
    lens_metadata,
    _id(),
    _cluster(),
    Column("last_log_id", BigInteger, nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    UniqueConstraint("cluster_name"),
)

# Events that were accepted but could not be logged or applied (a value the log format or the
# database cannot hold, data that does not decode, a time out of range): kept whole with why, so
# that processing moves past them and nothing is lost. `stage` is where it failed: log, processing.
container_event_dead_letter = Table(
    "container_event_dead_letter",
    lens_metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    _cluster(),
    Column("stage", String(32), nullable=False),
    Column("reason", String(1024), nullable=False),
    Column("source", String(16)),
    Column("event_type", String(256)),
    Column("container_id", String(1024)),
    Column("node_name", String(1024)),
    Column("event_id", String(1024)),
    Column("log_segment_id", BigInteger),  # where it is in the log, when it got there
    Column("payload", LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb"), nullable=False),
    Column("received_at", UTCDateTime()),
    Column("created_at", UTCDateTime(), nullable=False),
    UniqueConstraint("cluster_name", "id"),
    sqlite_autoincrement=True,
)

# When each asset of each cluster was last materialized (written at the end of the cluster's turn):
# what `lens api`'s /metrics exposes for per-cluster staleness alerts.
asset_freshness = Table(
    "asset_freshness",
    lens_metadata,
    _id(),
    _cluster(),
    Column("asset", String(128), nullable=False),
    Column("materialized_at", UTCDateTime(), nullable=False),
    UniqueConstraint("cluster_name", "asset"),
)

# §1.15
storage = Table(
    "storage",
    lens_metadata,
    _id(),
    _cluster(),
    Column("name", String(K8S_NAME), nullable=False),
    Column("kind", String(64), nullable=False),
    Column("config", JSONDocument),
    Column("source", String(64)),
    Column("status", String(64)),
    Column("created_at", UTCDateTime()),
    Column("updated_at", UTCDateTime()),
    Column("deleted_at", UTCDateTime()),
    UniqueConstraint("cluster_name", "kind", "name"),
)


def _figure(name: str, type_: Any) -> Column:
    """A figure that is always known: NOT NULL, 0 until computed."""
    return Column(name, type_, nullable=False, server_default=text("0"))


# §1.16: one row per cluster in one shared database.
cluster_overview_cache = Table(
    "cluster_overview_cache",
    lens_metadata,
    _id(),
    _cluster(),
    *(
        _figure(c, Integer)
        for c in (
            "total_nodes",
            "healthy_nodes",
            "faulty_nodes",
            "fully_idle_nodes",
            "partially_idle_nodes",
            "busy_nodes",
        )
    ),
    # Unknown is NULL, never 0: no GPU series, a JuiceFS volume without a quota (migration 0005) or
    # without series, no InfiniBand counters, Prometheus not asked yet (migration 0009).
    *(
        Column(c, Float, nullable=True, server_default=text("0"))
        for c in (
            "utilization",
            "storage_total_space",
            "storage_usage_percentage",
            "storage_total_inodes",
            "storage_inodes_usage_percentage",
            "storage_used_space",
            "storage_used_inodes",
            "storage_read_bandwidth",
            "storage_write_bandwidth",
            "rdma_total_tx",
            "rdma_total_rx",
        )
    ),
    _figure("allocation_rate", Float),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    UniqueConstraint("cluster_name"),
    Index("ix_cluster_overview_cache_updated_at", "updated_at"),
)

# §1.17
workload_statistic = Table(
    "workload_statistic",
    lens_metadata,
    _id(),
    Column("uid", String(255), nullable=False),
    _cluster(),
    Column("namespace", String(K8S_NAME), nullable=False),
    Column("workload_name", String(K8S_NAME), nullable=False),
    Column("workload_type", String(50), nullable=False),
    # NULL while unknown: the figures until a first sample, the instant one while no series names
    # the workload's GPUs (the original stored 0, which looked like an idle workload).
    *(
        Column(c, Float, server_default=text("0"))
        for c in (
            "instant_gpu_utilization",
            "avg_gpu_utilization",
            "p50_gpu_utilization",
            "p90_gpu_utilization",
            "p95_gpu_utilization",
            "max_gpu_utilization",
            "min_gpu_utilization",
        )
    ),
    Column("stat_start_time", UTCDateTime(), nullable=False),
    Column("stat_end_time", UTCDateTime(), nullable=False),
    _figure("sample_count", Integer),
    _figure("allocated_gpu_count", Float),
    Column("workload_status", String(50)),
    Column("labels", JSONDocument, nullable=False),
    Column("annotations", JSONDocument, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("last_query_time", UTCDateTime()),
    Column("total_sum", Float, server_default=text("0")),
    Column("histogram", JSONDocument),
    # Beyond the original: GPU-seconds held, and held under the idle threshold (Run:ai's idle GPUs).
    _figure("allocated_gpu_seconds", Float),
    _figure("idle_gpu_seconds", Float),
    UniqueConstraint("cluster_name", "uid"),
    Index(
        "ix_workload_statistic_workload_time", "cluster_name", "namespace", "workload_name", "stat_end_time"
    ),
    Index("ix_workload_statistic_end_time", "stat_end_time"),
)

# The hourly history (spec §1.19, §4.9): one row per cluster / namespace / label or annotation value
# / top-level workload and hour, and the allocation snapshots of each hour, all written by the hourly
# history assets (`lens_pipeline.defs.history`), which recompute a whole (cluster, hour) at a time
# from Prometheus range queries and the pods' lives in the Lens tables. A figure that could not be
# measured in an hour (no utilization sample, no GPU series) is NULL, never 0.
LABEL_KEY = 317  # a label key: a DNS subdomain prefix (253), "/" and a name (63)
LABEL_VALUE = 255  # label values are at most 63; longer annotation values are cut to this


def _hourly_figures(*names: str) -> list[Column]:
    """Utilization figures of an hour: NULL when the hour had no sample."""
    return [Column(f"{name}_utilization", Float) for name in names]


cluster_gpu_hourly_stats = Table(
    "cluster_gpu_hourly_stats",
    lens_metadata,
    _id(),
    _cluster(),
    Column("stat_hour", UTCDateTime(), nullable=False),
    # Mean GPUs the exporters reported over the hour's steps with series (NULL: none).
    Column("total_gpu_capacity", Float),
    _figure("allocated_gpu_count", Float),
    Column("allocation_rate", Float),
    *_hourly_figures("avg", "max", "min", "p50", "p95"),
    _figure("sample_count", Integer),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    UniqueConstraint("cluster_name", "stat_hour"),
    Index("ix_cluster_gpu_hourly_stats_hour", "stat_hour"),
)

namespace_gpu_hourly_stats = Table(
    "namespace_gpu_hourly_stats",
    lens_metadata,
    _id(),
    _cluster(),
    Column("namespace", String(K8S_NAME), nullable=False),
    Column("stat_hour", UTCDateTime(), nullable=False),
    # The namespace's GPU quota: the original read SaFE's workspace quotas; none is known here.
    Column("total_gpu_capacity", Float),
    Column("allocation_rate", Float),
    _figure("allocated_gpu_count", Float),
    *_hourly_figures("avg", "max", "min"),
    _figure("active_workload_count", Float),
    _figure("sample_count", Integer),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    UniqueConstraint("cluster_name", "namespace", "stat_hour"),
    Index("ix_namespace_gpu_hourly_stats_hour", "cluster_name", "stat_hour"),
)

label_gpu_hourly_stats = Table(
    "label_gpu_hourly_stats",
    lens_metadata,
    _id(),
    _cluster(),
    Column("dimension_type", String(20), nullable=False),  # label | annotation
    Column("dimension_key", String(LABEL_KEY), nullable=False),
    Column("dimension_value", String(LABEL_VALUE), nullable=False),
    Column("stat_hour", UTCDateTime(), nullable=False),
    _figure("allocated_gpu_count", Float),
    *_hourly_figures("avg", "max", "min"),
    _figure("active_workload_count", Float),
    _figure("sample_count", Integer),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    UniqueConstraint("cluster_name", "dimension_type", "dimension_key", "dimension_value", "stat_hour"),
    Index("ix_label_gpu_hourly_stats_hour", "cluster_name", "stat_hour"),
)

# One row per top-level workload and hour, keyed by uid (names are reused across time, uids are
# not); what the SaFE workload statistic's three hours are read from.
workload_gpu_hourly_stats = Table(
    "workload_gpu_hourly_stats",
    lens_metadata,
    _id(),
    _cluster(),
    Column("workload_uid", String(255), nullable=False),
    Column("namespace", String(K8S_NAME), nullable=False),
    Column("workload_name", String(K8S_NAME), nullable=False),
    Column("workload_type", String(50), nullable=False),
    Column("stat_hour", UTCDateTime(), nullable=False),
    _figure("allocated_gpu_count", Float),
    _figure("requested_gpu_count", Float),
    *_hourly_figures("avg", "max", "min", "p50", "p90", "p95"),
    # Per GPU, GiB; NULL when the exporter reported no memory for the workload's GPUs.
    Column("avg_gpu_memory_used", Float),
    Column("max_gpu_memory_used", Float),
    Column("avg_gpu_memory_total", Float),
    _figure("avg_replica_count", Float),
    _figure("max_replica_count", Integer),
    _figure("min_replica_count", Integer),
    Column("workload_status", String(50)),
    _figure("sample_count", Integer),
    Column("owner_uid", String(255)),
    Column("owner_name", String(255)),
    Column("labels", JSONDocument, nullable=False),
    Column("annotations", JSONDocument, nullable=False),
    # Beyond the original: the sum of the samples (SaFE weighs hours by it), GPU-seconds held and held idle.
    _figure("total_sum", Float),
    _figure("allocated_gpu_seconds", Float),
    _figure("idle_gpu_seconds", Float),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    UniqueConstraint("cluster_name", "workload_uid", "stat_hour"),
    Index("ix_workload_gpu_hourly_stats_hour", "cluster_name", "namespace", "workload_name", "stat_hour"),
    Index("ix_workload_gpu_hourly_stats_cluster_hour", "cluster_name", "stat_hour"),
)

# The cluster's allocation every few minutes of each hour, with what each namespace, label and
# annotation value held (spec §1.19's `gpu_allocation_snapshots`, dimension "cluster").
gpu_allocation_snapshots = Table(
    "gpu_allocation_snapshots",
    lens_metadata,
    _id(),
    _cluster(),
    Column("snapshot_time", UTCDateTime(), nullable=False),
    Column("dimension_type", String(20), nullable=False),
    Column("dimension_key", String(LABEL_KEY)),
    Column("dimension_value", String(LABEL_VALUE)),
    Column("total_gpu_capacity", Integer, nullable=False, server_default=text("0")),
    Column("allocated_gpu_count", Integer, nullable=False, server_default=text("0")),
    Column("allocation_details", JSONDocument, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    UniqueConstraint("cluster_name", "dimension_type", "snapshot_time"),
    Index("ix_gpu_allocation_snapshots_time", "cluster_name", "snapshot_time"),
)

# The GPU consumers (spec §4.2): one row per running top-level workload, what the consumer metrics
# and `/v1/clusters/consumers` serve; a consumer that ends loses its row (no stale series).
gpu_consumers = Table(
    "gpu_consumers",
    lens_metadata,
    _id(),
    _cluster(),
    Column("uid", String(128), nullable=False),
    Column("group_version", String(128)),
    Column("kind", String(64), nullable=False),
    Column("namespace", String(K8S_NAME), nullable=False),
    Column("name", String(K8S_NAME), nullable=False),
    _figure("gpu_allocated", Integer),
    Column("gpu_utilization", Float, server_default=text("0")),  # NULL while unknown
    _figure("active_pods", Integer),
    _figure("idle_gpu_seconds", Float),
    Column("source", String(64)),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    UniqueConstraint("cluster_name", "uid"),
)

# §1.18: the SaFE database.
node_statistic = Table(
    "node_statistic",
    safe_metadata,
    _id(),
    Column("cluster", String(64), nullable=False),
    Column("node_name", String(K8S_NAME), nullable=False),
    Column("gpu_utilization", Numeric(5, 2)),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime()),
    Column("deleted_at", UTCDateTime()),
    UniqueConstraint("cluster", "node_name"),
    Index("ix_node_statistic_created_at", "created_at"),
)

safe_workload_statistic = Table(
    "workload_statistic",
    safe_metadata,
    _id(),
    Column("workload_id", String(64), nullable=False),
    Column("workload_uid", String(36)),
    Column("cluster", String(64)),
    Column("workspace", String(64)),
    Column("statistic_type", String(32), nullable=False),
    Column("avg_gpu_usage_3h", Numeric(5, 2)),
    Column("max_gpu_usage_3h", Numeric(5, 2)),
    Column("data_points_count", Integer),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime()),
    UniqueConstraint("workload_id", "statistic_type"),
    Index("ix_workload_statistic_workload_uid", "workload_uid"),
    Index("ix_workload_statistic_cluster_workspace", "cluster", "workspace"),
    Index("ix_workload_statistic_created_at", "created_at"),
)


def logical_key(table: Table) -> tuple[str, ...]:
    """The columns of a table's one unique constraint: what every upsert conflicts on."""
    keys = [c for c in table.constraints if isinstance(c, UniqueConstraint)]
    if len(keys) != 1:
        raise LookupError(f"table {table.name} must have exactly one unique constraint, has {len(keys)}")
    return tuple(col.name for col in keys[0].columns)


LENS_TABLES: dict[str, Table] = dict(lens_metadata.tables)
SAFE_TABLES: dict[str, Table] = dict(safe_metadata.tables)
