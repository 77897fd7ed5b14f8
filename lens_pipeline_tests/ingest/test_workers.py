"""`lens ingest --workers 2` as real processes on real sockets: one port for both, every
acknowledged event logged once (also when both workers receive it), `/metrics` summed over the
workers, a `kill -9` of a worker mid-stream loses nothing acknowledged and the worker comes back."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import grpc
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lens_pipeline.sim import node_agent as agent
from lens_pipeline_tests.ingest.support import (
    container_id,
    gpu_container,
    logged,
    start_lens_ingest,
    stream_and_kill,
)
from lens_pipeline_tests.ports import free_port

# On SQLite and PostgreSQL: each worker is a log writer of its own.
on_sqlite_and_postgresql = pytest.mark.parametrize("db_urls", ["sqlite", "postgresql"], indirect=True)

STREAMS = 16  # connections: the kernel spreads them over the workers by their address hash
OWN, SHARED = 40, 10  # events per stream, and events every stream sends (the same ones)


def _event(index: int) -> bytes:
    return agent.event(
        "Running", container_id(index), gpu_container(index, "Running", gpus=1, nics=0), "node-w"
    )


def _workers(parent: subprocess.Popen) -> list[psutil.Process]:
    return psutil.Process(parent.pid).children()


def _streams_per_worker(parent: subprocess.Popen, grpc_port: int) -> dict[int, int]:
    return {
        worker.pid: sum(
            1
            for conn in worker.net_connections(kind="tcp")
            if conn.status == psutil.CONN_ESTABLISHED and conn.laddr.port == grpc_port
        )
        for worker in _workers(parent)
    }


def _metrics(http_port: int) -> dict[str, float]:
    """Every sample of `/metrics`, summed over its labels, by sample name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    sums: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] += sample.value
    return dict(sums)


def _stop(parent: subprocess.Popen, sig: signal.Signals = signal.SIGTERM) -> None:
    if parent.poll() is None:
        parent.send_signal(sig)
        parent.wait(30)


def _metrics_dirs(parent: subprocess.Popen) -> list[Path]:
    """The supervisor's prometheus_client multiprocess directory (named after its pid)."""
    return list(Path(tempfile.gettempdir()).glob(f"lens-ingest-metrics-{parent.pid}-*"))


