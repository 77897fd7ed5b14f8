"""Write-behind: a write transaction's bulk writes run on a helper thread while the run goes on.

At a first run of a large cluster, most of the database's work is inserting rows (a million of
them at 150k pods). Done in line, the collector waits for PostgreSQL's work on every COPY; the
server works in its own process, and psycopg2 lets go of the GIL while it waits, so a helper thread
can have the server take one chunk of rows while the collector converts the next one, and the
machine's second core is used.

What keeps it correct:
- One connection, one transaction: the helper runs its jobs on the transaction's own DBAPI
  connection, in the order they were submitted, and never at the same time as a statement of the
  collector on that connection.
- A statement the collector runs through SQLAlchemy (a read of stored rows, an UPDATE) first waits
  for every submitted job on the tables it names (all jobs, when its tables cannot be told), so it
  sees the transaction's writes exactly as if they had been done in line.
- The transaction commits only after every job ran; a job's error is raised in the collector's
  thread (at its next submit, statement or commit), and the transaction rolls back. When the
  collector fails, the jobs not yet started are dropped and the rollback waits for the running one.
- A commit inside the block first waits for every job; a rollback drops the jobs not started.
- Pending work is bounded (`MAX_PENDING_BYTES` of converted rows): the collector waits rather than
  holding more.
- psycopg2's cursors read a result whole when the statement runs: nothing of the collector's is
  still reading from the connection when a job starts.

Each job makes few GIL round trips (a few statements per chunk of COPY text): each time the helper
wants the GIL back it waits for the collector's thread to give it up (up to the interpreter's
switch interval, 5 ms).

SQLite writes in line. Its work is done in this process by the sqlite3 module, whose `executemany`
gives the GIL back once per row: on a helper thread it was far slower than in line. Multi-row
INSERTs of 5,000 rows on the helper (one round trip per statement) did no better than in line at
5,000 nodes, within the runs' spread, and kept 40-140 MiB more (prepared statements of 5,000 rows,
the helper's allocations): docs/BENCHMARKS.md.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Table, event
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import ColumnClause, TextClause
from sqlalchemy.sql.selectable import TableClause, TextualSelect

MAX_PENDING_BYTES = 24 << 20
_INFO_KEY = "lens_write_behind"
DIALECTS = frozenset({"postgresql"})  # why not SQLite: above

Job = Callable[[Any], None]  # called with a DBAPI cursor of the transaction's connection


class WriteBehindError(RuntimeError):
    """A write that ran behind the collector failed; the transaction is rolled back."""


class WriteBehind:
    """The helper thread of one transaction, and what it has been given to do."""

    def __init__(self, dbapi_connection: Any, max_pending_bytes: int = MAX_PENDING_BYTES) -> None:
        self.dbapi_connection = dbapi_connection
        self._max_pending_bytes = max_pending_bytes
        self._cond = threading.Condition()
        self._jobs: deque[tuple[str, int, Job]] = deque()
        self._tables: dict[str, int] = {}  # table -> jobs submitted and not yet done
        self._pending_bytes = 0
        self._running = False
        self._statement = False  # the collector's thread is running a statement on the connection
        self._waiting: tuple[set[str] | None] | None = None  # the tables a statement waits for
        self._closed = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.jobs_done = 0

    @staticmethod
    def of(conn: Connection) -> WriteBehind | None:
        """The write-behind of the transaction `conn` is in, if it has one."""
        return conn.info.get(_INFO_KEY)

    def submit(self, table: str, size: int, job: Job) -> None:
        """Run `job` after the jobs before it. `size` (bytes of converted rows it holds) counts
        against the pending bound; waits while the bound is exceeded."""
        with self._cond:
            self._resume()
            self._cond.wait_for(
                lambda: self._error is not None or self._pending_bytes < self._max_pending_bytes
            )
            self._raise()
            if self._closed:
                raise RuntimeError("write-behind is closed")
            self._jobs.append((table, size, job))
            self._tables[table] = self._tables.get(table, 0) + 1
            self._pending_bytes += size
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="lens-write-behind", daemon=True)
                thread.start()
                self._thread = thread
            self._cond.notify_all()

    def wait(self, tables: set[str] | None = None) -> None:
        """Until every job on `tables` (every job, when None) has run; raises a job's error."""
        with self._cond:
            self._resume()
            self._cond.wait_for(lambda: self._error is not None or self._settled(tables))
            self._raise()

    def finish(self) -> None:
        """Every job run (before the commit); raises the first job's error."""
        self.wait()
        self._stop()

    def abort(self) -> None:
        """Drop the jobs not started and wait for the running one (before a rollback)."""
        self.discard()
        self._stop()

    def discard(self, forget_error: bool = False) -> None:
        """Drop the jobs not started and wait for the running one; the writer stays usable (after a
        rollback, `forget_error`: what failed was rolled back with the rest)."""
        with self._cond:
            self._resume()
            for table, size, _ in self._jobs:
                self._done(table, size)
            self._jobs.clear()
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._running)
            if forget_error:
                self._error = None

    # The collector's statements on the connection: one at a time with the helper's jobs. A statement
    # that failed has no "after": whatever the collector's thread does next means it is over.
    def before_statement(self, tables: set[str] | None) -> None:
        with self._cond:
            self._resume()
            # While the statement waits, the helper runs only jobs it waits for: otherwise it would
            # take the lock first as soon as each job ends, and the statement would wait for the
            # whole queue instead of the job under way.
            self._waiting = (tables,)
            self._cond.notify_all()
            try:
                self._cond.wait_for(
                    lambda: self._error is not None or (self._settled(tables) and not self._running)
                )
            finally:
                self._waiting = None
                self._cond.notify_all()
            self._raise()
            self._statement = True

    def after_statement(self) -> None:
        with self._cond:
            self._resume()

    def _resume(self) -> None:
        """The collector's thread left its statement (called holding the condition)."""
        if self._statement:
            self._statement = False
            self._cond.notify_all()

    def _may_start(self) -> bool:
        if not self._jobs or self._statement:
            return False
        return self._waiting is None or not self._settled(self._waiting[0])

    def _settled(self, tables: set[str] | None) -> bool:
        if tables is None:
            return not self._jobs and not self._running
        return not any(self._tables.get(t) for t in tables)

    def _raise(self) -> None:
        if self._error is not None:
            raise WriteBehindError(f"a write that ran behind failed: {self._error}") from self._error

    def _done(self, table: str, size: int) -> None:
        left = self._tables[table] - 1
        if left:
            self._tables[table] = left
        else:
            del self._tables[table]
        self._pending_bytes -= size

    def _stop(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._running)
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        try:
            cursor = self.dbapi_connection.cursor()
        except BaseException as exc:  # nothing can run: every job fails with this
            with self._cond:
                self._error = exc
                for table, size, _ in self._jobs:
                    self._done(table, size)
                self._jobs.clear()
                self._cond.notify_all()
            return
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._closed or self._may_start())
                    if not self._may_start():
                        return  # closed, nothing left to run
                    table, size, job = self._jobs.popleft()
                    self._running = True
                try:
                    if self._error is None:
                        job(cursor)
                except BaseException as exc:  # handed to the collector's thread
                    with self._cond:
                        self._error = exc
                finally:
                    with self._cond:
                        self._running = False
                        self._done(table, size)
                        self.jobs_done += 1
                        if self._error is not None:
                            for t, s, _ in self._jobs:
                                self._done(t, s)
                            self._jobs.clear()
                        self._cond.notify_all()
        finally:
            cursor.close()


