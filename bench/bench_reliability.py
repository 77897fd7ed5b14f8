"""The larger reliability sweep behind docs/RELIABILITY.md: generated hostile container events (half
valid; of the others, 17 kinds the edge refuses and 5 it accepts that no table can hold) over gRPC
streams and HTTP batches at once into one `lens ingest` server, then `container_events` applies the
log. Every answer is checked as in the suite
(`lens_pipeline_tests/ingest/hostile.py`); the figures are printed.

    .venv/bin/python bench/bench_reliability.py                       # 100,000 events, SQLite
    .venv/bin/python bench/bench_reliability.py --events 200000 \\
        --database-url postgresql+psycopg2://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, func, select  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from lens_pipeline.store.db import get_engine  # noqa: E402
from lens_pipeline.store.event_log import dead_letters  # noqa: E402
from lens_pipeline.store.schema import node_container  # noqa: E402
from lens_pipeline_tests.ingest.hostile import MAX_EVENT_BYTES, run_sweep  # noqa: E402
from lens_pipeline_tests.ingest.support import ingest_server, logged  # noqa: E402
from lens_pipeline_tests.ingest.test_quarantine import _run_container_events  # noqa: E402


def _fresh_database(url: str | None, folder: Path) -> str:
    if not url:
        return f"sqlite:///{folder / 'lens.db'}"
    name = f"lens_rel_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    admin.dispose()
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--streams", type=int, default=4, help="concurrent gRPC streams")
    parser.add_argument("--batch", type=int, default=200, help="events per HTTP batch")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--database-url", help="a server to create a fresh database on (default: SQLite)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lens-reliability-") as folder:
        url = _fresh_database(args.database_url, Path(folder))
        with ingest_server(url, max_event_bytes=MAX_EVENT_BYTES) as server:
            figures, valid_ids = run_sweep(
                server, args.events, seed=args.seed, streams=args.streams, batch=args.batch
            )
        unusable = figures.unusable_ids
        logged_ids = {e.container_id for e in logged(url)}
        assert logged_ids == valid_ids | unusable, "the log is not the accepted events"
        started = time.monotonic()
        runs = 0
        while True:  # a run applies at most 200,000 events; the sensor would start the next
            metadata, _check = _run_container_events(url)
            runs += 1
            if metadata["log_ids_left"].value == 0:
                break
        applied_seconds = time.monotonic() - started
        with get_engine(url).connect() as conn:
            applied = conn.scalar(select(func.count()).select_from(node_container))
            letters = {letter["container_id"] for letter in dead_letters(conn)}
        quarantined = len(letters)
        assert applied == len(valid_ids) and letters == unusable, (applied, len(valid_ids), quarantined)
    print(f"database: {make_url(url).get_backend_name()}")
    print(
        f"events: {figures.events} ({figures.valid} valid, {figures.refused} refused at the edge, "
        f"{len(figures.unusable_ids)} accepted but unusable) over "
        f"{figures.grpc_streams} gRPC streams and {figures.http_batches} HTTP batches"
    )
    print(
        f"sent and answered in {figures.send_seconds:.1f} s ({figures.events / figures.send_seconds:,.0f} events/s)"
    )
    print(
        "every accepted event acknowledged and logged once; every refused one answered with a reason; "
        "every valid one applied; every unusable one quarantined"
    )
    print(
        f"applied {applied} containers in {applied_seconds:.1f} s ({runs} container_events runs); quarantined {quarantined}"
    )
    print("hostile kinds: " + ", ".join(f"{k} {n}" for k, n in sorted(figures.kinds.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
