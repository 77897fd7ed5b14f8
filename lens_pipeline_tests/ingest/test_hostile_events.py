"""Generated hostile input through the real sidecar: thousands of malformed or hostile events over
gRPC streams and HTTP batches at once, interleaved with valid ones. Nothing crashes or stalls, every
valid event is acknowledged and applied, every bad one is refused with a reason (or, had it passed
the edge, quarantined with one). A property test holds the edge to the log format: whatever the
edge accepts, the log stores and reads back, and processing applies or quarantines, never raises.

The figures of one run are printed (`pytest -s`) and recorded in docs/RELIABILITY.md; a larger
sweep is `bench/bench_reliability.py`.
"""

from __future__ import annotations

import math
import random
import threading
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lens_pipeline.collect.containers import ContainerEventRecord, apply_events
from lens_pipeline.ingest.events import Origin, Refused, from_json
from lens_pipeline.sim import node_agent as agent
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.event_log import dead_letters, decode_segment, encode_record
from lens_pipeline.store.schema import node_container
from lens_pipeline_tests.ingest.support import channel, container_id, gpu_container, ingest_server, logged
from lens_pipeline_tests.ingest.test_quarantine import _run_container_events
from lens_pipeline_tests.ingest.test_wire import _post

# Events of the suite's sweep: half valid, half hostile, split between gRPC and HTTP.
SWEEP_EVENTS = 10_400
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


def _hostile(rng: random.Random, index: int) -> tuple[str, str, dict[str, Any] | bytes]:
    """(kind, id field, event): a bad event, as a dict for either transport or raw bytes for gRPC."""
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


def _grpc_bytes(event: dict[str, Any]) -> bytes:
    raw = agent.event(event["type"], event["container_id"], event["data"], event["node"])
    return agent.with_extra_fields(raw, event_id=event.get("event_id"), cluster=event.get("cluster"))


def _valid(index: int) -> dict[str, Any]:
    return {
        "type": "Running",
        "source": "k8s",
        "node": "n1",
        "container_id": container_id(index),
        "data": gpu_container(index, "Running"),
    }


def test_thousands_of_hostile_events_over_grpc_and_http_stop_nothing(sqlite_url, capsys):
    rng = random.Random(17)
    started = time.monotonic()
    # Each stream and each HTTP sender gets its own share of events, valid ones interleaved.
    grpc_work: list[list[tuple[bool, str, bytes]]] = [[] for _ in range(GRPC_STREAMS)]
    http_work: list[tuple[bool, str, Any]] = []
    valid_ids: set[str] = set()
    kinds: Counter[str] = Counter()
    for index in range(1, SWEEP_EVENTS + 1):
        over_grpc = index % 2 == 0
        if rng.random() < 0.5:
            event = _valid(index)
            valid_ids.add(event["container_id"])
            item: tuple[bool, str, Any] = (True, "valid", _grpc_bytes(event) if over_grpc else event)
        else:
            kind, _cid, bad = _hostile(rng, index)
            kinds[kind] += 1
            if not over_grpc and isinstance(bad, bytes):  # HTTP carries JSON: junk of another kind
                bad = {"type": "Running", "source": "k8s", "node": "n1", "container_id": 5, "data": "junk"}
            elif not over_grpc and kind == "created_at" and not math.isfinite(bad["data"]["created_at"]):
                bad["data"]["created_at"] = 1e30  # NaN is no JSON: it would refuse the whole batch
            item = (False, kind, bad if isinstance(bad, bytes) or not over_grpc else _grpc_bytes(bad))
        if over_grpc:
            grpc_work[index % GRPC_STREAMS].append(item)  # type: ignore[arg-type]
        else:
            http_work.append(item)

    results: dict[str, Any] = {}
    with ingest_server(sqlite_url, max_event_bytes=MAX_EVENT_BYTES) as server:

        def stream(number: int) -> None:
            with channel(server) as ch:
                results[f"grpc{number}"] = agent.stream_events(
                    ch, [raw for *_, raw in grpc_work[number]], timeout=120
                )

        def post() -> None:
            answers = []
            for start in range(0, len(http_work), HTTP_BATCH):
                events = [e for *_, e in http_work[start : start + HTTP_BATCH]]
                answers.append(_post(server, "/v1/container-events/batch", {"events": events}))
            results["http"] = answers

        threads = [threading.Thread(target=stream, args=(n,)) for n in range(GRPC_STREAMS)]
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
    for number in range(GRPC_STREAMS):
        result, work = results[f"grpc{number}"], grpc_work[number]
        assert result.code is None and result.acked == len(work), (number, result.code, result.details)
        refused = {position for position, (ok, *_) in enumerate(work, start=1) if not ok}
        accepted_bad = Counter(work[p - 1][1] for p in refused - set(result.errors))
        assert set(result.errors) == refused, (number, accepted_bad)
        assert all(result.errors[p] for p in refused)  # each with its reason
    # HTTP: per batch, the bad events named with a reason, the others committed.
    for (status, answer), start in zip(results["http"], range(0, len(http_work), HTTP_BATCH), strict=True):
        work = http_work[start : start + HTTP_BATCH]
        bad = {i for i, (ok, *_) in enumerate(work) if not ok}
        assert status in (200, 206, 400) and answer["success"] == len(work) - len(bad)
        assert {e["index"] for e in answer["errors"]} == bad and all(e["reason"] for e in answer["errors"])

    stored_log = {e.container_id for e in logged(sqlite_url)}
    assert stored_log == valid_ids  # nothing bad got into the log, nothing valid was lost
    processed_at = time.monotonic()
    metadata, check = _run_container_events(sqlite_url)
    with get_engine(sqlite_url).connect() as conn:
        applied = {r.container_id for r in conn.execute(node_container.select())}
        letters = dead_letters(conn)
    assert applied == valid_ids and not letters and check.passed
    assert metadata["events_processed"].value == len(valid_ids)
    # Each refusal counted, by reason.
    refusals = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("primus_lens_jobs_container_event_error_total{")
    )
    assert refusals == SWEEP_EVENTS - len(valid_ids)
    with capsys.disabled():
        print(
            f"\nhostile ingest sweep: {SWEEP_EVENTS} events ({len(valid_ids)} valid, "
            f"{SWEEP_EVENTS - len(valid_ids)} hostile) over {GRPC_STREAMS} gRPC streams and "
            f"{len(results['http'])} HTTP batches in {sent:.1f} s; applied {len(applied)} in "
            f"{time.monotonic() - processed_at:.1f} s; quarantined {len(letters)}; hostile kinds: "
            + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
        )


