"""Engines for the Lens and SaFE databases, and the one way to open a write transaction.

SQLite is the embedded default; runs for several clusters write to it at the same time, so it
runs in WAL mode with a busy timeout, and write transactions take the write lock up front
(`BEGIN IMMEDIATE`): a deferred transaction that upgrades to writing can fail at once with
SQLITE_BUSY instead of waiting. A process that only reads (`lens api`) takes `get_read_engine`:
its transactions begin deferred, so that its readers run side by side under WAL instead of taking
the write lock one after the other.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any
from urllib.parse import quote

import orjson
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from lens_pipeline.store.write_behind import write_behind

_ENGINES: dict[tuple[str, bool], Engine] = {}

# A NUL escape in JSON text: `\u0000` whose backslash is not itself escaped (an even number of
# backslashes before it; after an odd number it is the text "\u0000" written out).
_JSON_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def json_text(value: Any) -> str:
    """A JSON column's value as text. A NUL inside a string (an annotation may hold one) becomes
    U+FFFD on every dialect: PostgreSQL's jsonb refuses it, and one such value would fail the whole
    write of the cluster's objects."""
    text = orjson.dumps(value).decode()
    return _JSON_NUL.sub(r"\1\\ufffd", text) if "\\u0000" in text else text


# JSON columns (labels, snapshots) through orjson: several times faster both ways than `json`.
JSON_CODEC = {"json_serializer": json_text, "json_deserializer": orjson.loads}
_LOCK = threading.Lock()
SQLITE_BUSY_TIMEOUT_MS = 60_000
# Seconds a PostgreSQL connection may take to be made (server URLs may set their own).
CONNECT_TIMEOUT_SECONDS = 10
SQLITE_AUTOCHECKPOINT_PAGES = 1000  # SQLite's default


