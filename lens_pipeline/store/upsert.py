"""The one write path: bulk upsert on a table's logical key, and snapshot sync built on it.

`bulk_upsert` is one `INSERT ... ON CONFLICT DO UPDATE` (SQLite, PostgreSQL) or `INSERT ... ON
DUPLICATE KEY UPDATE` (MySQL/MariaDB) per batch. `sync_snapshot` compares what a collector saw
with what is stored for the cluster and writes only the difference, so a run with no change
writes no row, and it says what happened to rows that vanished.

Rows go to the driver directly (COPY text on PostgreSQL, multi-row VALUES whose literals we write
on MySQL with PyMySQL, `executemany` on SQLite), converted by each column's own SQLAlchemy bind
processor: at 150k pods, SQLAlchemy's per-row parameter processing and psycopg2's
one-statement-per-row `executemany` were most of a first run's time.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from functools import partial
from operator import itemgetter
from typing import Any, Literal, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    not_,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy import column as sql_column
from sqlalchemy import table as sql_table
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Dialect

from lens_pipeline.memory import paused_gc
from lens_pipeline.store.schema import logical_key
from lens_pipeline.store.write_behind import WriteBehind, statement_tables

BATCH_ROWS = 1000
# Write-behind: converted rows handed to the helper thread in chunks of about this many bytes. Each
# chunk of new rows is one savepoint: at 8 MiB a first run at 150k pods takes 31 in its largest
# transaction, under the 64 subtransactions PostgreSQL caches per transaction (beyond,
# every other session's snapshot has to look them up on disk while the transaction lasts).
CHUNK_BYTES = 8 << 20
# Columns an upsert never overwrites: the surrogate id and the first-seen time.
NEVER_UPDATED = frozenset({"id", "created_at"})

Row = dict[str, Any]


def bulk_upsert(
    conn: Connection,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    *,
    update_columns: Iterable[str] | None = None,
    batch_rows: int = BATCH_ROWS,
    new: bool = False,
) -> int:
    """Insert `rows`, updating the ones whose logical key exists. Returns the number of rows sent.

    Every row must carry the same columns. `update_columns` defaults to every column of the row
    except the key, `id` and `created_at`; an empty list makes conflicts a no-op. `new` says the
    caller found none of the keys stored: PostgreSQL then COPYs the rows straight into the table
    (about half its work at a first run of 110k pods), and upserts them instead, all of them, only
    if a key turns out to be stored after all.
    """
    if not rows:
        return 0
    key = logical_key(table)
    columns = _columns_of(table, rows, key)
    if update_columns is None:
        update_columns = [c for c in columns if c not in key and c not in NEVER_UPDATED]
    update_columns = list(update_columns)
    dialect = conn.dialect
    positions = [columns.index(k) for k in key]
    if not conn.in_transaction():
        conn.begin()  # what `conn.execute` would do: the rows belong to the caller's transaction
    writer = WriteBehind.of(conn)
    if writer is not None:
        _submit(writer, dialect, table, columns, key, update_columns, rows, new=new, batch_rows=batch_rows)
        return len(rows)
    sql = _upsert_sql(dialect, table, columns, key, update_columns)
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]

    def batches() -> Iterator[list[tuple]]:
        # Converted batch by batch: 100k snapshots converted at once would all be JSON text at once.
        for start in range(0, len(rows), batch_rows):
            batch = _driver_values(dialect, table, columns, rows[start : start + batch_rows])
            if update_columns:
                # One multi-row statement may not update the same row twice (PostgreSQL refuses);
                # the last row of a key wins, as it would row by row.
                last = {tuple(v[i] for i in positions): v for v in batch}
                if len(last) != len(batch):
                    batch = list(last.values())
            yield batch

    try:
        if dialect.driver == "pymysql":
            for batch in batches():
                _insert_as_literals(cursor, sql, batch)
        elif dialect.name != "postgresql":
            for batch in batches():
                cursor.executemany(sql, batch)
        else:
            encoding = _python_encoding(cursor.connection)
            target = dialect.identifier_preparer.format_table(table)
            texts = (_copy_text(batch).encode(encoding) for batch in batches())
            if not (new and _copy_new(cursor, target, columns, texts)):
                for batch in batches():
                    _copy_into_stage(cursor, table, columns, _copy_text(batch).encode(encoding))
                    cursor.execute(sql)
    finally:
        cursor.close()
    return len(rows)


def _columns_of(table: Table, rows: Sequence[Mapping[str, Any]], key: Sequence[str]) -> list[str]:
    """The columns every row carries (the same for all, the key among them), in the table's order
    (the order SQLAlchemy's insert constructs put their parameters in), or ValueError."""
    place = {column.name: index for index, column in enumerate(table.c)}
    unknown = [c for c in rows[0] if c not in place]
    if unknown:
        raise ValueError(f"{table.name}: rows have columns the table has not: {unknown}")
    columns = sorted(rows[0], key=place.__getitem__)
    missing = [k for k in key if k not in columns]
    if missing:
        raise ValueError(f"{table.name}: rows lack key columns {missing}")
    keys = rows[0].keys()
    if any(row.keys() != keys for row in rows):
        raise ValueError(f"{table.name}: every row of one upsert must have the same columns")
    return columns


def _submit(
    writer: WriteBehind,
    dialect: Dialect,
    table: Table,
    columns: list[str],
    key: Sequence[str],
    update_columns: list[str],
    rows: Sequence[Mapping[str, Any]],
    *,
    new: bool,
    batch_rows: int,
) -> None:
    """`bulk_upsert` inside a write-behind transaction (PostgreSQL): rows are converted to COPY text
    here, batch by batch, and handed to the helper thread in chunks of about `CHUNK_BYTES`, one job
    (a few statements) each."""
    if update_columns:
        # A chunk holds several batches, and one statement may not update a row twice: the last
        # row of a key wins, as it would row by row.
        getter = itemgetter(*key)
        last = {getter(row): row for row in rows}
        if len(last) != len(rows):
            rows = list(last.values())
    encoding = _python_encoding(writer.dbapi_connection)
    target = dialect.identifier_preparer.format_table(table)
    sql = _upsert_sql(dialect, table, columns, key, update_columns)
    job = partial(_copy_chunk, table, target, columns, sql, new)
    chunk: list[bytes] = []
    size = 0
    for start in range(0, len(rows), batch_rows):
        batch = _driver_columns(dialect, table, columns, rows[start : start + batch_rows])
        piece = _copy_text_of_columns(batch).encode(encoding)
        chunk.append(piece)
        size += len(piece)
        if size >= CHUNK_BYTES or start + batch_rows >= len(rows):
            writer.submit(table.name, size, partial(job, chunk))
            chunk, size = [], 0


def _python_encoding(dbapi_connection: Any) -> str:
    from psycopg2.extensions import encodings  # the COPY path is psycopg2's (`copy_expert`)

    return encodings[dbapi_connection.encoding]


def _copy_chunk(
    table: Table, target: str, columns: Sequence[str], sql: str, new: bool, pieces: list[bytes], cursor: Any
) -> None:
    """PostgreSQL, on the write-behind thread: rows with new keys COPYed straight into the table
    under a savepoint, falling back to the staged upsert if a key is stored after all; other rows
    through the stage."""
    data = b"".join(pieces)
    del pieces[:]
    if new and _copy_new(cursor, target, columns, [data]):
        return
    _copy_into_stage(cursor, table, columns, data)
    cursor.execute(sql)


def _stage_name(table: Table) -> str:
    return f"lens_stage_{table.name}"


def _copy_into_stage(cursor: Any, table: Table, columns: Sequence[str], data: bytes) -> None:
    """PostgreSQL: rows (COPY text) into an empty temporary copy of the table, several times faster
    than a multi-row INSERT to parse; `_upsert_sql` then moves them with one INSERT ... SELECT."""
    stage = _stage_name(table)
    cursor.execute(
        f'CREATE TEMPORARY TABLE IF NOT EXISTS "{stage}" ON COMMIT DROP AS '
        f'SELECT * FROM "{table.name}" WITH NO DATA'
    )
    cursor.execute(f'TRUNCATE "{stage}"')
    _copy(cursor, f'"{stage}"', columns, data)


def _copy_new(cursor: Any, target: str, columns: Sequence[str], texts: Iterable[bytes]) -> bool:
    """PostgreSQL: COPY rows with new keys (COPY text, piece by piece) straight into the table, under
    one savepoint (one subtransaction per call, however many pieces). False, with nothing written,
    when a key is stored after all (written since the caller looked)."""
    from psycopg2.errors import UniqueViolation

    cursor.execute("SAVEPOINT lens_copy_new")
    try:
        for data in texts:
            _copy(cursor, target, columns, data)
    except UniqueViolation:
        cursor.execute("ROLLBACK TO SAVEPOINT lens_copy_new")
        cursor.execute("RELEASE SAVEPOINT lens_copy_new")
        return False
    cursor.execute("RELEASE SAVEPOINT lens_copy_new")
    return True


def _copy_text(batch: list[tuple]) -> str:
    """Rows (tuples of driver values) in COPY's text format."""
    return _copy_text_of_columns([list(column) for column in zip(*batch, strict=True)]) if batch else ""


def _copy_text_of_columns(columns: list[list]) -> str:
    """Rows given column by column in COPY's text format. A column is converted as a whole where its
    values allow (strings with nothing to escape, integers), without a call per value: at 110k
    pods, converting value by value was about 2.5 s of the collector's thread on PostgreSQL."""
    lines = map("\t".join, zip(*map(_copy_column, columns), strict=True))
    return "\n".join(lines) + "\n"


def _copy_column(values: list) -> list[str]:
    kinds = set(map(type, values))
    nullable = type(None) in kinds
    kinds.discard(type(None))
    if kinds <= {str}:
        joined = "".join(filter(None, values))
        if "\\" in joined or "\t" in joined or "\n" in joined or "\r" in joined:
            return list(map(_copy_field, values))  # something to escape: value by value
        return ["\\N" if v is None else v for v in values] if nullable else values
    if kinds <= {int}:  # not bool: its own type, written t/f below
        return ["\\N" if v is None else str(v) for v in values] if nullable else list(map(str, values))
    if kinds == {bool} or (kinds == {datetime} and all(v is None or v.tzinfo is UTC for v in values)):
        # Many rows share a time (a run's `now`) and every row one of two booleans: each distinct
        # value is written once. Times only when all are UTC (as `UTCDateTime` binds them): equal
        # times of other zones, or of one zone's repeated hour (`fold`), are written differently.
        text = {v: _copy_field(v) for v in set(values)}
        return list(map(text.__getitem__, values))
    return list(map(_copy_field, values))


def _insert_as_literals(cursor: Any, sql: str, batch: list[tuple]) -> None:
    """PyMySQL: the statements its `executemany` sends for a multi-row INSERT (the rows as literals
    in its VALUES, in statements of at most the cursor's `max_stmt_length` bytes), with each column's
    literals written by `_literal_column`: the driver's own `escape` of a value, a string at a time
    with `str.translate`, was a quarter of a first run's collector CPU into MariaDB. A server in
    NO_BACKSLASH_ESCAPES mode quotes strings otherwise: the driver writes those rows itself."""
    from pymysql.constants.SERVER_STATUS import SERVER_STATUS_NO_BACKSLASH_ESCAPES
    from pymysql.cursors import RE_INSERT_VALUES

    connection = cursor.connection
    parts = RE_INSERT_VALUES.match(sql)
    if not batch or parts is None or connection.server_status & SERVER_STATUS_NO_BACKSLASH_ESCAPES:
        cursor.executemany(sql, batch)
        return
    encoding = connection.encoding
    # As the driver splits it: `%%` in the statement's own text is `%` once no parameter is left,
    # and each row is the VALUES template filled in.
    prefix = (parts.group(1) % ()).encode(encoding)
    template = parts.group(2).rstrip()
    postfix = ((parts.group(3) or "") % ()).encode(encoding)
    columns = [_literal_column(list(values), connection.escape) for values in zip(*batch, strict=True)]
    statement = bytearray(prefix)
    for literals in zip(*columns, strict=True):
        row = (template % literals).encode(encoding)
        if len(statement) > len(prefix):
            if len(statement) + len(row) + len(postfix) + 1 > cursor.max_stmt_length:
                cursor.execute(bytes(statement + postfix))
                statement = bytearray(prefix)
            else:
                statement += b","
        statement += row
    cursor.execute(bytes(statement + postfix))


# What MySQL's string literals escape with a backslash (PyMySQL's `escape_string`), backslash first.
_MYSQL_ESCAPES = (
    ("\\", "\\\\"),
    ("\0", "\\0"),
    ("\n", "\\n"),
    ("\r", "\\r"),
    ("\x1a", "\\Z"),
    ("'", "\\'"),
    ('"', '\\"'),
)


# Types whose equal values the driver writes alike (unlike 0.0 and -0.0, or Decimal 1.0 and 1.00).
_WRITTEN_ALIKE = (bool, bytes, type(None))


def _literal_column(values: list, escape: Callable[[Any], str]) -> list[str]:
    """A column's values as MySQL literals, each as the driver's `escape` writes it: strings
    escaped with chained `replace`, integers (not booleans) with `str`, times and booleans once
    per distinct value (many rows share a run's `now`), any other value through `escape`."""
    kinds = set(map(type, values))
    kinds.discard(type(None))
    if kinds <= {str}:
        joined = "".join(filter(None, values))
        if any(special in joined for special, _ in _MYSQL_ESCAPES):
            return ["NULL" if v is None else f"'{_mysql_escaped(v)}'" for v in values]
        return ["NULL" if v is None else f"'{v}'" for v in values]
    if kinds <= {int}:
        return ["NULL" if v is None else str(v) for v in values]
    seen: dict[tuple, str] = {}
    literals = []
    for value in values:
        if type(value) is not datetime and type(value) not in _WRITTEN_ALIKE:
            literals.append(escape(value))
            continue
        key = _memo_key(value)  # equal times of two zones are written apart
        literal = seen.get(key)
        if literal is None:
            literal = seen[key] = "NULL" if value is None else escape(value)
        literals.append(literal)
    return literals


def _mysql_escaped(text: str) -> str:
    for special, escaped in _MYSQL_ESCAPES:
        if special in text:
            text = text.replace(special, escaped)
    return text


def _copy(cursor: Any, target: str, columns: Sequence[str], data: bytes) -> None:
    """COPY text, encoded in the connection's encoding, into `target`."""
    names = ", ".join(f'"{c}"' for c in columns)
    # Read in one piece: one send, not one per 8 KiB (each a GIL round trip on the helper thread).
    cursor.copy_expert(f"COPY {target} ({names}) FROM STDIN", io.BytesIO(data), size=len(data) + 1)


def _escaped(text: str) -> str:
    """`text` with COPY's special characters escaped. Chained `replace`, not `str.translate`: a
    translation table that maps a character to two is applied character by character in Python's
    slow path, 25 times slower on a kilobyte of JSON with quotes escaped in it (an annotation such
    as kubectl's last-applied-configuration)."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _copy_field(value: Any) -> str:
    """One value in COPY's text format."""
    if value.__class__ is str:
        # Most strings have nothing to escape; looking costs less than replacing.
        if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
            return _escaped(value)
        return value
    if value is None:
        return "\\N"
    if value is True or value is False:
        return "t" if value else "f"
    if isinstance(value, str):
        return _escaped(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def _upsert_sql(
    dialect: Dialect,
    table: Table,
    columns: Sequence[str],
    key: Sequence[str],
    update_columns: Sequence[str],
) -> str:
    """`_compiled_upsert`, compiled once per table, columns and dialect for the process."""
    return _compiled_upsert(dialect, table, tuple(columns), tuple(key), tuple(update_columns))


@functools.lru_cache(maxsize=512)
def _compiled_upsert(
    dialect: Dialect,
    table: Table,
    columns: tuple[str, ...],
    key: tuple[str, ...],
    update_columns: tuple[str, ...],
) -> str:
    """The dialect's upsert of `columns` on the logical `key` (SQLAlchemy's own insert constructs),
    as SQL text with positional parameters in `columns` order, for the driver's `executemany`
    (SQLite, MySQL) or over the COPY stage (PostgreSQL): executed on the raw cursor, it costs
    what hand-written text cost (docs/BENCHMARKS.md)."""
    values: dict[str, Any] = {c: bindparam(c) for c in columns}
    if dialect.name in ("mysql", "mariadb"):
        stmt = mysql.insert(table).values(values)
        # MySQL has no DO NOTHING: a key column assigned itself is the no-op update.
        sets = {c: stmt.inserted[c] for c in update_columns} or {key[0]: table.c[key[0]]}
        return _positional(stmt.on_duplicate_key_update(sets), dialect, columns)
    if dialect.name == "postgresql":
        stage = sql_table(_stage_name(table), *(sql_column(c) for c in columns))
        insert_stmt = postgresql.insert(table).from_select(list(columns), select(stage))
        if not update_columns:
            return str(insert_stmt.on_conflict_do_nothing(index_elements=list(key)).compile(dialect=dialect))
        sets = {c: insert_stmt.excluded[c] for c in update_columns}
        return str(
            insert_stmt.on_conflict_do_update(index_elements=list(key), set_=sets).compile(dialect=dialect)
        )
    if dialect.name == "sqlite":
        lite = sqlite.insert(table).values(values)
        if not update_columns:
            return _positional(lite.on_conflict_do_nothing(index_elements=list(key)), dialect, columns)
        updates = {c: lite.excluded[c] for c in update_columns}
        return _positional(
            lite.on_conflict_do_update(index_elements=list(key), set_=updates), dialect, columns
        )
    raise NotImplementedError(f"bulk upsert does not support the {dialect.name!r} dialect")


def _positional(stmt: Any, dialect: Dialect, columns: Sequence[str]) -> str:
    """`stmt` as text whose parameters are positional, in `columns` order: PyMySQL's dialect names
    its parameters, and the driver takes `%s` too (a dialect of the same class, positional; it
    renders `VALUES(c)` in ON DUPLICATE KEY UPDATE, which MariaDB and MySQL both take)."""
    if not dialect.positional:
        dialect = type(dialect)(paramstyle="format")  # type: ignore[call-arg]
    compiled = stmt.compile(dialect=dialect)
    if list(compiled.positiontup or ()) != list(columns):
        raise RuntimeError(f"upsert of {columns!r} compiled with parameters {compiled.positiontup!r}")
    return str(compiled)


def _driver_values(
    dialect: Dialect, table: Table, columns: Sequence[str], rows: Sequence[Mapping]
) -> list[tuple]:
    """Each row as a tuple the driver takes (`_driver_columns`, row by row)."""
    return list(zip(*_driver_columns(dialect, table, columns, rows), strict=True))


def _driver_columns(
    dialect: Dialect, table: Table, columns: Sequence[str], rows: Sequence[Mapping]
) -> list[list]:
    """The values of each column as the driver takes them, through the column type's bind processor
    (timestamps to UTC, JSON to text...); a column without one passes its values through untouched."""
    by_column = [[row[c] for row in rows] for c in columns]
    for column, values in zip(columns, by_column, strict=True):
        # The dialect's own type: a TypeDecorator's bind_processor alone applies only the generic
        # type's (SQLite then got datetimes in another text form than its queries compare with).
        column_type = table.c[column].type.dialect_impl(dialect)
        process = column_type.bind_processor(dialect)
        if process is not None:
            _convert(values, process)
    return by_column


def _memo_key(value: Any) -> tuple:
    """What tells a value apart from another when each distinct one is converted once: its type
    (True, 1 and 1.0 stay apart) and, for a time, its offset (equal times of two zones, or of one
    zone's repeated hour, `fold`, are different text or instants)."""
    return (datetime, value, value.utcoffset()) if type(value) is datetime else (type(value), value)


def _convert(values: list, process: Callable[[Any], Any]) -> None:
    # Many rows share a value (a run's `now`, a phase): convert each distinct hashable one once.
    # The type is part of the key, so that True, 1 and 1.0 stay apart.
    if isinstance(next((v for v in values if v is not None), None), dict | list):
        # A JSON column's documents cannot be keys: each converted, without first failing to hash
        # it (the failed hash was half the cost of a snapshot column).
        for n, value in enumerate(values):
            if value is not None:
                values[n] = process(value)
        return
    seen: dict[tuple, Any] = {}
    for n, value in enumerate(values):
        if value is None:
            continue
        try:
            key = _memo_key(value)
            converted = seen.get(key, seen)
            if converted is seen:
                converted = seen[key] = process(value)
        except TypeError:  # unhashable: a dict or list for a JSON column
            converted = process(value)
        values[n] = converted


@dataclass
class SyncResult:
    """What a snapshot sync did, for run metadata."""

    inserted: list[tuple] = field(default_factory=list)
    updated: list[tuple] = field(default_factory=list)
    unchanged: int = 0
    vanished: list[tuple] = field(default_factory=list)

    @property
    def written(self) -> int:
        return len(self.inserted) + len(self.updated) + len(self.vanished)


Vanish = Literal["delete", "keep"] | Mapping[str, Any] | Callable[[Row], Row]


def sync_snapshot(
    conn: Connection,
    table: Table,
    scope: Mapping[str, Any],
    rows: Sequence[Row],
    *,
    now: datetime,
    compare: Sequence[str] | None = None,
    on_vanish: Vanish = "delete",
    protect: Iterable[tuple] = (),
    may_vanish: ColumnElement[bool] | None = None,
    extra_columns: Sequence[str] = (),
    settled: ColumnElement[bool] | None = None,
    unchanged: Mapping[tuple, tuple] | None = None,
    unchanged_columns: Sequence[str] = (),
) -> SyncResult:
    """Make the stored rows under `scope` (e.g. one cluster) equal `rows`, writing only what differs.

    - New keys are inserted with `created_at` and `updated_at` = `now` (where the table has them);
      rows whose `compare` columns changed are upserted with `updated_at` = `now`.
    - Stored keys absent from `rows` have vanished: deleted, left alone (`"keep"`), or updated
      with a mapping of column values (e.g. `{"deleted": True}`), or with a function of the stored
      row. Keys in `protect` (objects seen but unreadable this run) never count as vanished, nor do
      stored rows that do not match `may_vanish` (e.g. already marked: a condition, so that the
      database, not this process, sets aside the rows marked in earlier runs). `extra_columns` are
      read from the stored rows for `on_vanish` without being compared.
    - Stored rows matching `settled` (e.g. pods marked deleted, which pile up) are not read back
      every run; a row seen again whose key is among them is fetched by its key, so it is
      compared and updated like any other.
    - `unchanged` names keys seen this run whose stored row is known to hold what was seen (the
      object did not change since the row was written from it) but for `unchanged_columns`, whose
      values it gives (a tuple per key, in that order): only these are read back and compared, and
      written when they differ. Each must have a stored row that is not `settled`. The stored rows
      of `rows` are then read by their keys: a run where little changed reads little.
    """
    with paused_gc():
        return _sync(
            conn,
            table,
            scope,
            rows,
            now,
            _SyncRules(compare, on_vanish, protect, may_vanish, extra_columns, settled),
            unchanged,
            tuple(unchanged_columns),
        )


def read_rows(conn: Connection, query: Select) -> list[tuple]:
    """The rows of `query`, each a tuple of the values SQLAlchemy would give (its columns' result
    processors), fetched by the driver's own cursor: at 100k rows, SQLAlchemy's row objects cost
    several times what the driver does. On the connection's transaction, after the writes behind
    it on the same tables (`write_behind`)."""
    dialect = conn.dialect
    compiled = query.compile(dialect=dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.params
    arguments: Any = [params[name] for name in compiled.positiontup or ()] if dialect.positional else params
    if not conn.in_transaction():
        conn.begin()  # what `conn.execute` would do
    writer = WriteBehind.of(conn)
    if writer is not None:
        writer.before_statement(statement_tables(query))
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(compiled.string, arguments)
        records = cursor.fetchall()
        # With the driver's type of each column, as SQLAlchemy hands it to them.
        processors = [
            (n, process)
            for n, (column, described) in enumerate(
                zip(query.selected_columns, cursor.description, strict=True)
            )
            if (process := column.type.dialect_impl(dialect).result_processor(dialect, described[1]))
            is not None
        ]
    finally:
        cursor.close()
        if writer is not None:
            writer.after_statement()
    if not processors:
        return list(map(tuple, records))
    converted = []
    for record in records:
        values = list(record)
        for n, process in processors:
            values[n] = process(values[n])
        converted.append(tuple(values))
    return converted


@dataclass(frozen=True)
class _SyncRules:
    compare: Sequence[str] | None
    on_vanish: Vanish
    protect: Iterable[tuple]
    may_vanish: ColumnElement[bool] | None
    extra_columns: Sequence[str]
    settled: ColumnElement[bool] | None


class _Stored:
    """The stored rows of one sync's scope that it reads: whole (key, compared and extra columns, as
    tuples: at 100k rows, a dict per row was a good part of a no-change run), by key when asked.
    With `may_vanish`, each read also asks the database whether the row matches it: `vanishable`
    holds the keys of those that do."""

    def __init__(
        self,
        conn: Connection,
        table: Table,
        scope: Mapping[str, Any],
        columns: list[str],
        may_vanish: ColumnElement[bool] | None,
    ) -> None:
        self.conn, self.table, self.columns = conn, table, columns
        self.key = logical_key(table)
        self.where = and_(*(table.c[k] == v for k, v in scope.items()))
        self.flag = () if may_vanish is None else (case((may_vanish, 1), else_=0),)
        self.query = select(*(table.c[c] for c in columns), *self.flag)
        self.rows: dict[tuple, tuple] = {}
        self.vanishable: set[tuple] = set()

    def may_vanish(self, row_key: tuple) -> bool:
        return not self.flag or row_key in self.vanishable

    def read(self, condition: ColumnElement[bool]) -> None:
        width = len(self.key)
        for record in read_rows(self.conn, self.query.where(self.where, condition)):
            row_key = record[:width]
            if self.flag:
                flag, record = record[-1], record[:-1]
                if flag:
                    self.vanishable.add(row_key)
            self.rows[row_key] = record

    def read_keys(self, keys: Sequence[tuple]) -> None:
        key_expr = tuple_(*(self.table.c[k] for k in self.key))
        for start in range(0, len(keys), BATCH_ROWS):
            self.read(key_expr.in_(keys[start : start + BATCH_ROWS]))

    def brief(self, condition: ColumnElement[bool], columns: Sequence[str]) -> dict[tuple, tuple]:
        """key -> values of `columns` of the rows matching `condition`."""
        width, end = len(self.key), len(self.key) + len(columns)
        query = select(*(self.table.c[c] for c in [*self.key, *columns]), *self.flag)
        brief = {}
        for record in read_rows(self.conn, query.where(self.where, condition)):
            brief[record[:width]] = record[width:end]
            if self.flag and record[end]:
                self.vanishable.add(record[:width])
        return brief

    def count(self, condition: ColumnElement[bool]) -> int:
        return (
            self.conn.execute(
                select(func.count()).select_from(self.table).where(self.where, condition)
            ).scalar()
            or 0
        )


def _sync(
    conn: Connection,
    table: Table,
    scope: Mapping[str, Any],
    rows: Sequence[Row],
    now: datetime,
    rules: _SyncRules,
    unchanged: Mapping[tuple, tuple] | None,
    unchanged_columns: tuple[str, ...],
) -> SyncResult:
    key = logical_key(table)
    if rules.compare is None:
        # The rows' own columns; with no row at all, every column, so that what decides about the
        # rows that vanished (`on_vanish`) can read any of them.
        columns = rows[0] if rows else [c.name for c in table.c]
        compare = [c for c in columns if c not in key]
    else:
        compare = list(rules.compare)
    columns = list(dict.fromkeys([*key, *compare, *rules.extra_columns]))
    stored = _Stored(conn, table, scope, columns, rules.may_vanish)
    live = true() if rules.settled is None else not_(rules.settled)
    key_of = _getter(key)
    row_keys = list(map(key_of, rows))
    brief: dict[tuple, tuple] = {}
    if unchanged is None:
        stored.read(live)
    else:
        brief = stored.brief(live, unchanged_columns)
        changed = [k for k in row_keys if k in brief]
        if len(changed) > len(brief) // 4:  # much changed: one scan reads less than many lookups
            stored.read(live)
        else:
            stored.read_keys(changed)
    if rules.settled is not None:
        unread = [k for k in row_keys if k not in stored.rows]
        # A few are looked up at once; many (a first run) only if any row is settled at all.
        if len(unread) <= BATCH_ROWS or stored.count(rules.settled):
            stored.read_keys(unread)

    result = SyncResult()
    _write_rows(
        conn,
        table,
        rows,
        row_keys,
        stored.rows,
        slice(len(key), len(key) + len(compare)),
        _getter(compare),
        now,
        result,
    )
    seen = set(row_keys)
    if unchanged is not None:
        seen.update(unchanged)
        _write_unchanged(conn, table, key, unchanged, unchanged_columns, brief, now, result)

    protected = set(rules.protect)

    def vanishes(k: tuple) -> bool:
        return k not in seen and k not in protected and stored.may_vanish(k)

    if unchanged is not None:
        # Only the rows that may vanish are read whole: not the ones marked in earlier runs.
        stored.read_keys([k for k in brief if k not in stored.rows and vanishes(k)])
    gone = {
        k: dict(zip(stored.columns, record, strict=True)) for k, record in stored.rows.items() if vanishes(k)
    }
    vanished = list(gone)
    result.vanished = vanished
    if vanished and rules.on_vanish != "keep":
        _apply_vanish(conn, table, key, vanished, gone, rules.on_vanish, now, "updated_at" in table.c)
    return result


def _write_rows(
    conn: Connection,
    table: Table,
    rows: Sequence[Row],
    row_keys: list[tuple],
    stored: Mapping[tuple, tuple],
    compared: slice,
    values_of: Callable[[Row], tuple],
    now: datetime,
    result: SyncResult,
) -> None:
    """Insert the rows whose key is not stored, update the ones that differ from the stored row."""
    inserts: list[Row] = []
    updates: list[Row] = []
    for row, row_key in zip(rows, row_keys, strict=True):
        previous = stored.get(row_key)
        if previous is None:
            inserts.append(row)
            result.inserted.append(row_key)
        elif previous[compared] != values_of(row) and _row_differs(previous[compared], values_of(row)):
            updates.append(row)
            result.updated.append(row_key)
        else:
            result.unchanged += 1
    # A row may bring its own created_at (an object's creation time); otherwise it is first-seen time.
    # Updates carry it too: an upsert's INSERT half must satisfy NOT NULL, and the conflict update
    # never overwrites created_at (NEVER_UPDATED).
    first_seen = {"created_at": now} if "created_at" in table.c else {}
    stamp = {"updated_at": now} if "updated_at" in table.c else {}
    for changed, new in ((inserts, True), (updates, False)):
        if changed:
            bulk_upsert(conn, table, [{**first_seen, **row, **stamp} for row in changed], new=new)


def _write_unchanged(
    conn: Connection,
    table: Table,
    key: Sequence[str],
    unchanged: Mapping[tuple, tuple],
    columns: tuple[str, ...],
    brief: Mapping[tuple, tuple],
    now: datetime,
    result: SyncResult,
) -> None:
    """Compare and write the `columns` of the rows said unchanged but for them."""
    updates: list[Row] = []
    for row_key, values in unchanged.items():
        before = brief.get(row_key)
        if before is None:
            raise RuntimeError(f"{table.name}: {row_key} was said unchanged, but no such row is stored")
        if before != values and _row_differs(before, values):
            updates.append(
                {**dict(zip(key, row_key, strict=True)), **dict(zip(columns, values, strict=True))}
            )
            result.updated.append(row_key)
        else:
            result.unchanged += 1
    if updates:
        # Every key is stored (checked above): the upsert only updates these columns.
        stamp = {"updated_at": now} if "updated_at" in table.c else {}
        bulk_upsert(conn, table, [{**row, **stamp} for row in updates], update_columns=[*columns, *stamp])


def _getter(columns: Sequence[str]) -> Callable[[Row], tuple]:
    """A row's values of `columns` as a tuple (a missing column reads as None)."""
    if len(columns) < 2:
        return lambda row: tuple(row.get(c) for c in columns)
    get = itemgetter(*columns)

    def values(row: Row) -> tuple:
        try:
            return get(row)
        except KeyError:
            return tuple(row.get(c) for c in columns)

    return values


def _apply_vanish(
    conn: Connection,
    table: Table,
    key: Sequence[str],
    vanished: list[tuple],
    stored: Mapping[tuple, Row],
    on_vanish: Vanish,
    now: datetime,
    has_updated: bool,
) -> None:
    key_expr = tuple_(*(table.c[k] for k in key))
    if on_vanish == "delete":
        for start in range(0, len(vanished), BATCH_ROWS):
            conn.execute(delete(table).where(key_expr.in_(vanished[start : start + BATCH_ROWS])))
        return
    if callable(on_vanish):
        rows = [{**dict(zip(key, k, strict=True)), **on_vanish(stored[k])} for k in vanished]
        stamp = {"updated_at": now} if has_updated else {}
        bulk_upsert(conn, table, [{**row, **stamp} for row in rows])
        return
    marks = cast(Mapping[str, Any], on_vanish)  # not "delete", "keep" nor callable: the columns to set
    values = {**dict(marks), **({"updated_at": now} if has_updated else {})}
    for start in range(0, len(vanished), BATCH_ROWS):
        conn.execute(update(table).where(key_expr.in_(vanished[start : start + BATCH_ROWS])).values(**values))


def _row_differs(stored: tuple, seen: tuple) -> bool:
    # Called only when exact tuple equality (the common case, one C-level comparison) failed.
    return any(_differs(a, b) for a, b in zip(stored, seen, strict=True))


def _differs(stored: Any, seen: Any) -> bool:
    if isinstance(stored, float) or isinstance(seen, float):
        if stored is None or seen is None:
            return stored is not seen
        return abs(float(stored) - float(seen)) > 1e-9 * max(1.0, abs(float(seen)))
    return stored != seen