# -- the edge against the log format, property-based ----------------------------------------

_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=80) | st.sampled_from(HOSTILE_TEXT)
_number = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**70), 2**70)
_leaf = st.none() | st.booleans() | _number | _text
_json = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=12,
)
_data = st.fixed_dictionaries(
    {},
    optional={
        "pod_name": _text | _json,
        "pod_namespace": _text,
        "pod_uuid": _text,
        "status": _text | _json,
        "created_at": _number | _json,
        "metadata": st.dictionaries(_text, _json, max_size=3) | _json,
        "labels": st.dictionaries(_text, _text, max_size=3) | _json,
        "devices": st.fixed_dictionaries(
            {}, optional={"gpu": st.lists(st.dictionaries(_text, _json, max_size=4), max_size=3) | _json}
        )
        | _json,
    },
)
_event = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["Running", "Created", "Exit", "snapshot", "Deleted"]) | _text,
        "source": st.sampled_from(["k8s", "docker"]) | _text,
        "node": _text,
        "container_id": _text,
        "data": _data | _json,
    },
    optional={"event_id": _text | _json, "cluster": _text | _json},
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=_event)
def test_what_the_edge_accepts_the_log_stores_and_processing_never_raises(event):
    origin = Origin("k8s", None, "east")
    try:
        row = from_json(event, origin, datetime(2026, 11, 25, tzinfo=UTC))
    except Refused as refused:
        assert refused.reason and str(refused)
        return
    record = encode_record(row)  # never raises for an accepted event
    (back,) = decode_segment(1, row["cluster_name"], b"\x01" + record)
    assert (back.container_id, back.node_name, back.event_id, back.event_type) == (
        row["container_id"],
        row["node_name"],
        row["event_id"],
        row["event_type"],
    )
    decoded = back.data()
    rows = apply_events(
        [
            ContainerEventRecord(
                1, back.source, back.event_type, back.container_id, back.node_name, decoded, back.received_at
            )
        ],
        {},
    )
    # Applied, or set aside with a reason: never an exception, never a row no table can hold.
    assert len(rows.containers) + len(rows.unusable) == 1
    for container in rows.containers.values():
        for value in container.values():
            assert not (isinstance(value, str) and "\x00" in value)
            assert not (isinstance(value, float) and not math.isfinite(value))
