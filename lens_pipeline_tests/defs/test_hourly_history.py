"""The hourly history against the simulator's truth, on every dialect: a churning fleet that keeps
its past (its Prometheus answers range queries over past hours as the fleet was then), collected
as time goes by; past hours materialized later, one of them left out until the automation asks for
it and a run over both clusters fills it in; every hourly table then equals the truth of each hour,
a re-materialized hour is the same and drops rows that no longer apply, and SaFE's workload
statistic reads the hours.

The simulator's clock and the collectors' `now` run hours in seconds: the only mock here is the
time the collectors and the statistics see (nothing real can travel in time).
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetSelection,
    evaluate_automation_conditions,
    instance_for_test,
    materialize,
)
from sqlalchemy import insert, select

import lens_pipeline.defs.collectors.gpu_pods as gpu_pods_collector
import lens_pipeline.defs.derived.statistics as statistics_view
from lens_pipeline.collect.objects import LAST_APPLIED
from lens_pipeline.definitions import defs
from lens_pipeline.defs import resources
from lens_pipeline.defs.history.assets import KEYS, UPSTREAM, HistoryConfig, hourly_history
from lens_pipeline.defs.history.partitions import history_key
from lens_pipeline.defs.history.sensors import history_automation
from lens_pipeline.defs.partitions import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    CLUSTER_PARTITIONS_NAME,
)
from lens_pipeline.defs.resources import ClusterRegistryResource, LensDatabase, SafeDatabase
from lens_pipeline.defs.run_tags import HISTORY_TAG
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.store.db import get_engine, write_transaction
from lens_pipeline.store.schema import (
    cluster_gpu_hourly_stats,
    gpu_allocation_snapshots,
    label_gpu_hourly_stats,
    namespace_gpu_hourly_stats,
    safe_workload_statistic,
    workload_gpu_hourly_stats,
    workload_statistic,
)
from lens_pipeline_tests.defs.support import materialize_cluster, statistics_config

HOUR = 3600
# Labels the simulated workloads carry, and one they never do (all of it under the default value).
LABEL_KEYS = ("app.kubernetes.io/name", "primus-safe.workload.id", "team")
ANNOTATION_KEYS = ("project",)
HISTORY_CONFIG = {
    "ops": {
        "hourly_history": {
            "config": {"label_keys": list(LABEL_KEYS), "annotation_keys": list(ANNOTATION_KEYS)}
        }
    }
}


class SimClock:
    """The fleet's clock, and a `datetime` whose now() is it (for the collectors' `now`)."""

    def __init__(self, start: float) -> None:
        self.t = start
        clock = self

        class Now(datetime):
            @classmethod
            def now(cls, tz=None):  # type: ignore[override]
                return datetime.fromtimestamp(clock.t, tz)

        self.datetime = Now

    def __call__(self) -> float:
        return self.t


def run_resources(registry, lens_url: str, safe_url: str) -> dict:
    return {
        **resources.defs.resources,
        "registry": ClusterRegistryResource(clusters_file=str(registry)),
        "lens_db": LensDatabase(url=lens_url),
        "safe_db": SafeDatabase(url=safe_url),
    }


def rows(url: str, table, cluster: str, start: datetime) -> list[dict]:
    column = table.c.snapshot_time if table is gpu_allocation_snapshots else table.c.stat_hour
    with get_engine(url).connect() as conn:
        query = select(table).where(
            table.c.cluster_name == cluster, column >= start, column < start + timedelta(hours=1)
        )
        return [dict(r) for r in conn.execute(query).mappings()]


def approx(value):
    """The truth's figures, compared as floats are (NULL stays NULL)."""
    if isinstance(value, dict):
        return {k: approx(v) for k, v in value.items()}
    if isinstance(value, list):
        return [approx(v) for v in value]
    return pytest.approx(value, rel=1e-9, abs=1e-9) if isinstance(value, float) else value


