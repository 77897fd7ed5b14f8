"""Benchmark: `GET /v1/clusters/overview` from the cache, loaded by wrk (Debian's package) from a
second process; the live fallback for a 5,000-node cluster with no cached row; then every list
route and the 24-hour history routes the database answers, on that cluster at the envelope.

The database gets `--clusters` cached overview rows and one uncached cluster of `--live-nodes`
GPU nodes with `--pods-per-node` GPU pods each (150,000 at the defaults: 4 running per node, the
rest ended), their workloads, references, statistics, consumers and 24 hours of hourly workload
rows; `lens api` serves it in a subprocess; wrk asks for a random cached cluster each request,
then, per route, cycles through URLs of different nodes and workloads for `--route-seconds`.

    .venv/bin/python bench/bench_api.py [--clusters 1000] [--connections 8] [--seconds 20]
        [--route-seconds 5] [--route-connections 4] [--sim-nodes 1000] [--workers 1]
        [--database-url postgresql+psycopg2://postgres@127.0.0.1:5432/lens_api_bench]
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
from datetime import UTC, datetime, timedelta
from pathlib import Path

from lens_pipeline.collect.overview import NODE_COUNTS, OVERVIEW_FIGURES
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.sim.truth import cluster_truth
from lens_pipeline.store.db import get_engine, write_transaction
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.overview import write_overview
from lens_pipeline.store.schema import (
    gpu_consumers,
    gpu_pods,
    gpu_workload,
    node,
    pod_resource,
    workload_gpu_hourly_stats,
    workload_pod_reference,
    workload_statistic,
)
from lens_pipeline.store.upsert import bulk_upsert

LIVE_CLUSTER = "live-5000"
WRK_SCRIPT = """
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/v1/clusters/overview?cluster=bench-" .. math.random(0, {last}))
end
"""
# One route's URLs, asked in turn (each connection starts at its own place).
ROUTE_SCRIPT = """
local paths = {{{paths}}}
local i = 0
setup = function(thread) thread:set("i", math.random(1, #paths)) end
request = function()
  i = i % #paths + 1
  return wrk.format("GET", paths[i])
end
"""
RUNNING_PODS_PER_NODE = 4
GPUS = 8
HOUR = 3600


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


def _node_name(i: int) -> str:
    return f"node-{i:05d}"


def fill_envelope(url: str, nodes: int, pods_per_node: int, now: datetime) -> dict[str, list[str]]:
    """The live cluster's workloads, pods (running and ended), references, statistics, consumers
    and a day of hourly rows: what the list and history routes read. Returns URLs' ingredients."""
    engine = get_engine(url)
    rng = random.Random(2)
    pods, resources, references, workloads = [], [], [], []
    stats, consumers, hours = [], [], []
    top_uids: list[str] = []
    day = now.replace(minute=0, second=0, microsecond=0)
    workload_no = 0

    def workload(kind: str, uid: str, parent: str, running: bool, created: datetime) -> None:
        workloads.append(
            {
                "cluster_name": LIVE_CLUSTER,
                "uid": uid,
                "parent_uid": parent,
                "kind": kind,
                "group_version": "batch/v1",
                "namespace": f"team-{workload_no % 40}",
                "name": f"{kind.lower()}-{workload_no}",
                "gpu_request": 2 * RUNNING_PODS_PER_NODE if running else 2,
                "status": "Running" if running else "Done",
                "created_at": created,
                "updated_at": now,
                "end_at": None if running else now,
                "source": "k8s",
                "labels": {},
                "annotations": {},
            }
        )

    for n in range(nodes):
        for k in range(pods_per_node):
            running = k < RUNNING_PODS_PER_NODE
            if k % RUNNING_PODS_PER_NODE == 0:  # one workload per four pods, a ReplicaSet under every third
                workload_no += 1
                top = f"w-{workload_no}"
                created = now - timedelta(hours=rng.randint(1, 72))
                workload("Deployment" if workload_no % 3 == 0 else "Job", top, "", running, created)
                owners = [top]
                if workload_no % 3 == 0:
                    workload("ReplicaSet", f"{top}-rs", top, running, created)
                    owners.append(f"{top}-rs")
                top_uids.append(top)
            uid = f"p-{n}-{k}"
            created = now - timedelta(hours=rng.uniform(0.1, 72))
            ended = None if running else created + timedelta(minutes=rng.randint(5, 600))
            pods.append(
                {
                    "cluster_name": LIVE_CLUSTER,
                    "uid": uid,
                    "namespace": f"team-{workload_no % 40}",
                    "name": f"pod-{n}-{k}",
                    "node_name": _node_name(n),
                    "gpu_allocated": 2,
                    "phase": "Running" if running else "Succeeded",
                    "deleted": not running,
                    "running": running,
                    "created_at": created,
                    "updated_at": ended or now,
                    "owner_uid": owners[-1],
                }
            )
            resources.append(
                {
                    "cluster_name": LIVE_CLUSTER,
                    "uid": uid,
                    "gpu_model": "AMD Instinct MI300X",
                    "gpu_allocated": 2,
                    "created_at": created,
                    "bound_at": created,
                    "end_at": ended,
                }
            )
            references += [
                {"cluster_name": LIVE_CLUSTER, "workload_uid": o, "pod_uid": uid, "created_at": created}
                for o in owners
            ]
            if running and k % RUNNING_PODS_PER_NODE == 0:
                stats.append(
                    {
                        "cluster_name": LIVE_CLUSTER,
                        "uid": top,
                        "namespace": "team",
                        "workload_name": top,
                        "workload_type": "Job",
                        "instant_gpu_utilization": rng.uniform(0, 100),
                        "avg_gpu_utilization": rng.uniform(0, 100),
                        "stat_start_time": created,
                        "stat_end_time": now,
                        "labels": {},
                        "annotations": {},
                        "created_at": now,
                        "updated_at": now,
                    }
                )
                consumers.append(
                    {
                        "cluster_name": LIVE_CLUSTER,
                        "uid": top,
                        "kind": "Job",
                        "namespace": "team",
                        "name": top,
                        "gpu_allocated": 2 * RUNNING_PODS_PER_NODE,
                        "active_pods": RUNNING_PODS_PER_NODE,
                        "created_at": now,
                        "updated_at": now,
                    }
                )
                if len(hours) < 2000 * 24:  # a day of hours for the first 2,000 running workloads
                    hours += [
                        {
                            "cluster_name": LIVE_CLUSTER,
                            "workload_uid": top,
                            "namespace": "team",
                            "workload_name": top,
                            "workload_type": "Job",
                            "stat_hour": day - timedelta(hours=h),
                            "avg_utilization": rng.uniform(0, 100),
                            "sample_count": 120,
                            "labels": {},
                            "annotations": {},
                            "created_at": now,
                            "updated_at": now,
                        }
                        for h in range(25)
                    ]
    with write_transaction(engine) as conn:
        for table, rows in (
            (gpu_workload, workloads),
            (gpu_pods, pods),
            (pod_resource, resources),
            (workload_pod_reference, references),
            (workload_statistic, stats),
            (gpu_consumers, consumers),
            (workload_gpu_hourly_stats, hours),
        ):
            bulk_upsert(conn, table, rows, new=True)
    running_tops = [s["uid"] for s in stats]
    return {
        "nodes": [_node_name(i) for i in range(0, nodes, max(nodes // 200, 1))],
        "workloads": running_tops[:200],
    }


def analyze(url: str) -> None:
    """Planner statistics after the bulk load, as autovacuum (PostgreSQL) or InnoDB's automatic
    recalculation (MariaDB) take them soon after in a deployment; `lens api` takes SQLite's itself."""
    engine = get_engine(url)
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("ANALYZE")
    elif engine.dialect.name in ("mysql", "mariadb"):
        with engine.connect() as conn:
            for table in ("node", "gpu_workload", "gpu_pods", "pod_resource", "workload_pod_reference"):
                conn.exec_driver_sql(f"ANALYZE TABLE {table}")


def route_urls(ingredients: dict[str, list[str]], now: int) -> dict[str, list[str]]:
    """Per route measured: the URLs wrk cycles through."""
    c = f"cluster={LIVE_CLUSTER}"
    nodes, workloads = ingredients["nodes"], ingredients["workloads"]
    day = f"start={now - 86_400}&end={now}&step={HOUR}"
    return {
        "/v1/nodes": [f"/v1/nodes?{c}&page_num={p}&page_size=10" for p in (1, 2, 50, 100)],
        "/v1/nodes (sorted, 100)": [f"/v1/nodes?{c}&order_by=gpu_allocation&desc=true&page_size=100"],
        "/v1/nodes/gpuAllocation": [f"/v1/nodes/gpuAllocation?{c}"],
        "/v1/workloads": [f"/v1/workloads?{c}&page_num={p}&page_size=10" for p in (1, 2, 10)],
        "/v1/workloads (Running, 100)": [f"/v1/workloads?{c}&status=Running&page_size=100"],
        "/v1/clusters/consumers": [f"/v1/clusters/consumers?{c}&page_size=10&page_num={p}" for p in (1, 5)],
        "/v1/nodes/{name}/workloads": [f"/v1/nodes/{n}/workloads?{c}" for n in nodes],
        "/v1/nodes/{name}/workloadsHistory": [
            f"/v1/nodes/{n}/workloadsHistory?{c}&page_size=20" for n in nodes
        ],
        "/v1/workloads/statistic": [f"/v1/workloads/statistic?{c}"],
        "/v1/workloadMetadata": [f"/v1/workloadMetadata?{c}"],
        "/v1/workloads/gpuUtilizationHistory (24 h, hourly)": [
            f"/v1/workloads/gpuUtilizationHistory?{c}&kind=Job&name=job-{w[2:]}&{day}"
            for w in workloads
            if int(w[2:]) % 3
        ],
    }


def simulated_series(
    url: str, nodes: int, now: int, work: Path
) -> tuple[SimServer, Path, dict[str, list[str]]]:
    """A simulated cluster of `nodes` nodes served on localhost, its `node` rows (the truth's) in
    the database and its registry, and the URLs of the series routes over its last 24 hours."""
    fleet = SimFleet.generate(clusters=1, nodes=nodes, seed=3, vendor="amd")
    (cluster,) = fleet.clusters
    server = SimServer(fleet).start()
    registry = write_registry(work / "clusters.yaml", server)
    stamp = datetime.now(UTC)
    rows = [
        {**row, "cluster_name": cluster.name, "created_at": stamp, "updated_at": stamp}
        for row in cluster_truth(cluster)["nodes"]
    ]
    with write_transaction(get_engine(url)) as conn:
        bulk_upsert(conn, node, rows)
    ready = [r["name"] for r in rows if r["status"] == "Ready"][:50]
    c = f"cluster={cluster.name}"
    day = f"start={now - 86_400}&end={now}"
    urls = {
        "/v1/nodes/gpuUtilizationHistory (24 h, step 300)": [
            f"/v1/nodes/gpuUtilizationHistory?{c}&{day}&step=300"
        ],
        "/v1/nodes/{name}/gpuMetrics (24 h, step 60)": [
            f"/v1/nodes/{n}/gpuMetrics?{c}&{day}&step=60" for n in ready
        ],
        "/v1/nodes/{name}/utilizationHistory (24 h, step 60)": [
            f"/v1/nodes/{n}/utilizationHistory?{c}&{day}&step=60" for n in ready
        ],
        "/v1/clusters/gpuHeatmap": [f"/v1/clusters/gpuHeatmap?{c}"],
    }
    return server, registry, urls


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_api(env: dict[str, str], workers: int = 1) -> tuple[subprocess.Popen, str]:
    """`lens api` in a subprocess on a free local port, with `env`: (the process, its base URL)."""
    port = free_port()
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
            str(workers),
        ],
        env=env,
    )
    return server, f"http://127.0.0.1:{port}"


def wait_ready(base: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/healthz", timeout=2).read()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("lens api did not start")


def run_wrk(
    base: str,
    script_text: str,
    connections: int,
    seconds: int,
    work: Path,
    *,
    threads: int = 2,
    quiet: bool = False,
) -> dict[str, float]:
    script = work / "load.lua"
    script.write_text(script_text)
    out = subprocess.run(
        [
            "wrk",
            f"-t{min(threads, connections)}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            base,
        ],
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
    if not quiet:
        print(out)
    return figures


def check_urls(base: str, urls: dict[str, list[str]]) -> None:
    """Every URL answers 200 once before it is measured (a bench of 404s would measure nothing)."""
    for route, paths in urls.items():
        for path in paths[:3]:
            with urllib.request.urlopen(f"{base}{path}") as response:
                assert response.status == 200, (route, path)
                body = response.read()
            assert b'"code":2000' in body, (route, path, body[:200])


def prometheus_queries(base: str) -> tuple[float, float]:
    """(seconds, count) the API's Prometheus queries took so far (`lens_api_prometheus_query_seconds`)."""
    text = urllib.request.urlopen(f"{base}/metrics").read().decode()
    found = dict(re.findall(r"^lens_api_prometheus_query_seconds_(sum|count) ([\d.e+-]+)$", text, re.M))
    return float(found.get("sum", 0)), float(found.get("count", 0))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--live-nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=int, default=30)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--route-connections", type=int, default=4)
    parser.add_argument("--route-seconds", type=int, default=5)
    parser.add_argument(
        "--wrk-threads", type=int, default=1, help="wrk threads (one leaves the server a core)"
    )
    parser.add_argument(
        "--sim-nodes", type=int, default=1000, help="simulated nodes of the series routes (0: none)"
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        url = args.database_url or f"sqlite:///{work / 'lens.db'}"
        now = datetime.now(UTC)
        started = time.perf_counter()
        fill(url, args.clusters, args.live_nodes)
        ingredients = fill_envelope(url, args.live_nodes, args.pods_per_node, now)
        analyze(url)
        print(f"filled in {time.perf_counter() - started:.0f} s")
        urls = route_urls(ingredients, int(now.timestamp()))
        sim = None
        env = {**os.environ, "LENS_DATABASE_URL": url}
        env.pop("LENS_API_TOKEN", None)
        env.pop("LENS_CLUSTERS_FILE", None)
        if args.sim_nodes:
            sim, registry, series = simulated_series(url, args.sim_nodes, int(now.timestamp()), work)
            urls.update(series)
            env["LENS_CLUSTERS_FILE"] = str(registry)
        server, base = start_api(env, args.workers)
        try:
            wait_ready(base)
            urllib.request.urlopen(f"{base}/v1/clusters/overview?cluster=bench-0").read()
            time.sleep(1.5)  # the API's copy of the overview table has made its first refresh
            cached = run_wrk(
                base,
                WRK_SCRIPT.format(last=args.clusters - 1),
                args.connections,
                args.seconds,
                work,
                threads=args.wrk_threads,
            )
            live = []
            for _ in range(20):
                started = time.perf_counter()
                urllib.request.urlopen(f"{base}/v1/clusters/overview?cluster={LIVE_CLUSTER}").read()
                live.append((time.perf_counter() - started) * 1000)
            check_urls(base, urls)
            routes = {}
            for route, paths in urls.items():
                before = prometheus_queries(base)
                routes[route] = run_wrk(
                    base,
                    ROUTE_SCRIPT.format(paths=", ".join(f'"{p}"' for p in paths)),
                    args.route_connections,
                    args.route_seconds,
                    work,
                    threads=args.wrk_threads,
                    quiet=True,
                )
                seconds, count = (a - b for a, b in zip(prometheus_queries(base), before, strict=True))
                answered = routes[route]["requests_per_second"] * args.route_seconds
                routes[route]["queries"] = count / answered if answered else 0.0
                routes[route]["query_ms"] = 1000 * seconds / count if count else 0.0
        finally:
            server.terminate()
            server.wait(timeout=30)
            if sim is not None:
                sim.stop()
    dialect = url.split(":", 1)[0]
    print(
        f"database: {dialect}; workers: {args.workers}; clusters cached: {args.clusters}; load average: {os.getloadavg()[0]:.2f}"
    )
    print(
        f"cached overview, wrk -t{min(args.wrk_threads, args.connections)} -c{args.connections} -d{args.seconds}s: "
        f"{cached['requests_per_second']:.0f} req/s, p50 {cached['p50_ms']:.2f} ms, p90 {cached['p90_ms']:.2f} ms, "
        f"p99 {cached['p99_ms']:.2f} ms, non-2xx {cached['non_2xx']:.0f}"
    )
    print(
        f"live fallback, {args.live_nodes} nodes: median {statistics.median(live):.1f} ms, "
        f"max {max(live):.1f} ms over {len(live)} requests"
    )
    print(
        f"routes at {args.live_nodes} nodes, {args.live_nodes * args.pods_per_node} pods "
        f"(series: {args.sim_nodes} simulated nodes), wrk -c{args.route_connections} -d{args.route_seconds}s each:"
    )
    for route, figures in routes.items():
        asked = (
            f"  {figures['queries']:.1f} Prometheus queries/request, {figures['query_ms']:.1f} ms each"
            if figures["queries"]
            else ""
        )
        print(
            f"  {route:<52} {figures['requests_per_second']:7.0f} req/s  p50 {figures['p50_ms']:6.2f} ms  "
            f"p99 {figures['p99_ms']:6.2f} ms  non-2xx {figures['non_2xx']:.0f}{asked}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
