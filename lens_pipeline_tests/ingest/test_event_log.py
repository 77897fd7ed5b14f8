"""The event log on every dialect: segments, replays, retention, and the move from the row-per-event
log of migration 0002."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Boolean, Column, Integer, LargeBinary, MetaData, String, Table, func, insert, select

from lens_pipeline.ingest.events import ContainerEvent, Origin, from_grpc
from lens_pipeline.sim import node_agent as agent
from lens_pipeline.store import event_log
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.event_log import (
    Backlog,
    append_events,
    backlog,
    log_transaction,
    logged_events,
    news_after,
    prune,
    read_events,
    set_processed_up_to,
)
from lens_pipeline.store.migrate import upgrade
from lens_pipeline.store.schema import container_event_key, lens_metadata
from lens_pipeline.store.types import UTCDateTime
from lens_pipeline_tests.ingest.support import container_id, gpu_container

T0 = datetime(2026, 11, 22, 6, 0, tzinfo=UTC)


def _rows(indexes, cluster: str = "east", at: datetime = T0) -> list[dict]:
    origin = Origin("k8s", None, cluster)
    return [
        from_grpc(
            agent.event("Running", container_id(i), gpu_container(i, "Running", gpus=i % 2)), origin, at
        )
        for i in indexes
    ]


def _append(url: str, rows: list[dict]) -> int:
    with log_transaction(get_engine(url)) as conn:
        return append_events(conn, rows)


def test_a_round_becomes_segments_and_a_partial_replay_adds_only_the_new(lens_url, monkeypatch):
    upgrade(get_engine(lens_url), "lens")
    monkeypatch.setattr(event_log, "SEGMENT_MAX_EVENTS", 4)
    assert _append(lens_url, _rows(range(10)) + _rows(range(3), cluster="west")) == 13
    assert _append(lens_url, _rows(range(8, 14)) + _rows(range(3), cluster="west")) == 4  # 10..13
    with get_engine(lens_url).connect() as conn:
        events = logged_events(conn)
        news = {n.cluster: (n.events, n.to_process) for n in news_after(conn, 0)}
        # GPU-less events (even indexes) are logged but need no processing.
        chunk = read_events(conn, "east", 0, 10**9, limit=3)
        keys = conn.scalar(select(func.count()).select_from(container_event_key))
    east = [e.container_id for e in events if e.cluster == "east"]
    assert east == [container_id(i) for i in range(14)]
    assert news == {"east": (14, 7), "west": (3, 1)}
    assert [e.container_id for e in chunk.events] == [container_id(i) for i in (1, 3, 5, 7)]
    assert chunk.up_to_id == chunk.events[-1].id  # whole segments, up to the one that filled it
    assert keys == 17
    assert events[0].data()["pod_name"] == "train-0" and events[0].received_at == T0


def test_the_backlog_is_what_waits_past_each_watermark(lens_url):
    """The ingest lag of `/metrics`: per cluster, the events needing processing beyond its
    watermark and when the oldest of them arrived; a cluster caught up has 0, and events needing no
    processing (GPU-less: no run is started for them) are not waiting."""
    upgrade(get_engine(lens_url), "lens")
    engine = get_engine(lens_url)
    _append(lens_url, _rows(range(4), at=T0))  # events 1 and 3 need processing
    _append(lens_url, _rows(range(4, 8), at=T0 + timedelta(minutes=5)) + _rows([0], cluster="west"))
    _append(lens_url, _rows([2], cluster="north"))  # needs no processing
    with engine.connect() as conn:
        newest = event_log.last_id(conn, "east")
    with engine.connect() as conn:
        # Waiting since the first round, the newest from the second.
        assert backlog(conn) == [Backlog("east", 4, T0, T0 + timedelta(minutes=5))]
    with engine.begin() as conn:
        set_processed_up_to(conn, "east", newest - 1, T0)  # the second round is still waiting
        set_processed_up_to(conn, "west", event_log.last_id(conn, "west"), T0)
    with engine.connect() as conn:
        second = T0 + timedelta(minutes=5)
        assert backlog(conn) == [Backlog("east", 2, second, second), Backlog("west", 0, None)]
    with engine.begin() as conn:
        set_processed_up_to(conn, "east", newest, T0)
    with engine.connect() as conn:
        assert backlog(conn) == [Backlog("east", 0, None), Backlog("west", 0, None)]


def test_retention_drops_processed_old_segments_and_their_keys(lens_url):
    upgrade(get_engine(lens_url), "lens")
    _append(lens_url, _rows(range(3), at=T0 - timedelta(days=10)))
    _append(lens_url, _rows(range(3, 6), at=T0))
    engine = get_engine(lens_url)
    with engine.connect() as conn:
        newest = event_log.last_id(conn, "east")
    with engine.begin() as conn:
        assert prune(conn, "east", newest, T0 - timedelta(days=7)) == 3
        assert prune(conn, "east", 0, T0 + timedelta(days=1)) == 0  # nothing unprocessed goes
    with engine.connect() as conn:
        assert [e.container_id for e in logged_events(conn)] == [container_id(i) for i in range(3, 6)]
    assert _append(lens_url, _rows(range(6))) == 3  # a replay of a dropped event is logged again


def test_migration_0004_moves_the_old_log_keeping_ids_and_watermarks(lens_url):
    engine = get_engine(lens_url)
    upgrade(engine, "lens", "0003_lens")
    assert "container_event_log" not in lens_metadata.tables  # written through 0002's columns
    table = Table(
        "container_event_log",
        MetaData(),
        Column("id", Integer, primary_key=True),
        *(Column(c, String) for c in ("cluster_name", "event_key", "source", "event_type", "container_id")),
        Column("node_name", String),
        Column("event_id", String),
        Column("needs_processing", Boolean),
        Column("payload", LargeBinary),
        Column("payload_format", String),
        Column("received_at", UTCDateTime()),
    )
    rows = _rows(range(3))
    with engine.begin() as conn:
        for log_id, row in zip((5, 7, 9), rows, strict=True):
            data = ContainerEvent.FromString(row["payload"]).data.SerializeToString(deterministic=True)
            old = {**row, "id": log_id, "event_key": row["event_key"].hex(), "payload": data}
            conn.execute(insert(table).values({**old, "payload_format": "struct"}))
    upgrade(engine, "lens")
    with engine.connect() as conn:
        moved = logged_events(conn)
    assert [(e.id, e.container_id, e.needs_processing) for e in moved] == [
        (5, container_id(0), False),
        (7, container_id(1), True),
        (9, container_id(2), False),
    ]
    assert moved[1].data()["pod_name"] == "train-1" and moved[1].received_at == T0
    assert _append(lens_url, rows) == 0  # their keys moved too
    assert _append(lens_url, _rows([3])) == 1
    with engine.connect() as conn:
        assert event_log.last_id(conn, "east") > 9  # new segments come after the moved ids


def _writer_process(url: str, rounds: list[list[int]], start_at: float) -> int:
    """One `lens ingest` worker's log writer, offering `rounds` as they come (another process)."""
    import threading
    import time

    from lens_pipeline.ingest.log_writer import LogWriter, Producer

    writer = LogWriter(get_engine(url), linger_seconds=0)
    writer.start()
    committed = threading.Semaphore(0)
    producer = Producer(on_commit=lambda seq, received: committed.release())
    batches = [_rows(indexes) for indexes in rounds]
    time.sleep(max(0.0, start_at - time.time()))
    for seq, rows in enumerate(batches, 1):
        writer.offer(producer, rows, seq, time.monotonic())
        committed.acquire(timeout=30)
    writer.stop()
    return writer.committed_rows


def test_two_writer_processes_offered_the_same_events_log_each_once(lens_url):
    """Workers of `lens ingest --workers N` each have a log writer; an agent's replay can reach
    both. Their commits serialize through the database (log_transaction), so the replay key is
    checked and written as one step and each event is logged once."""
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor

    upgrade(get_engine(lens_url), "lens")
    rounds = [list(range(start, start + 50)) for start in range(0, 1000, 50)]
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=spawn) as pool:
        start_at = time.time() + 3  # both write at once, once both have started
        futures = [pool.submit(_writer_process, lens_url, rounds, start_at) for _ in range(2)]
        committed = [future.result(60) for future in futures]
    with get_engine(lens_url).connect() as conn:
        logged = [e.container_id for e in logged_events(conn)]
        keys = conn.scalar(select(func.count()).select_from(container_event_key))
    assert sorted(logged) == [container_id(i) for i in range(1000)]  # each once
    assert keys == 1000 and committed == [1000, 1000]  # both offered all of them