def assert_hour_is_the_truth(url: str, cluster, start: float) -> int:
    """Every hourly table's rows of the cluster's hour equal the simulator's truth of it; returns
    how many workload rows there were."""
    hour = datetime.fromtimestamp(start, UTC)
    want = cluster.hour_truth(start, label_keys=LABEL_KEYS, annotation_keys=ANNOTATION_KEYS)
    (row,) = rows(url, cluster_gpu_hourly_stats, cluster.name, hour)
    assert {k: row[k] for k in want["cluster"]} == approx(want["cluster"]), (cluster.name, hour)

    namespaces = {r["namespace"]: r for r in rows(url, namespace_gpu_hourly_stats, cluster.name, hour)}
    assert namespaces.keys() == want["namespaces"].keys()
    for name, figures in want["namespaces"].items():
        assert {k: namespaces[name][k] for k in figures} == approx(figures), name

    values = {
        (r["dimension_type"], r["dimension_key"], r["dimension_value"]): r
        for r in rows(url, label_gpu_hourly_stats, cluster.name, hour)
    }
    assert values.keys() == want["labels"].keys()
    for key, figures in want["labels"].items():
        assert {k: values[key][k] for k in figures} == approx(figures), key

    workloads = {r["workload_uid"]: r for r in rows(url, workload_gpu_hourly_stats, cluster.name, hour)}
    assert workloads.keys() == want["workloads"].keys()
    for uid, figures in want["workloads"].items():
        assert {k: workloads[uid][k] for k in figures} == approx(figures), uid
        assert workloads[uid]["requested_gpu_count"] == workloads[uid]["allocated_gpu_count"]

    snapshots = {
        r["snapshot_time"].timestamp(): r for r in rows(url, gpu_allocation_snapshots, cluster.name, hour)
    }
    assert snapshots.keys() == want["snapshots"].keys()
    for at, figures in want["snapshots"].items():
        assert snapshots[at]["dimension_type"] == "cluster"
        assert {k: snapshots[at][k] for k in figures} == approx(figures), at
    return len(workloads)


def wait_clear_of_the_hour() -> None:
    """The test reads the last closed hours by the wall clock (and SaFE's three hours): it starts
    clear of an hour's turn (a wait of a minute at most, rarely)."""
    left = HOUR - time.time() % HOUR
    if left < 90:
        time.sleep(left + 1)


def test_past_hours_equal_the_truth_and_a_missed_hour_is_healed(tmp_path, db_urls):
    lens_url, safe_url = db_urls
    wait_clear_of_the_hour()
    latest = math.floor(time.time() / HOUR) * HOUR - HOUR  # the last closed hour
    hours = [latest - 2 * HOUR, latest - HOUR, latest]
    clock = SimClock(hours[0] - 600 + 13)
    fleet = SimFleet.generate(
        clusters=2,
        nodes=10,
        seed=6,  # one whose SaFE Workloads still run at the end
        vendor="mixed",
        dialect="everything",
        pods_per_node=3,
        history=True,
        clock=clock,
    )
    names = [c.name for c in fleet]
    both = {ASSET_PARTITION_RANGE_START_TAG: names[0], ASSET_PARTITION_RANGE_END_TAG: names[-1]}
    with (
        SimServer(fleet) as server,
        instance_for_test() as instance,
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr(gpu_pods_collector, "datetime", clock.datetime)
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, names)
        registry = write_registry(tmp_path / "clusters.yaml", server)
        run = run_resources(registry, lens_url, safe_url)

        # Three hours of churn, the collectors running after every change (at the fleet's time).
        while clock.t < hours[-1] + HOUR + 60:
            if clock.t > hours[0]:
                fleet.churn(1)
            collected = materialize_cluster(
                ["gpu_nodes", "gpu_pods", "gpu_workloads"], tags=both, instance=instance, resources=run
            )
            assert collected.success
            clock.t += 1333

        def materialize_hours(partition_key=None, tags=None):
            return materialize(
                [hourly_history],
                partition_key=partition_key,
                tags=tags,
                instance=instance,
                resources=run,
                run_config=HISTORY_CONFIG,
            )

        # The first and the last hour are materialized when they close; the middle one is missed.
        for start in (hours[0], hours[2]):
            for name in names:
                assert materialize_hours(history_key(name, datetime.fromtimestamp(start, UTC))).success

        # The automation finds the missed hour (among the week a new cluster lacks) and asks for it
        # as one backfill; the latest hour is left to its five-past tick.
        evaluated = _evaluate_history(instance)
        asked = set(evaluated.get_requested_partitions(AssetKey("cluster_gpu_hourly_stats")))
        missed = {history_key(n, datetime.fromtimestamp(hours[1], UTC)) for n in names}
        done = {history_key(n, datetime.fromtimestamp(h, UTC)) for n in names for h in (hours[0], hours[2])}
        assert missed <= asked and not asked & done
        assert history_automation.emit_backfills and len(asked) > 1
        assert history_automation.run_tags[HISTORY_TAG] == "hourly"

        # The backfill's run: one hour of both clusters (a range of the cluster dimension).
        middle = datetime.fromtimestamp(hours[1], UTC)
        healed = materialize_hours(
            tags={
                ASSET_PARTITION_RANGE_START_TAG: history_key(names[0], middle),
                ASSET_PARTITION_RANGE_END_TAG: history_key(names[-1], middle),
            }
        )
        assert healed.success
        assert len(healed.get_asset_materialization_events()) == len(KEYS) * len(names)

        workload_rows = 0
        for cluster in fleet:
            for start in hours:
                workload_rows += assert_hour_is_the_truth(lens_url, cluster, start)
        assert workload_rows > 0, "the simulator should run workloads"

        # Re-materialized later, an hour is the same; rows that no longer apply are gone.
        first = fleet.clusters[0]
        hour = datetime.fromtimestamp(hours[0], UTC)
        before = rows(lens_url, workload_gpu_hourly_stats, first.name, hour)
        with write_transaction(get_engine(lens_url)) as conn:
            conn.execute(
                insert(namespace_gpu_hourly_stats).values(
                    cluster_name=first.name,
                    namespace="gone",
                    stat_hour=hour,
                    created_at=hour,
                    updated_at=hour,
                )
            )
        fleet.churn(2)
        assert materialize_hours(history_key(first.name, hour)).success
        assert_hour_is_the_truth(lens_url, first, hours[0])
        after = rows(lens_url, workload_gpu_hourly_stats, first.name, hour)
        ignored = ("id", "created_at", "updated_at")
        assert [{k: v for k, v in r.items() if k not in ignored} for r in after] == [
            {k: v for k, v in r.items() if k not in ignored} for r in before
        ]

        # SaFE's workload statistic: each running SaFE Workload's hours of the last three.
        assert materialize_cluster(
            ["safe_workload_statistic"], tags=both, instance=instance, resources=run
        ).success
        checked = _assert_safe_statistics(lens_url, safe_url, fleet)
        assert checked > 0, "the simulator should run SaFE Workloads"


