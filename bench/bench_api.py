"""Benchmark: `GET /v1/clusters/overview` from the cache, loaded by wrk (Debian's package) from a
second process, and the live fallback for a 5,000-node cluster with no cached row.

The database gets `--clusters` cached overview rows and one uncached cluster of `--live-nodes`
GPU nodes; `lens api` serves it in a subprocess; wrk asks for a random cached cluster each request.

    .venv/bin/python bench/bench_api.py [--clusters 1000] [--connections 16] [--seconds 20]
        [--workers 1] [--database-url postgresql+psycopg2://postgres@127.0.0.1:5432/lens_api_bench]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from lens_pipeline.collect.overview import NODE_COUNTS, OVERVIEW_FIGURES
from lens_pipeline.store.db import get_engine, write_transaction
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.overview import write_overview
from lens_pipeline.store.schema import node
from lens_pipeline.store.upsert import bulk_upsert

LIVE_CLUSTER = "live-5000"
WRK_SCRIPT = """
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/v1/clusters/overview?cluster=bench-" .. math.random(0, {last}))
end
"""


def fill(url: str, clusters: int, live_nodes: int) -> None:
    engine = get_engine(url)
    ensure_schema(engine, "lens")
    now = datetime.now(UTC)
    rng = random.Random(1)
    with write_transaction(engine) as conn:
        for i in range(clusters):
            figures = {name: float(rng.randint(0, 500)) for name in OVERVIEW_FIGURES}
            figures.update({name: rng.randint(0, 500) for name in NODE_COUNTS})
            write_overview(conn, f"bench-{i}", figures, now=now)
        rows = [
            {
                "cluster_name": LIVE_CLUSTER,
                "name": f"node-{i:05d}",
                "address": f"10.0.{i // 250}.{i % 250}",
                "gpu_name": "AMD Instinct MI300X",
                "gpu_count": 8,
                "gpu_allocation": rng.randint(0, 8),
                "gpu_utilization": rng.uniform(0, 100),
                "status": "Ready" if i % 50 else "NotReady",
                "taints": {"taints": []},
                "labels": {},
                "annotations": {},
                "created_at": now,
                "updated_at": now,
            }
            for i in range(live_nodes)
        ]
        bulk_upsert(conn, node, rows)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(base: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/healthz", timeout=2).read()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("lens api did not start")


def run_wrk(base: str, clusters: int, connections: int, seconds: int, work: Path) -> dict[str, float]:
    script = work / "overview.lua"
    script.write_text(WRK_SCRIPT.format(last=clusters - 1))
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), base],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    figures = {"requests_per_second": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))}
    for percentile in ("50", "90", "99"):
        value, unit = re.search(rf"^\s+{percentile}%\s+([\d.]+)(us|ms|s)", out, re.M).groups()
        figures[f"p{percentile}_ms"] = float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    figures["non_2xx"] = float(errors.group(1)) if errors else 0.0
    print(out)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--live-nodes", type=int, default=5000)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        url = args.database_url or f"sqlite:///{work / 'lens.db'}"
        fill(url, args.clusters, args.live_nodes)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = {**os.environ, "LENS_DATABASE_URL": url}
        env.pop("LENS_API_TOKEN", None)
        server = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from lens_pipeline.cli import main; raise SystemExit(main())",
                "api",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(args.workers),
            ],
            env=env,
        )
        try:
            wait_ready(base)
            urllib.request.urlopen(f"{base}/v1/clusters/overview?cluster=bench-0").read()
            cached = run_wrk(base, args.clusters, args.connections, args.seconds, work)
            live = []
            for _ in range(20):
                started = time.perf_counter()
                urllib.request.urlopen(f"{base}/v1/clusters/overview?cluster={LIVE_CLUSTER}").read()
                live.append((time.perf_counter() - started) * 1000)
        finally:
            server.terminate()
            server.wait(timeout=30)
    dialect = url.split(":", 1)[0]
    print(f"database: {dialect}; workers: {args.workers}; clusters cached: {args.clusters}")
    print(
        f"cached overview, wrk -t2 -c{args.connections} -d{args.seconds}s: "
        f"{cached['requests_per_second']:.0f} req/s, p50 {cached['p50_ms']:.2f} ms, p90 {cached['p90_ms']:.2f} ms, "
        f"p99 {cached['p99_ms']:.2f} ms, non-2xx {cached['non_2xx']:.0f}"
    )
    print(
        f"live fallback, {args.live_nodes} nodes: median {statistics.median(live):.1f} ms, "
        f"max {max(live):.1f} ms over {len(live)} requests"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
