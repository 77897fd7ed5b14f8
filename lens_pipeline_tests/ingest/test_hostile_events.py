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
import time
from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lens_pipeline.collect.containers import ContainerEventRecord, apply_events
from lens_pipeline.ingest.events import Origin, Refused, from_json
from lens_pipeline.store.containers import container_column_widths
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.event_log import dead_letters, decode_segment, encode_record
from lens_pipeline.store.schema import node_container
from lens_pipeline_tests.ingest.hostile import HOSTILE_TEXT, MAX_EVENT_BYTES, run_sweep
from lens_pipeline_tests.ingest.support import ingest_server, logged
from lens_pipeline_tests.ingest.test_quarantine import _run_container_events

# Events of the suite's sweep: half valid, half hostile, split between gRPC and HTTP.
SWEEP_EVENTS = 10_400


def test_thousands_of_hostile_events_over_grpc_and_http_stop_nothing(sqlite_url, capsys):
    with ingest_server(sqlite_url, max_event_bytes=MAX_EVENT_BYTES) as server:
        figures, valid_ids = run_sweep(server, SWEEP_EVENTS)
    unusable = figures.unusable_ids
    stored_log = {e.container_id for e in logged(sqlite_url)}
    # Every accepted event logged once; nothing the edge refused got in; nothing valid was lost.
    assert stored_log == valid_ids | unusable and len(unusable) >= SWEEP_EVENTS // 20
    processed_at = time.monotonic()
    metadata, check = _run_container_events(sqlite_url)
    with get_engine(sqlite_url).connect() as conn:
        applied = {r.container_id for r in conn.execute(node_container.select())}
        letters = dead_letters(conn)
    # Every valid event applied; every accepted one that no table holds quarantined with a reason.
    assert applied == valid_ids
    assert sorted(letter["container_id"] for letter in letters) == sorted(unusable)
    assert all(letter["stage"] == "processing" and letter["reason"] for letter in letters)
    assert metadata["events_quarantined"].value == len(unusable) and not check.passed
    assert metadata["events_processed"].value == len(valid_ids) + len(unusable)
    # Each refusal counted, by reason.
    refusals = sum(
        float(line.rsplit(" ", 1)[1])
        for line in figures.metrics.splitlines()
        if line.startswith("primus_lens_jobs_container_event_error_total{")
    )
    assert refusals == figures.refused
    with capsys.disabled():
        print(
            f"\nhostile ingest sweep: {figures.events} events ({figures.valid} valid, {figures.refused} "
            f"refused at the edge, {len(unusable)} accepted but unusable) over {figures.grpc_streams} gRPC "
            f"streams and {figures.http_batches} HTTP batches in "
            f"{figures.send_seconds:.1f} s; applied {len(applied)} in {time.monotonic() - processed_at:.1f} s; "
            f"quarantined {len(letters)}; hostile kinds: "
            + ", ".join(f"{k} {n}" for k, n in sorted(figures.kinds.items()))
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
        container_column_widths(),
    )
    # Applied, or set aside with a reason: never an exception, never a row no table can hold.
    assert len(rows.containers) + len(rows.unusable) == 1
    for container in rows.containers.values():
        for value in container.values():
            assert not (isinstance(value, str) and "\x00" in value)
            assert not (isinstance(value, float) and not math.isfinite(value))
