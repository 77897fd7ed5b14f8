"""What the ingest tests share: a server on real sockets, and an agent built from the original proto."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lens_pipeline.ingest.config import IngestConfig
from lens_pipeline.ingest.server import IngestServer, RunningServer
from lens_pipeline.sim import node_agent as agent
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.event_log import LoggedEvent, logged_events

CREATED_NS = 1_763_700_000_000_000_000  # 2025-11-21, as the CRI reports it


@contextmanager
def ingest_server(database_url: str, **overrides: object) -> Iterator[IngestServer]:
    config = IngestConfig(
        **{
            "database_url": database_url,
            "host": "127.0.0.1",
            "grpc_port": 0,
            "http_port": 0,
            "default_cluster": "east",
            **overrides,
        }
    )
    with RunningServer(config) as server:
        yield server


@contextmanager
def channel(server: IngestServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        yield ch


def logged(database_url: str) -> list[LoggedEvent]:
    """Every event in the log, in log order."""
    with get_engine(database_url).connect() as conn:
        return logged_events(conn)


def start_lens_ingest(
    lens_url: str, grpc_port: int, http_port: int, log_path: Path, *, workers: int = 1, extra: tuple = ()
) -> subprocess.Popen:
    """`lens ingest` as a real process (output appended to `log_path`), once it serves: gRPC health
    says SERVING and, with workers, every worker has said it serves."""
    lens = Path(sys.executable).with_name("lens")
    command = [str(lens)] if lens.exists() else [sys.executable, "-m", "lens_pipeline.cli"]
    command += ["ingest", "--database-url", lens_url, "--host", "127.0.0.1", "--workers", str(workers)]
    command += ["--grpc-port", str(grpc_port), "--http-port", str(http_port), "--default-cluster", "east"]
    command += [str(arg) for arg in extra]
    offset = log_path.stat().st_size if log_path.exists() else 0
    process = subprocess.Popen(command, stdout=log_path.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while True:
            try:
                answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                output = log_path.read_bytes()[offset:]
                if answer.status == health_pb2.HealthCheckResponse.SERVING and (
                    workers == 1 or output.count(b" serving") >= workers
                ):
                    return process
            except grpc.RpcError:
                pass
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, f"lens ingest did not become healthy: {log_path.read_text()}"
            time.sleep(0.1)


def gpu_container(index: int, status: str, *, vendor: str = "amd", gpus: int = 2, nics: int = 1) -> dict:
    """A real-shaped k8s container of pod `train-<index>` holding `gpus` GPUs and `nics` RDMA NICs."""
    make_gpu = agent.amd_gpu if vendor == "amd" else agent.nvidia_gpu
    return agent.k8s_container(
        container_id(index),
        name="trainer",
        pod_name=f"train-{index}",
        pod_namespace="ml",
        pod_uid=f"00000000-0000-4000-8000-{index:012d}",
        status=status,
        created_ns=CREATED_NS + index * 1_000_000_000,
        gpus=[make_gpu(g, index) for g in range(gpus)],
        nics=[agent.infiniband(n, index) for n in range(nics)],
    )


def container_id(index: int) -> str:
    return f"{index:064x}"


def stream_and_kill(grpc_port: int, events: list[bytes], kill_at: int, kill: Callable[[], None]) -> int:
    """Stream `events` on one connection and call `kill` (a SIGKILL of the server holding it) just
    before event `kill_at`, once some acknowledgement came back; the highest sequence acknowledged."""
    acked = 0
    some_acked = threading.Event()

    def send() -> Iterator[bytes]:
        for index, raw in enumerate(events):
            if index == kill_at:
                some_acked.wait(30)
                kill()  # mid-stream, acknowledgements in flight
            yield raw

    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
        call = ch.stream_stream(agent.K8S_METHOD, request_serializer=None, response_deserializer=None)
        try:
            for raw in call(send(), timeout=60):
                reply = agent.read_reply(raw)
                if reply.type == "ack":
                    acked = max(acked, reply.sequence)
                    some_acked.set()
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
    return acked


def post_json(server: IngestServer, path: str, body: Any, token: str | None = None) -> tuple[int, dict]:
    """POST `body` (JSON, or bytes as they are) to the sidecar's HTTP port: (status, JSON answer)."""
    return post_json_to(f"http://127.0.0.1:{server.http_port}", path, body, token)


def post_json_to(base: str, path: str, body: Any, token: str | None = None) -> tuple[int, dict]:
    """POST `body` to `base` + `path`: (status, JSON answer)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(f"{base}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
