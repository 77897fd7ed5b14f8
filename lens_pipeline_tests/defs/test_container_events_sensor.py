"""`container_events_sensor` on a real instance: the cursor follows the log, only clusters with new
events to process get runs, and events that need none become an observation."""

from __future__ import annotations

from datetime import UTC, datetime

from dagster import (
    DagsterRun,
    DagsterRunStatus,
    SensorResult,
    SkipReason,
    build_sensor_context,
    instance_for_test,
)

from lens_pipeline.defs.containers.sensors import (
    CONTAINER_EVENTS_TAG,
    container_events_sensor,
    process_container_events_job,
)
from lens_pipeline.defs.resources import LensDatabase
from lens_pipeline.ingest.events import Origin, from_json
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.event_log import append_events, log_transaction
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline_tests.ingest.support import container_id, gpu_container


def _log(lens_url: str, cluster: str, index: int, *, gpus: int = 1) -> None:
    event = {
        "type": "Running",
        "source": "k8s",
        "node": "n1",
        "container_id": container_id(index),
        "data": gpu_container(index, "Running", gpus=gpus),
        "cluster": cluster,
    }
    row = from_json(event, Origin("k8s", None, "east"), datetime.now(UTC))
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    with log_transaction(engine) as conn:
        append_events(conn, [row])


def _tick(instance, lens_url: str, cursor: str | None):
    context = build_sensor_context(
        instance=instance, cursor=cursor, resources={"lens_db": LensDatabase(url=lens_url)}
    )
    return container_events_sensor(context)


def test_the_cursor_follows_the_log_and_only_clusters_with_news_get_runs(sqlite_url):
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", ["east", "west", "north"])
        assert isinstance(_tick(instance, sqlite_url, None), SkipReason)  # an empty log

        _log(sqlite_url, "east", 1)
        _log(sqlite_url, "east", 2)
        _log(sqlite_url, "west", 3)
        result = _tick(instance, sqlite_url, None)
        assert isinstance(result, SensorResult) and result.cursor == "3"
        assert sorted((r.partition_key, r.run_key) for r in result.run_requests) == [
            ("east", "east@2"),
            ("west", "west@3"),
        ]
        assert all(r.tags[CONTAINER_EVENTS_TAG] == r.partition_key for r in result.run_requests)

        assert isinstance(_tick(instance, sqlite_url, "3"), SkipReason)  # nothing after the cursor

        _log(sqlite_url, "west", 4)
        _log(sqlite_url, "north", 5, gpus=0)  # the original ignored it: an observation, no run
        _log(sqlite_url, "south", 6)  # not a registered cluster
        result = _tick(instance, sqlite_url, "3")
        assert result.cursor == "6"
        assert [(r.partition_key, r.run_key) for r in result.run_requests] == [("west", "west@4")]
        assert [
            (o.partition, o.metadata["events_needing_no_processing"].value) for o in result.asset_events
        ] == [("north", 1)]


def test_a_cluster_whose_run_waits_in_the_queue_gets_no_second_run(sqlite_url):
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", ["east"])
        instance.add_run(
            DagsterRun(
                job_name=process_container_events_job.name,
                run_id="queued-east",
                status=DagsterRunStatus.NOT_STARTED,
                tags={"dagster/partition": "east"},
            )
        )
        _log(sqlite_url, "east", 1)
        result = _tick(instance, sqlite_url, None)
        assert result.run_requests == [] and result.cursor == "1"
