"""Write-behind: a write transaction's bulk writes sent by a helper thread (PostgreSQL), seen by the
transaction's own reads, committed with it or not at all."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from sqlalchemy import column, func, literal_column, select, table, text
from sqlalchemy.dialects import postgresql

from lens_pipeline.store.db import get_engine, write_transaction
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.schema import node, pod_snapshot
from lens_pipeline.store.upsert import bulk_upsert
from lens_pipeline.store.write_behind import WriteBehind, WriteBehindError, _statement_tables, write_behind
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


class Jobs:
    """Jobs for a WriteBehind that record their names; a held job waits for `release`."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def release_when(self, condition) -> None:
        """Let the held job end once `condition()` holds (checked from another thread)."""

        def watch() -> None:
            deadline = time.monotonic() + 5
            while not condition() and time.monotonic() < deadline:
                time.sleep(0.005)
            self.release.set()

        threading.Thread(target=watch, daemon=True).start()

    def __call__(self, name: str, hold: bool = False):
        def run(_cursor) -> None:
            if hold:
                self.started.set()
                assert self.release.wait(5)
            self.done.append(name)

        return run


@pytest.fixture
def dbapi_connection() -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(":memory:", check_same_thread=False)
    yield connection
    connection.close()


def test_jobs_run_in_order_and_pending_work_is_bounded(dbapi_connection):
    writer, jobs = WriteBehind(dbapi_connection, max_pending_bytes=100), Jobs()
    writer.submit("a", 60, jobs("a1", hold=True))
    writer.submit("b", 40, jobs("b1"))
    third = threading.Thread(target=writer.submit, args=("a", 60, jobs("a2")))
    third.start()
    third.join(0.5)
    assert third.is_alive() and writer._tables == {"a": 1, "b": 1}  # 100 bytes pending: it waits
    jobs.release.set()
    third.join(5)
    writer.finish()
    assert jobs.done == ["a1", "b1", "a2"]


def test_a_statement_waits_for_its_tables_jobs_and_for_the_job_under_way_only(dbapi_connection):
    writer, jobs = WriteBehind(dbapi_connection), Jobs()
    writer.submit("a", 1, jobs("a1", hold=True))
    writer.submit("a", 1, jobs("a2"))
    writer.submit("b", 1, jobs("b1"))
    assert jobs.started.wait(5)
    jobs.release_when(lambda: writer._waiting is not None)
    writer.before_statement({"c"})  # nothing pending on c: waits for a1 to end, not for the queue
    assert jobs.done == ["a1"]
    writer.after_statement()
    writer.before_statement({"b"})  # b1 is pending: it runs first (and a2, before it)
    assert jobs.done == ["a1", "a2", "b1"]
    writer.after_statement()
    writer.finish()


def test_an_error_stops_the_jobs_after_it_and_abort_drops_the_jobs_not_started(dbapi_connection):
    failing, jobs = WriteBehind(dbapi_connection), Jobs()
    gate = threading.Event()

    def fail(_cursor) -> None:
        assert gate.wait(5)
        raise ZeroDivisionError("division by zero")

    failing.submit("a", 1, fail)
    failing.submit("a", 1, jobs("never"))
    gate.set()
    with pytest.raises(WriteBehindError, match="division by zero"):
        failing.wait()
    with pytest.raises(WriteBehindError):
        failing.submit("a", 1, jobs("never"))
    failing.abort()

    aborted = WriteBehind(dbapi_connection)
    aborted.submit("a", 1, jobs("held", hold=True))
    aborted.submit("a", 1, jobs("dropped"))
    assert jobs.started.wait(5)
    jobs.release_when(lambda: not aborted._jobs)
    aborted.abort()  # waits for the job under way, drops the other
    assert jobs.done == ["held"]


def test_statements_whose_tables_cannot_be_told_wait_for_every_job():
    def tables(statement):
        return _statement_tables(SimpleNamespace(compiled=statement.compile(dialect=postgresql.dialect())))

    assert tables(select(node.c.name).where(node.c.cluster_name == "c1")) == {"node"}
    assert tables(select(func.count()).select_from(node)) == {"node"}
    newer = pod_snapshot.alias("newer")
    assert tables(select(newer.c.id).where(newer.c.pod_uid == "p")) == {"pod_snapshot"}
    assert tables(select(node.c.name).where(text("name IN (SELECT pod_uid FROM pod_snapshot)"))) is None
    assert tables(select(node.c.name, literal_column("pod_snapshot.pod_uid"))) is None
    assert tables(select(table("pod_snapshot", column("id")).c.id)) is None


def test_a_commit_inside_the_block_waits_for_the_writes_and_a_rollback_drops_them(url):
    engine = get_engine(url)
    ensure_schema(engine, "lens")
    # (`write_transaction` does not allow either inside its block; a bare connection does.)
    with engine.connect() as conn, write_behind(conn):
        bulk_upsert(conn, node, [_node("committed")])
        conn.commit()
        bulk_upsert(conn, node, [_node("rolled-back")])
        conn.rollback()
        bulk_upsert(conn, pod_snapshot, [_snapshot("p1", version=None)], new=True)  # fails behind
        with pytest.raises(WriteBehindError):
            conn.commit()  # what failed is rolled back
        conn.rollback()  # SQLAlchemy's side of it, after a failed commit
        bulk_upsert(conn, node, [_node("last")])
        conn.commit()
    with engine.connect() as conn:
        assert sorted(conn.execute(select(node.c.name)).scalars()) == ["committed", "last"]
        assert _count(conn, pod_snapshot) == 0
