"""Engines for the Lens and SaFE databases, and the one way to open a write transaction.

SQLite is the embedded default; runs for several clusters write to it at the same time, so it
runs in WAL mode with a busy timeout, and write transactions take the write lock up front
(`BEGIN IMMEDIATE`): a deferred transaction that upgrades to writing can fail at once with
SQLITE_BUSY instead of waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import orjson
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

_ENGINES: dict[str, Engine] = {}
# JSON columns (labels, snapshots) through orjson: several times faster both ways than `json`.
JSON_CODEC = {
    "json_serializer": lambda value: orjson.dumps(value).decode(),
    "json_deserializer": orjson.loads,
}
_LOCK = threading.Lock()
SQLITE_BUSY_TIMEOUT_MS = 60_000


def get_engine(url: str) -> Engine:
    """One engine per URL per process (engines own connection pools)."""
    with _LOCK:
        engine = _ENGINES.get(url)
        if engine is None:
            engine = _ENGINES[url] = _create(url)
        return engine


def dispose_engines() -> None:
    with _LOCK:
        for engine in _ENGINES.values():
            engine.dispose()
        _ENGINES.clear()


def _create(url: str) -> Engine:
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
        _make_sqlite_transactions_immediate(engine)
        return engine
    if parsed.get_backend_name() == "mysql":
        # utf8mb4 so that any Kubernetes label survives; pre-ping because MySQL drops idle links.
        query = dict(parsed.query)
        query.setdefault("charset", "utf8mb4")
        return create_engine(parsed.set(query=query), pool_pre_ping=True, pool_recycle=3600, **JSON_CODEC)
    return create_engine(url, pool_pre_ping=True, **JSON_CODEC)


def _make_sqlite_transactions_immediate(engine: Engine) -> None:
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
        connection.exec_driver_sql("BEGIN IMMEDIATE")


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction: everything inside commits together or not at all."""
    with engine.begin() as connection:
        yield connection
