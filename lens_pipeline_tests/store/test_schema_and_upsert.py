"""The store on every dialect: migrations, unique keys, the one bulk upsert, snapshot sync."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from alembic import command
from sqlalchemy import inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from lens_pipeline.collect.overview import NODE_COUNTS, RDMA_FIGURES, STORAGE_FIGURES
from lens_pipeline.store.db import get_engine, write_transaction
from lens_pipeline.store.migrate import (
    alembic_config,
    current_revision,
    ensure_schema,
    head_revision,
    upgrade,
)
from lens_pipeline.store.schema import (
    LENS_TABLES,
    SAFE_TABLES,
    cluster_overview_cache,
    logical_key,
    node,
    node_statistic,
    storage,
    workload_statistic,
)
from lens_pipeline.store.upsert import bulk_upsert, sync_snapshot
from lens_pipeline_tests.conftest import _server_database

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _node(name: str, **overrides) -> dict:
    return {
        "cluster_name": "c1",
        "name": name,
        "gpu_count": 8,
        "gpu_allocation": 0,
        "status": "Ready",
        "taints": {},
        "labels": {"a": "b"},
        "gpu_utilization": 12.5,
        **overrides,
    }


def test_migrations_create_every_table_with_its_unique_key(db_urls):
    lens_url, safe_url = db_urls
    for url, database, tables in ((lens_url, "lens", LENS_TABLES), (safe_url, "safe", SAFE_TABLES)):
        engine = get_engine(url)
        upgrade(engine, database)
        upgrade(engine, database)  # a second upgrade is a no-op
        assert current_revision(engine, database) == head_revision(database)
        inspector = inspect(engine)
        for name, table in tables.items():
            uniques = [tuple(u["column_names"]) for u in inspector.get_unique_constraints(name)]
            unique_indexes = [
                tuple(i["column_names"]) for i in inspector.get_indexes(name) if i.get("unique")
            ]
            assert logical_key(table) in uniques + unique_indexes, (name, uniques, unique_indexes)
            if database == "lens":
                assert "cluster_name" in {c["name"] for c in inspector.get_columns(name)}


def _nullable(engine, table: str) -> dict[str, bool]:
    return {c["name"]: c["nullable"] for c in inspect(engine).get_columns(table)}


def test_overview_figures_that_may_be_unknown_become_nullable_keeping_stored_rows(lens_url):
    """Migration 0011 on a database holding an overview row: every column is then as nullable as the
    model says, the row keeps its figures, unknown (NULL) can be stored after it, and going back
    turns NULL into the 0 the old columns required."""
    engine = get_engine(lens_url)
    upgrade(engine, "lens", "0010_lens")
    before = _nullable(engine, "cluster_overview_cache")
    old_row = {
        "cluster_name": "c1",
        **{c.name: 7.5 for c in cluster_overview_cache.columns if c.name not in ("id", "cluster_name")},
        **{figure: 0 for figure in NODE_COUNTS},
        "created_at": T0,
        "updated_at": T0,
    }
    with write_transaction(engine) as conn:
        conn.execute(cluster_overview_cache.insert(), [old_row])
    upgrade(engine, "lens")
    after = _nullable(engine, "cluster_overview_cache")
    assert after == {c.name: c.nullable for c in cluster_overview_cache.columns}
    newly = sorted(name for name, nullable in after.items() if nullable and not before[name])
    assert newly and set(newly) <= {*STORAGE_FIGURES, *RDMA_FIGURES}
    with write_transaction(engine) as conn:
        conn.execute(
            cluster_overview_cache.insert(), [{**old_row, "cluster_name": "c2", **dict.fromkeys(newly)}]
        )
    stored = {r["cluster_name"]: r for r in rows(engine, cluster_overview_cache)}
    assert {f: stored["c1"][f] for f in newly} == dict.fromkeys(newly, 7.5)
    assert {f: stored["c2"][f] for f in newly} == dict.fromkeys(newly)

    with engine.connect() as connection:
        config = alembic_config("lens")
        config.attributes["connection"] = connection
        command.downgrade(config, "0010_lens")
        connection.commit()
    assert _nullable(engine, "cluster_overview_cache") == before
    stored = {r["cluster_name"]: r for r in rows(engine, cluster_overview_cache)}
    assert {f: stored["c2"][f] for f in newly} == dict.fromkeys(newly, 0)
    upgrade(engine, "lens")
    assert current_revision(engine, "lens") == head_revision("lens")


def test_workload_utilization_becomes_nullable_and_unmeasured_zeros_unknown(lens_url):
    """Migration 0014 on a database holding two workloads' statistics, one measured and one never:
    the figures become nullable as the model says, the measured row keeps its figures (a measured 0
    too), the never-measured one's 0s become NULL; the consumers' utilization becomes nullable."""
    engine = get_engine(lens_url)
    upgrade(engine, "lens", "0013_lens")
    figures = [c.name for c in workload_statistic.columns if c.name.endswith("_gpu_utilization")]
    base = {
        "cluster_name": "c1",
        "namespace": "ns",
        "workload_type": "Job",
        "stat_start_time": T0,
        "stat_end_time": T0,
        "labels": {},
        "annotations": {},
        "created_at": T0,
        "updated_at": T0,
    }
    with write_transaction(engine) as conn:
        conn.execute(
            workload_statistic.insert(),
            [
                {
                    **base,
                    "uid": "measured",
                    "workload_name": "a",
                    "sample_count": 3,
                    **dict.fromkeys(figures, 0.0),
                },
                {
                    **base,
                    "uid": "never",
                    "workload_name": "b",
                    "sample_count": 0,
                    **dict.fromkeys(figures, 0.0),
                },
            ],
        )
    upgrade(engine, "lens")
    assert {
        c: n for c, n in _nullable(engine, "workload_statistic").items() if c in figures
    } == dict.fromkeys(figures, True)
    assert _nullable(engine, "gpu_consumers")["gpu_utilization"] is True
    stored = {r["uid"]: r for r in rows(engine, workload_statistic)}
    assert {f: stored["measured"][f] for f in figures} == dict.fromkeys(figures, 0.0)
    # Never measured: unknown; its instant 0 cannot be told from a measured one and stays.
    assert {f: stored["never"][f] for f in figures} == {
        **dict.fromkeys(figures),
        "instant_gpu_utilization": 0.0,
    }


@pytest.mark.parametrize("own", [None, 2])
def test_a_postgresql_connection_that_hangs_fails_after_the_connect_timeout(own):
    """A database address that takes the connection and never answers (a failed-over server's old
    address behind a load balancer): the connection fails after `CONNECT_TIMEOUT_SECONDS`, or the
    URL's own `connect_timeout`, rather than hold a run, a sensor or an API worker for as long as
    the network lets it hang."""
    import socket
    import threading

    from sqlalchemy.exc import OperationalError

    from lens_pipeline.store.db import CONNECT_TIMEOUT_SECONDS, dispose_engines

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nothing ever speaks
        port = silent.getsockname()[1]
        outcome: list[BaseException | None] = []

        def connect() -> None:
            try:
                query = f"?connect_timeout={own}" if own else ""
                with get_engine(f"postgresql+psycopg2://postgres@127.0.0.1:{port}/lens{query}").connect():
                    outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        started = time.monotonic()
        worker = threading.Thread(target=connect, daemon=True)
        worker.start()
        worker.join(CONNECT_TIMEOUT_SECONDS + 20)
        took = time.monotonic() - started
        dispose_engines()
    assert outcome, f"the connection still hangs after {took:.0f} s"
    assert isinstance(outcome[0], OperationalError) and "timeout" in str(outcome[0]).lower(), outcome
    timeout = own or CONNECT_TIMEOUT_SECONDS
    assert timeout - 1 <= took <= timeout + 5, took


def rows(engine, t) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(t)).mappings()]


def test_unique_key_is_enforced_by_the_database(lens_url):
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    with write_transaction(engine) as conn:
        conn.execute(node.insert(), [_node("n1")])
    with pytest.raises(IntegrityError), write_transaction(engine) as conn:
        conn.execute(node.insert(), [_node("n1")])


def test_bulk_upsert_inserts_then_updates_and_keeps_created_at(lens_url):
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    rows = [_node(f"n{i:04d}", created_at=T0, updated_at=T0) for i in range(2500)]
    with write_transaction(engine) as conn:
        assert bulk_upsert(conn, node, rows, batch_rows=1000) == 2500
    later = T0 + timedelta(hours=1)
    changed = [{**r, "gpu_allocation": 4, "created_at": later, "updated_at": later} for r in rows[:10]]
    with write_transaction(engine) as conn:
        bulk_upsert(conn, node, changed)
    with engine.connect() as conn:
        stored = {r.name: r for r in conn.execute(select(node)).all()}
    assert len(stored) == 2500
    first = stored["n0000"]
    assert first.gpu_allocation == 4
    assert first.created_at == T0 and first.created_at.tzinfo is not None  # never overwritten
    assert first.updated_at == later
    assert first.labels == {"a": "b"} and first.taints == {}
    assert stored["n0010"].gpu_allocation == 0


def test_rows_given_out_of_key_order_the_last_of_each_key_wins(lens_url):
    """Of two rows of one key the later one wins, within a batch and across batches."""
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    given = [("c", 1), ("a", 2), ("b", 8), ("a", 3), ("c", 4), ("a", 5), ("d", 6)]
    with write_transaction(engine) as conn:
        bulk_upsert(conn, node, [_node(name, gpu_count=n) for name, n in given], batch_rows=2)
    with engine.connect() as conn:
        assert dict(conn.execute(select(node.c.name, node.c.gpu_count)).all()) == {
            "a": 5,
            "b": 8,
            "c": 4,
            "d": 6,
        }


def test_bulk_upsert_with_nothing_to_update_ignores_conflicts(lens_url):
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    with write_transaction(engine) as conn:
        bulk_upsert(conn, node, [_node("n1")])
        bulk_upsert(conn, node, [_node("n1", gpu_count=1)], update_columns=[])
    with engine.connect() as conn:
        assert conn.execute(select(node.c.gpu_count)).scalar_one() == 8


def test_rows_said_new_are_still_upserted_when_a_key_is_stored_after_all(lens_url):
    # On PostgreSQL `new` rows are COPYed straight into the table; a batch holding a stored key
    # falls back to the upsert, in the same transaction, with the rows before it kept.
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    with write_transaction(engine) as conn:
        bulk_upsert(conn, node, [_node("n0005", gpu_count=1)])
    rows = [_node(f"n{i:04d}", created_at=T0, updated_at=T0) for i in range(25)]
    with write_transaction(engine) as conn:
        assert bulk_upsert(conn, node, rows, batch_rows=10, new=True) == 25
        bulk_upsert(conn, node, [_node("n0100")], new=True)
    with engine.connect() as conn:
        stored = dict(conn.execute(select(node.c.name, node.c.gpu_count)).all())
    assert sorted(stored) == [f"n{i:04d}" for i in range(25)] + ["n0100"]
    assert stored["n0005"] == 8  # updated by the fallback, not refused
    if engine.dialect.name != "postgresql":
        return
    # PostgreSQL: new rows skip the stage table; a fallback goes through it and leaves no savepoint.
    stage = text("SELECT to_regclass('pg_temp.lens_stage_node') IS NOT NULL")
    with write_transaction(engine) as conn:
        bulk_upsert(conn, node, [_node("n0200"), _node("n0201")], new=True)
        assert conn.execute(stage).scalar() is False
        bulk_upsert(conn, node, [_node("n0200", gpu_count=2), _node("n0202")], new=True)
        assert conn.execute(stage).scalar() is True
        with pytest.raises(Exception, match="savepoint"):
            conn.exec_driver_sql("RELEASE SAVEPOINT lens_copy_new")
        conn.rollback()


AWKWARD = [
    "plain",
    "tab\there",
    "line\nbreak",
    "carriage\rreturn",
    "back\\slash",
    "\\N",
    "",
    "ünïcode",
    None,
    "it's",
    'say "so"',
    "ctrl\x1aZ",
    "100%s%% of %(name)s",
    "\\'",
]


@pytest.mark.parametrize("new", [False, True], ids=["upsert", "new rows"])
def test_values_that_need_escaping_are_stored_as_given(lens_url, new):
    # PostgreSQL takes rows as COPY text, converted column by column where nothing needs escaping
    # and value by value where something does, MySQL as literals we write; every dialect must store
    # exactly what was given.
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    rows = [
        _node(f"n{i:02d}", status=status, gpu_utilization=None if i % 2 else 1.5, labels={"k": status or "-"})
        for i, status in enumerate(AWKWARD)
    ]
    plain = [
        _node(f"p{i:02d}", status="Ready", gpu_count=i) for i in range(5)
    ]  # a column with nothing to escape
    with write_transaction(engine) as conn:
        bulk_upsert(conn, node, rows, new=new)
        bulk_upsert(conn, node, plain, new=new)
    with engine.connect() as conn:
        stored = {r.name: r for r in conn.execute(select(node)).all()}
    for row in rows + plain:
        have = stored[row["name"]]
        assert (have.status, have.gpu_utilization, have.labels, have.gpu_count) == (
            row["status"],
            row["gpu_utilization"],
            row["labels"],
            row["gpu_count"],
        ), row["name"]


@pytest.mark.parametrize("new", [False, True], ids=["upsert", "new rows"])
def test_times_and_booleans_many_rows_share_are_stored_as_given(lens_url, new):
    # PostgreSQL's COPY text writes each distinct time and boolean of a column once.
    from lens_pipeline.store.schema import gpu_pods

    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    plus_two = timezone(timedelta(hours=2))
    created = [
        T0,
        T0,
        T0 + timedelta(microseconds=1),
        T0.astimezone(plus_two),
        None,
        T0 + timedelta(days=400),
    ]
    rows = [
        {
            "cluster_name": "c1",
            "uid": f"u{i}",
            "name": f"p{i}",
            "deleted": [True, False, None][i % 3],
            "running": i % 2 == 0,
            "created_at": at,
            "updated_at": T0,  # one time for every row, as a run's `now`
        }
        for i, at in enumerate(created)
    ]
    with write_transaction(engine) as conn:
        bulk_upsert(conn, gpu_pods, rows, new=new)
    with engine.connect() as conn:
        stored = {r.uid: r for r in conn.execute(select(gpu_pods)).all()}
    for row in rows:
        have = stored[row["uid"]]
        assert (have.deleted, have.running, have.created_at, have.updated_at) == (
            row["deleted"],
            row["running"],
            row["created_at"],
            T0,
        ), row["uid"]


def test_a_column_written_once_per_distinct_value_reads_as_each_value_alone():
    # Equal times need not be the same text or instant: another zone's twin of a UTC time, and the
    # two 02:30 of the night Berlin's clocks go back (equal, a fold apart, an hour apart in UTC).
    from zoneinfo import ZoneInfo

    from dateutil.tz import tzutc
    from sqlalchemy.dialects import postgresql

    from lens_pipeline.store.schema import gpu_pods
    from lens_pipeline.store.upsert import _convert, _copy_column, _copy_field

    berlin = datetime(2024, 10, 27, 2, 30, tzinfo=ZoneInfo("Europe/Berlin"))
    columns = [
        [T0, T0, None, T0 + timedelta(microseconds=1)],
        [T0, T0.astimezone(timezone(timedelta(hours=2))), None],
        [berlin, berlin.replace(fold=1)],
        [T0, T0.replace(tzinfo=tzutc())],
        [True, False, None, True],
    ]
    for values in columns:
        assert _copy_column(list(values)) == [_copy_field(v) for v in values], values
    dialect = postgresql.dialect()
    process = gpu_pods.c.created_at.type.dialect_impl(dialect).bind_processor(dialect)
    both = [berlin, berlin.replace(fold=1)]
    _convert(both, process)
    assert both == [datetime(2024, 10, 27, 0, 30, tzinfo=UTC), datetime(2024, 10, 27, 1, 30, tzinfo=UTC)]


@pytest.fixture
def mysql_url() -> Iterator[str]:
    yield from _server_database("mysql", "lens")


MYSQL_AWKWARD = [*filter(None, AWKWARD), "nul\x00byte", "\x00\\\x1a\r\n'\"", "ünï'cøde\\"]


def test_mysql_literals_are_the_drivers_own(mysql_url):
    # Rows go to MySQL as literals we write (`_literal_column`), each what PyMySQL's own `escape`
    # writes, with times, booleans and bytes written once per distinct value (equal times of two
    # zones apart); a NUL, which PostgreSQL's text cannot hold, goes too.
    from lens_pipeline.store.upsert import _literal_column

    engine = get_engine(mysql_url)
    with engine.connect() as conn:
        escape = conn.connection.dbapi_connection.escape
        columns = [
            MYSQL_AWKWARD,
            [*MYSQL_AWKWARD, None],
            [1, None, -(2**40)],
            [True, False, None, True],
            [T0, T0, None, T0 + timedelta(microseconds=1), T0.astimezone(timezone(timedelta(hours=2)))],
            [1.5, 1.5, 2.0, None, 1e-300, 0.0, -0.0],
            [b"\x00\x01'", None, b"\x00\x01'"],
            [Decimal("1.0"), Decimal("1.00"), 1],
        ]
        for values in columns:
            assert _literal_column(list(values), escape) == [
                "NULL" if v is None else escape(v) for v in values
            ], values


@pytest.mark.parametrize("mode", ["", "NO_BACKSLASH_ESCAPES"])
def test_mysql_statements_are_the_ones_the_driver_sends(mysql_url, monkeypatch, mode):
    # Byte for byte what PyMySQL's `executemany` sends for the same rows, split across statements
    # of at most its `max_stmt_length` where it splits them (a row over the limit alone in its own);
    # on a server quoting without backslashes, the driver's own statements. Stored as given.
    import pymysql.cursors

    from lens_pipeline.store.upsert import _columns_of, _driver_values, _insert_as_literals, _upsert_sql

    engine = get_engine(mysql_url)
    ensure_schema(engine, "lens")
    monkeypatch.setattr(pymysql.cursors.Cursor, "max_stmt_length", 1024)
    # (A NUL in a JSON document is stored as U+FFFD on every database: store/db.py's `json_text`.)
    rows = [
        _node(f"n{i:03d}", status=name, labels={"k": name.replace("\x00", "0")})
        for i, name in enumerate(MYSQL_AWKWARD * 3)
    ]
    rows.append(_node("long", labels={"k": "x" * 5000}))  # over the limit alone
    sent: list[bytes] = []
    execute = pymysql.cursors.Cursor.execute

    def spy(cursor, query, args=None):
        if args is None and bytes(query[:6]).upper() == b"INSERT":
            sent.append(bytes(query))
        return execute(cursor, query, args)

    monkeypatch.setattr(pymysql.cursors.Cursor, "execute", spy)
    with engine.connect() as conn:
        if mode:
            conn.exec_driver_sql(f"SET SESSION sql_mode = CONCAT(@@sql_mode, ',{mode}')")
        key = logical_key(node)
        columns = _columns_of(node, rows, key)
        updated = [c for c in columns if c not in key and c not in ("id", "created_at")]
        sql = _upsert_sql(conn.dialect, node, columns, key, updated)
        batch = _driver_values(conn.dialect, node, columns, rows)
        cursor = conn.connection.dbapi_connection.cursor()
        _insert_as_literals(cursor, sql, batch)
        ours = sent[:]
        sent.clear()
        cursor.executemany(sql, batch)
        assert ours == sent and len(ours) > 5
        assert all(len(statement) <= 1024 for statement in ours if b"x" * 5000 not in statement)
        conn.commit()
        stored = {r.name: (r.status, r.labels) for r in conn.execute(select(node)).all()}
    assert stored == {row["name"]: (row["status"], row["labels"]) for row in rows}


def test_naive_datetimes_are_refused(sqlite_url):
    engine = get_engine(sqlite_url)
    ensure_schema(engine, "lens")
    with pytest.raises(Exception, match="naive datetime"), write_transaction(engine) as conn:
        bulk_upsert(conn, node, [_node("n1", created_at=datetime(2026, 1, 1))])


def test_sync_snapshot_writes_only_the_difference(lens_url):
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    scope = {"cluster_name": "c1"}
    with write_transaction(engine) as conn:
        first = sync_snapshot(conn, node, scope, [_node("a"), _node("b"), _node("c")], now=T0)
    assert len(first.inserted) == 3 and first.written == 3

    with write_transaction(engine) as conn:
        again = sync_snapshot(
            conn, node, scope, [_node("a"), _node("b"), _node("c")], now=T0 + timedelta(minutes=1)
        )
    assert again.written == 0 and again.unchanged == 3

    later = T0 + timedelta(minutes=2)
    with write_transaction(engine) as conn:
        result = sync_snapshot(
            conn, node, scope, [_node("a", gpu_allocation=8), _node("d")], now=later, protect=[("c1", "c")]
        )
    assert result.updated == [("c1", "a")]
    assert result.inserted == [("c1", "d")]
    assert result.vanished == [("c1", "b")]  # c is protected: unreadable this run, not gone
    with engine.connect() as conn:
        stored = {r.name: r for r in conn.execute(select(node))}
    assert sorted(stored) == ["a", "c", "d"]
    assert stored["a"].updated_at == later and stored["a"].created_at == T0
    assert stored["c"].updated_at == T0


def test_rows_said_unchanged_are_compared_only_in_the_columns_given(lens_url):
    """Objects listed at the version their rows were built from: only the columns that come from
    elsewhere are read back and compared; the rows of the others are compared whole; a stored row
    neither seen nor said unchanged has vanished, and one said unchanged but not stored is an error."""
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    scope = {"cluster_name": "c1"}
    with write_transaction(engine) as conn:
        sync_snapshot(conn, node, scope, [_node(n) for n in "abcd"], now=T0)
    later = T0 + timedelta(minutes=1)
    with write_transaction(engine) as conn:
        result = sync_snapshot(
            conn,
            node,
            scope,
            [_node("c", gpu_count=4), _node("e")],
            now=later,
            unchanged={("c1", "a"): ("Ready",), ("c1", "b"): ("NotReady",)},
            unchanged_columns=("status",),
        )
    assert result.unchanged == 1  # a
    assert sorted(result.updated) == [("c1", "b"), ("c1", "c")]
    assert result.inserted == [("c1", "e")]
    assert result.vanished == [("c1", "d")]
    with engine.connect() as conn:
        stored = {r.name: r for r in conn.execute(select(node))}
    assert sorted(stored) == ["a", "b", "c", "e"]
    assert (stored["a"].status, stored["a"].updated_at) == ("Ready", T0)
    assert (stored["b"].status, stored["b"].gpu_count, stored["b"].updated_at) == ("NotReady", 8, later)
    assert (stored["c"].gpu_count, stored["c"].updated_at) == (4, later)

    with pytest.raises(RuntimeError, match="said unchanged"), write_transaction(engine) as conn:
        sync_snapshot(conn, node, scope, [], now=later, unchanged={("c1", "zz"): ()})


def test_rows_marked_in_earlier_runs_are_neither_vanished_again_nor_read_back(lens_url):
    """`may_vanish` is asked of the database: thousands of rows marked gone in earlier runs are set
    aside by the query, not read back by key each run to be found already marked (on SQLite the
    statements are counted: as many with 2,500 marked rows as with none)."""
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    scope = {"cluster_name": "c1"}

    def row(name: str) -> dict:
        return {"cluster_name": "c1", "kind": "nfs", "name": name, "status": "Healthy"}

    def sync(conn, rows, now, unchanged=None):
        return sync_snapshot(
            conn,
            storage,
            scope,
            rows,
            now=now,
            compare=["kind", "status"],
            on_vanish={"deleted_at": now},
            may_vanish=storage.c.deleted_at.is_(None),
            unchanged=unchanged,
            unchanged_columns=("status",),
        )

    def selects(marked: int, start: datetime) -> int:
        names = [f"gone-{marked}-{n}" for n in range(marked)]
        later = start + timedelta(minutes=1)
        with write_transaction(engine) as conn:
            sync(conn, [row(n) for n in ["a", "b", "c", *names]], start)
        with write_transaction(engine) as conn:
            assert len(sync(conn, [row("a"), row("b"), row("c")], later).vanished) == marked
        statements: list[str] = []
        with write_transaction(engine) as conn:
            if conn.dialect.name == "sqlite":
                conn.connection.dbapi_connection.set_trace_callback(statements.append)
            unchanged = {("c1", "nfs", "a"): ("Healthy",), ("c1", "nfs", "b"): ("Degraded",)}
            result = sync(conn, [], later + timedelta(minutes=1), unchanged)  # c is gone now
            if conn.dialect.name == "sqlite":
                conn.connection.dbapi_connection.set_trace_callback(None)
        assert result.vanished == [("c1", "nfs", "c")] and result.updated == [("c1", "nfs", "b")]
        with write_transaction(engine) as conn:  # the whole read: the marked rows stay as they were
            assert sync(conn, [row("a"), row("b")], later + timedelta(minutes=2)).vanished == []
        with engine.connect() as conn:
            conn.execute(storage.delete())
            conn.commit()
        if engine.dialect.name == "sqlite":
            assert statements, "the trace saw no statement"
        return sum(s.lstrip().upper().startswith("SELECT") for s in statements)

    assert selects(2500, T0) == selects(0, T0 + timedelta(hours=1))


def test_sync_snapshot_marks_instead_of_deleting(sqlite_url):
    engine = get_engine(sqlite_url)
    ensure_schema(engine, "lens")
    with write_transaction(engine) as conn:
        sync_snapshot(conn, node, {"cluster_name": "c1"}, [_node("a"), _node("b")], now=T0)
        sync_snapshot(
            conn,
            node,
            {"cluster_name": "c1"},
            [_node("a")],
            now=T0,
            on_vanish={"status": "Gone"},
            compare=["gpu_count"],
        )
    with engine.connect() as conn:
        assert dict(conn.execute(select(node.c.name, node.c.status)).all()) == {"a": "Ready", "b": "Gone"}


def test_sqlite_commits_leave_the_checkpoint_to_a_background_thread(tmp_path):
    from lens_pipeline.store import db

    path = tmp_path / "checkpointed.db"
    engine = get_engine(f"sqlite:///{path}")
    ensure_schema(engine, "lens")
    done = db._checkpointer.done
    before = path.stat().st_size
    rows = [_node(f"n{i:05d}", labels={"padding": "x" * 200}) for i in range(5000)]
    with write_transaction(engine) as conn:
        assert conn.connection.dbapi_connection.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
        bulk_upsert(conn, node, rows)
    # The commit left the rows in the log; the database file grows once the thread has copied them.
    deadline = time.monotonic() + 10
    while db._checkpointer.done == done or path.stat().st_size <= before:
        assert time.monotonic() < deadline, "no checkpoint after the commit"
        time.sleep(0.02)
    assert path.stat().st_size > before + 5000 * 200
    with engine.connect() as conn:  # the pooled connection checkpoints as usual again
        raw = conn.connection.dbapi_connection
        assert raw.execute("PRAGMA wal_autocheckpoint").fetchone() == (db.SQLITE_AUTOCHECKPOINT_PAGES,)
        assert conn.execute(select(node.c.name)).all()[-1] == ("n04999",)


def test_a_failed_transaction_leaves_the_previous_snapshot_whole(sqlite_url):
    engine = get_engine(sqlite_url)
    ensure_schema(engine, "lens")
    with write_transaction(engine) as conn:
        sync_snapshot(conn, node, {"cluster_name": "c1"}, [_node("a"), _node("b")], now=T0)
    with pytest.raises(RuntimeError), write_transaction(engine) as conn:
        sync_snapshot(conn, node, {"cluster_name": "c1"}, [_node("z")], now=T0)
        raise RuntimeError("collector died half-way")
    with engine.connect() as conn:
        assert sorted(conn.execute(select(node.c.name)).scalars()) == ["a", "b"]


def test_safe_tables_live_in_their_own_database(db_urls):
    _, safe_url = db_urls
    engine = get_engine(safe_url)
    ensure_schema(engine, "safe")
    row = {"cluster": "default", "node_name": "n1", "gpu_utilization": 42.5, "created_at": T0}
    with write_transaction(engine) as conn:
        bulk_upsert(conn, node_statistic, [row])
        bulk_upsert(conn, node_statistic, [{**row, "gpu_utilization": 50.25}])
    with engine.connect() as conn:
        (value,) = conn.execute(select(node_statistic.c.gpu_utilization)).one()
    assert float(value) == 50.25
    assert "node" not in inspect(engine).get_table_names()


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_a_url_without_a_driver_uses_the_installed_one(dialect):
    """`postgresql://` and `mysql://` name SQLAlchemy's default drivers (psycopg 3, mysqlclient),
    which are not installed: the installed ones are used; a URL naming an absent one is a clear error."""
    for url in _server_database(dialect, "url"):
        bare = make_url(url).set(drivername=dialect).render_as_string(hide_password=False)
        assert "+" not in bare.split("://")[0]
        engine = get_engine(bare)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        assert engine.dialect.driver in ("psycopg2", "pymysql")
    absent = "postgresql+psycopg://u@h/db" if dialect == "postgresql" else "mysql+mysqldb://u@h/db"
    with pytest.raises(ValueError, match="not installed"):
        get_engine(absent)


def _hour_row(uid: str, hour: datetime, samples: int) -> dict:
    figures = dict.fromkeys(
        ("avg_utilization", "max_utilization", "min_utilization", "p50_utilization", "p90_utilization"), 1.0
    )
    return {
        "cluster_name": "c1",
        "workload_uid": uid,
        "namespace": "n",
        "workload_name": "w",
        "workload_type": "Job",
        "stat_hour": hour,
        "allocated_gpu_count": 1.0,
        **figures,
        "p95_utilization": 1.0,
        "total_sum": float(samples),
        "allocated_gpu_seconds": 0.0,
        "idle_gpu_seconds": 0.0,
        "sample_count": samples,
        "workload_status": "Running",
        "created_at": T0,
        "updated_at": T0,
    }


def test_a_time_of_whole_seconds_written_in_bulk_is_found_by_its_own_bound(lens_url):
    """A bulk write stores a time as the dialect's queries compare it: on SQLite a whole hour was
    stored without its fraction and `stat_hour >= hour` missed it, so each run overwrote the hour's
    statistics instead of adding to them."""
    from lens_pipeline.store.schema import workload_gpu_hourly_stats
    from lens_pipeline.store.statistics import stored_hours

    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    with write_transaction(engine) as conn:
        bulk_upsert(
            conn, workload_gpu_hourly_stats, [{**_hour_row("u1", T0, 60), "labels": {}, "annotations": {}}]
        )
    with engine.connect() as conn:
        assert {k: r["sample_count"] for k, r in stored_hours(conn, "c1", T0).items()} == {("u1", T0): 60}


def test_migration_gives_sqlite_times_their_fraction_and_drops_twins(tmp_path):
    from lens_pipeline.store.schema import workload_gpu_hourly_stats

    engine = get_engine(f"sqlite:///{tmp_path / 'lens.db'}")
    upgrade(engine, "lens", "0008_lens")
    old, new = "2026-11-01 12:00:00", "2026-11-01 12:00:00.000000"
    with engine.begin() as conn:
        conn.execute(workload_gpu_hourly_stats.insert(), [_hour_row("u1", T0, 60), _hour_row("u2", T0, 30)])
        # As bulk writes stored them: both hours in the short form, and u2's once more in the long
        # one (the same row written twice).
        conn.exec_driver_sql(f"UPDATE workload_gpu_hourly_stats SET stat_hour = '{old}'")
        conn.execute(workload_gpu_hourly_stats.insert(), [_hour_row("u2", T0, 31)])
    # Up to 0012: 0013 makes this table anew for the hourly history.
    upgrade(engine, "lens", "0012_lens")
    with engine.connect() as conn:
        stored = conn.exec_driver_sql(
            "SELECT workload_uid, stat_hour, sample_count FROM workload_gpu_hourly_stats ORDER BY workload_uid"
        ).fetchall()
    assert [tuple(r) for r in stored] == [("u1", new, 60), ("u2", new, 31)]


def test_migration_gives_pods_gone_before_bound_at_their_binding_time(lens_url):
    """Pods that ended before migration 0007 get `bound_at` from their newest snapshot (PodScheduled,
    else the start time), else their creation when their row names a node; one never scheduled keeps
    NULL, and a live pod is left to the next `gpu_pods` run."""
    from lens_pipeline.store.schema import gpu_pods, pod_resource, pod_snapshot

    engine = get_engine(lens_url)
    upgrade(engine, "lens", "0009_lens")
    created, scheduled, started, ended = (T0 + timedelta(minutes=m) for m in (0, 5, 7, 60))

    def pod(uid, node_name, end_at=ended):
        return (
            {
                "cluster_name": "c1",
                "uid": uid,
                "gpu_model": "",
                "gpu_allocated": 8,
                "created_at": created,
                "end_at": end_at,
            },
            {"cluster_name": "c1", "uid": uid, "namespace": "ml", "name": uid, "node_name": node_name},
        )

    def snapshot(uid, version, status, node_name="n1"):
        return {
            "cluster_name": "c1",
            "pod_uid": uid,
            "pod_name": uid,
            "namespace": "ml",
            "spec": {"nodeName": node_name},
            "metadata": {},
            "status": status,
            "resource_version": version,
        }

    rfc = lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    pods = [
        pod("scheduled", "n1"),
        pod("started", "n1"),
        pod("unknown", "n1"),
        pod("never", ""),
        pod("live", "n1", None),
    ]
    with write_transaction(engine) as conn:
        conn.execute(pod_resource.insert(), [p for p, _ in pods])
        conn.execute(gpu_pods.insert(), [g for _, g in pods])
        conn.execute(
            pod_snapshot.insert(),
            [
                snapshot("scheduled", 1, {"phase": "Pending"}, node_name=""),
                snapshot(
                    "scheduled",
                    2,
                    {
                        "conditions": [
                            {"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc(scheduled)}
                        ],
                        "startTime": rfc(started),
                    },
                ),
                snapshot(
                    "started",
                    3,
                    {"conditions": [{"type": "PodScheduled", "status": "False"}], "startTime": rfc(started)},
                ),
                snapshot("never", 4, {"phase": "Pending"}, node_name=""),
            ],
        )
    upgrade(engine, "lens")
    with engine.connect() as conn:
        bound = dict(conn.execute(select(pod_resource.c.uid, pod_resource.c.bound_at)).all())
    assert bound == {
        "scheduled": scheduled,
        "started": started,
        "unknown": created,
        "never": None,
        "live": None,
    }


def test_a_mariadb_url_gets_the_mysql_settings(mysql_url):
    """`mariadb+pymysql://` names the same server kind as `mysql+pymysql://` (SQLAlchemy's MariaDB
    dialect): the same utf8mb4 connections and recycled pool, and it works end to end."""
    from lens_pipeline.store.db import dispose_engines

    url = make_url(mysql_url).set(drivername="mariadb+pymysql")
    engine = get_engine(url.render_as_string(hide_password=False))
    try:
        assert engine.dialect.name == "mariadb" and engine.url.query.get("charset") == "utf8mb4"
        assert engine.pool._recycle == 3600  # private: no public view of the pool's recycle time
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 'GPU \N{GRINNING FACE}'")).scalar() == "GPU \N{GRINNING FACE}"
    finally:
        dispose_engines()
