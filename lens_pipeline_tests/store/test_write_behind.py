"""Write-behind: a write transaction's bulk writes sent by a helper thread (PostgreSQL), seen by the
transaction's own reads, committed with it or not at all."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from lens_pipeline.store.db import get_engine, write_transaction
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.schema import node, pod_snapshot
from lens_pipeline.store.upsert import bulk_upsert
from lens_pipeline.store.write_behind import WriteBehind, WriteBehindError
from lens_pipeline_tests.conftest import _server_database

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def url() -> Iterator[str]:
    """A fresh Lens database on PostgreSQL, the dialect that writes behind."""
    database = _server_database("postgresql", "lens")
    try:
        yield next(database)
    finally:
        database.close()


def _node(name: str, **overrides) -> dict:
    return {
        "cluster_name": "c1",
        "name": name,
        "gpu_count": 8,
        "status": "Ready",
        "labels": {"n": name},
        **overrides,
    }


def _snapshot(uid: str, version: int | None = 1) -> dict:
    return {
        "cluster_name": "c1",
        "pod_uid": uid,
        "pod_name": uid,
        "namespace": "ns",
        "spec": {"containers": [{"name": "main", "tab": "a\tb", "newline": "a\nb", "slash": "a\\b"}]},
        "metadata": {"uid": uid},
        "status": {"phase": "Running"},
        "created_at": T0,
        "resource_version": version,
    }


def _count(conn, table) -> int:
    return conn.execute(select(func.count()).select_from(table)).scalar_one()


def test_rows_written_behind_are_read_back_in_the_transaction_and_committed(lens_url):
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    with write_transaction(engine) as conn:
        writer = WriteBehind.of(conn)
        assert (writer is not None) == (engine.dialect.name == "postgresql")
        bulk_upsert(conn, pod_snapshot, [_snapshot(f"p{i}") for i in range(50)], batch_rows=7, new=True)
        bulk_upsert(conn, node, [_node(f"n{i}") for i in range(30)], batch_rows=4)
        # The reads wait for the writes on their tables: the transaction sees all of them.
        assert _count(conn, pod_snapshot) == 50
        assert _count(conn, node) == 30
        if writer is not None:
            assert writer.jobs_done >= 2
    with engine.connect() as conn:
        assert _count(conn, pod_snapshot) == 50
        spec = conn.execute(select(pod_snapshot.c.spec).where(pod_snapshot.c.pod_uid == "p3")).scalar_one()
    assert spec == _snapshot("p3")["spec"]  # tabs, newlines and backslashes survive COPY


def test_a_failed_write_behind_rolls_back_its_transaction_and_keeps_what_was_stored(url):
    engine = get_engine(url)
    ensure_schema(engine, "lens")
    with write_transaction(engine) as conn:
        bulk_upsert(conn, node, [_node("kept")])
    with pytest.raises(WriteBehindError, match="resource_version"), write_transaction(engine) as conn:
        bulk_upsert(conn, node, [_node("lost")])
        # resource_version is NOT NULL: the helper's COPY fails, and the error comes out here.
        bulk_upsert(conn, pod_snapshot, [_snapshot("p1"), _snapshot("p2", version=None)], new=True)
        conn.execute(select(func.count()).select_from(pod_snapshot))
    with engine.connect() as conn:
        assert conn.execute(select(node.c.name)).scalars().all() == ["kept"]
        assert _count(conn, pod_snapshot) == 0


def test_an_error_in_the_collector_drops_the_writes_not_yet_sent(url):
    engine = get_engine(url)
    ensure_schema(engine, "lens")
    with pytest.raises(ValueError, match="collector failed"), write_transaction(engine) as conn:
        writer = WriteBehind.of(conn)
        bulk_upsert(conn, node, [_node(f"n{i}") for i in range(20)], batch_rows=2)
        raise ValueError("collector failed")
    assert writer is not None and writer._thread is not None and not writer._thread.is_alive()
    with engine.connect() as conn:
        assert _count(conn, node) == 0


def test_the_last_row_of_a_key_wins_across_the_batches_of_one_chunk(url):
    engine = get_engine(url)
    ensure_schema(engine, "lens")
    rows = [_node("a", gpu_count=1), _node("b"), _node("c"), _node("a", gpu_count=3), _node("b", gpu_count=5)]
    with write_transaction(engine) as conn:
        assert bulk_upsert(conn, node, rows, batch_rows=2) == 5
    with engine.connect() as conn:
        assert dict(conn.execute(select(node.c.name, node.c.gpu_count)).all()) == {"a": 3, "b": 5, "c": 8}


def test_jobs_run_in_order_a_statement_waits_for_its_tables_and_pending_work_is_bounded():
    connection = sqlite3.connect(":memory:", check_same_thread=False)
    writer = WriteBehind(connection, max_pending_bytes=100)
    release = threading.Event()
    done: list[str] = []

    def job(name: str, wait: bool = False):
        def run(_cursor) -> None:
            if wait:
                release.wait(5)
            done.append(name)

        return run

    writer.submit("a", 60, job("a1", wait=True))
    writer.submit("b", 40, job("b1"))
    blocked = threading.Thread(target=writer.submit, args=("a", 60, job("a2")))
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive()  # 100 bytes are pending: the third submit waits
    release.set()
    writer.before_statement({"a"})  # waits for a1, and for a2 once the bound lets it in
    blocked.join(5)
    writer.after_statement()
    writer.wait({"a"})
    assert done[0] == "a1" and sorted(done) == ["a1", "a2", "b1"]
    writer.finish()
    assert done == ["a1", "b1", "a2"]  # in the order submitted

    # A statement on a table nothing is pending for waits for the job under way, not the queue.
    release.clear()
    done.clear()
    ordered = WriteBehind(connection)
    ordered.submit("a", 1, job("a1", wait=True))
    ordered.submit("a", 1, job("a2"))
    threading.Timer(0.2, release.set).start()
    ordered.before_statement({"b"})
    assert done == ["a1"]
    ordered.after_statement()
    ordered.finish()
    assert done == ["a1", "a2"]

    failing = WriteBehind(connection)
    failing.submit("a", 1, lambda _cursor: 1 / 0)
    failing.submit("a", 1, job("never"))
    with pytest.raises(WriteBehindError, match="division by zero"):
        failing.wait()
    failing.abort()
    assert "never" not in done
    connection.close()