def _assert_safe_statistics(lens_url: str, safe_url: str, fleet: SimFleet) -> int:
    since = (datetime.now(UTC) - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    checked = 0
    for cluster in fleet:
        by_uid: dict[str, list[dict]] = {}
        with get_engine(lens_url).connect() as conn:
            query = select(workload_gpu_hourly_stats).where(
                workload_gpu_hourly_stats.c.cluster_name == cluster.name,
                workload_gpu_hourly_stats.c.stat_hour >= since,
                workload_gpu_hourly_stats.c.workload_type == "Workload",
                workload_gpu_hourly_stats.c.sample_count > 0,
            )
            for r in conn.execute(query).mappings():
                by_uid.setdefault(r["workload_uid"], []).append(dict(r))
        truth = {w["uid"]: w for w in cluster.truth()["workloads"]}
        with get_engine(safe_url).connect() as conn:
            safe = {r["workload_uid"]: r for r in conn.execute(select(safe_workload_statistic)).mappings()}
        for uid, hours in by_uid.items():
            if truth.get(uid, {}).get("status") not in ("Running", "Pending"):
                continue  # SaFE keeps the statistic of running and pending Workloads
            count = sum(h["sample_count"] for h in hours)
            row = safe[uid]
            assert row["data_points_count"] == count
            mean = Decimal(str(sum(h["total_sum"] for h in hours) / count)).quantize(Decimal("0.01"))
            assert abs(row["avg_gpu_usage_3h"] - mean) <= Decimal("0.01")
            checked += 1
    return checked


def test_an_annotation_that_is_not_kept_is_refused_as_a_dimension():
    """kubectl's last-applied copy of the spec is not stored (docs/DIFFERENCES.md W15): cutting by
    it would count every workload under the default value, so the run configuration says so."""
    with pytest.raises(ValueError, match="last-applied-configuration is not kept"):
        HistoryConfig(annotation_keys=["project", LAST_APPLIED])
    assert HistoryConfig(annotation_keys=["project"]).dimensions().annotation_keys == ("project",)


def test_a_failing_cluster_fails_its_own_hour_only(tmp_path):
    """One hour of two clusters in one run, one cluster's Prometheus refusing: that (cluster, hour)
    gets no materialization and fails the run (its partition shows red), the other is written."""
    fleet = SimFleet.generate(clusters=2, nodes=3, seed=2, vendor="amd", history=True)
    names = [c.name for c in fleet]
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    with SimServer(fleet) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, names)
        registry = write_registry(tmp_path / "clusters.yaml", server)
        run = run_resources(
            registry, f"sqlite:///{tmp_path / 'lens.db'}", f"sqlite:///{tmp_path / 'safe.db'}"
        )
        fleet.clusters[1].set_fault("prometheus", 503)
        result = materialize(
            [hourly_history],
            tags={
                ASSET_PARTITION_RANGE_START_TAG: history_key(names[0], hour),
                ASSET_PARTITION_RANGE_END_TAG: history_key(names[1], hour),
            },
            instance=instance,
            resources=run,
            raise_on_error=False,
        )
    assert not result.success
    written = {(e.asset_key.path[-1], e.partition) for e in result.get_asset_materialization_events()}
    assert written == {(key.path[-1], history_key(names[0], hour)) for key in KEYS}
    (present,) = (c for c in result.get_asset_check_evaluations() if c.check_name == "gpu_series_present")
    assert history_key(names[1], hour) in present.metadata["not_computed"].value


