"""Generated hostile container events, and a sweep that sends thousands of them, mixed with valid
ones, over gRPC streams and HTTP batches at once and checks every answer: shared by the suite
(`test_hostile_events.py`) and the larger sweep of `bench/bench_reliability.py`."""

from __future__ import annotations

import math
import random
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from typing import Any

from lens_pipeline.ingest.server import IngestServer
from lens_pipeline.sim import node_agent as agent
from lens_pipeline_tests.ingest.support import channel, container_id, gpu_container, post_json

GRPC_STREAMS = 4
HTTP_BATCH = 200
MAX_EVENT_BYTES = 64 << 10

HOSTILE_TEXT = [
    "\x00",
    "a\x00b",
    "é" * 200,
    "\U0001d54f" * 70,
    "\u202e" + "x" * 10,
    "x" * 300,
    "\n",
    "'; DROP TABLE node_container; --",
    "{{7*7}}",
    "../../etc/passwd",
]
# A read field with a value of the wrong kind.
WRONG_SHAPES = [
    ("pod_name", 5),
    ("pod_name", [1]),
    ("pod_name", {}),
    ("devices", "all"),
    ("devices", [1]),
    ("labels", "s"),
    ("labels", 5),
    ("created_at", "s"),
    ("created_at", {}),
]
HOSTILE_NUMBERS = [1e30, -1.0, float("inf"), float("-inf"), float("nan"), 2.0**64, -(2.0**63)]


def unusable_event(rng: random.Random, index: int) -> tuple[str, dict[str, Any]]:
    """(kind, event): an event the edge accepts (its ids and read fields are within limits) that no
    table can hold once applied: nested text with NUL, or text longer than its column. It is
    acknowledged and logged, then quarantined by `container_events` at stage "processing"."""
    data = gpu_container(index, "Running")
    device = dict(data["devices"]["gpu"][0])
    kinds = {
        "long_pod_name": lambda: {"pod_name": "p" * rng.randint(254, 600)},
        "long_status": lambda: {"status": "s" * rng.randint(129, 400)},
        "nul_in_label": lambda: {
            "pod_name": None,
            "labels": {**data.get("labels", {}), "io.kubernetes.pod.name": "pod\x00" + str(index)},
        },
        "long_container_name": lambda: {"metadata": {"name": "c" * rng.randint(129, 300)}},
        "nul_in_device_serial": lambda: {
            "devices": {"gpu": [{**device, "uuid": "", "serial": "SN\x00" + str(index)}]}
        },
    }
    kind = rng.choice(list(kinds))
    changed = {k: v for k, v in {**data, **kinds[kind]()}.items() if v is not None}
    return kind, {
        "type": "Running",
        "source": "k8s",
        "node": "n1",
        "container_id": container_id(index),
        "data": changed,
    }


def hostile_event(rng: random.Random, index: int) -> tuple[str, str, dict[str, Any] | bytes]:
    """(kind, id field, event): a bad event the edge refuses, as a dict for either transport or raw
    bytes for gRPC."""
    data = gpu_container(index, "Running")
    cid = container_id(index)
    kinds = {
        "long_event_id": lambda: {"event_id": rng.choice(["é" * 65, "\U0001d54f" * 40, "x" * 129])},
        "nul_event_id": lambda: {"event_id": "id\x00" + str(index)},
        "nul_container_id": lambda: {"container_id": cid[:10] + "\x00" + cid[11:]},
        "long_container_id": lambda: {"container_id": cid + rng.choice(["0" * 65, "é" * 33])},
        "no_container_id": lambda: {"container_id": ""},
        "long_node": lambda: {"node": "n" * 254},
        "nul_node": lambda: {"node": "node\x00x"},
        "unknown_type": lambda: {"type": rng.choice(["Rebooted", "", "running", "\x00", "é" * 50])},
        "bad_cluster": lambda: {"cluster": rng.choice(["Prod", "a,b", "east\n", "x" * 64, "\x00"])},
        "created_at": lambda: {"data": {**data, "created_at": rng.choice(HOSTILE_NUMBERS)}},
        "nul_pod_name": lambda: {"data": {**data, "pod_name": rng.choice(HOSTILE_TEXT[:2])}},
        "wrong_shape": lambda: {"data": {**data, **dict([rng.choice(WRONG_SHAPES)])}},
        "devices_not_list": lambda: {"data": {**data, "devices": {"gpu": rng.choice(["all", 3, {"a": 1}])}}},
        "oversized": lambda: {"data": {**data, "blob": "x" * (MAX_EVENT_BYTES + 10)}},
    }
    raw_kinds = {
        "random_bytes": lambda: rng.randbytes(rng.randint(1, 200)),
        "truncated": lambda: agent.event("Running", cid, data, "n1")[: rng.randint(1, 40)],
        "bad_utf8": lambda: agent.event("Running", cid, data, "n1").replace(cid.encode(), b"\xff" * 64),
    }
    kind = rng.choice([*kinds, *raw_kinds])
    if kind in raw_kinds:
        return kind, "", raw_kinds[kind]()
    event = {"type": "Running", "source": "k8s", "node": "n1", "container_id": cid, "data": data}
    event.update(kinds[kind]())
    return kind, event.get("container_id", ""), event


