"""Benchmark: how many simulated clusters one machine keeps fresh at one-minute refresh, with
everything a deployment runs.

Starts `lens demo` (simulator, SQLite, `dagster dev` with its daemon and webserver, the read API,
the ingest sidecar and simulated node agents streaming every cluster's container events) with
`--clusters` clusters of `--nodes` GPU nodes, lets it settle for one round, then for `--minutes`
samples every 5 s: the staleness of every cluster's overview (now - `cluster_overview_cache.updated_at`),
how long acknowledged container events waited for their rows (the commit of the watermark that
passed them - their arrival in the log), the CPU and memory of each role, and at the end the runs
per job (a minute, wall time, time from creation to start, failures) and the growth of the Dagster
instance and the Lens database per run. `--no-agents` leaves the API, the sidecar and the agents
out (the earlier figures). The hourly history's backfill of a new cluster's past days is a one-off
(bench/bench_history.py measures it) left out by default: the window measures the steady state.

    .venv/bin/python bench/bench_fleet.py --clusters 30 --nodes 100 --minutes 8
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import psutil

ROLES = (
    ("webserver", ("dagster-webserver", "dagster_webserver")),
    ("daemon", ("dagster-daemon", "dagster_daemon", "daemon run")),
    # `dagster dev` launches each run in a spawned process.
    ("runs", ("execute_run", "execute_step", "multiprocessing.spawn")),
    ("code server", ("api grpc", "code-server", "grpc-health")),
    ("lens api", ("SystemExit(main()) api",)),
    ("lens ingest", ("SystemExit(main()) ingest",)),
)


def role(process: psutil.Process) -> str:
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return "runs"  # gone before its command line was read: a short-lived run process
    for name, needles in ROLES:
        if any(n in command for n in needles):
            return name
    if "dagster dev" in command:
        return "dagster dev"
    return "demo: simulator + agents" if "lens" in command else "other"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def staleness(lens_db: Path, clusters: int) -> list[float] | None:
    """Seconds since each cluster's overview was written; None until every cluster has one."""
    try:
        with sqlite3.connect(f"file:{lens_db}?mode=ro", uri=True, timeout=5) as conn:
            rows = conn.execute("SELECT updated_at FROM cluster_overview_cache").fetchall()
    except sqlite3.Error:
        return None
    if len(rows) < clusters:
        return None
    now = datetime.now(UTC)
    return [(now - datetime.fromisoformat(r[0]).replace(tzinfo=UTC)).total_seconds() for r in rows]


