"""`container_events_sensor` on a real instance: clusters with events to apply share runs over
ranges of partitions, which never cover a cluster another run holds; a failing cluster runs alone;
events that need no processing become an observation; and a run applies every cluster of its range."""

from __future__ import annotations

from datetime import UTC, datetime

from dagster import (
    DagsterRun,
    DagsterRunStatus,
    SensorResult,
    SkipReason,
    build_sensor_context,
    instance_for_test,
    materialize,
)
from sqlalchemy import select

from lens_pipeline.defs.containers.assets import container_events
from lens_pipeline.defs.containers.sensors import (
    CONTAINER_EVENTS_TAG,
    container_events_sensor,
    event_requests,
    process_container_events_job,
)
from lens_pipeline.defs.partitions import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from lens_pipeline.defs.resources import LensDatabase
from lens_pipeline.ingest.events import Origin, from_json
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.event_log import append_events, log_transaction, pending_clusters
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.schema import node_container
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


def _spans(result) -> list[tuple[str, str]]:
    return [
        (r.tags[ASSET_PARTITION_RANGE_START_TAG], r.tags[ASSET_PARTITION_RANGE_END_TAG])
        for r in result.run_requests
    ]


def test_clusters_with_events_to_apply_share_runs_and_the_cursor_follows_the_log(sqlite_url):
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", ["east", "west", "north", "south"])
        assert isinstance(_tick(instance, sqlite_url, None), SkipReason)  # an empty log

        _log(sqlite_url, "east", 1)
        _log(sqlite_url, "east", 2)
        _log(sqlite_url, "north", 3)
        result = _tick(instance, sqlite_url, None)
        assert isinstance(result, SensorResult) and result.cursor == "3"
        # One run over the range east..north (west, with nothing new, costs two queries in it).
        assert _spans(result) == [("east", "north")]
        (request,) = result.run_requests
        assert "dagster/partition" not in request.tags
        assert process_container_events_job.tags[CONTAINER_EVENTS_TAG]  # the run queue's own slots
        assert request.run_key.startswith("east..north@3/")

        _log(sqlite_url, "north", 4, gpus=0)  # the original ignored it: no run needed for it alone
        _log(sqlite_url, "elsewhere", 5)  # not a registered cluster
        result = _tick(instance, sqlite_url, "3")
        assert result.cursor == "5"
        # The events of east and north are still to apply (no run applied them): asked for again.
        assert _spans(result) == [("east", "north")]
        assert result.asset_events == []  # north has events to apply: no observation

        _log(sqlite_url, "south", 6, gpus=0)
        result = _tick(instance, sqlite_url, "5")
        assert [
            (o.partition, o.metadata["events_needing_no_processing"].value) for o in result.asset_events
        ] == [("south", 1)]


def test_the_runs_apply_every_cluster_of_their_batch(sqlite_url):
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", ["east", "west", "north"])
        _log(sqlite_url, "east", 1)
        _log(sqlite_url, "north", 2)
        (request,) = _tick(instance, sqlite_url, None).run_requests
        result = materialize(
            [container_events],
            instance=instance,
            tags=request.tags,
            resources={"lens_db": LensDatabase(url=sqlite_url)},
        )
        assert result.success
        done = result.asset_materializations_for_node("container_events")
        # west had nothing new: no materialization that says nothing.
        assert sorted(m.partition for m in done) == ["east", "north"]
        assert all(m.metadata["events_processed"].value == 1 for m in done)
        with get_engine(sqlite_url).connect() as conn:
            assert pending_clusters(conn) == {}
            stored = set(conn.execute(select(node_container.c.cluster_name, node_container.c.container_id)))
        assert stored == {("east", container_id(1)), ("north", container_id(2))}
        assert isinstance(_tick(instance, sqlite_url, "2"), SkipReason)


def test_a_cluster_a_run_holds_is_left_out_and_asked_for_once_it_is_free(sqlite_url):
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", ["east", "west", "north"])
        instance.add_run(
            DagsterRun(
                job_name=process_container_events_job.name,
                run_id="queued-west",
                status=DagsterRunStatus.NOT_STARTED,
                tags={ASSET_PARTITION_RANGE_START_TAG: "west", ASSET_PARTITION_RANGE_END_TAG: "west"},
            )
        )
        for index, cluster in enumerate(["east", "west", "north"], start=1):
            _log(sqlite_url, cluster, index)
        result = _tick(instance, sqlite_url, None)
        assert _spans(result) == [("east", "east"), ("north", "north")]  # never over west
        instance.report_run_canceled(instance.get_run_by_id("queued-west"))
        assert _spans(_tick(instance, sqlite_url, "3")) == [("east", "north")]


def test_a_failing_cluster_runs_alone_at_most_once_a_minute():
    pending = {"a": 1, "b": 2, "c": 3, "d": 4}
    requests = event_requests(["a", "b", "c", "d"], pending, busy=set(), alone={"c"}, now=120.0)
    assert [
        (r.tags[ASSET_PARTITION_RANGE_START_TAG], r.tags[ASSET_PARTITION_RANGE_END_TAG]) for r in requests
    ] == [
        ("a", "b"),
        ("c", "c"),
        ("d", "d"),
    ]
    keys = [r.run_key for r in requests]
    later = [
        r.run_key for r in event_requests(["a", "b", "c", "d"], pending, busy=set(), alone={"c"}, now=150.0)
    ]
    assert keys[1] == later[1] and keys[0] != later[0]  # the failing one: the same key within the minute
    # A batch never spans more than its size, and never ends on a cluster with nothing new.
    many = [f"c{i:03}" for i in range(120)]
    spans = event_requests(many, {n: 1 for n in many[:101]}, busy=set(), alone=set(), now=0, span=50)
    assert [
        (r.tags[ASSET_PARTITION_RANGE_START_TAG], r.tags[ASSET_PARTITION_RANGE_END_TAG]) for r in spans
    ] == [
        ("c000", "c049"),
        ("c050", "c099"),
        ("c100", "c100"),
    ]
