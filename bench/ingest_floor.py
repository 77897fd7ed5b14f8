"""The floor under `lens ingest`'s CPU per event: what any Python server of the original's protocol
pays before it checks or stores anything (`bench_ingest.py --floor` runs it in place of lens ingest).

A grpc.aio server on the same port and methods, with gRPC health, whose stream handler reads each
message of a stream, splits a `ContainerEventBatch` into its events (without decoding them, as lens
ingest does; the original's methods carry one event a message) and acknowledges every message at
once: the gRPC transport, the event loop, the split and the replies, nothing else. `--parse` also
decodes each event (`ContainerEvent.FromString`, C), the first thing lens ingest does with it. With
`--workers N`, N such processes share the port (SO_REUSEPORT), as `lens ingest --workers N`.

    .venv/bin/python bench/ingest_floor.py --port 50099 --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from lens_pipeline.ingest.events import ContainerEvent, split_batch
from lens_pipeline.ingest.server import BATCH_METHOD, METHOD_SOURCES, SERVICE


def _handler(batches: bool, parse: bool) -> grpc.RpcMethodHandler:
    """A stream's handler: every message acknowledged as soon as it is read (raw bytes in and out)."""

    async def stream(requests, _context):
        acked = 0
        async for raw in requests:
            events = split_batch(raw)[0] if batches else [raw]
            if parse:
                for event in events:
                    ContainerEvent.FromString(event)
            acked += len(events)
            yield ContainerEvent(type="ack", sequence=acked).SerializeToString()

    return grpc.stream_stream_rpc_method_handler(stream)


async def _serve(port: int, shared: bool, parse: bool) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 1 if shared else 0)])
    handlers = {method: _handler(False, parse) for method in METHOD_SOURCES}  # an event a message
    handlers[BATCH_METHOD] = _handler(True, parse)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    checks = health.HealthServicer()
    checks.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"ingest floor (pid {os.getpid()}) serving", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(1)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--parse", action="store_true", help="also decode each event (ContainerEvent)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker or args.workers == 1:
        asyncio.run(_serve(args.port, args.worker, args.parse))
        return 0
    command = [sys.executable, __file__, "--port", str(args.port), "--worker"]
    children = [subprocess.Popen(command + (["--parse"] if args.parse else [])) for _ in range(args.workers)]

    def forward(_signum: int, _frame: object) -> None:
        for child in children:
            child.terminate()

    signal.signal(signal.SIGTERM, forward)
    for child in children:
        child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