class EventLatency:
    """Seconds from an event's arrival in the log to the commit of the watermark that passed it, per
    segment of events to process (the watermark commit is the rows' commit: one transaction)."""

    def __init__(self, lens_db: Path) -> None:
        self.lens_db, self.seconds = lens_db, []
        self.watermarks = self._progress()

    def _progress(self) -> dict[str, tuple[int, str]]:
        try:
            with sqlite3.connect(f"file:{self.lens_db}?mode=ro", uri=True, timeout=5) as conn:
                rows = conn.execute(
                    "SELECT cluster_name, last_log_id, updated_at FROM container_event_progress"
                ).fetchall()
        except sqlite3.Error:
            return {}
        return {cluster: (last, updated) for cluster, last, updated in rows}

    def sample(self) -> None:
        now = self._progress()
        with sqlite3.connect(f"file:{self.lens_db}?mode=ro", uri=True, timeout=5) as conn:
            for cluster, (last, updated) in now.items():
                before = self.watermarks.get(cluster, (0, ""))[0]
                if last <= before:
                    continue
                applied = _time(updated)
                for (received,) in conn.execute(
                    "SELECT received_at FROM container_event_segment WHERE cluster_name = ? AND id > ? "
                    "AND id <= ? AND to_process > 0",
                    (cluster, before, last),
                ):
                    self.seconds.append((applied - _time(received)).total_seconds())
        self.watermarks = now

    def pending(self) -> int:
        with sqlite3.connect(f"file:{self.lens_db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute(
                "SELECT count(*) FROM container_event_segment s LEFT JOIN container_event_progress p "
                "ON p.cluster_name = s.cluster_name WHERE s.id > coalesce(p.last_log_id, 0) AND s.to_process > 0"
            ).fetchone()[0]


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clusters", type=int, default=30)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=8)
    parser.add_argument(
        "--settle-minutes", type=float, default=6, help="longest wait for the first full round"
    )
    parser.add_argument(
        "--history-backfill-days",
        type=int,
        default=0,
        help="days of hourly history each new cluster backfills ($LENS_HISTORY_BACKFILL_DAYS; the "
        "default 0 measures the steady state: each closed hour, at five past)",
    )
    parser.add_argument(
        "--clusters-per-run",
        type=int,
        default=None,
        help="healthy clusters per scheduled run ($LENS_CLUSTERS_PER_RUN; 1: one run per cluster)",
    )
    parser.add_argument(
        "--no-agents", action="store_true", help="no read API, no ingest sidecar, no node agents"
    )
    args = parser.parse_args()

    # Run processes a stopped demo leaves finishing may still write under it: cleanup tolerates them.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        state = Path(tmp)
        lens = Path(sys.executable).with_name("lens")
        command = [str(lens), "demo", "--clusters", str(args.clusters), "--nodes", str(args.nodes)]
        sidecars = ("0", "0") if args.no_agents else (str(free_port()), str(free_port()))
        command += ["--port", str(free_port()), "--api-port", sidecars[0], "--ingest-port", sidecars[1]]
        command += ["--watch-port", str(free_port())]
        command += ["--state-dir", str(state), "--churn", "20"]
        started = time.monotonic()
        env = dict(os.environ)
        if args.clusters_per_run is not None:
            env["LENS_CLUSTERS_PER_RUN"] = str(args.clusters_per_run)
        env["LENS_HISTORY_BACKFILL_DAYS"] = str(args.history_backfill_days)
        print(
            f"clusters per run: {env.get('LENS_CLUSTERS_PER_RUN', 'default')}; hourly history "
            f"backfilled {args.history_backfill_days} day(s) per new cluster",
            flush=True,
        )
        demo = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env
        )
        lens_db, home = state / "lens.db", state / "dagster_home"
        try:
            while staleness(lens_db, args.clusters) is None:
                if time.monotonic() - started > args.settle_minutes * 60:
                    sys.exit(f"not every cluster had an overview after {args.settle_minutes} minutes")
                time.sleep(5)
            first_round = time.monotonic() - started
            print(f"every cluster has an overview {first_round:.0f} s after start", flush=True)
            size_before, db_before = tree_size(home), _db_size(lens_db)
            runs_before = _finished_runs(home)
            samples: list[float] = []
            cpu: dict[str, list[float]] = defaultdict(list)
            rss: dict[str, list[float]] = defaultdict(list)
            events = EventLatency(lens_db)
            root = psutil.Process(demo.pid)
            known: dict[int, psutil.Process] = {}  # cpu_percent measures since the same object's last call
            others: set[str] = set()
            deadline = time.monotonic() + args.minutes * 60
            while time.monotonic() < deadline:
                time.sleep(5)
                samples += staleness(lens_db, args.clusters) or []
                events.sample()
                by_role_cpu: dict[str, float] = defaultdict(float)
                by_role_rss: dict[str, float] = defaultdict(float)
                for found in [root, *root.children(recursive=True)]:
                    process = known.setdefault(found.pid, found)
                    try:
                        name = role(process)
                        if name == "other":
                            others.add(" ".join(process.cmdline())[:160])
                        by_role_cpu[name] += process.cpu_percent(None)
                        by_role_rss[name] += process.memory_info().rss / 2**20
                    except psutil.Error:
                        continue
                for name in by_role_cpu:
                    cpu[name].append(by_role_cpu[name])
                    rss[name].append(by_role_rss[name])
            runs = _finished_runs(home) - runs_before
            finished = _finished(home, runs_before)
            grown, db_grown = tree_size(home) - size_before, _db_size(lens_db) - db_before
            pending = events.pending()
        finally:
            os.killpg(demo.pid, signal.SIGINT)
            try:
                demo.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)

    load = os.getloadavg()
    with_what = "no agents" if args.no_agents else "API, ingest and node agents on"
    print(
        f"{args.clusters} clusters x {args.nodes} nodes ({with_what}), {args.minutes:g} min measured; "
        f"load {load[0]:.1f}"
    )
    print(
        f"overview staleness over {len(samples)} samples: p50 {percentile(samples, 50):.0f} s, "
        f"p95 {percentile(samples, 95):.0f} s, max {max(samples):.0f} s"
    )
    if events.seconds:
        print(
            f"container events, arrival to rows, over {len(events.seconds)} segments: p50 "
            f"{percentile(events.seconds, 50):.1f} s, p95 {percentile(events.seconds, 95):.1f} s, "
            f"max {max(events.seconds):.1f} s; segments still pending at the end {pending}"
        )
    elif not args.no_agents:
        print(f"container events: none applied in the window; segments pending {pending}")
    for name in sorted(cpu):
        print(
            f"  {name:18s} CPU mean {statistics.mean(cpu[name]):5.0f} %  "
            f"RSS mean {statistics.mean(rss[name]):6.0f} MiB  max {max(rss[name]):6.0f} MiB"
        )
    for command in sorted(others)[:5]:
        print(f"  (other: {command})")
    _print_runs(finished, args.minutes)
    per_run = grown / runs if runs else 0.0
    per_cluster_day = per_run * 1440 * (runs / (args.clusters * args.minutes)) if runs else 0.0
    print(
        f"runs finished: {runs} ({runs / args.minutes:.1f}/min); Dagster instance grew {grown / 2**20:.1f} MiB "
        f"({per_run / 1024:.0f} KiB per run, {per_cluster_day / 2**20:.0f} MiB per cluster per day "
        f"without retention); Lens database grew {db_grown / 2**20:.1f} MiB"
    )
    return 0


