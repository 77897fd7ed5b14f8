"""The read API over real HTTP (uvicorn on a socket), on a Lens database the pipeline filled from the
simulator: the original's routes and envelope, paging and filters, 400/401/404, injection attempts
in every string parameter, the consumer metrics, and the live fallback when the cache misses."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import uvicorn
from dagster import instance_for_test
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, delete, update

from lens_pipeline import settings
from lens_pipeline.api import queries
from lens_pipeline.api.app import create_app
from lens_pipeline.clusters import load_registry
from lens_pipeline.collect.overview import api_overview
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.store.db import get_engine, write_transaction
from lens_pipeline.store.schema import cluster_overview_cache, gpu_consumers, node
from lens_pipeline_tests.conftest import _server_database
from lens_pipeline_tests.defs.test_collectors_against_truth import table, truth
from lens_pipeline_tests.defs.test_derived_against_truth import run_cluster
from lens_pipeline_tests.ports import free_port

TOKEN = "s3cret-token"
# Seconds: the copy follows the table within its refresh (1 s) and a read; a copy not refreshed for
# 3 s is not used at all (the table is read).
OVERVIEW_STALE_BOUND = 3.5
INJECTIONS = (
    "' OR '1'='1",
    "x'; DROP TABLE node; --",
    '" OR 1=1 --',
    "%' UNION SELECT * FROM node --",
    "\\'%_",
)


class Api:
    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str, token: str | None = TOKEN, **params: object) -> tuple[int, dict]:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        request = urllib.request.Request(f"{self.base}{path}{'?' + query if query else ''}")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def text(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.base}{path}", timeout=10) as response:
            return response.read().decode()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request, tmp_path_factory) -> Iterator[tuple[Api, str, dict, str]]:
    """Two simulated clusters collected once, and the API serving their database over a socket."""
    tmp = tmp_path_factory.mktemp("api")
    database = _server_database("postgresql", "api") if request.param == "postgresql" else None
    lens_url = next(database) if database is not None else f"sqlite:///{tmp}/lens.db"
    fleet = SimFleet.generate(clusters=2, nodes=12, seed=5, vendor="mixed")
    with SimServer(fleet) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [c.name for c in fleet])
        registry = write_registry(tmp / "clusters.yaml", server)
        for cluster in fleet:
            run_cluster(cluster.name, registry, lens_url, f"sqlite:///{tmp}/safe.db", instance)
        truths = {c.name: truth(server, c.name) for c in fleet}
    port = free_port()
    config = uvicorn.Config(
        create_app(get_engine(lens_url), token=TOKEN),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
    )
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uv.started
    try:
        yield Api(f"http://127.0.0.1:{port}"), lens_url, truths, fleet.clusters[0].name
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        if database is not None:
            database.close()


def test_overview_is_the_cached_row_in_the_original_envelope(served):
    api, _, truths, _ = served
    for cluster, want in truths.items():
        status, body = api.get("/v1/clusters/overview", cluster=cluster)
        assert status == 200 and body["meta"] == {"code": 2000, "message": "OK"}
        assert body["data"] == pytest.approx(api_overview(want["overview"]))
        assert {"totalNodes", "fullyIdleNodes", "allocationRate", "total_space", "total_rx"} <= body[
            "data"
        ].keys()


def test_overview_cache_miss_is_computed_live_from_the_node_table(served):
    api, lens_url, truths, cluster = served
    engine = get_engine(lens_url)
    with engine.connect() as conn:
        (cached,) = [
            dict(r._mapping)
            for r in conn.execute(
                cluster_overview_cache.select().where(cluster_overview_cache.c.cluster_name == cluster)
            )
        ]
    with write_transaction(engine) as conn:
        conn.execute(delete(cluster_overview_cache).where(cluster_overview_cache.c.cluster_name == cluster))
    deleted = time.monotonic()
    try:
        # The API's copy of the table follows it within its stated bound.
        while True:
            status, body = api.get("/v1/clusters/overview", cluster=cluster)
            assert status == 200
            live = body["data"]
            if live["total_space"] != api_overview(cached)["total_space"]:
                break
            assert time.monotonic() - deleted < OVERVIEW_STALE_BOUND, "the copy kept a deleted row"
            time.sleep(0.05)
        want = api_overview(truths[cluster]["overview"])
        for field in (
            "totalNodes",
            "healthyNodes",
            "faultyNodes",
            "fullyIdleNodes",
            "busyNodes",
            "allocationRate",
        ):
            assert live[field] == pytest.approx(want[field]), field
        # Storage and RDMA need Prometheus: unknown (null, never 0) until the asset fills them.
        assert live["total_space"] is None and live["used_space"] is None and live["total_rx"] is None
    finally:
        with write_transaction(engine) as conn:
            conn.execute(cluster_overview_cache.insert(), [{k: cached[k] for k in cached if k != "id"}])


def test_unknown_cluster_node_and_workload_are_404(served):
    api, *_, cluster = served
    assert api.get("/v1/clusters/overview", cluster="no-such-cluster")[0] == 404
    assert api.get("/v1/nodes", cluster="no-such-cluster")[0] == 404
    status, body = api.get("/v1/nodes/no-such-node", cluster=cluster)
    assert status == 404 and body["meta"]["code"] == 4040 and body["data"] is None
    assert api.get("/v1/nodes/no-such-node/gpuDevices", cluster=cluster)[0] == 404
    assert api.get("/v1/workloads/0000-none", cluster=cluster)[0] == 404
    assert api.get("/v1/workloads/0000-none/hierarchy", cluster=cluster)[0] == 404


def test_bad_parameters_are_400_and_a_missing_cluster_is_asked_for(served):
    api, *_, cluster = served
    for params in (
        {"page_num": 0},
        {"page_size": 100_000},
        {"page_num": "x"},
        {"order_by": "name; DROP TABLE node"},
        {"status": "Broken"},
        {"desc": "maybe"},
    ):
        status, body = api.get("/v1/nodes", cluster=cluster, **params)
        assert status == 400 and body["meta"]["code"] == 4000, params
    assert api.get("/v1/workloads", cluster=cluster, order="sideways")[0] == 400
    status, body = api.get("/v1/clusters/overview")  # two clusters: which one?
    assert status == 400 and "cluster" in body["meta"]["message"]


def test_hostile_parameters_are_400_on_every_dialect_never_5xx(served):
    """Pages past any integer, NUL in any parameter or path, names with a trailing newline, query
    strings of megabytes: a 400 that names the problem, on SQLite, PostgreSQL and MariaDB alike."""
    api, *_, cluster = served
    hostile = [
        ("/v1/nodes", {"page_num": 2**63}),
        ("/v1/nodes", {"page_num": 10**7}),
        ("/v1/workloads", {"page_num": 2**64 + 1, "page_size": 1000}),
        ("/v1/nodes", {"name": "gpu\x00-1"}),
        ("/v1/nodes", {"gpu_name": "AMD\x00"}),
        ("/v1/workloads", {"namespace": "a\x00b"}),
        ("/v1/clusters/overview", {"cluster": f"{cluster}\n"}),
        ("/v1/nodes", {"cluster": f"{cluster}\n"}),
        ("/v1/nodes", {"name": "x" * 20_000}),
        ("/v1/nodes/gpu%00node", {}),
    ]
    for path, params in hostile:
        status, body = api.get(path, cluster=params.pop("cluster", cluster), **params)
        assert status == 400, (path, params, status, body)
        assert body["meta"]["code"] == 4000 and body["meta"]["message"].startswith(("bad request", "invalid"))


def test_wrong_or_missing_token_is_401_and_health_needs_none(served):
    api, *_, cluster = served
    assert api.get("/v1/clusters/overview", token="wrong", cluster=cluster)[0] == 401
    status, body = api.get("/v1/nodes", token=None, cluster=cluster)
    assert status == 401 and body["meta"]["code"] == 4010
    assert api.get("/healthz", token=None)[0] == 200


def test_each_answer_carries_its_trace_and_writes_one_json_access_line(served, caplog):
    """The envelope's `tracing` (the original's field, null before): the caller's W3C trace id when
    it sends a `traceparent`, else a new one, with this answer's span; the access log's JSON line of
    the request carries the same ids, its route and status."""
    _api, lens_url, _truths, cluster = served
    client = TestClient(create_app(get_engine(lens_url), token=TOKEN))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    caller = "4bf92f3577b34da6a3ce929d0e0e4736"
    caplog.set_level(logging.INFO, logger="lens.api.access")
    answer = client.get(
        "/v1/clusters/overview",
        params={"cluster": cluster},
        headers={**headers, "traceparent": f"00-{caller}-00f067aa0ba902b7-01"},
    )
    assert answer.status_code == 200
    tracing = answer.json()["tracing"]
    assert tracing["trace_id"] == caller and re.fullmatch(r"[0-9a-f]{16}", tracing["span_id"])
    assert tracing["span_id"] != "00f067aa0ba902b7"
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "lens.api.access"]
    assert {k: line[k] for k in ("method", "path", "route", "status", "trace_id", "span_id")} == {
        "method": "GET",
        "path": "/v1/clusters/overview",
        "route": "/v1/clusters/overview",
        "status": 200,
        **tracing,
    }
    assert line["duration_ms"] >= 0
    # No traceparent, or one W3C trace context calls invalid: a new trace per request.
    traces = set()
    for extra in (
        {},
        {"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01"},
        {"traceparent": "garbage"},
        {"traceparent": f"00-{caller}-00f067aa0ba902b7-01-more"},  # version 00 has four fields
    ):
        body = client.get("/v1/nodes", params={"cluster": cluster}, headers={**headers, **extra}).json()
        assert re.fullmatch(r"[0-9a-f]{32}", body["tracing"]["trace_id"]), body["tracing"]
        traces.add(body["tracing"]["trace_id"])
    assert len(traces) == 4 and caller not in traces
    # A later version may carry more fields: its trace id is the caller's.
    later = client.get(
        "/v1/nodes",
        params={"cluster": cluster},
        headers={**headers, "traceparent": f"01-{caller}-00f067aa0ba902b7-01-more"},
    )
    assert later.json()["tracing"]["trace_id"] == caller
    # An answer refused before any route (a NUL in the query) is traced too.
    refused = client.get(
        "/v1/nodes?cluster=%00", headers={**headers, "traceparent": f"00-{caller}-00f067aa0ba902b7-01"}
    )
    assert refused.status_code == 400 and refused.json()["tracing"]["trace_id"] == caller


def test_injection_in_every_string_parameter_is_400_or_empty_never_an_sql_error(served):
    api, lens_url, _, cluster = served
    routes = {
        "/v1/clusters/overview": ("cluster",),
        "/v1/clusters/consumers": ("cluster",),
        "/v1/nodes": ("cluster", "name", "gpu_name", "status", "order_by"),
        "/v1/workloads": ("cluster", "name", "kind", "namespace", "status", "order_by", "order"),
    }
    for attempt in INJECTIONS:
        for route, params in routes.items():
            for param in params:
                args = {"cluster": cluster, param: attempt}
                status, body = api.get(route, **args)
                assert status in (200, 400, 404), (route, param, attempt, body)
                if status == 200:
                    assert body["data"]["total"] == 0, (route, param, attempt)
        for route in (
            "/v1/nodes/{}",
            "/v1/nodes/{}/gpuDevices",
            "/v1/workloads/{}",
            "/v1/workloads/{}/hierarchy",
        ):
            status, _ = api.get(route.format(urllib.parse.quote(attempt, safe="")), cluster=cluster)
            assert status in (400, 404), (route, attempt)
    assert table(lens_url, node, cluster)  # still there


def test_nodes_filter_sort_and_page(served):
    api, _, truths, cluster = served
    nodes = truths[cluster]["nodes"]
    status, body = api.get("/v1/nodes", cluster=cluster, page_size=5, order_by="gpu_allocation", desc="true")
    assert status == 200 and body["data"]["total"] == len(nodes)
    page = body["data"]["data"]
    assert len(page) == 5
    assert [n["gpu_allocation"] for n in page] == sorted((n["gpu_allocation"] for n in nodes), reverse=True)[
        :5
    ]
    assert {
        "name",
        "ip",
        "gpu_name",
        "gpu_count",
        "gpu_allocation",
        "gpu_utilization",
        "status",
        "status_color",
    } == page[0].keys()
    everything = [
        n["name"]
        for p in (1, 2, 3)
        for n in api.get("/v1/nodes", cluster=cluster, page_num=p, page_size=5)[1]["data"]["data"]
    ]
    assert everything == sorted(n["name"] for n in nodes)
    ready = api.get("/v1/nodes", cluster=cluster, status="Ready", page_size=100)[1]["data"]
    assert ready["total"] == sum(n["status"] == "Ready" for n in nodes)
    assert {n["status_color"] for n in ready["data"]} == {"green"}
    suffix = nodes[0]["name"][-5:]
    named = api.get("/v1/nodes", cluster=cluster, name=suffix)[1]["data"]
    assert named["total"] == sum(suffix in n["name"] for n in nodes) >= 1
    assert api.get("/v1/nodes", cluster=cluster, name="100%")[1]["data"]["total"] == 0  # % is literal


def test_node_detail_and_gpu_devices(served):
    api, _, truths, cluster = served
    ready = next(n for n in truths[cluster]["nodes"] if n["status"] == "Ready")
    status, body = api.get(f"/v1/nodes/{ready['name']}", cluster=cluster)
    assert status == 200 and body["data"]["name"] == ready["name"] and body["data"]["health"] == "Ready"
    assert body["data"]["static_gpu_details"] == f"{ready['gpu_count']} X {ready['gpu_name']}"
    devices = api.get(f"/v1/nodes/{ready['name']}/gpuDevices", cluster=cluster)[1]["data"]
    want = sorted(
        (d for d in truths[cluster]["gpu_devices"] if d["node_name"] == ready["name"]),
        key=lambda d: d["gpu_id"],
    )
    assert [d["deviceId"] for d in devices] == [d["gpu_id"] for d in want]
    assert [d["utilization"] for d in devices] == pytest.approx([d["utilization"] for d in want])


def test_workloads_top_level_with_statistics_detail_and_hierarchy(served):
    api, _, truths, cluster = served
    top = [w for w in truths[cluster]["workloads"] if not w["parent_uid"]]
    status, body = api.get("/v1/workloads", cluster=cluster, page_size=1000)
    assert status == 200 and body["data"]["total"] >= len(top)
    listed = {w["uid"]: w for w in body["data"]["data"]}
    assert {w["uid"] for w in top} <= listed.keys()
    for want in top:
        item = listed[want["uid"]]
        assert item["kind"] == want["kind"] and item["status"] == want["status"]
        if want["status"] == "Running":
            assert item["instant_gpu_utilization"] is not None
            assert item["gpu_allocated"] >= want["gpu_request"] if want["kind"] != "Workload" else True
    running = api.get("/v1/workloads", cluster=cluster, status="Running", page_size=1000)[1]["data"]
    assert {w["status"] for w in running["data"]} <= {"Running"}
    newest_first = [w["start_at"] for w in body["data"]["data"]]
    assert newest_first == sorted(newest_first, reverse=True)

    parent = next(
        w
        for w in truths[cluster]["workloads"]
        if any(c["parent_uid"] == w["uid"] for c in truths[cluster]["workloads"])
    )
    status, body = api.get(f"/v1/workloads/{parent['uid']}/hierarchy", cluster=cluster)
    assert status == 200 and body["data"]["uid"] == parent["uid"]
    children = {c["uid"] for c in truths[cluster]["workloads"] if c["parent_uid"] == parent["uid"]}
    assert {c["uid"] for c in body["data"]["children"]} == children

    detail = api.get(f"/v1/workloads/{parent['uid']}", cluster=cluster)[1]["data"]
    assert detail["uid"] == parent["uid"] and detail["apiVersion"] == parent["group_version"]
    pods = {p["uid"]: p for p in truths[cluster]["pods"]}
    assert {(p["podNamespace"], p["podName"]) for p in detail["pods"]} >= {
        (pods[u]["namespace"], pods[u]["name"]) for u in parent["pod_uids"] if u in pods
    }


def test_consumers_and_metrics_have_no_series_for_ended_consumers(served):
    api, lens_url, _, cluster = served
    rows = table(lens_url, gpu_consumers, cluster)
    status, body = api.get("/v1/clusters/consumers", cluster=cluster, page_size=1000)
    assert status == 200 and body["data"]["total"] == len(rows) > 0
    assert {c["uid"] for c in body["data"]["data"]} == {r["uid"] for r in rows}

    def series() -> dict[str, dict[tuple, float]]:
        out: dict[str, dict[tuple, float]] = {}
        for family in text_string_to_metric_families(api.text("/metrics")):
            for sample in family.samples:
                out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
        return out

    before = series()
    assert set(before["gpu_allocation_rate"].values()) == {
        r["allocation_rate"] for r in table(lens_url, cluster_overview_cache, cluster)
    } | {v for k, v in before["gpu_allocation_rate"].items() if dict(k)["cluster"] != cluster}
    mine = {
        dict(k)["uid"]: v
        for k, v in before["consumer_pod_gpu_allocated"].items()
        if dict(k)["cluster"] == cluster
    }
    assert mine == {r["uid"]: r["gpu_allocated"] for r in rows}
    assert all(0 <= v <= 100 for v in before["consumer_pod_gpu_usage"].values())  # no x100 (§10.4)
    # Base units beside the original's percentages.
    assert before["lens_gpu_allocation_ratio"] == pytest.approx(
        {k: v / 100 for k, v in before["gpu_allocation_rate"].items()}
    )
    (overview,) = table(lens_url, cluster_overview_cache, cluster)
    assert before["lens_gpu_utilization_ratio"][(("cluster", cluster),)] == pytest.approx(
        overview["utilization"] / 100
    )
    # The GPU nodes by state, as the overview counts them (what the faulty-nodes alert reads).
    states = ("healthy", "faulty", "fully_idle", "partially_idle", "busy")
    assert {
        dict(k)["state"]: v
        for k, v in before["lens_cluster_gpu_nodes"].items()
        if dict(k)["cluster"] == cluster
    } == {state: overview[f"{state}_nodes"] for state in states}
    assert overview["healthy_nodes"] + overview["faulty_nodes"] == overview["total_nodes"] > 0
    assert before["lens_consumer_gpu_utilization_ratio"] == pytest.approx(
        {k: v / 100 for k, v in before["consumer_pod_gpu_usage"].items()}
    )
    # Per cluster and asset, when it was last materialized: what a staleness alert reads.
    collected = {
        dict(k)["asset"]: v
        for k, v in before["lens_cluster_last_collected_timestamp_seconds"].items()
        if dict(k)["cluster"] == cluster
    }
    assert set(collected) >= {"gpu_nodes", "gpu_pods", "gpu_devices", "cluster_overview_cache"}
    assert all(time.time() - 600 < v <= time.time() for v in collected.values())

    engine = get_engine(lens_url)
    # A consumer whose GPUs no series names yet: its utilization is unknown (NULL), shown as null
    # and without a usage series, never as 0 % (an idle-looking busy job); its allocation stays.
    unknown = rows[-1]
    with write_transaction(engine) as conn:
        conn.execute(
            update(gpu_consumers).where(gpu_consumers.c.id == unknown["id"]).values(gpu_utilization=None)
        )
    try:
        now = series()
        assert not any(dict(k)["uid"] == unknown["uid"] for k in now["consumer_pod_gpu_usage"])
        assert not any(dict(k)["uid"] == unknown["uid"] for k in now["lens_consumer_gpu_utilization_ratio"])
        assert any(dict(k)["uid"] == unknown["uid"] for k in now["consumer_pod_gpu_allocated"])
        status, body = api.get("/v1/clusters/consumers", cluster=cluster, page_size=1000)
        (shown,) = [c for c in body["data"]["data"] if c["uid"] == unknown["uid"]]
        assert shown["stat"]["gpu_utilization"] is None
    finally:
        with write_transaction(engine) as conn:
            conn.execute(
                update(gpu_consumers)
                .where(gpu_consumers.c.id == unknown["id"])
                .values(gpu_utilization=unknown["gpu_utilization"])
            )

    gone = rows[0]
    with write_transaction(engine) as conn:  # the consumer ends: gpu_consumers drops its row
        conn.execute(delete(gpu_consumers).where(gpu_consumers.c.uid == gone["uid"]))
    try:
        after = series()
        assert all(dict(k)["uid"] != gone["uid"] for k in after["consumer_pod_active"])
    finally:
        with write_transaction(engine) as conn:
            conn.execute(gpu_consumers.insert(), [{k: v for k, v in gone.items() if k != "id"}])


def test_a_cluster_the_registry_no_longer_lists_has_no_gauges(served, tmp_path):
    """A cluster taken out of the registry keeps its rows, but `/metrics` exports none of its
    gauges (no staleness alert for a collection stopped on purpose, no frozen allocation rate) and
    counts it; with the registry unreadable, or none, every cluster is exported."""
    _api, lens_url, truths, cluster = served
    other = next(name for name in truths if name != cluster)
    path = tmp_path / "clusters.yaml"

    def gauges(registry) -> dict[str, set[str]]:
        client = TestClient(create_app(get_engine(lens_url), token=TOKEN, registry=registry))
        out: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(client.get("/metrics").text):
            for sample in family.samples:
                out.setdefault(sample.name, set()).add(sample.labels.get("cluster", str(sample.value)))
        return out

    path.write_text(f"clusters:\n  - name: {cluster}\n    server: http://127.0.0.1:9\n    token: x\n")
    listed = gauges(lambda: load_registry(path))
    for name in (
        "gpu_allocation_rate",
        "lens_cluster_last_collected_timestamp_seconds",
        "consumer_pod_gpu_allocated",
    ):
        assert listed[name] == {cluster}, name
    assert listed["lens_clusters_unregistered"] == {"1.0"}
    # Events the node agents logged for a cluster no registry lists ("default": they name none)
    # are never applied: counted by that name, where a retired cluster's backlog is not shown.
    from lens_pipeline.ingest.events import Origin, from_grpc
    from lens_pipeline.sim import node_agent as agent
    from lens_pipeline.store.event_log import append_events, log_transaction
    from lens_pipeline_tests.ingest.support import container_id, gpu_container

    # A cluster retired on purpose whose agents sent their last events two hours ago is not:
    # those leftovers stay in the log, but nothing keeps coming.
    now = datetime.now(UTC)
    with log_transaction(get_engine(lens_url)) as conn:
        append_events(
            conn,
            [
                from_grpc(
                    agent.event("Running", container_id(i), gpu_container(i, "Running", gpus=1)),
                    Origin("k8s", None, name),
                    at,
                )
                for name, at in (("default", now), ("retired", now - timedelta(hours=2)))
                for i in range(3)
            ],
        )
    strays = gauges(lambda: load_registry(path))
    assert strays["lens_container_events_unregistered"] == {"default"}
    assert "default" not in strays.get("lens_container_events_unprocessed", set())
    assert "lens_container_events_unregistered" not in gauges(None)  # no registry: nothing is stray
    # An entry in error still lists its cluster: it is broken, not retired.
    path.write_text(
        f"clusters:\n  - name: {cluster}\n    server: http://127.0.0.1:9\n    token: x\n"
        f"  - name: {other}\n    vendor: intel\n    server: http://127.0.0.1:9\n    token: x\n"
    )
    assert gauges(lambda: load_registry(path))["gpu_allocation_rate"] == {cluster, other}
    path.unlink()  # unreadable: it says nothing about which clusters left
    unreadable = gauges(lambda: load_registry(path))
    assert unreadable["gpu_allocation_rate"] == {cluster, other}
    assert unreadable["lens_clusters_unregistered"] == {"0.0"}
    assert gauges(None)["lens_cluster_last_collected_timestamp_seconds"] == {cluster, other}

    def broken_loader():
        raise PermissionError("the registry cannot be read")

    # /metrics answers whatever the loader raises, with every cluster.
    assert gauges(broken_loader)["gpu_allocation_rate"] == {cluster, other}


def test_openapi_describes_the_routes(served):
    api, *_ = served
    spec = json.loads(api.text("/openapi.json"))
    for path in (
        "/v1/clusters/overview",
        "/v1/clusters/consumers",
        "/v1/nodes",
        "/v1/nodes/{name}",
        "/v1/nodes/{name}/gpuDevices",
        "/v1/workloads",
        "/v1/workloads/{uid}",
        "/v1/workloads/{uid}/hierarchy",
        "/healthz",
        "/metrics",
    ):
        assert path in spec["paths"], path


def test_a_lost_database_connection_is_a_503_then_recovers(served):
    """Sessions killed under the API: the routes reading the database per request reconnect, the
    overview (answered from the API's copy of its table) does not notice. A database that does
    not answer at all is said clearly on every route, the overview included: a 503, not a 500."""
    api, lens_url, _, cluster = served
    assert api.get("/v1/clusters/consumers", cluster=cluster)[0] == 200  # its connections are open
    if lens_url.startswith("postgresql"):
        with get_engine(lens_url).connect() as conn:  # drop every other session: the API's too
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
    for _ in range(2):
        assert api.get("/v1/clusters/consumers", cluster=cluster)[0] == 200
        assert api.get("/v1/clusters/overview", cluster=cluster)[0] == 200
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there
        down = TestClient(create_app(create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:{port}/lens")))
        for path in ("/v1/clusters/overview", "/v1/clusters/consumers", "/v1/nodes"):
            response = down.get(path, params={"cluster": cluster})
            assert (response.status_code, response.json()["meta"]["code"]) == (503, 5030), path
            assert "database unavailable" in response.json()["meta"]["message"]
        # Unready (the readiness probe's /healthz), but alive (the liveness probe's /livez): the
        # kubelet takes the pods out of the Service and does not restart them for an outage.
        assert down.get("/healthz").status_code == 503
        alive = down.get("/livez")
        assert alive.status_code == 200 and alive.json()["data"] == {"status": "alive"}


def test_a_statement_the_database_refuses_is_a_500_not_an_outage():
    """Only a database that is away is a 503 (and counted as such): a statement it refuses while it
    answers (here a column renamed under the API, PostgreSQL's UndefinedColumn) is our bug, a 500,
    and the outage counter stays at zero."""
    from fastapi.testclient import TestClient

    from lens_pipeline.store.migrate import ensure_schema

    database = _server_database("postgresql", "api500")
    url = next(database)
    try:
        engine = get_engine(url)
        ensure_schema(engine, "lens")
        with write_transaction(engine) as conn:
            conn.execute(node.insert(), [{"cluster_name": "c1", "name": "n1", "gpu_count": 8}])
            conn.exec_driver_sql("ALTER TABLE node RENAME COLUMN gpu_count TO gpu_total")
        client = TestClient(create_app(engine), raise_server_exceptions=False)
        answer = client.get("/v1/nodes", params={"cluster": "c1"})
        assert (answer.status_code, answer.json()["meta"]["code"]) == (500, 5000)
        assert "ProgrammingError" in answer.json()["meta"]["message"]
        assert "lens_api_database_errors_total 0.0" in client.get("/metrics").text
    finally:
        database.close()


def test_an_unexpected_error_is_a_500_in_the_envelope_with_its_trace(served, caplog, monkeypatch):
    """A bug of ours (here a query that raises) answers in the envelope, not Starlette's plain
    text: a 500 naming the exception's type but none of its text, with the request's trace ids,
    which the error log line and the access line carry too."""
    _api, lens_url, _truths, cluster = served

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("secret detail of the failure")

    monkeypatch.setattr(queries, "nodes", broken)
    page = "https://lens.example.com"
    # The test client raises what the app lets escape to the server: nothing may.
    client = TestClient(create_app(get_engine(lens_url), token=TOKEN, cors_origins=[page]))
    caplog.set_level(logging.INFO)
    caller = "4bf92f3577b34da6a3ce929d0e0e4736"
    answer = client.get(
        "/v1/nodes",
        params={"cluster": cluster},
        headers={
            "Authorization": f"Bearer {TOKEN}",
            "traceparent": f"00-{caller}-00f067aa0ba902b7-01",
            "Origin": page,
        },
    )
    assert answer.headers["access-control-allow-origin"] == page  # the page can read why
    body = answer.json()
    assert (answer.status_code, body["meta"]["code"]) == (500, 5000)
    assert body["meta"]["message"] == "internal error: RuntimeError" and "secret" not in answer.text
    assert body["tracing"]["trace_id"] == caller
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "unhandled error" in errors[0].getMessage() and errors[0].exc_info
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "lens.api.access"]
    assert (line["status"], line["trace_id"]) == (500, caller)
    # The other routes still answer.
    assert client.get("/healthz", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_pages_of_the_configured_origins_may_read_the_api_from_a_browser(served, monkeypatch):
    """CORS (the original's router had it): a page of a configured origin gets its preflight
    answered without a token and may read the answers; another origin's page may not; without
    configuration no CORS header is sent at all."""
    _api, lens_url, _truths, cluster = served
    page = "https://lens.example.com"
    client = TestClient(create_app(get_engine(lens_url), token=TOKEN, cors_origins=[page]))
    preflight = client.options(
        "/v1/nodes",
        headers={
            "Origin": page,
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization,traceparent",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == page
    assert {"authorization", "traceparent"} <= {
        h.strip().lower() for h in preflight.headers["access-control-allow-headers"].split(",")
    }
    answer = client.get(
        "/v1/nodes", params={"cluster": cluster}, headers={"Origin": page, "Authorization": f"Bearer {TOKEN}"}
    )
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == page
    # The 401 of a missing token is readable by the page too (it can tell the user why).
    refused = client.get("/v1/nodes", params={"cluster": cluster}, headers={"Origin": page})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == page
    other = client.get(
        "/v1/nodes",
        params={"cluster": cluster},
        headers={"Origin": "https://elsewhere.example", "Authorization": f"Bearer {TOKEN}"},
    )
    assert "access-control-allow-origin" not in other.headers
    plain = TestClient(create_app(get_engine(lens_url), token=TOKEN))
    assert (
        "access-control-allow-origin"
        not in plain.get(
            "/v1/nodes",
            params={"cluster": cluster},
            headers={"Origin": page, "Authorization": f"Bearer {TOKEN}"},
        ).headers
    )
    # From the environment, and refused by name when an entry is no origin.
    monkeypatch.setenv(settings.LENS_API_CORS_ORIGINS, f"{page}, http://localhost:3000")
    assert settings.api_cors_origins() == (page, "http://localhost:3000")
    for bad in ("lens.example.com", "https://lens.example.com/", "https://lens.example.com/ui", "ftp://x"):
        monkeypatch.setenv(settings.LENS_API_CORS_ORIGINS, bad)
        with pytest.raises(ValueError, match="is not an origin"):
            settings.api_cors_origins()


def test_a_slow_database_read_on_an_event_loop_route_stops_no_other_request(served, monkeypatch):
    """The overview routes are served on the event loop (the in-memory copy is read there, in
    microseconds). When the copy is stale (the database is down, most likely) they read the table
    on a worker thread: a database that hangs delays those requests only, not `/livez` nor any
    other."""
    import asyncio

    import httpx

    _api, lens_url, _truths, cluster = served
    read = queries.OverviewReader.__call__

    def slow_read(self: Any, name: str) -> Any:
        time.sleep(2.0)  # a database that takes its time
        return read(self, name)

    monkeypatch.setattr(queries.OverviewReader, "__call__", slow_read)
    # Without its lifespan the app's copy never refreshes: it is stale, every overview reads the table.
    app = create_app(get_engine(lens_url))

    async def race() -> list[tuple[httpx.Response, float]]:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://lens"
        ) as client:

            async def timed(path: str, **params: str) -> tuple[httpx.Response, float]:
                started = time.monotonic()
                answer = await client.get(path, params=params)
                return answer, time.monotonic() - started

            began = time.monotonic()
            slow = [
                asyncio.create_task(timed(path, cluster=cluster))
                for path in ("/v1/clusters/overview", "/v1/nodes/gpuUtilization", "/v1/storage/stat")
            ]
            await asyncio.sleep(0.3)  # they are in their database reads by now
            alive, _ = await timed("/livez")
            # From the start: a read on the event loop would have held /livez behind all three.
            answered_after = time.monotonic() - began
            return [(alive, answered_after), *[await task for task in slow]]

    (alive, answered_after), *slow = asyncio.run(race())
    assert alive.status_code == 200 and answered_after < 1.5, answered_after
    assert [answer.status_code for answer, _ in slow] == [200, 200, 200]
    # The first read through the slow database (it also restarts the copy's refresh, which may
    # answer the later ones from memory).
    assert max(took for _, took in slow) >= 2.0
