"""`every_cluster_fresh` names the late clusters even when the others are fresh: evaluated by
`cluster_freshness_sensor` on a real instance over a real Lens database, and by the pure rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dagster import AssetCheckSeverity, SkipReason, build_sensor_context, instance_for_test

from lens_pipeline.collect.freshness import late_clusters
from lens_pipeline.defs.fleet.freshness import ASSETS, CHECK_NAME, cluster_freshness_sensor
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.defs.resources import LensDatabase
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.overview import record_materialized


def _tick(instance, lens_url: str):
    context = build_sensor_context(instance=instance, resources={"lens_db": LensDatabase(url=lens_url)})
    return cluster_freshness_sensor(context)


def test_one_late_cluster_among_fresh_ones_is_named(sqlite_url):
    db = LensDatabase(url=sqlite_url)
    now = datetime.now(UTC)
    with write_transaction(db.engine()) as conn:
        for cluster in ("east", "west", "north"):
            record_materialized(conn, cluster, ASSETS, now=now - timedelta(seconds=30))
        # west's turn stopped writing its views three minutes ago (its collectors are fresh).
        record_materialized(conn, "west", ["cluster_overview_cache"], now=now - timedelta(minutes=3))
    with instance_for_test() as instance:
        assert isinstance(_tick(instance, sqlite_url), SkipReason)  # no partitions yet
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, ["east", "west", "north", "south"])

        (evaluation,) = _tick(instance, sqlite_url).asset_events
        assert evaluation.check_name == CHECK_NAME and not evaluation.passed
        late = evaluation.metadata["late"].value
        # south is registered and never collected: failing (an error); west is late (a warning).
        assert set(late) == {"west", "south"}
        assert late["west"] == {"cluster_overview_cache": late["west"]["cluster_overview_cache"]}
        assert 170 < late["west"]["cluster_overview_cache"] < 200
        assert late["south"] == {asset: None for asset in ASSETS}
        assert evaluation.severity == AssetCheckSeverity.ERROR
        assert "west: cluster_overview_cache" in evaluation.description

        instance.delete_dynamic_partition(CLUSTER_PARTITIONS_NAME, "south")
        (evaluation,) = _tick(instance, sqlite_url).asset_events
        assert set(evaluation.metadata["late"].value) == {"west"}
        assert evaluation.severity == AssetCheckSeverity.WARN  # late, not yet past the fail window

        with write_transaction(db.engine()) as conn:
            record_materialized(conn, "west", ASSETS, now=datetime.now(UTC))
        (evaluation,) = _tick(instance, sqlite_url).asset_events
        assert evaluation.passed and evaluation.metadata["clusters"].value == 3


def test_the_windows():
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    times = {
        "a": {"x": now - timedelta(seconds=119), "y": now},
        "b": {"x": now - timedelta(seconds=121), "y": now},
        "c": {"x": now - timedelta(seconds=301), "y": now - timedelta(seconds=10)},
    }
    late = late_clusters(["a", "b", "c"], times, ["x", "y"], now)
    assert [(c.cluster, c.stale, c.failing) for c in late] == [
        ("b", {"x": 121.0}, False),
        ("c", {"x": 301.0}, True),
    ]


def test_a_collection_run_leaves_the_sensors_verdict_standing(tmp_path):
    """The scheduled collection job runs every collector's and view's checks but not
    `every_cluster_fresh`: a run that planned it recorded it skipped every minute, and the UI showed
    that in place of the sensor's verdict, late clusters and all, until the sensor's next tick."""
    from dagster import AssetCheckKey, Definitions

    from lens_pipeline.defs import resources
    from lens_pipeline.defs.cluster_assets import JOB_NAME, cluster_assets
    from lens_pipeline.defs.collectors.schedules import collect_cluster_job
    from lens_pipeline.defs.fleet.freshness import CHECKED, every_cluster_fresh
    from lens_pipeline.defs.resources import ClusterRegistryResource, SafeDatabase
    from lens_pipeline.sim import SimFleet, SimServer, write_registry

    fleet = SimFleet.generate(clusters=1, nodes=3, seed=2, vendor="amd")
    (name,) = [c.name for c in fleet]
    lens_url = f"sqlite:///{tmp_path / 'lens.db'}"
    with SimServer(fleet) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [name])
        defs = Definitions(
            assets=[cluster_assets],
            asset_checks=[every_cluster_fresh],
            jobs=[collect_cluster_job],
            resources={
                **resources.defs.resources,
                "registry": ClusterRegistryResource(
                    clusters_file=str(write_registry(tmp_path / "c.yaml", server))
                ),
                "lens_db": LensDatabase(url=lens_url),
                "safe_db": SafeDatabase(url=f"sqlite:///{tmp_path / 'safe.db'}"),
            },
        )
        (evaluation,) = _tick(instance, lens_url).asset_events  # never collected: failing
        instance.report_runless_asset_event(evaluation)
        result = defs.resolve_job_def(JOB_NAME).execute_in_process(instance=instance, partition_key=name)
        assert result.success
        ran = {(e.asset_key.path[-1], e.check_name) for e in result.get_asset_check_evaluations()}
        assert ("gpu_nodes", "every_node_readable") in ran and len(ran) > 20
        history = instance.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(CHECKED, CHECK_NAME), limit=10
        )
        assert [record.status.value for record in history] == ["FAILED"]  # the sensor's, not a skip
        (evaluation,) = _tick(instance, lens_url).asset_events
        assert evaluation.passed