def _evaluate_history(instance, when: datetime | None = None, cursor=None):
    """One evaluation of the hourly history's automation conditions, as its sensor makes it."""
    return evaluate_automation_conditions(
        defs=list(defs.resolve_asset_graph().assets_defs),
        instance=instance,
        asset_selection=AssetSelection.assets(*KEYS),
        evaluation_time=when,
        cursor=cursor,
    )


def test_the_automation_asks_for_a_new_clusters_week_and_each_hour_at_five_past(tmp_path):
    """A new cluster: every hour of the last days at once (one backfill), all but the hour that just
    closed; that one once five past has passed and the cluster's collectors ran since."""
    names = ["new-a", "new-b"]
    # The test reads the closed hour from the clock: it does not start in the last 30 s of an hour.
    to_the_hour = HOUR - time.time() % HOUR
    if to_the_hour < 30:
        time.sleep(to_the_hour + 1)
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, names)
        now = datetime.now(UTC)
        tick = now.replace(minute=5, second=0, microsecond=0)
        tick = tick if tick <= now else tick - timedelta(hours=1)
        first = _evaluate_history(instance, tick - timedelta(minutes=1))
        asked = set(first.get_requested_partitions(AssetKey("workload_gpu_hourly_stats")))
        latest = (tick - timedelta(minutes=1)).replace(minute=0) - timedelta(hours=1)
        week = {history_key(n, latest - timedelta(hours=h)) for n in names for h in range(1, 7 * 24)}
        assert asked == week
        # Each cluster's closed hour waits for that cluster's collectors, not the others'.
        cursor = first.cursor
        for name in names:
            for upstream in UPSTREAM:
                instance.report_runless_asset_event(AssetMaterialization(upstream, partition=name))
            when = datetime.now(UTC) + timedelta(seconds=1)
            evaluated = _evaluate_history(instance, when, cursor)
            cursor = evaluated.cursor
            closed = when.replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
            closed_keys = {history_key(n, closed) for n in names}
            for key in KEYS:
                asked_now = set(evaluated.get_requested_partitions(key)) & closed_keys
                assert asked_now == {history_key(name, closed)}, (key, name)


