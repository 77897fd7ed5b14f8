"""Sustained ingest into `lens ingest`: concurrent streaming agents in other processes, durable acks.

Starts `lens ingest` as its own process on a fresh database (a new PostgreSQL database on the
server of `--database-url`, or a SQLite file), then client processes that each hold `--streams`
gRPC streams and send real-shaped, distinct container events (8 GPUs and one RDMA NIC each, about
2.2 KB) as fast as acknowledgements allow (at most `--window` unacknowledged events per stream, as
an agent's buffer). An event counts once the server acknowledged it, i.e. after it was committed
to the event log. Reports events/s, send->ack latency percentiles, the log's row count (must equal
the acknowledged count) and the CPU each process used.

    .venv/bin/python bench/bench_ingest.py --database-url postgresql+psycopg2://postgres@127.0.0.1:5432/postgres
    .venv/bin/python bench/bench_ingest.py --mode stream     # one gRPC message per event (original agents)
    .venv/bin/python bench/bench_ingest.py                   # SQLite
    .venv/bin/python bench/bench_ingest.py --workers 2       # `lens ingest --workers 2`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure import (  # noqa: E402
    children_cpu_seconds,
    database_cpu_seconds,
    machine_busy_seconds,
    process_cpu_seconds,
)

from lens_pipeline.sim import node_agent as agent  # noqa: E402
from lens_pipeline_tests.ingest.support import gpu_container  # noqa: E402

PLACEHOLDER = "f" * 64


def event_template() -> tuple[bytes, bytes]:
    """The bench's event (a k8s container with 8 GPUs and an RDMA NIC, about 3 KB) around the place of
    its 64-character container id, which `bench_event` fills in."""
    data = gpu_container(0, "Running", gpus=8, nics=1)
    template = agent.event("Running", PLACEHOLDER, {**data, "id": PLACEHOLDER}, "bench-node")
    head, _, tail = template.partition(PLACEHOLDER.encode())
    return head, tail


def bench_event(head: bytes, tail: bytes, unique: str, event_id: bool) -> bytes:
    """One distinct event: `unique` (64 characters) as its container id, and as its event_id too."""
    raw = unique.encode()
    # field 5 (event_id), length-delimited: 64 characters
    return head + raw + tail + (b"\x2a\x40" + raw if event_id else b"")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None, help="PostgreSQL server URL (default: SQLite)")
    parser.add_argument("--mode", choices=("batch", "stream"), default="batch")
    parser.add_argument("--batch", type=int, default=20, help="events per message in batch mode")
    parser.add_argument("--clients", type=int, default=1, help="client processes")
    parser.add_argument("--streams", type=int, default=8, help="streams per client process (agents)")
    parser.add_argument("--window", type=int, default=1000, help="unacknowledged events per stream at most")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--rate", type=float, default=0, help="offered events/s per client (0: as fast as acked)"
    )
    parser.add_argument(
        "--event-ids", action="store_true", help="events carry an event_id (agents of the batch method)"
    )
    parser.add_argument("--workers", type=int, default=1, help="`lens ingest --workers N`")
    parser.add_argument(
        "--linger-ms", type=float, default=None, help="`lens ingest --linger-ms` (default: its own)"
    )
    parser.add_argument(
        "--shared-connection",
        action="store_true",
        help="a client process's streams share one connection (HTTP/2 streams); by default each "
        "stream is an agent with its own connection, as agents on different nodes are. With "
        "`--workers`, the kernel spreads connections, not streams, over the workers",
    )
    parser.add_argument(
        "--floor",
        choices=("transport", "parse"),
        default=None,
        help="run bench/ingest_floor.py in place of lens ingest: the gRPC transport, the event loop and "
        "the acks only (transport), and also each event's decode (parse); nothing is stored",
    )
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds not counted at the start")
    parser.add_argument("--client", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client is not None:
        print(json.dumps(asyncio.run(_client(args))))
        return 0
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    database_url, cleanup = _fresh_database(None if args.floor else args.database_url)
    grpc_port, http_port = _free_port(), _free_port()
    lens = Path(sys.executable).with_name("lens")
    load_before = os.getloadavg()[0]
    server_output = tempfile.TemporaryFile()  # noqa: SIM115 - closed after the server stops
    if args.floor:
        command = [sys.executable, str(ROOT / "bench" / "ingest_floor.py"), "--port", str(grpc_port)]
        command += ["--workers", str(args.workers)] + (["--parse"] if args.floor == "parse" else [])
    else:
        command = [
            *(str(lens), "ingest", "--database-url", database_url, "--host", "127.0.0.1"),
            *("--grpc-port", str(grpc_port), "--http-port", str(http_port), "--default-cluster", "bench"),
            *("--workers", str(args.workers)),
        ]
        if args.linger_ms is not None:
            command += ["--linger-ms", str(args.linger_ms)]
    server = subprocess.Popen(command, stdout=server_output, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(grpc_port, server_output, args.workers)
        server_cpu0, machine_busy0 = process_cpu_seconds(server.pid), machine_busy_seconds()
        worker_cpu0 = children_cpu_seconds(server.pid)
        database_cpu0, began = database_cpu_seconds("postgresql"), time.monotonic()
        command = [
            sys.executable,
            __file__,
            "--port",
            str(grpc_port),
            "--mode",
            args.mode,
            "--batch",
            str(args.batch),
        ]
        command += ["--streams", str(args.streams), "--window", str(args.window)]
        command += ["--seconds", str(args.seconds), "--warmup", str(args.warmup), "--rate", str(args.rate)]
        command += ["--event-ids"] if args.event_ids else []
        command += ["--shared-connection"] if args.shared_connection else []
        clients = [
            subprocess.Popen([*command, "--client", str(index)], stdout=subprocess.PIPE, text=True)
            for index in range(args.clients)
        ]
        reports = [json.loads(c.communicate()[0]) for c in clients]
        server_cpu = process_cpu_seconds(server.pid) - server_cpu0
        worker_cpu = {
            pid: cpu - worker_cpu0.get(pid, 0.0) for pid, cpu in children_cpu_seconds(server.pid).items()
        }
        machine_busy = machine_busy_seconds() - machine_busy0
        database_cpu, span = database_cpu_seconds("postgresql") - database_cpu0, time.monotonic() - began
        logged, segments = _count_log(database_url) if not args.floor else (0, 0)
    finally:
        server.terminate()
        server.wait(60)
        server_output.close()
        cleanup()
    load_after = os.getloadavg()[0]
    measured = sum(r["measured_events"] for r in reports)
    window = max(r["measured_seconds"] for r in reports)
    latencies = sorted(x for r in reports for x in r["latencies"])
    acked = sum(r["acked"] for r in reports)

    def pct(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else float("nan")
        )

    dialect = "PostgreSQL" if database_url.startswith("postgresql") else "SQLite"
    if args.floor:
        dialect = f"none: the floor ({args.floor}), bench/ingest_floor.py in place of lens ingest"
    print(
        f"database: {dialect}; mode: {args.mode}"
        + (f" ({args.batch} events/message)" if args.mode == "batch" else "")
        + ("; events with event_id" if args.event_ids else "; no event_id (replay key from the content)")
    )
    offered = f", offered {args.rate * args.clients:,.0f} events/s" if args.rate else ", unpaced"
    print(
        f"clients: {args.clients} processes x {args.streams} streams, window {args.window} events/stream{offered}"
    )
    print(
        f"sustained: {measured / window:,.0f} events/s acknowledged over {window:.1f} s (after {args.warmup:g} s warm-up)"
    )
    print(f"send->ack latency: p50 {pct(0.50):.1f} ms, p99 {pct(0.99):.1f} ms, max {pct(1.0):.1f} ms")
    if not args.floor:
        print(f"acknowledged {acked:,} events; event log holds {logged:,} rows (must be >= acknowledged)")
        print(f"log segments: {segments:,}, {logged / max(segments, 1):,.0f} events each on average")
    client_cpu = sum(r["cpu_seconds"] for r in reports)
    total = args.seconds + args.warmup
    print(f"CPU: server {server_cpu:.1f} s, clients {client_cpu:.1f} s over {total:.0f} s wall")
    if len(worker_cpu) > 1:  # the kernel spreads connections over the workers: how evenly it did
        shares = ", ".join(f"{cpu:.1f}" for cpu in sorted(worker_cpu.values(), reverse=True))
        print(f"CPU of each worker: {shares} s")
    print(
        f"machine: {os.cpu_count()} cores busy {machine_busy:.1f} of {span * (os.cpu_count() or 1):.1f} core-seconds "
        f"from server start to the end; local PostgreSQL processes {database_cpu:.1f} s (any database's)"
    )
    per_event = server_cpu / acked * 1e6 if acked else float("nan")
    print(f"server CPU per acknowledged event: {per_event:.1f} µs ({args.workers} worker(s))")
    print(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after")
    return 0 if args.floor or logged >= acked else 1


async def _client(args: argparse.Namespace) -> dict:
    head, tail = event_template()
    method = agent.BATCH_METHOD if args.mode == "batch" else agent.K8S_METHOD
    per_message = args.batch if args.mode == "batch" else 1
    start = time.monotonic()
    measure_from, deadline = start + args.warmup, start + args.warmup + args.seconds
    cpu0 = time.process_time()
    target = f"127.0.0.1:{args.port}"
    # A channel per agent, each on its own connection (a local subchannel pool: channels of one
    # process to one target otherwise share theirs), unless --shared-connection.
    options = [] if args.shared_connection else [("grpc.use_local_subchannel_pool", 1)]
    shared = grpc.aio.insecure_channel(target) if args.shared_connection else None
    channels = [shared or grpc.aio.insecure_channel(target, options=options) for _ in range(args.streams)]
    try:
        results = await asyncio.gather(
            *(
                _stream(
                    channels[k],
                    method,
                    head,
                    tail,
                    args.client,
                    k,
                    per_message,
                    args.window,
                    measure_from,
                    deadline,
                    args.rate / args.streams,
                    args.event_ids,
                )
                for k in range(args.streams)
            )
        )
    finally:
        for channel in {id(c): c for c in channels}.values():
            await channel.close()
    return {
        "acked": sum(r[0] for r in results),
        "measured_events": sum(r[1] for r in results),
        "measured_seconds": args.seconds,
        "latencies": [x for r in results for x in r[2]],
        "cpu_seconds": time.process_time() - cpu0,
    }


async def _stream(
    channel, method, head, tail, client, k, per_message, window, measure_from, deadline, rate, event_ids
):
    call = channel.stream_stream(method, request_serializer=None, response_deserializer=None)()
    sent: deque[tuple[int, float]] = deque()  # (last sequence of a message, send time)
    state = {"acked": 0, "measured": 0}
    latencies: list[float] = []
    room = asyncio.Event()
    room.set()

    async def read_acks() -> None:
        async for raw in call:
            reply = agent.read_reply(raw)
            if reply.type != "ack":
                continue
            now = time.monotonic()
            while sent and sent[0][0] <= reply.sequence:
                _, at = sent.popleft()
                if measure_from <= at and now <= deadline:
                    latencies.append(now - at)
                    state["measured"] += per_message
            state["acked"] = reply.sequence
            room.set()

    reader = asyncio.create_task(read_acks())
    seq = 0
    prefix = f"{client:04x}{k:04x}"
    began = time.monotonic()
    while time.monotonic() < deadline:
        if rate:
            delay = began + seq / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        if seq - state["acked"] >= window:
            room.clear()
            await room.wait()
            continue
        events = []
        for _ in range(per_message):
            seq += 1
            events.append(bench_event(head, tail, f"{prefix}{seq:056x}", event_ids))
        message = agent.batch(events) if per_message > 1 or method == agent.BATCH_METHOD else events[0]
        sent.append((seq, time.monotonic()))
        await call.write(message)
    await call.done_writing()
    await reader
    return state["acked"], state["measured"], latencies[::10]


def _fresh_database(url: str | None):
    if not url:
        directory = tempfile.TemporaryDirectory(prefix="lens-bench-ingest-")
        return f"sqlite:///{directory.name}/lens.db", directory.cleanup
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"lens_bench_ingest_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()

    return make_url(url).set(database=name).render_as_string(hide_password=False), drop


def _count_log(url: str) -> tuple[int, int]:
    """Events in the log, and its segments (one per group commit and cluster; a round over 5,000
    events or 8 MB is cut into several)."""
    from sqlalchemy import create_engine, func, select

    from lens_pipeline.store.event_log import count_events
    from lens_pipeline.store.schema import container_event_segment

    engine = create_engine(url)
    with engine.connect() as conn:
        count = count_events(conn)
        segments = int(conn.scalar(select(func.count()).select_from(container_event_segment)) or 0)
    engine.dispose()
    return count, segments


def _wait_healthy(port: int, output, workers: int) -> None:
    """Until gRPC health says SERVING and, with workers, each of them said it serves."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + 60
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        while time.monotonic() < deadline:
            try:
                status = (
                    health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1).status
                )
                output.seek(0)
                if status == 1 and (workers == 1 or output.read().count(b" serving") >= workers):
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise RuntimeError("lens ingest did not become healthy")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
