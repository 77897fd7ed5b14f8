"""Two runs that read the same statistics cursor of a cluster: the second to write waits for the
first and then learns the window was added already, on every dialect, with real concurrent
transactions."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, update

from lens_pipeline.store.db import get_engine, write_transaction
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.schema import workload_statistic
from lens_pipeline.store.statistics import claim_statistics_window, statistics_cursor

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
HOLD = 0.8  # seconds the first writer keeps its transaction open


def _row(cluster: str) -> dict:
    return {
        "cluster_name": cluster,
        "uid": "w-1",
        "namespace": "ml",
        "workload_name": "train",
        "workload_type": "Job",
        "stat_start_time": T0,
        "stat_end_time": T0,
        "labels": {},
        "annotations": {},
        "created_at": T0,
        "updated_at": T0,
        "last_query_time": T0,
    }


def test_the_second_writer_of_a_window_waits_and_writes_nothing(lens_url):
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    with write_transaction(engine) as conn:
        conn.execute(insert(workload_statistic), [_row("east"), {**_row("west"), "uid": "w-2"}])
    with engine.connect() as conn:
        read_by_both = statistics_cursor(conn, "east")
    assert read_by_both == T0

    first_claimed = threading.Event()
    outcome: dict[str, object] = {}

    def first() -> None:
        with write_transaction(engine) as conn:
            outcome["first"] = claim_statistics_window(conn, "east", read_by_both)
            conn.execute(
                update(workload_statistic)
                .where(workload_statistic.c.cluster_name == "east")
                .values(last_query_time=T0 + timedelta(seconds=30))
            )
            first_claimed.set()
            time.sleep(HOLD)

    thread = threading.Thread(target=first)
    thread.start()
    assert first_claimed.wait(30)
    started = time.monotonic()
    with write_transaction(engine) as conn:
        outcome["second"] = claim_statistics_window(conn, "east", read_by_both)
    waited = time.monotonic() - started
    thread.join(30)

    assert outcome == {"first": True, "second": False}
    assert waited >= HOLD / 2  # it waited for the first writer's commit
    # Another cluster's writer is not held up by this one, and its cursor is its own.
    with write_transaction(engine) as conn:
        assert claim_statistics_window(conn, "west", T0)