def grpc_bytes(event: dict[str, Any]) -> bytes:
    raw = agent.event(event["type"], event["container_id"], event["data"], event["node"])
    return agent.with_extra_fields(raw, event_id=event.get("event_id"), cluster=event.get("cluster"))


def valid_event(index: int) -> dict[str, Any]:
    return {
        "type": "Running",
        "source": "k8s",
        "node": "n1",
        "container_id": container_id(index),
        "data": gpu_container(index, "Running"),
    }


@dataclass
class SweepFigures:
    events: int
    valid: int
    hostile: int  # refused at the edge, or accepted and unusable
    grpc_streams: int
    http_batches: int
    send_seconds: float
    kinds: Counter[str]
    metrics: str
    # Accepted by the edge, logged, and quarantined when applied (container ids).
    unusable_ids: set[str]

    @property
    def refused(self) -> int:
        return self.hostile - len(self.unusable_ids)


# Of the generated events: this share valid, this share accepted but unusable, the rest refused.
VALID_SHARE = 0.5
UNUSABLE_SHARE = 0.1


def run_sweep(
    server: IngestServer, total: int, *, seed: int = 17, streams: int = GRPC_STREAMS, batch: int = HTTP_BATCH
) -> tuple[SweepFigures, set[str]]:
    """Send `total` generated events (half valid; of the others, a fifth accepted by the edge but
    unusable, the rest refused) at once over `streams` gRPC streams and HTTP batches of `batch`;
    assert every answer; return the figures and the valid ids."""
    rng = random.Random(seed)
    started = time.monotonic()
    # Each stream and each HTTP sender gets its own share of events, valid ones interleaved.
    grpc_work: list[list[tuple[bool, str, bytes]]] = [[] for _ in range(streams)]
    http_work: list[tuple[bool, str, Any]] = []
    valid_ids: set[str] = set()
    unusable_ids: set[str] = set()
    kinds: Counter[str] = Counter()
    for index in range(1, total + 1):
        over_grpc = index % 2 == 0
        draw = rng.random()
        if draw < VALID_SHARE:
            event = valid_event(index)
            valid_ids.add(event["container_id"])
            item: tuple[bool, str, Any] = (True, "valid", grpc_bytes(event) if over_grpc else event)
        elif draw < VALID_SHARE + UNUSABLE_SHARE:
            kind, event = unusable_event(rng, index)
            kinds[kind] += 1
            unusable_ids.add(event["container_id"])
            item = (True, kind, grpc_bytes(event) if over_grpc else event)
        else:
            kind, _cid, bad = hostile_event(rng, index)
            kinds[kind] += 1
            if not over_grpc and isinstance(bad, bytes):  # HTTP carries JSON: junk of another kind
                bad = {"type": "Running", "source": "k8s", "node": "n1", "container_id": 5, "data": "junk"}
            elif not over_grpc and kind == "created_at" and not math.isfinite(bad["data"]["created_at"]):
                bad["data"]["created_at"] = 1e30  # NaN is no JSON: it would refuse the whole batch
            item = (False, kind, bad if isinstance(bad, bytes) or not over_grpc else grpc_bytes(bad))
        if over_grpc:
            grpc_work[index % streams].append(item)  # type: ignore[arg-type]
        else:
            http_work.append(item)

    results: dict[str, Any] = {}

    def stream(number: int) -> None:
        with channel(server) as ch:
            results[f"grpc{number}"] = agent.stream_events(
                ch, [raw for *_, raw in grpc_work[number]], timeout=120
            )

    def post() -> None:
        answers = []
        for start in range(0, len(http_work), batch):
            events = [e for *_, e in http_work[start : start + batch]]
            answers.append(post_json(server, "/v1/container-events/batch", {"events": events}))
        results["http"] = answers

    threads = [threading.Thread(target=stream, args=(n,)) for n in range(streams)]
    threads.append(threading.Thread(target=post))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert not any(t.is_alive() for t in threads), "a sender stalled"
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/healthz") as response:
        assert b"SERVING" in response.read()
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics").read().decode()
    sent = time.monotonic() - started

    # gRPC: every event of every stream answered, an error exactly for the bad ones.
    for number in range(streams):
        result, work = results[f"grpc{number}"], grpc_work[number]
        assert result.code is None and result.acked == len(work), (number, result.code, result.details)
        refused = {position for position, (ok, *_) in enumerate(work, start=1) if not ok}
        accepted_bad = Counter(work[p - 1][1] for p in refused - set(result.errors))
        assert set(result.errors) == refused, (number, accepted_bad)
        assert all(result.errors[p] for p in refused)  # each with its reason
    # HTTP: per batch, the bad events named with a reason, the others committed.
    for (status, answer), start in zip(results["http"], range(0, len(http_work), batch), strict=True):
        work = http_work[start : start + batch]
        bad = {i for i, (ok, *_) in enumerate(work) if not ok}
        assert status in (200, 206, 400) and answer["success"] == len(work) - len(bad)
        assert {e["index"] for e in answer["errors"]} == bad and all(e["reason"] for e in answer["errors"])

    figures = SweepFigures(
        total,
        len(valid_ids),
        total - len(valid_ids),
        streams,
        len(results["http"]),
        sent,
        kinds,
        metrics,
        unusable_ids,
    )
    return figures, valid_ids