def test_a_cluster_added_after_five_past_gets_its_closed_hour_after_its_first_collection():
    """Dagster's cron condition holds only for partitions that existed at the tick: a cluster added
    at twenty past gets the hour that just closed once its first collection is done, not at the next
    five past. A cluster whose collectors have run all along still waits for five past, also in the
    minutes after the hour when its new hour's partition is there and missing."""
    base = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    closed = base - timedelta(hours=1)  # the hour that closes at `base`

    def collected(name):
        for upstream in UPSTREAM:
            instance.report_runless_asset_event(AssetMaterialization(upstream, partition=name))

    def asked_latest(result):
        latest = {history_key(n, closed) for n in ("old", "late")}
        return {key: set(result.get_requested_partitions(key)) & latest for key in KEYS}

    with instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, ["old"])
        collected("old")
        result = _evaluate_history(instance, base - timedelta(minutes=10))
        # The sensor's first evaluation: its state is empty, yet nobody's collectors are "new".
        assert history_key("old", closed - timedelta(hours=1)) not in result.get_requested_partitions(KEYS[0])
        collected("old")  # the collectors run every minute
        result = _evaluate_history(instance, base + timedelta(minutes=2), result.cursor)
        assert asked_latest(result) == {key: set() for key in KEYS}, "before five past"
        collected("old")
        result = _evaluate_history(instance, base + timedelta(minutes=6), result.cursor)
        assert asked_latest(result) == {key: {history_key("old", closed)} for key in KEYS}

        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, ["late"])
        collected("old")
        result = _evaluate_history(instance, base + timedelta(minutes=20), result.cursor)
        assert asked_latest(result) == {key: set() for key in KEYS}, "before its first collection"
        assert history_key("late", closed - timedelta(hours=1)) in result.get_requested_partitions(KEYS[0])
        # Its first collection: one collector's materialization lands before an evaluation, the
        # other's after it; the hour is asked once both are there.
        instance.report_runless_asset_event(AssetMaterialization(UPSTREAM[0], partition="late"))
        result = _evaluate_history(instance, base + timedelta(minutes=21), result.cursor)
        assert asked_latest(result) == {key: set() for key in KEYS}, "half collected"
        instance.report_runless_asset_event(AssetMaterialization(UPSTREAM[1], partition="late"))
        collected("old")
        result = _evaluate_history(instance, base + timedelta(minutes=22), result.cursor)
        assert asked_latest(result) == {key: {history_key("late", closed)} for key in KEYS}
        collected("late")
        collected("old")
        result = _evaluate_history(instance, base + timedelta(minutes=23), result.cursor)
        assert asked_latest(result) == {key: set() for key in KEYS}, "asked once"

        # A cluster whose closed hour is already there (computed by hand) is not asked for it.
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, ["done"])
        result = _evaluate_history(instance, base + timedelta(minutes=24), result.cursor)
        for key in KEYS:
            instance.report_runless_asset_event(
                AssetMaterialization(key, partition=history_key("done", closed))
            )
        collected("done")
        result = _evaluate_history(instance, base + timedelta(minutes=25), result.cursor)
        assert history_key("done", closed) not in result.get_requested_partitions(KEYS[0])


def test_workload_statistics_read_the_whole_window_an_outage_left(tmp_path, monkeypatch):
    """The per-window statistics after two and a half hours without runs: each run reads an hour of
    what was missed, the next ones go on, and in the end every step of the outage is counted once."""
    start = math.floor(time.time() / 60) * 60 - 4 * HOUR
    clock = SimClock(start + 7)
    fleet = SimFleet.generate(clusters=1, nodes=3, seed=9, vendor="amd", history=True, clock=clock)
    (cluster,) = fleet
    lens_url = f"sqlite:///{tmp_path / 'lens.db'}"
    config = statistics_config({"step_seconds": 60, "first_window_seconds": 300, "max_window_seconds": 3600})
    monkeypatch.setattr(statistics_view, "datetime", clock.datetime)
    monkeypatch.setattr(gpu_pods_collector, "datetime", clock.datetime)
    with SimServer(fleet) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [cluster.name])
        run = run_resources(
            write_registry(tmp_path / "clusters.yaml", server), lens_url, f"sqlite:///{tmp_path / 's.db'}"
        )

        def statistics():
            result = materialize_cluster(
                ["gpu_pods", "gpu_workloads", "workload_gpu_statistics"],
                partition_key=cluster.name,
                instance=instance,
                resources=run,
                run_config=config,
            )
            assert result.success
            (event,) = [
                e
                for e in result.get_asset_materialization_events()
                if e.asset_key.path == ["workload_gpu_statistics"]
            ]
            return event.materialization.metadata

        statistics()
        clock.t += 2.5 * HOUR  # nothing runs meanwhile
        behind = [statistics()["seconds_behind"].value for _ in range(4)]
        assert behind[0] > HOUR and behind[1] > 0 and behind[2] == behind[3] == 0
        with get_engine(lens_url).connect() as conn:
            stats = {r["uid"]: r for r in conn.execute(select(workload_statistic)).mappings()}
        # A workload that held GPUs all along has a point for every minute since its first run.
        steady = [r for r in stats.values() if r["workload_status"] == "Running" and r["sample_count"]]
        assert steady and max(r["sample_count"] for r in steady) == 5 + 150
