"""`/v1/gpu-aggregation/*` over real HTTP on every dialect, on a day of hours the hourly history's own
aggregation and writer stored: lists of what the range holds, each table's hours paged and sorted,
the snapshots, and every kind of bad input answered 400 naming the parameter."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import uvicorn

from lens_pipeline.api.app import create_app
from lens_pipeline.collect.history import HeldPod, HourInputs, PodMemory, WorkloadInfo, hour_tables
from lens_pipeline.collect.statistics import PodSeries
from lens_pipeline.store.db import get_engine, write_transaction
from lens_pipeline.store.hourly import replace_hour_tables
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.schema import gpu_workload, node
from lens_pipeline_tests.api.test_api import TOKEN, Api
from lens_pipeline_tests.conftest import _server_database
from lens_pipeline_tests.ports import free_port

CLUSTER = "agg-1"
START = datetime(2026, 11, 24, tzinfo=UTC)  # a day of hours from here
HOURS = 24
A = "/v1/gpu-aggregation"


def _text(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _hour(start: float, index: int) -> HourInputs:
    """Two namespaces' workloads; the second workload only in the day's second half."""
    steps = [start + k * 300.0 for k in range(12)]
    busy = 20.0 + index
    pods = [HeldPod("p1", "ml", "train-0", 4, start - 60, None, "w1")]
    utilization = {("ml", "train-0"): PodSeries({t: 4 * busy for t in steps}, dict.fromkeys(steps, 4.0), {})}
    if index >= 12:
        pods.append(HeldPod("p2", "web", "infer-0", 2, start - 60, None, "w2"))
        utilization[("web", "infer-0")] = PodSeries(
            {t: 2 * 90.0 for t in steps}, dict.fromkeys(steps, 2.0), {}
        )
    return HourInputs(
        cluster=CLUSTER,
        start=start,
        step_seconds=300.0,
        capacity=dict.fromkeys(steps, 16.0),
        utilization=utilization,
        memory={
            ("ml", "train-0"): PodMemory(
                dict.fromkeys(steps, 4096.0), dict.fromkeys(steps, 8192.0), dict.fromkeys(steps, 4.0)
            )
        },
        pods=pods,
        workloads={
            "w1": WorkloadInfo("w1", "PyTorchJob", "ml", "train", "", {"team": "nlp"}, {}),
            "w2": WorkloadInfo("w2", "Deployment", "web", "infer", "", {"team": "search"}, {}),
        },
    )


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mysql"])
def api(request, tmp_path_factory) -> Iterator[Api]:
    """A day of one cluster's hours in a fresh database of each dialect, served over a socket."""
    database = None if request.param == "sqlite" else _server_database(request.param, "agg")
    lens_url = (
        next(database) if database is not None else f"sqlite:///{tmp_path_factory.mktemp('agg')}/lens.db"
    )
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    now = datetime.now(UTC)
    with write_transaction(engine) as conn:
        conn.execute(
            node.insert().values(
                cluster_name=CLUSTER, name="n1", gpu_count=16, created_at=now, updated_at=now
            )
        )
        conn.execute(
            gpu_workload.insert().values(
                cluster_name=CLUSTER, uid="w1", kind="PyTorchJob", namespace="ml", name="train", parent_uid=""
            )
        )
        for index in range(HOURS):
            hour = START + timedelta(hours=index)
            replace_hour_tables(conn, CLUSTER, hour, hour_tables(_hour(hour.timestamp(), index)), now)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(engine, token=TOKEN), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield Api(f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        if database is not None:
            database.close()


DAY = {"cluster": CLUSTER, "start_time": _text(START), "end_time": _text(START + timedelta(hours=HOURS - 1))}


def test_hours_paged_sorted_and_listed(api):
    status, body = api.get(f"{A}/cluster/hourly-stats", **DAY, page_size=10, order_direction="desc")
    assert status == 200 and body["meta"]["code"] == 2000
    page = body["data"]
    assert (page["total"], page["page"], page["page_size"], page["total_pages"]) == (24, 1, 10, 3)
    first = page["data"][0]
    assert first["stat_hour"] == "2026-11-24T23:00:00Z" and first["cluster_name"] == CLUSTER
    assert first["allocated_gpu_count"] == 6.0 and first["total_gpu_capacity"] == 16.0
    assert first["avg_utilization"] == pytest.approx((4 * 43 + 2 * 90) / 6)
    _, body = api.get(f"{A}/cluster/hourly-stats", **DAY, page=3, page_size=10, order_by="utilization")
    assert len(body["data"]["data"]) == 4

    _, body = api.get(f"{A}/namespaces/hourly-stats", **DAY, namespace="web", page_size=100)
    assert body["data"]["total"] == 12 and {r["namespace"] for r in body["data"]["data"]} == {"web"}
    _, body = api.get(
        f"{A}/workloads/hourly-stats", **DAY, workload_type="PyTorchJob", order_by="utilization"
    )
    rows = body["data"]["data"]
    assert body["data"]["total"] == 24 and rows[0]["avg_utilization"] == 20.0
    assert rows[0]["labels"] == {"team": "nlp"} and rows[0]["avg_gpu_memory_used"] == 1.0
    _, body = api.get(
        f"{A}/labels/hourly-stats",
        **DAY,
        dimension_type="label",
        dimension_key="team",
        dimension_value="search",
    )
    assert body["data"]["total"] == 12

    assert api.get(f"{A}/clusters")[1]["data"] == [CLUSTER]
    assert api.get(f"{A}/namespaces", **DAY)[1]["data"] == ["ml", "web"]
    first_half = DAY | {"end_time": _text(START + timedelta(hours=11))}
    assert api.get(f"{A}/namespaces", **first_half)[1]["data"] == ["ml"]
    assert api.get(f"{A}/dimension-keys", **DAY, dimension_type="label")[1]["data"] == ["app", "env", "team"]
    values = api.get(f"{A}/dimension-values", **DAY, dimension_type="label", dimension_key="team")[1]["data"]
    assert values == ["nlp", "search"]


def test_a_workloads_hourly_utilization_route_reads_the_hours_the_history_wrote(api):
    """`/v1/workloads/gpuUtilizationHistory` at steps of an hour or more reads this table."""
    day = {"start": int(START.timestamp()), "end": int(START.timestamp()) + (HOURS - 1) * 3600}
    status, body = api.get(
        "/v1/workloads/gpuUtilizationHistory",
        cluster=CLUSTER,
        kind="PyTorchJob",
        name="train",
        step=3600,
        **day,
    )
    assert status == 200, body
    (series,) = body["data"]["series"]
    assert [(p["timestamp"], p["value"]) for p in series["values"]] == [
        (day["start"] + i * 3600, pytest.approx(20.0 + i)) for i in range(HOURS)
    ]


def test_snapshots(api):
    status, body = api.get(f"{A}/snapshots/latest", cluster=CLUSTER)
    assert status == 200 and body["data"]["snapshot_time"] == "2026-11-24T23:55:00Z"
    assert body["data"]["allocation_details"]["namespaces"]["web"]["allocatedGpu"] == 2
    _, body = api.get(f"{A}/snapshots", **DAY, page=2, page_size=100)
    assert body["data"]["total"] == 23 * 12 + 1  # end_time is 23:00, included
    assert body["data"]["data"][0]["snapshot_time"] == "2026-11-24T08:20:00Z"  # the 101st, in order
    assert api.get(f"{A}/snapshots", cluster=CLUSTER)[1]["data"]["total"] == 0  # the last day: none yet


@pytest.mark.parametrize(
    ("path", "params", "named"),
    [
        ("cluster/hourly-stats", {"start_time": None}, "start_time"),
        ("cluster/hourly-stats", {"end_time": "yesterday"}, "end_time"),
        ("cluster/hourly-stats", {"end_time": "2026-11-24T10:00:00"}, "end_time"),  # no zone
        ("cluster/hourly-stats", {"start_time": "2026-11-25T00:00:00Z"}, "start_time"),  # after the end
        ("cluster/hourly-stats", {"start_time": "2025-11-01T00:00:00Z"}, "more than 366 days"),
        ("cluster/hourly-stats", {"order_by": "id; DROP TABLE node"}, "order_by"),
        ("cluster/hourly-stats", {"order_direction": "sideways"}, "order_direction"),
        ("cluster/hourly-stats", {"page_size": 1001}, "page_size"),
        ("cluster/hourly-stats", {"page": 0}, "page"),
        ("namespaces/hourly-stats", {"namespace": "' OR '1'='1"}, "namespace"),
        ("workloads/hourly-stats", {"workload_name": "x'; DROP TABLE node; --"}, "workload_name"),
        ("labels/hourly-stats", {"dimension_type": "label"}, "dimension_key"),
        ("labels/hourly-stats", {"dimension_type": "colour", "dimension_key": "team"}, "dimension_type"),
        ("labels/hourly-stats", {"dimension_type": "label", "dimension_key": "owner"}, "dimension_key"),
        ("dimension-values", {"dimension_type": "annotation", "dimension_key": "team"}, "dimension_key"),
        ("dimension-values", {"dimension_type": "label", "dimension_key": "a b"}, "dimension_key"),
        ("dimension-keys", {"dimension_type": None}, "dimension_type"),
        ("snapshots", {"start_time": "2026-11-01T00:00:00Z"}, "more than 7 days"),
        ("snapshots", {"page_size": 101}, "page_size"),
    ],
)
def test_bad_input_is_a_400_naming_the_parameter(api, path, params, named):
    status, body = api.get(f"{A}/{path}", **(DAY | params))
    assert status == 400 and body["meta"]["code"] == 4000, body
    assert named in body["meta"]["message"], body["meta"]


def test_unknown_cluster_and_token(api):
    status, body = api.get(f"{A}/cluster/hourly-stats", **(DAY | {"cluster": "nowhere"}))
    assert status == 404 and "nowhere" in body["meta"]["message"]
    assert api.get(f"{A}/snapshots/latest", cluster="nowhere")[0] == 404
    assert api.get(f"{A}/clusters", token=None)[0] == 401
