"""No single event stops anything: limits are enforced at the edge in the log's own units (bytes,
ranges, no NUL); an event that still cannot be logged or applied is kept whole in the dead-letter
table with why, counted, named by a failing check, and every event before and after it goes on."""

from __future__ import annotations

import struct
import threading
import time
from datetime import UTC, datetime

import orjson
import pytest
from dagster import instance_for_test, materialize
from fastapi.testclient import TestClient
from sqlalchemy import select

from lens_pipeline.api.app import create_app
from lens_pipeline.defs.containers.assets import container_events
from lens_pipeline.defs.resources import LensDatabase
from lens_pipeline.ingest.events import Origin, Refused, from_json
from lens_pipeline.ingest.log_writer import LogWriter, Producer
from lens_pipeline.retry import LOG_COMMIT, Backoff
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.event_log import append_events, dead_letters, encode_record, log_transaction
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.schema import node_container
from lens_pipeline_tests.ingest.support import container_id, gpu_container, ingest_server, logged, post_json
from lens_pipeline_tests.ingest.test_wire import _http_event

ORIGIN = Origin("k8s", None, "east")


def _row(index: int, **data_overrides) -> dict:
    event = _http_event(index)
    event["data"] = {**event["data"], **data_overrides}
    return from_json(event, ORIGIN, datetime.now(UTC))


def _run_container_events(url: str):
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", ["east"])
        result = materialize(
            [container_events],
            partition_key="east",
            resources={"lens_db": LensDatabase(url=url)},
            instance=instance,
        )
    assert result.success
    (check,) = (c for c in result.get_asset_check_evaluations() if c.check_name == "no_event_quarantined")
    return result.asset_materializations_for_node("container_events")[0].metadata, check


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"event_id": "é" * 128}, "event_id", "256 bytes in UTF-8, over 128"),
        ({"container_id": "c\x00d"}, "container_id", "NUL"),
        ({"node": "n" * 200 + "é" * 30}, "node", "over 253"),
    ],
)
def test_ids_are_limited_in_bytes_and_without_nul_at_the_edge(overrides, field, words):
    event = {**_http_event(1), **overrides}
    with pytest.raises(Refused) as refused:
        from_json(event, ORIGIN, datetime.now(UTC))
    assert field in str(refused.value) and words in str(refused.value)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"created_at": 1e30}, "before 2200"),
        ({"created_at": -5}, "before 2200"),
        ({"pod_name": "p\x00q"}, "data.pod_name contains a NUL"),
    ],
)
def test_data_no_table_could_hold_is_refused_at_the_edge(data, words):
    with pytest.raises(Refused, match=words):
        _row(1, **data)


def test_the_largest_accepted_event_id_is_logged(sqlite_url):
    """What the edge accepts, the log format stores: 128 bytes of event id."""
    row = _row(1)
    row["event_id"] = "é" * 64
    engine = get_engine(sqlite_url)
    ensure_schema(engine, "lens")
    with log_transaction(engine) as conn:
        assert append_events(conn, [row]) == 1
    assert logged(sqlite_url)[0].event_id == "é" * 64


def test_an_event_the_log_cannot_hold_is_quarantined_and_the_round_commits(lens_url):
    """Past the edge (a bug, an older sidecar), an event whose id the record format cannot hold
    goes to the dead-letter table in the same transaction; the others of the round are logged."""
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    good, bad, also_good = _row(1), _row(2), _row(3)
    bad["event_id"] = "x" * 300
    with pytest.raises(struct.error):
        encode_record(bad)
    quarantined: list = []
    with log_transaction(engine) as conn:
        assert append_events(conn, [good, bad, also_good], quarantined) == 2
    assert [reason for _, reason in quarantined] == [quarantined[0][1]] and "log format" in quarantined[0][1]
    with engine.connect() as conn:
        (letter,) = dead_letters(conn, "east")
    assert letter["stage"] == "log" and letter["event_id"] == "x" * 300
    assert bytes(letter["payload"]) == bad["payload"] and letter["container_id"] == bad["container_id"]
    assert [e.container_id for e in logged(lens_url)] == [good["container_id"], also_good["container_id"]]


def test_events_that_cannot_be_applied_are_set_aside_and_the_cluster_moves_on(lens_url):
    """Logged events with a creation time out of range, a NUL in the pod name and a pod name longer
    than its column (as an older sidecar let through): all quarantined, every valid event before and after applied, and the
    next run has nothing left to do."""
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    rows = [_row(i) for i in range(1, 7)]
    for index, poison in (
        (1, {"created_at": 1e30}),
        (3, {"pod_name": "p\x00q"}),
        (5, {"pod_name": "p" * 300}),
    ):
        data = {**_http_event(index + 1)["data"], **poison}
        rows[index]["payload"] = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    with log_transaction(engine) as conn:
        append_events(conn, rows)
    metadata, check = _run_container_events(lens_url)
    assert metadata["events_quarantined"].value == 3 and not check.passed
    named = " ".join(check.metadata["events"].value)
    assert "OverflowError" in named or "year" in named
    assert "NUL" in named and container_id(2) in named and container_id(4) in named
    assert "pod_name is 300 characters, over its column's 253" in named  # PostgreSQL and MariaDB refuse it
    with engine.connect() as conn:
        stored = {r.container_id for r in conn.execute(select(node_container.c.container_id))}
        letters = dead_letters(conn, "east")
    assert stored == {container_id(i) for i in (1, 3, 5)}
    assert sorted(letter["container_id"] for letter in letters) == [container_id(i) for i in (2, 4, 6)]
    assert all(letter["stage"] == "processing" and letter["payload"] for letter in letters)
    again, check = _run_container_events(lens_url)
    assert again["events_processed"].value == 0 and check.passed
    # Prometheus sees them too, from the read API.
    metrics = TestClient(create_app(engine)).get("/metrics").text
    assert 'lens_container_events_quarantined_total{cluster="east",stage="processing"} 3.0' in metrics


