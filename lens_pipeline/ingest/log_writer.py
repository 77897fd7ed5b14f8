"""Group commit into the event log: one thread writes what every stream has queued, in one
transaction per round, and only then tells each stream how far it is committed.

Streams (`Producer`) append rows as they arrive; the writer takes everything queued when it is
free (waiting up to `linger` for a round to fill), so under load a commit carries thousands of
events and when idle an event waits at most `linger`. A failed commit is retried with backoff
and nothing is acknowledged meanwhile; producers block (back-pressure) when too much waits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from lens_pipeline.retry import LOG_COMMIT
from lens_pipeline.store.event_log import append_events, log_transaction

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Producer:
    """One stream's (or one HTTP request's) queue into the log.

    `on_commit(last_seq, received)` is called from the writer thread once everything the
    producer had offered up to `last_seq` is committed; `received` holds, per offer of that round
    with rows, its monotonic receive time and how many rows it had (for the processing-duration
    histogram: the rows of one message share their receive time).
    """

    on_commit: Callable[[int, list[tuple[float, int]]], None]
    rows: list[dict] = field(default_factory=list)
    received: list[tuple[float, int]] = field(default_factory=list)
    last_seq: int = 0
    queued: bool = False


class LogWriter:
    def __init__(
        self,
        engine: Engine,
        *,
        linger_seconds: float = 0.002,
        max_pending_rows: int = 50_000,
        on_health: Callable[[bool], None] = lambda healthy: None,
        on_quarantine: Callable[[dict, str], None] = lambda row, reason: None,
    ) -> None:
        self.engine = engine
        self.on_quarantine = on_quarantine
        self.linger_seconds = linger_seconds
        self.max_pending_rows = max_pending_rows
        self.on_health = on_health
        self._lock = threading.Condition()
        self._queued: list[Producer] = []
        self._pending_rows = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="lens-ingest-log-writer", daemon=True)
        self.commits = 0
        self.committed_rows = 0
        self.retries = 0  # commits tried again (database away), each after a backoff

    def start(self) -> None:
        self._thread.start()

    @property
    def pending_rows(self) -> int:
        return self._pending_rows

    def offer(self, producer: Producer, rows: list[dict], seq: int, received: float) -> None:
        """Queue `rows` (a message's accepted events; none when all were refused, which only moves
        the sequence to `seq`) for the next round."""
        with self._lock:
            if rows:
                producer.rows += rows
                producer.received.append((received, len(rows)))
                self._pending_rows += len(rows)
            producer.last_seq = seq
            if not producer.queued:
                producer.queued = True
                self._queued.append(producer)
                self._lock.notify()

    def stop(self, timeout: float = 30.0) -> None:
        """Commit what is queued, then stop."""
        with self._lock:
            self._stopping = True
            self._lock.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queued and not self._stopping:
                    self._lock.wait()
                if not self._queued and self._stopping:
                    return
            if self.linger_seconds and not self._stopping:
                time.sleep(self.linger_seconds)  # let concurrent streams join this round
            with self._lock:
                round_, self._queued = self._queued, []
                taken = []
                for producer in round_:
                    taken.append((producer, producer.rows, producer.received, producer.last_seq))
                    producer.rows, producer.received, producer.queued = [], [], False
            rows = [row for _, batch, _, _ in taken for row in batch]
            self._commit(rows)
            with self._lock:
                self._pending_rows -= len(rows)
            for producer, _, received, last_seq in taken:
                producer.on_commit(last_seq, received)

    def _commit(self, rows: list[dict]) -> None:
        if not rows:
            return
        for delay in LOG_COMMIT.delays():
            quarantined: list[tuple[dict, str]] = []
            try:
                with log_transaction(self.engine) as conn:
                    append_events(conn, rows, quarantined)
                self.commits += 1
                self.committed_rows += len(rows)
                self.on_health(True)
                for row, reason in quarantined:  # kept whole in the dead-letter table, not lost
                    log.error("event of cluster %s quarantined: %s", row.get("cluster_name"), reason)
                    self.on_quarantine(row, reason)
                return
            except (OperationalError, DBAPIError) as exc:
                # Nothing is acknowledged until the round commits; the agents keep their events.
                self.on_health(False)
                log.warning(
                    "event log commit of %d events failed, retrying in %.1f s: %s",
                    len(rows),
                    delay,
                    str(exc).splitlines()[0],
                )
            except Exception:
                # Not the database's weather: still never lose the round or the writer thread.
                self.on_health(False)
                log.exception("event log commit of %d events failed, retrying in %.1f s", len(rows), delay)
            self.retries += 1
            time.sleep(delay)