def _print_runs(finished: list[Run], minutes: float) -> None:
    """Run wall times and failures, then per job: runs a minute, wall time and time queued."""
    if not finished:
        return
    print(
        f"run wall time (start to end): p50 {percentile([r.wall for r in finished], 50):.1f} s, "
        f"max {max(r.wall for r in finished):.1f} s; "
        f"failed runs {sum(r.status != 'SUCCESS' for r in finished)}"
    )
    for job in sorted({r.job for r in finished}):
        mine = [r for r in finished if r.job == job]
        print(
            f"  {job:28s} {len(mine) / minutes:5.1f} runs/min, wall p50 "
            f"{percentile([r.wall for r in mine], 50):5.1f} s max {max(r.wall for r in mine):5.1f} s, "
            f"queued p50 {percentile([r.queued for r in mine], 50):5.1f} s max "
            f"{max(r.queued for r in mine):5.1f} s, events p50 {percentile([r.events for r in mine], 50):.0f}, "
            f"failed {sum(r.status != 'SUCCESS' for r in mine)}"
        )


def _db_size(path: Path) -> int:
    """The SQLite file and its write-ahead log."""
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())


def _finished_runs(home: Path) -> int:
    try:
        with sqlite3.connect(f"file:{home / 'history' / 'runs.db'}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute(
                "SELECT count(*) FROM runs WHERE status IN ('SUCCESS', 'FAILURE', 'CANCELED')"
            ).fetchone()[0]
    except sqlite3.Error:
        return 0


class Run(NamedTuple):
    job: str
    status: str
    queued: float  # seconds from the run's creation to its start (the run queue, the launch)
    wall: float  # seconds from start to end
    events: int  # Dagster events the run wrote (each one write to the instance's event log)


def _finished(home: Path, skip: int) -> list[Run]:
    """The finished runs after the first `skip`, in the order they were created."""
    try:
        with sqlite3.connect(f"file:{home / 'history' / 'runs.db'}?mode=ro", uri=True, timeout=5) as conn:
            rows = conn.execute(
                "SELECT run_id, pipeline_name, status, create_timestamp, start_time, end_time FROM runs "
                "WHERE status IN ('SUCCESS', 'FAILURE', 'CANCELED') AND start_time IS NOT NULL "
                "AND end_time IS NOT NULL ORDER BY id"
            ).fetchall()[skip:]
    except sqlite3.Error:
        return []
    return [
        Run(job, status, start - _time(created).timestamp(), end - start, _events(home, run_id))
        for run_id, job, status, created, start, end in rows
    ]


def _events(home: Path, run_id: str) -> int:
    """The events in a run's own event log (SQLite storage keeps one file per run)."""
    try:
        with sqlite3.connect(f"file:{home / 'history' / 'runs' / f'{run_id}.db'}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT count(*) FROM event_logs").fetchone()[0]
    except sqlite3.Error:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
