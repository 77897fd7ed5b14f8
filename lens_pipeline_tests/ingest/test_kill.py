"""`kill -9` of a real `lens ingest` process in the middle of a stream: after a restart and a
resend of what was not acknowledged, every event is in the log exactly once."""

from __future__ import annotations

import os
import signal
from collections import Counter

import grpc
from sqlalchemy.engine import make_url

from lens_pipeline.sim import node_agent as agent
from lens_pipeline_tests.ingest.support import (
    container_id,
    gpu_container,
    logged,
    start_lens_ingest,
    stream_and_kill,
)
from lens_pipeline_tests.ports import free_port

# A 100,000-event stream on SQLite and PostgreSQL; MariaDB logs about 1,000 events a second here,
# so its stream is shorter (the same kill, the same checks).
EVENTS = {"sqlite": 100_000, "postgresql": 100_000, "mysql": 10_000}


def _logged(lens_url: str) -> list[tuple[str, int]]:
    return list(Counter(event.container_id for event in logged(lens_url)).items())


def test_kill_9_mid_stream_loses_no_acknowledged_event(lens_url, tmp_path):
    total = EVENTS[make_url(lens_url).get_backend_name()]
    kill_at = total // 2
    events = [
        agent.event("Running", container_id(i), gpu_container(i, "Running", gpus=1, nics=0), "node-k")
        for i in range(total)
    ]
    grpc_port, http_port = free_port(), free_port()
    server_log = tmp_path / "ingest.log"
    server = start_lens_ingest(lens_url, grpc_port, http_port, server_log)
    try:
        acked = stream_and_kill(grpc_port, events, kill_at, lambda: os.kill(server.pid, signal.SIGKILL))
        assert server.wait(10) == -signal.SIGKILL
        assert 0 < acked <= kill_at
        logged = dict(_logged(lens_url))
        # Everything acknowledged is there once; some of the rest may be (committed, not yet acked).
        assert all(logged.get(container_id(i)) == 1 for i in range(acked))
        assert set(logged.values()) == {1}

        # The agent reconnects and resends its unacknowledged tail (and, being careful, a few before).
        server = start_lens_ingest(lens_url, grpc_port, http_port, server_log)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            resend = events[max(0, acked - 100) :]
            result = agent.stream_events(ch, resend)
            assert (result.code, result.acked, result.errors) == (None, len(resend), {})
        logged = dict(_logged(lens_url))
        assert len(logged) == total and set(logged.values()) == {1}
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            server.wait(30)