def database_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the database is away (down, unreachable, overloaded, locked, the connection
    lost) rather than that the statement or its data is wrong: the first is worth waiting for."""
    if isinstance(exc, OperationalError | InterfaceError | DisconnectionError | PoolTimeout):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


# A URL that names no driver gets the first of these that is installed: the drivers the package
# depends on and is tested with (psycopg2, PyMySQL) first, SQLAlchemy's others when only they are.
_DRIVERS = {
    "postgresql": ("psycopg2", "psycopg"),
    "mysql": ("pymysql", "mysqldb"),
    "mariadb": ("pymysql", "mysqldb"),
}
_DRIVER_MODULES = {"psycopg": "psycopg", "psycopg2": "psycopg2", "mysqldb": "MySQLdb", "pymysql": "pymysql"}


def with_installed_driver(url: str) -> str:
    """`url` with a driver that is installed when it names none (`postgresql://`, `mysql://`); a URL
    that names an uninstalled driver is a clear error."""
    parsed = make_url(url)
    backend, driver = (
        parsed.get_backend_name(),
        parsed.get_driver_name() if "+" in parsed.drivername else None,
    )
    choices = _DRIVERS.get(backend)
    if choices is None:
        return url
    installed = [d for d in choices if importlib.util.find_spec(_DRIVER_MODULES[d]) is not None]
    if driver is None:
        if not installed:
            raise ValueError(f"no {backend} driver installed: pip install {' or '.join(choices)}")
        return parsed.set(drivername=f"{backend}+{installed[0]}").render_as_string(hide_password=False)
    if driver in _DRIVER_MODULES and driver not in installed:
        hint = f"; use {backend}+{installed[0]}://" if installed else ""
        raise ValueError(f"the database URL names the {driver} driver, which is not installed{hint}")
    return url


def get_engine(url: str) -> Engine:
    """One engine per URL per process (engines own connection pools)."""
    return _engine(url, reading=False)


def get_read_engine(url: str) -> Engine:
    """`get_engine` for a process that reads: the same on PostgreSQL and MariaDB; on SQLite its
    transactions begin deferred (readers in parallel, no write lock held by a read)."""
    return _engine(url, reading=True)


def _engine(url: str, *, reading: bool) -> Engine:
    url = with_installed_driver(url)
    reading = reading and make_url(url).get_backend_name() == "sqlite"
    with _LOCK:
        engine = _ENGINES.get((url, reading))
        if engine is None:
            engine = _ENGINES[(url, reading)] = _create(url, reading=reading)
        return engine


def dispose_engines() -> None:
    with _LOCK:
        for engine in _ENGINES.values():
            engine.dispose()
        _ENGINES.clear()


def _create(url: str, *, reading: bool = False) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            from pathlib import Path

            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
            **JSON_CODEC,
        )
        _configure_sqlite(engine, begin="BEGIN" if reading else "BEGIN IMMEDIATE")
        return engine
    if parsed.get_backend_name() in ("mysql", "mariadb"):
        # utf8mb4 so that any Kubernetes label survives; pre-ping because MySQL drops idle links.
        query = dict(parsed.query)
        query.setdefault("charset", "utf8mb4")
        return create_engine(parsed.set(query=query), pool_pre_ping=True, pool_recycle=3600, **JSON_CODEC)
    # libpq waits as long as the network lets a connection hang (minutes, when a failed-over
    # database's old address answers nothing). A URL's own `connect_timeout`, `$PGCONNECT_TIMEOUT`
    # or a service file win; other drivers name the setting otherwise.
    own = "connect_timeout" in parsed.query or "service" in parsed.query or "PGCONNECT_TIMEOUT" in os.environ
    libpq = parsed.get_driver_name() in ("psycopg2", "psycopg")
    connect_args = {"connect_timeout": CONNECT_TIMEOUT_SECONDS} if libpq and not own else {}
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args, **JSON_CODEC)


def _configure_sqlite(engine: Engine, begin: str) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        # Let SQLAlchemy, not the driver, say when a transaction begins.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        connection.exec_driver_sql(begin)


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction: everything inside commits together or not at all.

    On PostgreSQL its bulk writes run behind, on a helper thread (`write_behind`): they are all done
    before the commit, and a statement run on the connection sees them.

    On a SQLite file, the commit does not checkpoint the write-ahead log itself (SQLite's default,
    copying the whole transaction into the database file before the commit returns: 2 s of a
    collector run that writes 110k pods); a background thread checkpoints it right after, while the
    run goes on, and the connection goes back to the pool checkpointing as usual.
    """
    if engine.dialect.name != "sqlite":
        with engine.begin() as connection, write_behind(connection):
            yield connection
        return
    with engine.connect() as connection:
        raw: Any = connection.connection.dbapi_connection
        # The file as SQLite resolved it (absolute; "" for an in-memory database).
        database = next((row[2] for row in raw.execute("PRAGMA database_list") if row[1] == "main"), "")
        raw.execute("PRAGMA wal_autocheckpoint=0")
        try:
            with connection.begin(), write_behind(connection):
                yield connection
        finally:
            try:
                raw.execute(f"PRAGMA wal_autocheckpoint={SQLITE_AUTOCHECKPOINT_PAGES}")
            except sqlite3.Error:
                connection.invalidate()  # a broken connection is not pooled without its checkpoints
            if database:
                _checkpointer.request(database)


class _Checkpointer:
    """One daemon thread running `PRAGMA wal_checkpoint(PASSIVE)` on the SQLite files asked for.
    PASSIVE neither waits for nor blocks readers and writers; the sqlite3 module lets go of the
    GIL while it copies, so the copy runs on another core."""

    def __init__(self) -> None:
        self._pending: set[str] = set()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self.done = 0  # checkpoints run, for tests

    def request(self, database: str) -> None:
        with self._wake:
            self._pending.add(database)
            if self._thread is None or not self._thread.is_alive():  # first use, or a forked child
                self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending:
                    self._wake.wait()
                database = self._pending.pop()
            try:
                # mode=rw: a file removed since (a test's temporary database) is not created again.
                uri = f"file:{quote(database)}?mode=rw"
                with closing(
                    sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000)
                ) as connection:
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except Exception:
                pass  # the next commit's checkpoint, or SQLite's own, copies what this one did not
            with self._wake:
                self.done += 1


_checkpointer = _Checkpointer()


# Rows ANALYZE reads per index on SQLite: estimates good enough to choose an index, in milliseconds.
SQLITE_ANALYSIS_LIMIT = 1000


def refresh_planner_statistics(engine: Engine) -> None:
    """On SQLite, what its query planner knows of the tables' sizes (`ANALYZE`, sampled): without
    it SQLite guesses, and at 150,000 pods picks the wrong index of `gpu_workload`. PostgreSQL and
    MariaDB keep their statistics themselves (autovacuum, InnoDB's persistent statistics)."""
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as connection:
        connection.exec_driver_sql(f"PRAGMA analysis_limit={SQLITE_ANALYSIS_LIMIT}")
        connection.exec_driver_sql("ANALYZE")
        connection.commit()
