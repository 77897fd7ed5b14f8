"""Group commit into the event log: one thread writes what every stream has queued, in one
transaction per round, and only then tells each stream how far it is committed.

Streams (`Producer`) append rows as they arrive; the writer takes everything queued when it is
free (waiting up to `linger` for a round to fill), so under load a commit carries thousands of
events and when idle an event waits at most `linger`. A commit that failed because the database is
away is retried with backoff and nothing is acknowledged meanwhile; one that failed for what it
holds is split until the culprits are alone, and they go to the dead-letter table. Producers block
(back-pressure) when too much waits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Engine, text

from lens_pipeline.retry import LOG_COMMIT
from lens_pipeline.store.db import database_unavailable
from lens_pipeline.store.event_log import append_events, log_transaction, quarantine, received_dead_letter_row

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
        self.lost = 0  # events that could not be stored even in the dead-letter table (never seen)

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
        """Commit the round. A part that fails for what it holds, not for the database's weather, is
        split until the events that cannot be stored are alone; those go to the dead-letter table,
        and everything else of the round is committed (and so acknowledged)."""
        parts = [rows] if rows else []
        while parts:
            part = parts.pop()
            error = self._commit_part(part)
            if error is None:
                continue
            if len(part) == 1:
                self._set_aside(part[0], error)
            else:  # the first half is tried first: the log keeps the order of the round
                half = len(part) // 2
                parts += [part[half:], part[:half]]

    def _commit_part(self, rows: list[dict]) -> Exception | None:
        """Commit `rows` in one transaction: None once done, or the error that says the rows
        themselves cannot be stored. While the database is away, wait with backoff and try again,
        for as long as it takes: nothing is acknowledged meanwhile, and the agents keep their events."""
        quarantined: list[tuple[dict, str]] = []

        def append() -> None:
            quarantined.clear()
            with log_transaction(self.engine) as conn:
                append_events(conn, rows, quarantined)

        error = self._until_stored(append, f"event log commit of {len(rows)} events")
        if error is not None:
            return error
        self.commits += 1
        self.committed_rows += len(rows)
        for row, reason in quarantined:  # kept whole in the dead-letter table, not lost
            log.error("event of cluster %s quarantined: %s", row.get("cluster_name"), reason)
            self.on_quarantine(row, reason)
        return None

    def _until_stored(self, write: Callable[[], None], what: str) -> Exception | None:
        """Run `write` until it succeeds (None), waiting out an unavailable database with the one
        backoff table; an error of another kind is returned at once. So is a failure that the
        driver calls operational but that repeats while the database answers (MySQL reports some
        refused values so): the data's fault, not the weather's."""
        delays = LOG_COMMIT.delays()
        strikes = 0
        while True:
            try:
                write()
            except Exception as exc:
                self.on_health(False)
                if not database_unavailable(exc):
                    log.warning("%s failed for what it holds: %s", what, _first_line(exc))
                    return exc
                strikes = strikes + 1 if self._database_answers() else 0
                if strikes >= STRIKES_WHILE_ANSWERING:
                    log.warning(
                        "%s failed %d times while the database answers: %s", what, strikes, _first_line(exc)
                    )
                    return exc
                delay = next(delays)
                log.warning("%s failed, retrying in %.1f s: %s", what, delay, _first_line(exc))
                self.retries += 1
                time.sleep(delay)
                continue
            self.on_health(True)
            return None

    def _database_answers(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception:
            return False
        return True

    def _set_aside(self, row: dict, error: Exception) -> None:
        """An event that cannot be logged: into the dead-letter table, whole (or, should even that
        fail, its payload and cluster alone), so that the round and the stream go on."""
        reason = f"the event log could not store this event: {type(error).__name__}: {_first_line(error)}"
        received = received_dead_letter_row(row)
        for letter in (received, _bare_letter(received)):

            def keep(letter: dict = letter) -> None:
                with log_transaction(self.engine) as conn:
                    quarantine(conn, "log", [(letter, reason)])

            if self._until_stored(keep, "quarantine of an event") is None:
                log.error("event of cluster %s quarantined: %s", row.get("cluster_name"), reason)
                self.on_quarantine(row, reason)
                return
        # Not even its payload could be stored: acknowledged with its round all the same (a stream's
        # acknowledgement covers every event before it), and said as loudly as can be.
        self.lost += 1
        log.critical(
            "event of cluster %s could not be stored at all and is lost: %s", row.get("cluster_name"), reason
        )


# Operational failures in a row, with the database answering, before a part counts as unstorable.
STRIKES_WHILE_ANSWERING = 3


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0][:300]


def _bare_letter(letter: dict) -> dict:
    """A dead-letter row with only what any database stores: text cluster name and bytes payload."""
    payload = letter.get("payload")
    return {
        "cluster_name": str(letter.get("cluster_name") or ""),
        "payload": payload if isinstance(payload, bytes) else repr(payload).encode(),
    }