def test_an_http_event_past_the_limits_is_a_400_naming_the_field_and_the_others_go_on(sqlite_url):
    with ingest_server(sqlite_url) as server:
        status, answer = post_json(server, "/v1/container-events", {**_http_event(1), "event_id": "é" * 128})
        assert status == 400 and "event_id" in answer["errors"][0]["message"]
        status, answer = post_json(
            server,
            "/v1/container-events/batch",
            {
                "events": [
                    _http_event(2),
                    {**_http_event(3), "data": gpu_container(3, "Running") | {"created_at": 1e30}},
                    _http_event(4),
                ]
            },
        )
        assert status == 206 and answer["errors"][0]["index"] == 1
    assert [e.container_id for e in logged(sqlite_url)] == [container_id(2), container_id(4)]


def test_backoff_grows_with_jitter_and_stops_at_its_cap():
    backoff = Backoff(first=0.1, factor=2.0, cap=1.0, jitter=0.5)
    delays = [backoff.delay(n) for n in range(1, 10)]
    for n, delay in enumerate(delays, start=1):
        nominal = min(1.0, 0.1 * 2 ** (n - 1))
        assert nominal * 0.5 <= delay <= nominal
    assert max(delays) <= 1.0 and LOG_COMMIT.cap == 5.0
    with pytest.raises(ValueError):
        Backoff(first=2.0, cap=1.0)


def test_the_log_writer_waits_between_commits_while_the_database_is_away():
    """A database that refuses every connection: the writer retries with backoff, a few times a
    second at most, never a tight loop; nothing is acknowledged."""
    acknowledged = threading.Event()
    writer = LogWriter(get_engine("postgresql+psycopg2://postgres@127.0.0.1:9/none?connect_timeout=1"))
    writer.start()
    try:
        producer = Producer(on_commit=lambda *_: acknowledged.set())
        writer.offer(producer, [_row(1)], 1, time.monotonic())
        time.sleep(2.0)
        assert writer.commits == 0 and not acknowledged.is_set()
        assert 1 <= writer.retries <= 8, writer.retries  # 0.1, 0.2, 0.4, 0.8 s... not a thousand
    finally:
        writer.stop(timeout=1.0)


def _write_round(url: str, rows: list[dict]) -> tuple[LogWriter, list, list]:
    """Rows offered by one producer in one round through a real LogWriter: (writer, the sequence
    numbers acknowledged, the events quarantined)."""
    engine = get_engine(url)
    ensure_schema(engine, "lens")
    acknowledged, quarantined, done = [], [], threading.Event()

    def on_commit(seq, _received):
        acknowledged.append(seq)
        done.set()

    writer = LogWriter(engine, on_quarantine=lambda row, reason: quarantined.append((row, reason)))
    writer.start()
    try:
        writer.offer(Producer(on_commit=on_commit), rows, len(rows), time.monotonic())
        assert done.wait(30), "the round was never acknowledged"
    finally:
        writer.stop(timeout=5.0)
    return writer, acknowledged, quarantined


def test_an_event_the_database_refuses_is_quarantined_and_its_round_is_acknowledged(lens_url):
    """A round holding an event no database takes (a NULL replay key: NOT NULL refuses it, the
    PostgreSQL path cannot even build it) fails for what it holds, not for the database's weather:
    it is split until that event is alone, the event goes to the dead-letter table at stage "log",
    and every other event is logged, in order, and acknowledged. No retry loop."""
    rows = [_row(i) for i in range(1, 8)]
    rows[4]["event_key"] = None
    writer, acknowledged, quarantined = _write_round(lens_url, rows)
    assert acknowledged == [7] and writer.retries == 0 and writer.lost == 0
    assert [e.container_id for e in logged(lens_url)] == [container_id(i) for i in (1, 2, 3, 4, 6, 7)]
    ((row, reason),) = quarantined
    assert row["container_id"] == container_id(5) and "could not store" in reason
    with get_engine(lens_url).connect() as conn:
        (letter,) = dead_letters(conn, "east")
    assert letter["stage"] == "log" and bytes(letter["payload"]) == rows[4]["payload"]


def test_an_event_whose_quarantine_fails_too_is_kept_bare_and_the_round_goes_on(lens_url):
    """An event the log format cannot hold whose dead-letter row cannot be written either (its
    receive time has no zone, which the time columns refuse): kept with its payload and cluster
    alone; the others are logged and acknowledged."""
    rows = [_row(i) for i in range(1, 4)]
    rows[1]["event_id"] = "x" * 300
    rows[1]["received_at"] = rows[1]["received_at"].replace(tzinfo=None)
    writer, acknowledged, quarantined = _write_round(lens_url, rows)
    assert acknowledged == [3] and writer.lost == 0 and len(quarantined) == 1
    assert [e.container_id for e in logged(lens_url)] == [container_id(1), container_id(3)]
    with get_engine(lens_url).connect() as conn:
        (letter,) = dead_letters(conn, "east")
    assert letter["stage"] == "log" and letter["container_id"] is None
    assert bytes(letter["payload"]) == rows[1]["payload"] and "ValueError" in letter["reason"]
