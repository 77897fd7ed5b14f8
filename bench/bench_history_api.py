"""Benchmark: the `/v1/gpu-aggregation/*` history routes over a day, loaded by wrk (Debian's
package) from a second process, on `--hours` of hourly rows of a cluster of `--nodes` GPU nodes.

One hour is aggregated by the pipeline's own code from `bench_history.synthetic_hour` (every GPU
held, a workload per 3 nodes), then its rows are stored for every hour (with its allocation
snapshots) by the history's writer; `lens api` serves the database in a subprocess; wrk asks each route for the last
24 hours, first page (20 rows), for `--seconds`.

    .venv/bin/python bench/bench_history_api.py [--nodes 5000] [--hours 72] [--connections 8]
        [--seconds 10] [--database-url postgresql+psycopg2://postgres@127.0.0.1:5432/lens_hist_bench]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench_api import run_wrk, start_api, wait_ready
from bench_history import synthetic_hour

from lens_pipeline.collect.history import hour_tables
from lens_pipeline.store.db import get_engine, write_transaction
from lens_pipeline.store.hourly import replace_hour_tables
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.schema import node

CLUSTER = "bench-history"
ROUTES = {
    "cluster": ("cluster/hourly-stats", {}),
    "namespaces": ("namespaces/hourly-stats", {}),
    "labels": ("labels/hourly-stats", {"dimension_type": "label", "dimension_key": "team"}),
    "workloads": ("workloads/hourly-stats", {}),
    "workloads by utilization": (
        "workloads/hourly-stats",
        {"order_by": "utilization", "order_direction": "desc"},
    ),
    "one namespace's workloads": ("workloads/hourly-stats", {"namespace": "team-3"}),
}


def fill(url: str, nodes: int, hours: int, last: datetime) -> int:
    """`hours` hours of the same aggregated hour, the last one starting at `last`; rows written."""
    engine = get_engine(url)
    ensure_schema(engine, "lens")
    tables = hour_tables(synthetic_hour(nodes))
    now = datetime.now(UTC)
    written = 0
    with write_transaction(engine) as conn:
        conn.execute(
            node.insert().values(cluster_name=CLUSTER, name="n", gpu_count=8, created_at=now, updated_at=now)
        )
    for back in range(hours):
        with write_transaction(engine) as conn:
            written += sum(
                replace_hour_tables(conn, CLUSTER, last - timedelta(hours=back), tables, now).values()
            )
    return written


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--hours", type=int, default=72)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    last = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'lens.db'}"
        began = time.perf_counter()
        written = fill(url, args.nodes, args.hours, last)
        print(
            f"{written} rows of {args.hours} hours of {args.nodes} nodes stored in {time.perf_counter() - began:.0f} s"
        )
        env = {**os.environ, "LENS_DATABASE_URL": url}
        env.pop("LENS_API_TOKEN", None)
        server, base = start_api(env)
        day = {
            "cluster": CLUSTER,
            "start_time": (last - timedelta(hours=23)).isoformat().replace("+00:00", "Z"),
            "end_time": last.isoformat().replace("+00:00", "Z"),
        }
        try:
            wait_ready(base)
            print(
                f"database: {url.split(':', 1)[0]}; wrk -t{min(2, args.connections)} -c{args.connections} -d{args.seconds}s; the last 24 hours"
            )
            for name, (path, params) in ROUTES.items():
                target = f"/v1/gpu-aggregation/{path}?{urllib.parse.urlencode(day | params)}"
                urllib.request.urlopen(f"{base}{target}").read()  # warm
                script = f'request = function() return wrk.format("GET", "{target}") end\n'
                f = run_wrk(base, script, args.connections, args.seconds, Path(tmp), quiet=True)
                print(
                    f"{name:>26}: {f['requests_per_second']:.0f} req/s, p50 {f['p50_ms']:.2f} ms, "
                    f"p99 {f['p99_ms']:.2f} ms, non-2xx {f['non_2xx']:.0f}"
                )
        finally:
            server.terminate()
            server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