def _statement_tables(context: Any) -> set[str] | None:
    """The tables a compiled statement names (`statement_tables`)."""
    compiled = getattr(context, "compiled", None)
    return statement_tables(getattr(compiled, "statement", None))


def statement_tables(statement: Any) -> set[str] | None:
    """The tables a statement names; None when it cannot be told: SQL text anywhere in it (a
    `text()` clause, a literal column, a lightweight `table()`) may name any table."""
    if statement is None:
        return None
    tables: set[str] = set()
    for element in visitors.iterate(statement):
        if isinstance(element, TextClause | TextualSelect):
            return None
        if isinstance(element, ColumnClause) and element.is_literal and element.name != "*":
            return None
        if isinstance(element, TableClause) and not isinstance(element, Table):
            return None
        if isinstance(element, Table):
            tables.add(element.name)
        elif isinstance(element, ColumnClause) and isinstance(element.table, Table):
            tables.add(element.table.name)
    return tables or None


@contextmanager
def write_behind(conn: Connection) -> Iterator[WriteBehind | None]:
    """Bulk writes inside run behind on a helper thread (on dialects where that helps): every job is
    done when the block ends normally, dropped when it raises. Yields None elsewhere."""
    if conn.dialect.name not in DIALECTS or WriteBehind.of(conn) is not None:
        yield None
        return
    writer = WriteBehind(conn.connection.dbapi_connection)

    def before(
        _conn: Any, _cursor: Any, _statement: Any, _parameters: Any, context: Any, _many: bool
    ) -> None:
        writer.before_statement(_statement_tables(context))

    def after(*_args: Any) -> None:
        writer.after_statement()

    def commit(_conn: Any) -> None:  # a commit inside the block commits what was submitted
        try:
            writer.wait()
        except WriteBehindError:
            # SQLAlchemy ends its transaction without a rollback when this hook raises: roll the
            # connection back here, so that nothing of it is committed later and it stays usable.
            writer.discard(forget_error=True)
            writer.dbapi_connection.rollback()
            raise

    def rollback(_conn: Any) -> None:  # and a rollback drops it, and forgets a failed write
        writer.discard(forget_error=True)

    listeners = {
        "before_cursor_execute": before,
        "after_cursor_execute": after,
        "commit": commit,
        "rollback": rollback,
    }
    for name, listener in listeners.items():
        event.listen(conn, name, listener)
    conn.info[_INFO_KEY] = writer
    try:
        yield writer
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    finally:
        del conn.info[_INFO_KEY]
        for name, listener in listeners.items():
            event.remove(conn, name, listener)