@on_sqlite_and_postgresql
def test_two_workers_share_the_port_log_each_event_once_and_sum_their_metrics(lens_url, tmp_path):
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    parent = start_lens_ingest(
        lens_url,
        grpc_port,
        http_port,
        tmp_path / "ingest.log",
        workers=2,
        extra=("--metrics-port", metrics_port),
    )
    try:
        assert len(_workers(parent)) == 2 and len(_metrics_dirs(parent)) == 1
        # In the supervisor's process group: a Ctrl-C or a group kill reaches them too.
        assert {os.getpgid(worker.pid) for worker in _workers(parent)} == {os.getpgid(parent.pid)}
        hold = threading.Event()
        results: list[agent.StreamResult] = []

        def agent_stream(k: int) -> None:
            own = [_event(1000 + k * OWN + i) for i in range(OWN)]
            shared = [_event(i) for i in range(SHARED)]  # a replay that lands on either worker

            def events():
                yield from own + shared
                hold.wait(30)  # keep the stream open while the test looks at the workers

            # A channel of its own subchannel pool: a connection (and a source port) per agent.
            with grpc.insecure_channel(
                f"127.0.0.1:{grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
            ) as ch:
                results.append(agent.stream_events(ch, events()))

        threads = [threading.Thread(target=agent_stream, args=(k,)) for k in range(STREAMS)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        while sum(_streams_per_worker(parent, grpc_port).values()) < STREAMS:
            assert time.monotonic() < deadline, _streams_per_worker(parent, grpc_port)
            time.sleep(0.1)
        per_worker = _streams_per_worker(parent, grpc_port)
        assert sorted(per_worker.values())[0] > 0, per_worker  # both workers serve streams
        sent = STREAMS * (OWN + SHARED)
        while _metrics(http_port).get("primus_lens_jobs_container_event_recv_total", 0) < sent:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # The live streams of all workers, on the HTTP port and on the metrics port alike.
        assert _metrics(http_port)["primus_lens_jobs_upstream_connected"] == STREAMS
        assert _metrics(metrics_port)["primus_lens_jobs_upstream_connected"] == STREAMS
        hold.set()
        for thread in threads:
            thread.join(30)

        assert [(r.code, r.acked, r.errors) for r in results] == [(None, OWN + SHARED, {})] * STREAMS
        counts = Counter(event.container_id for event in logged(lens_url))
        assert len(counts) == STREAMS * OWN + SHARED and set(counts.values()) == {1}
        summed = _metrics(http_port)  # whichever worker answers, the sums of both
        assert summed["primus_lens_jobs_container_event_recv_total"] == sent
        assert summed["primus_lens_jobs_event_processing_duration_seconds_count"] == sent
        assert summed.get("primus_lens_jobs_upstream_connected", 0) == 0  # closed streams leave no series
    finally:
        _stop(parent)
    assert parent.returncode == 0
    assert not _workers_alive(parent)
    assert _metrics_dirs(parent) == []  # its metrics directory is gone


def _workers_alive(parent: subprocess.Popen) -> list[int]:
    return [p.pid for p in psutil.process_iter(["ppid"]) if p.info["ppid"] == parent.pid]


@on_sqlite_and_postgresql
def test_kill_9_of_a_worker_mid_stream_loses_no_acknowledged_event_and_it_is_restarted(lens_url, tmp_path):
    events = [_event(i) for i in range(3000)]
    kill_at = 1500
    grpc_port, http_port = free_port(), free_port()
    server_log = tmp_path / "ingest.log"
    parent = start_lens_ingest(lens_url, grpc_port, http_port, server_log, workers=2)
    killed = None

    def kill() -> None:
        nonlocal killed
        (killed,) = [pid for pid, n in _streams_per_worker(parent, grpc_port).items() if n]
        os.kill(killed, signal.SIGKILL)  # the worker holding this stream

    try:
        acked = stream_and_kill(grpc_port, events, kill_at, kill)
        assert killed is not None and 0 < acked <= kill_at
        counts = Counter(event.container_id for event in logged(lens_url))
        assert all(counts[container_id(i)] == 1 for i in range(acked)) and set(counts.values()) == {1}

        # The agent reconnects (either worker may take it) and resends its unacknowledged tail.
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            resend = events[max(0, acked - 100) :]
            result = agent.stream_events(ch, resend)
            assert (result.code, result.acked, result.errors) == (None, len(resend), {})
        counts = Counter(event.container_id for event in logged(lens_url))
        assert len(counts) == len(events) and set(counts.values()) == {1}

        deadline = time.monotonic() + 30
        restarted = lambda: b" serving" in server_log.read_bytes().split(b"SIGKILL")[-1]  # noqa: E731
        while not (len(_workers(parent)) == 2 and restarted()):
            assert time.monotonic() < deadline, server_log.read_text()
            time.sleep(0.1)
        assert killed not in [worker.pid for worker in _workers(parent)]
        assert f"(pid {killed}) was killed by SIGKILL; restarting it" in server_log.read_text()
    finally:
        _stop(parent, signal.SIGINT)  # Ctrl-C stops them as SIGTERM does
    assert parent.returncode == 0 and not _workers_alive(parent)


# The stream of the whole-sidecar kill (SQLite: about 20 s here, most of it building and sending).
WHOLE_KILL_EVENTS = 100_000


def test_kill_9_of_every_process_mid_stream_loses_and_doubles_no_event(sqlite_url, tmp_path, capsys):
    """`kill -9` of the supervisor and both workers at once, half-way through a 100,000-event
    stream; a new sidecar, the agent's reconnect and the resend of its unacknowledged tail (and a
    few before it): every acknowledged event was logged, and every event is logged exactly once."""
    events = [_event(i) for i in range(WHOLE_KILL_EVENTS)]
    kill_at = WHOLE_KILL_EVENTS // 2
    grpc_port, http_port = free_port(), free_port()
    server_log = tmp_path / "ingest.log"
    parent = start_lens_ingest(sqlite_url, grpc_port, http_port, server_log, workers=2)
    killed: list[int] = []

    def kill_everything() -> None:
        workers = [worker.pid for worker in _workers(parent)]
        for pid in (parent.pid, *workers):  # no SIGTERM, no goodbye: as the node's OOM killer would
            os.kill(pid, signal.SIGKILL)
        killed.extend((parent.pid, *workers))

    try:
        acked = stream_and_kill(grpc_port, events, kill_at, kill_everything)
        assert parent.wait(10) == -signal.SIGKILL and len(killed) == 3
        deadline = time.monotonic() + 10
        while any(
            psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in killed
        ):
            assert time.monotonic() < deadline, "a killed process lives on"
            time.sleep(0.05)
        assert 0 < acked <= kill_at
        counts = Counter(event.container_id for event in logged(sqlite_url))
        # Everything acknowledged is there once; some of the rest may be (committed, not yet acked).
        assert all(counts[container_id(i)] == 1 for i in range(acked)) and set(counts.values()) == {1}
        committed = len(counts)

        parent = start_lens_ingest(sqlite_url, grpc_port, http_port, server_log, workers=2)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            resend = events[max(0, acked - 100) :]
            result = agent.stream_events(ch, resend, timeout=300)
            assert (result.code, result.acked, result.errors) == (None, len(resend), {})
        counts = Counter(event.container_id for event in logged(sqlite_url))
        assert len(counts) == WHOLE_KILL_EVENTS and set(counts.values()) == {1}
        with capsys.disabled():
            print(
                f"\nwhole-sidecar kill -9: {len(killed)} processes killed at event {kill_at:,} of "
                f"{WHOLE_KILL_EVENTS:,}; {acked:,} acknowledged before, {committed:,} in the log; "
                f"{len(resend):,} resent; {len(counts):,} logged, each once"
            )
    finally:
        _stop(parent)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("which", ["grpc", "http"])
def test_a_port_in_use_is_a_clear_error(which, workers, tmp_path):
    with socket.socket() as other_server:  # listening, without SO_REUSEPORT
        other_server.bind(("127.0.0.1", 0))
        other_server.listen()
        taken = other_server.getsockname()[1]
        ports = {"grpc": free_port(), "http": free_port(), which: taken}
        command = [str(Path(sys.executable).with_name("lens")), "ingest", "--workers", str(workers)]
        command += ["--database-url", f"sqlite:///{tmp_path / 'lens.db'}", "--host", "127.0.0.1"]
        command += ["--grpc-port", str(ports["grpc"]), "--http-port", str(ports["http"])]
        run = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert run.returncode == 1
    name = "gRPC" if which == "grpc" else "HTTP"
    assert f"lens ingest: {name} port 127.0.0.1:{taken} is in use" in run.stderr
