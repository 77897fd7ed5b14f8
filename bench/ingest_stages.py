"""What each stage of `lens ingest`'s path costs per event, in a loop on one core, without the gRPC
transport, the event loop or the database: the quick way to compare machines and changes before
`bench_ingest.py` measures the whole server.

The event is `bench_ingest.py`'s (about 3 KB: a k8s container with 8 GPUs and an RDMA NIC), in a
`ContainerEventBatch` of `--batch` events with event ids. Stages: the batch split, the decode
(`ContainerEvent.FromString`, upb), the shape check of the agent's `data` (on a freshly decoded
event, as the server meets it: the decode and the check together, less the decode), the whole
`from_grpc` (decode, checks, the replay key from the event id, the row), and the event's record in the log segment.

    .venv/bin/python bench/ingest_stages.py
"""

from __future__ import annotations

import argparse
import platform
import sys
import timeit
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_ingest import bench_event, event_template

from lens_pipeline.ingest.events import ContainerEvent, Origin, _pb_shape, from_grpc, split_batch
from lens_pipeline.sim import node_agent as agent
from lens_pipeline.store.event_log import record_parts


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=20, help="events per message")
    parser.add_argument("--events", type=int, default=20_000, help="events per timing")
    parser.add_argument("--repeat", type=int, default=5, help="timings per stage; the best is kept")
    args = parser.parse_args()

    head, tail = event_template()
    events = [bench_event(head, tail, f"{i:064x}", True) for i in range(args.batch)]
    message = agent.batch(events)
    origin = Origin("k8s", None, "default")
    now = datetime.now(UTC)
    row = from_grpc(events[0], origin, now)
    raw = events[0]

    def decode_and_check() -> None:
        _pb_shape(ContainerEvent.FromString(raw).data, "k8s")

    stages = {
        "batch split": (lambda: split_batch(message), args.batch),
        "decode": (lambda: ContainerEvent.FromString(raw), 1),
        "decode + shape check": (decode_and_check, 1),
        "from_grpc (all of the checks, key and row)": (lambda: from_grpc(raw, origin, now), 1),
        "log record": (lambda: record_parts(row, {}), 1),
    }
    print(
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}; "
        f"event {len(raw):,} bytes, batch of {args.batch} ({len(message):,} bytes)"
    )
    per_event = {}
    for name, (stage, events_per_call) in stages.items():
        calls = max(1, args.events // events_per_call)
        stage()
        best = min(timeit.repeat(stage, number=calls, repeat=args.repeat))
        per_event[name] = best / calls / events_per_call * 1e6
        print(f"  {name:44s} {per_event[name]:7.2f} µs per event")
    shape = per_event["decode + shape check"] - per_event["decode"]
    print(f"  {'shape check alone (the difference)':44s} {shape:7.2f} µs per event")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
