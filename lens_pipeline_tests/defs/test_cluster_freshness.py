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
