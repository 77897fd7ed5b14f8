"""Lens history retention on every dialect: superseded snapshots and changelog rows older than the
cutoff go, each object's newest snapshot and everything recent stay; then the nightly job does the
same through Dagster; and collector runs after it write no snapshot of an object that did not change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from dagster import instance_for_test
from sqlalchemy import select

from lens_pipeline.defs.fleet.retention import HistoryRetentionConfig, prune_lens_history
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.defs.resources import ClusterRegistryResource, LensDatabase
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.store.db import get_engine, write_transaction
from lens_pipeline.store.history import prune_history, prune_hourly
from lens_pipeline.store.hourly import HOURLY_TABLES
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.schema import (
    cluster_gpu_hourly_stats,
    gpu_allocation_snapshots,
    gpu_pods,
    gpu_pods_event,
    gpu_workload_snapshot,
    label_gpu_hourly_stats,
    namespace_gpu_hourly_stats,
    node_device_changelog,
    pod_resource,
    pod_snapshot,
    workload_gpu_hourly_stats,
)
from lens_pipeline.store.upsert import bulk_upsert
from lens_pipeline_tests.defs.support import materialize_cluster

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
OLD, RECENT = NOW - timedelta(days=40), NOW - timedelta(days=2)
CUTOFF = NOW - timedelta(days=30)


def _pod(cluster: str, uid: str, version: int, at: datetime) -> dict:
    return {
        "cluster_name": cluster,
        "pod_uid": uid,
        "pod_name": uid,
        "namespace": "ns",
        "spec": {"v": version},
        "metadata": {},
        "status": {},
        "created_at": at,
        "resource_version": version,
    }


def _workload(uid: str, version: int, at: datetime) -> dict:
    return {
        "cluster_name": "c1",
        "uid": uid,
        "group_version": "apps/v1",
        "kind": "Deployment",
        "name": uid,
        "namespace": "ns",
        "metadata": None,
        "detail": {"v": version},
        "resource_version": version,
        "created_at": at,
    }


def _change(device: str, at: datetime) -> dict:
    return {
        "cluster_name": "c1",
        "node_name": "n1",
        "device_type": "gpu",
        "device_name": device,
        "device_uuid": device,
        "op": "add",
        "created_at": at,
    }


def _store(url: str) -> None:
    engine = get_engine(url)
    ensure_schema(engine, "lens")
    pods = [
        # a: three old versions, only the newest stays
        *(_pod("c1", "a", v, OLD) for v in (1, 2, 3)),
        # b: one old version, the newest of its pod: stays
        _pod("c1", "b", 7, OLD),
        # c: an old version superseded by a recent one: the old goes
        _pod("c1", "c", 1, OLD),
        _pod("c1", "c", 2, RECENT),
        # d: recent versions, superseded or not: both stay
        _pod("c1", "d", 1, RECENT),
        _pod("c1", "d", 2, RECENT),
        # the same uid in another cluster is another object: its only version stays
        _pod("c2", "a", 1, OLD),
    ]
    with write_transaction(engine) as conn:
        bulk_upsert(conn, pod_snapshot, pods)
        bulk_upsert(conn, gpu_workload_snapshot, [_workload("w", 1, OLD), _workload("w", 2, OLD)])
        bulk_upsert(conn, node_device_changelog, [_change("g0", OLD), _change("g1", RECENT)])
        # Pods: "live" still runs; "ended" ended but is still there; "gone" was deleted and let its
        # GPUs go long ago, "lately" lately; "terminating" is marked deleted but holds its GPUs
        # still (stuck Terminating); "forgotten" has no row any more.
        deleted = {"live": False, "ended": False, "gone": True, "lately": True, "terminating": True}
        ends = {"live": None, "ended": OLD, "gone": OLD, "lately": RECENT, "terminating": None}
        bulk_upsert(
            conn, gpu_pods, [{"cluster_name": "c1", "uid": uid, "deleted": d} for uid, d in deleted.items()]
        )
        bulk_upsert(
            conn,
            pod_resource,
            [{"cluster_name": "c1", "uid": uid, "end_at": end} for uid, end in ends.items()],
        )
        bulk_upsert(
            conn,
            gpu_pods_event,
            [
                {"cluster_name": "c1", "pod_uuid": uid, "event_type": "Ready", "created_at": at}
                for uid in (*deleted, "forgotten")
                for at in (OLD, RECENT)
            ],
        )


def _events(url: str) -> set[tuple]:
    with get_engine(url).connect() as conn:
        rows = conn.execute(select(gpu_pods_event.c.pod_uuid, gpu_pods_event.c.created_at)).all()
    return {(uid, at.replace(tzinfo=UTC) if at.tzinfo is None else at) for uid, at in rows}


def _snapshots(url: str) -> set[tuple]:
    with get_engine(url).connect() as conn:
        return set(
            conn.execute(
                select(pod_snapshot.c.cluster_name, pod_snapshot.c.pod_uid, pod_snapshot.c.resource_version)
            ).all()
        )


def test_superseded_snapshots_and_old_changelog_rows_go(lens_url):
    _store(lens_url)
    deleted = prune_history(get_engine(lens_url), CUTOFF, batch=2)  # several batches
    assert deleted == {
        "pod_snapshot": 3,
        "gpu_workload_snapshot": 1,
        "node_device_changelog": 1,
        "gpu_pods_event": 2,
    }
    assert _snapshots(lens_url) == {
        ("c1", "a", 3),
        ("c1", "b", 7),
        ("c1", "c", 2),
        ("c1", "d", 1),
        ("c1", "d", 2),
        ("c2", "a", 1),
    }
    with get_engine(lens_url).connect() as conn:
        assert conn.execute(select(gpu_workload_snapshot.c.resource_version)).scalars().all() == [2]
        assert conn.execute(select(node_device_changelog.c.device_name)).scalars().all() == ["g1"]
    # A live pod's events stay whatever their age (its conditions are still True): only those of pods
    # deleted, or no longer known, go.
    assert _events(lens_url) == {
        *((uid, OLD) for uid in ("live", "ended", "lately", "terminating")),
        *((uid, RECENT) for uid in ("live", "ended", "gone", "lately", "terminating", "forgotten")),
    }
    # Nothing left to prune: a second pass deletes nothing.
    assert set(prune_history(get_engine(lens_url), CUTOFF).values()) == {0}


def test_the_nightly_job_prunes_through_dagster(sqlite_url):
    _store(sqlite_url)
    result = prune_lens_history.execute_in_process(
        resources={"lens_db": LensDatabase(url=sqlite_url)},
        run_config={"ops": {"delete_old_history": {"config": {"keep_days": 30}}}},
    )
    assert result.success and result.output_for_node("delete_old_history") == 7  # 3 + 1 + 1 + 2 events
    (materialized,) = [e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = {k: v.value for k, v in materialized.event_specific_data.metadata.items()}
    assert metadata["deleted_pod_snapshot"] == 3 and metadata["deleted_node_device_changelog"] == 1
    assert ("c1", "a", 3) in _snapshots(sqlite_url) and ("c1", "a", 1) not in _snapshots(sqlite_url)


def test_after_pruning_a_collector_run_without_change_writes_no_snapshot(tmp_path, sqlite_url):
    fleet = SimFleet.generate(clusters=1, nodes=8, seed=3, vendor="amd")
    (name,) = (c.name for c in fleet)
    with SimServer(fleet) as server, instance_for_test() as instance:
        registry = write_registry(tmp_path / "clusters.yaml", server)
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [name])

        def collect() -> dict:
            result = materialize_cluster(
                ["gpu_nodes", "gpu_pods", "gpu_workloads"],
                partition_key=name,
                instance=instance,
                resources={
                    "registry": ClusterRegistryResource(clusters_file=str(registry)),
                    "lens_db": LensDatabase(url=sqlite_url),
                },
            )
            return {
                e.asset_key.path[-1]: {k: v.value for k, v in e.metadata.items()}
                for e in result.asset_materializations_for_node("cluster_assets")
            }

        collect()
        for _ in range(6):  # pods and workloads change: superseded snapshots
            fleet.cluster(name).churn(steps=2)
            collect()
        before = _snapshots(sqlite_url)
        deleted = prune_history(get_engine(sqlite_url), datetime.now(UTC) + timedelta(days=1))
        assert deleted["pod_snapshot"] > 0 and _snapshots(sqlite_url) < before
        again = collect()
    assert again["gpu_pods"]["pod_snapshots_written"] == 0
    assert again["gpu_workloads"]["workload_snapshots_written"] == 0


def _hourly_rows(hour: datetime) -> dict:
    common = {"cluster_name": "c1", "allocated_gpu_count": 1.0, "sample_count": 1}
    stamps = {"created_at": hour, "updated_at": hour}
    return {
        cluster_gpu_hourly_stats: {**common, **stamps, "stat_hour": hour},
        namespace_gpu_hourly_stats: {
            **common,
            **stamps,
            "stat_hour": hour,
            "namespace": "ns",
            "active_workload_count": 1.0,
        },
        label_gpu_hourly_stats: {
            **common,
            **stamps,
            "stat_hour": hour,
            "dimension_type": "label",
            "dimension_key": "team",
            "dimension_value": "a",
            "active_workload_count": 1.0,
        },
        workload_gpu_hourly_stats: {
            **common,
            **stamps,
            "stat_hour": hour,
            "workload_uid": "w",
            "namespace": "ns",
            "workload_name": "w",
            "workload_type": "Deployment",
            "requested_gpu_count": 1.0,
            "avg_replica_count": 1.0,
            "max_replica_count": 1,
            "min_replica_count": 1,
            "labels": {},
            "annotations": {},
            "total_sum": 1.0,
            "allocated_gpu_seconds": 3600.0,
            "idle_gpu_seconds": 0.0,
        },
        gpu_allocation_snapshots: {
            "cluster_name": "c1",
            "snapshot_time": hour + timedelta(minutes=55),
            "dimension_type": "cluster",
            "total_gpu_capacity": 8,
            "allocated_gpu_count": 1,
            "allocation_details": {},
            "created_at": hour,
        },
    }


def test_hours_before_the_cutoff_go_from_every_hourly_table(lens_url):
    """The hourly history by its own cutoff: every table's rows of the hours before it (an hour's
    allocation snapshots by their time), the cutoff's hour and later stay."""
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    cutoff = NOW - timedelta(days=400)
    hours = [cutoff - timedelta(hours=2), cutoff - timedelta(hours=1), cutoff, cutoff + timedelta(hours=1)]
    with write_transaction(engine) as conn:
        for cluster in ("c1", "c2"):
            for hour in hours:
                for table, row in _hourly_rows(hour).items():
                    bulk_upsert(conn, table, [{**row, "cluster_name": cluster}])
    deleted = prune_hourly(engine, cutoff, batch=1)
    assert deleted == {table.name: 4 for table, _ in HOURLY_TABLES.values()}
    with engine.connect() as conn:
        for table, column in HOURLY_TABLES.values():
            kept = sorted(
                (cluster, at.replace(tzinfo=UTC))
                for cluster, at in conn.execute(select(table.c.cluster_name, table.c[column])).all()
            )
            offset = timedelta(minutes=55) if table is gpu_allocation_snapshots else timedelta()
            assert kept == [
                (cluster, at + offset)
                for cluster in ("c1", "c2")
                for at in (cutoff, cutoff + timedelta(hours=1))
            ], table.name
    assert set(prune_hourly(engine, cutoff).values()) == {0}


def test_the_hourly_history_is_never_pruned_inside_its_partitions(sqlite_url):
    """`hourly_keep_days` under `$LENS_HISTORY_DAYS` is refused: hours Dagster shows materialized
    would lose their rows."""
    result = prune_lens_history.execute_in_process(
        resources={"lens_db": LensDatabase(url=sqlite_url)},
        run_config={"ops": {"delete_old_history": {"config": {"hourly_keep_days": 2}}}},
        raise_on_error=False,
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "LENS_HISTORY_DAYS" in str(failure.event_specific_data.error)


def test_the_default_hourly_retention_is_never_shorter_than_the_partitions(monkeypatch):
    """Without a run config (the nightly schedule's), 400 days, or `$LENS_HISTORY_DAYS` when longer;
    a value asked for under it, or one that is no number of days, is refused."""
    assert HistoryRetentionConfig().hourly_days() == 400
    monkeypatch.setenv("LENS_HISTORY_DAYS", "500")
    assert HistoryRetentionConfig().hourly_days() == 500
    assert HistoryRetentionConfig(hourly_keep_days=600).hourly_days() == 600
    for refused in (450, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="LENS_HISTORY_DAYS"):
            HistoryRetentionConfig(hourly_keep_days=refused)
