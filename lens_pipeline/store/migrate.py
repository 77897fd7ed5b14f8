"""Alembic migrations for the two databases, run by `lens db upgrade` and on first use by the assets.

Each database has its own script directory and version table, so both may even share one
server. Concurrent first runs (several cluster partitions starting at once) are serialized by a
lock that each dialect provides: a file lock beside a SQLite file, `pg_advisory_lock`, `GET_LOCK`.
"""

from __future__ import annotations

import fcntl
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, DateTime, Engine, inspect, text

from lens_pipeline.store.schema import lens_metadata, safe_metadata

Database = Literal["lens", "safe"]
MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLES = {"lens": "lens_alembic_version", "safe": "safe_alembic_version"}
METADATA = {"lens": lens_metadata, "safe": safe_metadata}

_migrated: set[tuple[str, str]] = set()
_migrated_lock = threading.Lock()


def alembic_config(database: Database) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS / database))
    cfg.set_main_option("lens_database", database)
    return cfg


def upgrade(engine: Engine, database: Database, revision: str = "head") -> None:
    """Bring `database` to `revision` (idempotent; safe to call from many processes at once)."""
    with _migration_lock(engine, database), engine.connect() as connection:
        cfg = alembic_config(database)
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)
        connection.commit()


def ensure_schema(engine: Engine, database: Database) -> None:
    """Upgrade once per process and engine; later calls cost nothing."""
    marker = (str(engine.url), database)
    if marker in _migrated:
        return
    with _migrated_lock:
        if marker not in _migrated:
            if current_revision(engine, database) != head_revision(database):
                upgrade(engine, database)
            _migrated.add(marker)


def current_revision(engine: Engine, database: Database) -> str | None:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLES[database]})
        return context.get_current_revision()


def head_revision(database: Database) -> str | None:
    return ScriptDirectory.from_config(alembic_config(database)).get_current_head()


def run_env(context: Any) -> None:
    """The body of both env.py files: online migrations on the connection handed in by `upgrade`."""
    database: Database = context.config.get_main_option("lens_database")
    connection: Connection | None = context.config.attributes.get("connection")
    if connection is None:  # plain `alembic` CLI use: build the engine from the usual settings
        from lens_pipeline import settings
        from lens_pipeline.store.db import get_engine

        url = settings.lens_database_url() if database == "lens" else settings.safe_database_url()
        with get_engine(url).connect() as own:
            _configure_and_run(context, own, database)
            own.commit()
        return
    _configure_and_run(context, connection, database)


def _configure_and_run(context: Any, connection: Connection, database: Database) -> None:
    context.configure(
        connection=connection,
        target_metadata=METADATA[database],
        version_table=VERSION_TABLES[database],
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


@contextmanager
def _migration_lock(engine: Engine, database: Database) -> Iterator[None]:
    dialect = engine.dialect.name
    key = zlib.crc32(f"lens-pipeline-migrate-{database}".encode())
    if dialect == "sqlite":
        db_path = engine.url.database
        if not db_path or db_path == ":memory:":
            yield
            return
        with open(f"{db_path}.migrate.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
    elif dialect == "postgresql":
        with engine.connect() as lock_conn:
            lock_conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            try:
                yield
            finally:
                lock_conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                lock_conn.commit()
    elif dialect in ("mysql", "mariadb"):
        with engine.connect() as lock_conn:
            lock_conn.execute(text("SELECT GET_LOCK(:k, 120)"), {"k": f"lens_migrate_{database}"})
            try:
                yield
            finally:
                lock_conn.execute(text("SELECT RELEASE_LOCK(:k)"), {"k": f"lens_migrate_{database}"})
    else:
        yield


def normalize_sqlite_times(connection: Connection) -> None:
    """Migrations 0009 (Lens) and 0002 (SaFE), on SQLite: every stored time in the text form
    SQLAlchemy compares with (`YYYY-MM-DD HH:MM:SS.ffffff`). Bulk writes used to store a time of
    whole seconds without its fraction, which sorts before the same time with one, so `>=` missed
    the row (an hour's statistics were read as absent and overwritten). A row that cannot take the
    new form because its twin already has it (the same key written since in the new form) is the
    same row written twice: the old one goes."""
    if connection.dialect.name != "sqlite":
        return
    inspector = inspect(connection)
    for table in inspector.get_table_names():
        unique = {c for u in inspector.get_unique_constraints(table) for c in u["column_names"]}
        for column in inspector.get_columns(table):
            if not isinstance(column["type"], DateTime):
                continue
            name = f'"{column["name"]}"'
            connection.exec_driver_sql(
                f"UPDATE OR IGNORE \"{table}\" SET {name} = {name} || '.000000' "
                f"WHERE typeof({name}) = 'text' AND length({name}) = 19"
            )
            if column["name"] in unique:
                connection.exec_driver_sql(
                    f"DELETE FROM \"{table}\" WHERE typeof({name}) = 'text' AND length({name}) = 19"
                )
