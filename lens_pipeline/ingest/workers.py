"""`lens ingest --workers N`: N server processes on one gRPC port and one HTTP port, kept running
by the process that started them.

One Python process tops out near one core (docs/BENCHMARKS.md), so the sidecar scales by
processes. Each worker is a whole `IngestServer` with its own log writer: the event log's writers
already serialize their commits through the database (`lens_pipeline.store.event_log`), so an event
that two workers both receive (an agent's replay after a reconnect) is logged once.

- gRPC: every worker binds the port with SO_REUSEPORT and the kernel spreads connections over them.
  The supervisor first binds the port without it (a port in use is a clear error, not a silent
  share with another server), then keeps holding it with SO_REUSEPORT (not listening, so it takes no
  connections) so nothing else can take the port while a worker restarts.
- HTTP: the supervisor listens once and every worker accepts from that inherited socket.
- `/metrics`: prometheus_client's multiprocess mode in a private temporary directory, removed at
  stop (and, at start, those of supervisors that died without removing theirs).
- A worker that exits is logged and started again (at once, or with a growing delay when it keeps
  dying young); SIGTERM or SIGINT stops every worker gracefully. Workers stay in the supervisor's
  process group and end themselves when the supervisor dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from lens_pipeline.ingest.config import IngestConfig, Tokens

METRICS_DIR_PREFIX = "lens-ingest-metrics-"
# A worker that dies sooner than this after its start is restarted after a delay (doubling up to
# the cap), so a worker that cannot start does not spin.
YOUNG_SECONDS = 10.0
MAX_RESTART_DELAY = 30.0


class PortInUse(Exception):
    pass


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen | None = None
    started: float = 0.0
    restart_at: float = 0.0
    delay: float = 0.0


def supervise(config: IngestConfig, workers: int) -> int:
    """Run `workers` server processes until SIGTERM or SIGINT; returns the exit code."""
    from lens_pipeline.store.db import get_engine
    from lens_pipeline.store.migrate import ensure_schema

    try:
        http_socket = listen(config.host, config.http_port, "HTTP")
        grpc_hold = hold_port(config.host, config.grpc_port, "gRPC")
        metrics_socket = listen(config.host, config.metrics_port, "metrics") if config.metrics_port else None
    except PortInUse as exc:
        print(f"lens ingest: {exc}", file=sys.stderr, flush=True)
        return 1
    config = replace(config, grpc_port=grpc_hold.getsockname()[1], http_port=http_socket.getsockname()[1])
    if metrics_socket is not None:
        config = replace(config, metrics_port=metrics_socket.getsockname()[1])
    ensure_schema(get_engine(config.database_url), "lens")  # once, not racing in every worker
    metrics_dir = fresh_metrics_dir()
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    print(
        f"lens ingest: {workers} workers, gRPC on {config.host}:{config.grpc_port}"
        f"{' (TLS)' if config.tls else ''}, HTTP on {config.host}:{config.http_port}"
        f"{f', metrics on {config.host}:{config.metrics_port}' if metrics_socket else ''}; "
        f"{'per-cluster tokens' if config.tokens.required else f'default cluster {config.default_cluster!r}'}",
        flush=True,
    )
    pool = [_Worker(index) for index in range(workers)]
    try:
        while not stop.is_set():
            now = time.monotonic()
            for worker in pool:
                if worker.process is not None and worker.process.poll() is not None:
                    _reap(worker, metrics_dir, now)
                if worker.process is None and now >= worker.restart_at:
                    _start(worker, config, http_socket, metrics_dir, metrics_socket)
            stop.wait(0.2)
        print(f"lens ingest: stopping {workers} workers", flush=True)
        _stop_all(pool, config.shutdown_grace_seconds + 20)
    finally:
        for worker in pool:  # never leave a worker behind, whatever happened here
            if worker.process is not None and worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        http_socket.close()
        grpc_hold.close()
        if metrics_socket is not None:
            metrics_socket.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _start(
    worker: _Worker,
    config: IngestConfig,
    http_socket: socket.socket,
    metrics_dir: str,
    metrics_socket: socket.socket | None = None,
) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir}
    shared = (http_socket,) if metrics_socket is None else (http_socket, metrics_socket)
    process = subprocess.Popen(
        [sys.executable, "-m", "lens_pipeline.ingest.workers"],
        stdin=subprocess.PIPE,
        env=env,
        pass_fds=tuple(s.fileno() for s in shared),
    )
    # The configuration (with the tokens) goes through a pipe: never in argv or the environment.
    spec = {
        "index": worker.index,
        "supervisor": os.getpid(),
        "http_fd": http_socket.fileno(),
        "metrics_fd": metrics_socket.fileno() if metrics_socket is not None else None,
        "metrics_dir": metrics_dir,
        "config": asdict(config),
    }
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        process.stdin.write(json.dumps(spec).encode())
        process.stdin.close()
    worker.process, worker.started = process, time.monotonic()


def _reap(worker: _Worker, metrics_dir: str, now: float) -> None:
    from prometheus_client.multiprocess import mark_process_dead

    process = worker.process
    assert process is not None and process.returncode is not None
    mark_process_dead(process.pid, metrics_dir)  # its open streams are gone: drop its live gauge
    young = now - worker.started < YOUNG_SECONDS
    worker.delay = min(max(worker.delay * 2, 1.0), MAX_RESTART_DELAY) if young else 0.0
    worker.restart_at = now + worker.delay
    worker.process = None
    when = f"in {worker.delay:.0f} s" if worker.delay else "now"
    print(
        f"lens ingest: worker {worker.index} (pid {process.pid}) {describe_exit(process.returncode)}; "
        f"restarting it {when}",
        flush=True,
    )


def _stop_all(pool: list[_Worker], timeout: float) -> None:
    running = [w.process for w in pool if w.process is not None and w.process.poll() is None]
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"lens ingest: worker pid {process.pid} did not stop in time; killing it", flush=True)
            process.kill()
            process.wait()


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _bound(host: str, port: int, what: str, option: int) -> socket.socket:
    """A socket with `option` set, bound to the port; `PortInUse` when something else has it."""
    sock = socket.socket(_family(host))
    sock.setsockopt(socket.SOL_SOCKET, option, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortInUse(f"{what} port {host}:{port} is in use ({exc.strerror})") from None
    return sock


def listen(host: str, port: int, what: str) -> socket.socket:
    """A listening socket for the workers to share; `PortInUse` when something else has the port."""
    sock = _bound(host, port, what, socket.SO_REUSEADDR)
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def check_free(host: str, port: int, what: str) -> int:
    """The port (chosen when 0), after a plain bind shows that no server has it; `PortInUse` if one does."""
    probe = _bound(host, port, what, socket.SO_REUSEADDR)
    try:
        return probe.getsockname()[1]
    finally:
        probe.close()


def hold_port(host: str, port: int, what: str) -> socket.socket:
    """Check that nothing listens on the port, then keep it bound with SO_REUSEPORT, not
    listening: the workers can join it, other servers cannot take it."""
    return _bound(host, check_free(host, port, what), what, socket.SO_REUSEPORT)


def fresh_metrics_dir() -> str:
    """A new, empty multiprocess directory; those left by supervisors that are gone are removed."""
    base = Path(tempfile.gettempdir())
    for stale in base.glob(f"{METRICS_DIR_PREFIX}*"):
        pid = stale.name[len(METRICS_DIR_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)) and stale.stat().st_uid == os.getuid():
            shutil.rmtree(stale, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _end_with_supervisor(supervisor: int) -> None:
    """Linux: receive SIGTERM when the supervisor dies (even by kill -9), so no worker is orphaned."""
    with contextlib.suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != supervisor:  # it died before the line above
        sys.exit(0)


def worker_main() -> int:
    """A worker's entry point (`python -m lens_pipeline.ingest.workers`, spec on stdin)."""
    spec = json.loads(sys.stdin.buffer.read())
    _end_with_supervisor(spec["supervisor"])
    from lens_pipeline.ingest.server import WorkerSlot, serve_forever

    document = spec["config"]
    config = IngestConfig(**{**document, "tokens": Tokens(**document["tokens"])})
    slot = WorkerSlot(
        index=spec["index"],
        http_socket=socket.socket(fileno=spec["http_fd"]),
        metrics_dir=spec["metrics_dir"],
        metrics_socket=socket.socket(fileno=spec["metrics_fd"])
        if spec.get("metrics_fd") is not None
        else None,
    )
    return serve_forever(config, slot)


if __name__ == "__main__":
    sys.exit(worker_main())
