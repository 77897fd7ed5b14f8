"""The read API's routes beyond the overview, nodes and workloads lists (issue 19), on SQLite,
PostgreSQL and MariaDB, over a Lens database the pipeline filled from a simulated fleet (before and
after churn) and the simulator's Prometheus in four exporter dialects (AMD and NVIDIA as shipped,
and with a metric prefix, `exported_*` pod labels and nodes named only by `instance`).

What the routes read from the database is compared with the stored rows or the simulator's truth;
every series with the exporters' own samples (`sim.exporters.scrape`) and node_exporter's load
(`sim.exporters.host_load`), not with numbers written here.
"""

from __future__ import annotations

import io
import math
import sys
import time
from collections.abc import Iterator
from contextlib import redirect_stderr
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dagster import instance_for_test
from fastapi.testclient import TestClient

from lens_pipeline.api.app import create_app
from lens_pipeline.api.common import MAX_POINTS_PER_ANSWER, ApiError, TimeRange, time_range
from lens_pipeline.clusters import load_registry
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.sim.exporters import host_load, scrape
from lens_pipeline.sim.fleet import SimCluster, SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.schema import (
    cluster_overview_cache,
    gpu_pods,
    gpu_workload,
    pod_resource,
    workload_gpu_hourly_stats,
    workload_pod_reference,
    workload_statistic,
)
from lens_pipeline_tests.conftest import _server_database
from lens_pipeline_tests.defs.test_collectors_against_truth import table, truth
from lens_pipeline_tests.defs.test_derived_against_truth import materialize_everything

# The simulator's exporter families, by what the API makes of them (the truth's side of the names).
MEMORY = {
    "amd": ("gpu_used_vram", ("gpu_total_vram",)),
    "nvidia": (
        "DCGM_FI_DEV_FB_USED",
        ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"),
    ),
}
POWER = {"amd": "gpu_package_power", "nvidia": "DCGM_FI_DEV_POWER_USAGE"}
TEMPERATURE = {"amd": "gpu_junction_temperature", "nvidia": "DCGM_FI_DEV_GPU_TEMP"}


@dataclass
class World:
    client: TestClient
    url: str
    fleet: SimFleet
    server: SimServer
    registry: Path

    def get(self, path: str, cluster: str, **params: object) -> tuple[int, dict]:
        response = self.client.get(path, params={"cluster": cluster, **params})
        return response.status_code, response.json()

    def data(self, path: str, cluster: str, **params: object):
        status, body = self.get(path, cluster, **params)
        assert status == 200 and body["meta"] == {"code": 2000, "message": "OK"}, (path, body)
        return body["data"]


def _fill(fleet: SimFleet, registry: Path, url: str, tmp: Path, instance) -> None:
    for cluster in fleet:
        assert materialize_everything(
            registry, url, f"sqlite:///{tmp}/safe.db", instance, partition_key=cluster.name
        ).success


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mysql"])
def world(request, tmp_path_factory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("routes")
    database = _server_database(request.param, "routes") if request.param != "sqlite" else None
    url = next(database) if database is not None else f"sqlite:///{tmp}/lens.db"
    fleet = SimFleet.generate(clusters=4, nodes=6, seed=21, vendor="mixed", dialect="shipped,everything")
    log = io.StringIO()  # Dagster's run log, shown only if the fill fails
    try:
        with SimServer(fleet) as server:
            registry = write_registry(tmp / "clusters.yaml", server)
            try:
                with redirect_stderr(log), instance_for_test() as instance:
                    instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [c.name for c in fleet])
                    _fill(fleet, registry, url, tmp, instance)
                    for cluster in fleet:  # pods end and start: the nodes have a history
                        cluster.churn(steps=3)
                    _fill(fleet, registry, url, tmp, instance)
            except BaseException:
                sys.stderr.write(log.getvalue())
                raise
            app = create_app(get_engine(url), registry=lambda: load_registry(registry))
            with TestClient(app) as client:
                yield World(client, url, fleet, server, registry)
    finally:
        if database is not None:
            database.close()


def gpus(cluster: SimCluster) -> list[dict]:
    """Every GPU the cluster's exporters report, with its node, index, pod and figures."""
    found: dict[tuple[str, str], dict] = {}
    for target, samples in scrape(cluster).items():
        if target.job != cluster.profile.exporter_job:
            continue
        for metric, labels, value in samples:
            index = labels.get("gpu_id", labels.get("gpu"))
            if index is None:
                continue
            gpu = found.setdefault(
                (target.node, index),
                {
                    "node": target.node,
                    "index": int(index),
                    "pod": labels.get("pod") or "",
                    "namespace": labels.get("namespace") or "",
                },
            )
            gpu[metric] = value
    vendor = cluster.vendor
    used, total = MEMORY[vendor]
    # A dialect may leave series out (dcgm-exporter before 4.3.1 has no reserved framebuffer): the
    # total is what the cluster's Prometheus has, as gpu_device.memory adds it.
    total = tuple(m for m in total if m not in cluster.dialect.missing_metrics)
    for gpu in found.values():
        gpu["util"] = gpu[cluster.profile.util_metric]
        gpu["used"], gpu["total"] = gpu[used], sum(gpu[m] for m in total)
        gpu["power"], gpu["temperature"] = gpu[POWER[vendor]], gpu[TEMPERATURE[vendor]]
    return sorted(found.values(), key=lambda g: (g["node"], g["index"]))


def mean(values) -> float:
    values = [v for v in values if math.isfinite(v)]
    return sum(values) / len(values)


def span(seconds: int = 120, step: int = 60) -> dict[str, int]:
    now = int(time.time())
    return {"start": now - seconds, "end": now, "step": step}


def values(series: list[dict]) -> set[float]:
    return {round(p["value"], 6) for p in series}


# -- read from the database ---------------------------------------------------------------------


def test_node_allocation_is_the_node_table_with_each_nodes_vendor(world):
    for cluster in world.fleet:
        want = [n for n in truth(world.server, cluster.name)["nodes"] if n["gpu_count"]]
        have = world.data("/v1/nodes/gpuAllocation", cluster.name)
        assert have == [
            {
                "node": n["name"],
                "vendor": cluster.vendor,
                "capacity": n["gpu_count"],
                "allocated": n["gpu_allocation"],
                "allocationRate": pytest.approx(n["gpu_allocation"] / n["gpu_count"]),
            }
            for n in sorted(want, key=lambda n: n["name"])
        ]


def test_cluster_utilization_and_storage_are_the_cached_overview(world):
    for cluster in world.fleet:
        (row,) = table(world.url, cluster_overview_cache, cluster.name)
        assert world.data("/v1/nodes/gpuUtilization", cluster.name) == {
            "allocationRate": pytest.approx(row["allocation_rate"]),
            "utilization": pytest.approx(row["utilization"]),
        }
        storage = world.data("/v1/storage/stat", cluster.name)
        assert storage["used_space"] == pytest.approx(row["storage_used_space"])
        assert storage["total_space"] == (
            pytest.approx(row["storage_total_space"]) if row["storage_total_space"] is not None else None
        )
        assert storage["write_bandwidth"] == pytest.approx(row["storage_write_bandwidth"])
        assert storage["write_bandwidth"] > 0
    assert world.get("/v1/storage/stat", "no-such-cluster")[0] == 404
    assert world.get("/v1/nodes/gpuUtilization", "no-such-cluster")[0] == 404


def test_workload_statistic_metadata_and_hierarchy_by_kind_and_name(world):
    trees = 0
    for cluster in world.fleet:
        workloads = table(world.url, gpu_workload, cluster.name)
        statistics = {r["uid"]: r for r in table(world.url, workload_statistic, cluster.name)}
        running = [
            w for w in workloads if not w["parent_uid"] and w["status"] == "Running" and w["end_at"] is None
        ]
        measured = [statistics[w["uid"]] for w in running if w["uid"] in statistics]
        # Unknown figures (no series names a workload's GPUs) are left out, never taken as 0.
        instants = [
            s["instant_gpu_utilization"] for s in measured if s["instant_gpu_utilization"] is not None
        ]
        averages = [s["avg_gpu_utilization"] for s in measured if s["avg_gpu_utilization"] is not None]
        summary = world.data("/v1/workloads/statistic", cluster.name)
        assert summary == {
            "running_workloads_count": len(running),
            "avg_gpu_allocated": pytest.approx(mean([w["gpu_request"] for w in running]) if running else 0.0),
            "avg_gpu_utilization": pytest.approx(mean(instants)) if instants else None,
            "low_utilization_workloads_count": sum(a < 30 for a in averages),
        }
        metadata = world.data("/v1/workloadMetadata", cluster.name)
        assert metadata == {
            "namespaces": sorted({w["namespace"] for w in workloads}),
            "kinds": sorted({w["kind"] for w in workloads if not w["parent_uid"]}),
        }
        parents = [w for w in workloads if any(c["parent_uid"] == w["uid"] for c in workloads)]
        if not parents:
            continue
        parent = parents[0]
        by_uid = world.data(f"/v1/workloads/{parent['uid']}/hierarchy", cluster.name)
        by_name = world.data(
            "/v1/workloads/hierarchy",
            cluster.name,
            kind=parent["kind"],
            name=parent["name"],
            namespace=parent["namespace"],
        )
        assert by_name == by_uid and by_uid["children"]
        trees += 1
        status, body = world.get(
            "/v1/workloads/hierarchy", cluster.name, kind=parent["kind"], name="no-such-workload"
        )
        assert status == 404 and "no-such-workload" in body["meta"]["message"]
        status, body = world.get("/v1/workloads/hierarchy", cluster.name, name=parent["name"])
        assert status == 400 and "kind" in body["meta"]["message"]
    assert trees > 0


def test_node_workloads_now_and_the_pods_that_ran_before(world):
    ended_seen = 0
    for cluster in world.fleet:
        want = truth(world.server, cluster.name)
        running = {p["uid"]: p for p in want["pods"] if p["running"]}
        tops = [w for w in want["workloads"] if not w["parent_uid"]]
        for node in want["nodes"]:
            expected = {}
            for workload in tops:
                pods = [running[u] for u in workload["pod_uids"] if u in running]
                here = sum(p["gpu_allocated"] for p in pods if p["node_name"] == node["name"])
                if any(p["node_name"] == node["name"] for p in pods):
                    expected[workload["uid"]] = (sum(p["gpu_allocated"] for p in pods), here)
            page = world.data(f"/v1/nodes/{node['name']}/workloads", cluster.name, page_size=1000)
            assert page["total"] == len(expected)
            assert {w["uid"]: (w["gpu_allocated"], w["gpu_allocated_node"]) for w in page["data"]} == expected
            assert all(w["node_name"] == node["name"] and w["status"] == "Running" for w in page["data"])

        stored = table(world.url, gpu_pods, cluster.name)
        ends = {r["uid"]: r["end_at"] for r in table(world.url, pod_resource, cluster.name)}
        for node in {p["node_name"] for p in stored if p["node_name"]}:
            ended = [
                p for p in stored if p["node_name"] == node and not p["running"] and p["phase"] != "Pending"
            ]
            ended.sort(key=lambda p: (-p["created_at"].timestamp(), p["uid"]))
            page = world.data(f"/v1/nodes/{node}/workloadsHistory", cluster.name, page_size=1000)
            assert page["total"] == len(ended)
            assert [(h["pod_namespace"], h["pod_name"]) for h in page["data"]] == [
                (p["namespace"], p["name"]) for p in ended
            ]
            for have, pod in zip(page["data"], ended, strict=True):
                assert have["start_time"] == int(pod["created_at"].timestamp())
                assert have["end_time"] == int((ends.get(pod["uid"]) or pod["updated_at"]).timestamp())
                assert have["gpu_allocated"] == (pod["gpu_allocated"] or 0)
            ended_seen += len(ended)
            first = world.data(f"/v1/nodes/{node}/workloadsHistory", cluster.name, page_size=1)
            assert first["data"] == page["data"][:1] and first["total"] == page["total"]
    assert ended_seen > 0  # the churn ended pods: the history is not trivially empty
    assert world.get("/v1/nodes/no-such-node/workloads", world.fleet.clusters[0].name)[0] == 404


# -- series from Prometheus ---------------------------------------------------------------------


def test_cluster_history_is_the_exporters_allocation_utilization_and_memory(world):
    for cluster in world.fleet:
        reported = gpus(cluster)
        history = world.data("/v1/nodes/gpuUtilizationHistory", cluster.name, **span(600, 300))
        held = sum(1 for g in reported if g["pod"])
        assert values(history["allocationRate"]) == {round(100 * held / len(reported), 6)}
        assert values(history["utilization"]) == {round(mean(g["util"] for g in reported), 6)}
        memory = 100 * sum(g["used"] for g in reported) / sum(g["total"] for g in reported)
        assert values(history["vramUtilization"]) == {round(memory, 6)}
        assert len(history["utilization"]) == 3


def test_heatmap_is_the_gpus_of_the_five_hottest_nodes(world):
    for cluster in world.fleet:
        reported = gpus(cluster)
        heatmap = world.data("/v1/clusters/gpuHeatmap", cluster.name)
        assert {k: (v["serial"], v["unit"]) for k, v in heatmap.items()} == {
            "utilization": (1, "%"),
            "power": (2, "W"),
            "temperature": (3, "\u2103"),
        }
        for key, figure in (("utilization", "util"), ("power", "power"), ("temperature", "temperature")):
            by_node: dict[str, list[float]] = {}
            for gpu in reported:
                if math.isfinite(gpu[figure]) and gpu[figure] >= 0:
                    by_node.setdefault(gpu["node"], []).append(gpu[figure])
            means = sorted((mean(v) for v in by_node.values()), reverse=True)[:5]
            items = heatmap[key]["Data"]
            chosen = {i["node_name"] for i in items}
            assert sorted((mean(by_node[n]) for n in chosen), reverse=True) == pytest.approx(means), key
            figures = {(g["node"], g["index"]): g[figure] for g in reported}
            assert all(i["value"] == pytest.approx(figures[(i["node_name"], i["gpu_id"])]) for i in items)
            assert len(items) == sum(len(by_node[n]) for n in chosen)


def test_node_series_are_its_gpus_cpus_and_memory(world):
    for cluster in world.fleet:
        reported = gpus(cluster)
        nodes = truth(world.server, cluster.name)["nodes"]
        for node in nodes:
            mine = [g for g in reported if g["node"] == node["name"]]
            window = span()  # one window for both routes: two clocks may straddle a second
            metrics = world.data(f"/v1/nodes/{node['name']}/gpuMetrics", cluster.name, **window)
            history = world.data(f"/v1/nodes/{node['name']}/utilizationHistory", cluster.name, **window)
            now = world.data(f"/v1/nodes/{node['name']}/utilization", cluster.name)
            assert history["gpu_utilization"] == metrics["gpu_utilization"]
            assert history["gpu_allocation_rate"] == metrics["gpu_allocation_rate"]
            per_gpu = {
                s["labels"]["gpu_id"]: values(s["values"]) for s in metrics["gpu_utilization"]["series"]
            }
            assert per_gpu == {
                str(g["index"]): {round(g["util"], 6)} for g in mine if math.isfinite(g["util"])
            }
            assert now["gpu_allocation"] == node["gpu_allocation"]
            if not mine:  # NotReady: its exporters are down with it; nothing is made up
                assert metrics["gpu_allocation_rate"]["series"] == []
                assert now["cpu_utilization"] is None and now["mem_utilization"] is None
                continue
            (allocation,) = metrics["gpu_allocation_rate"]["series"]
            assert values(allocation["values"]) == {
                round(100 * sum(1 for g in mine if g["pod"]) / len(mine), 6)
            }
            busy, used = host_load(cluster.name, node["name"])
            assert now["cpu_utilization"] == pytest.approx(100 * busy)
            assert now["mem_utilization"] == pytest.approx(100 * used)
            (cpu,) = history["cpu_utilization"]["series"]
            (memory,) = history["mem_utilization"]["series"]
            assert [p["value"] for p in cpu["values"]] == pytest.approx([100 * busy] * 3)
            assert [p["value"] for p in memory["values"]] == pytest.approx([100 * used] * 3)


def test_workload_series_are_the_gpus_its_pods_hold(world):
    seen = 0
    for cluster in world.fleet:
        reported = gpus(cluster)
        want = truth(world.server, cluster.name)
        window = span()
        start, end = (datetime.fromtimestamp(window[k], UTC) for k in ("start", "end"))
        # The workload's pods that held GPUs in the range, as stored (a terminating pod holds its
        # GPUs until it is gone; one that ended before the range has no series in it).
        pods = {p["uid"]: p for p in table(world.url, gpu_pods, cluster.name)}
        held_between = {
            r["uid"]
            for r in table(world.url, pod_resource, cluster.name)
            if r["bound_at"] is not None
            and r["bound_at"] <= end
            and (r["end_at"] is None or r["end_at"] >= start)
        }
        references: dict[str, set[str]] = {}
        for r in table(world.url, workload_pod_reference, cluster.name):
            if r["pod_uid"] in held_between and r["pod_uid"] in pods:
                references.setdefault(r["workload_uid"], set()).add(r["pod_uid"])
        hours = {}
        for row in table(world.url, workload_gpu_hourly_stats, cluster.name):
            hours.setdefault(row["workload_uid"], []).append(row)
        for workload in want["workloads"]:
            if workload["parent_uid"] or workload["status"] != "Running":
                continue
            names = {(pods[u]["namespace"], pods[u]["name"]) for u in references.get(workload["uid"], ())}
            held = [g for g in reported if (g["namespace"], g["pod"]) in names]
            metrics = world.data(f"/v1/workloads/{workload['uid']}/metrics", cluster.name, **window)
            nodes = sorted({g["node"] for g in held})
            graphs = {
                title: {
                    s["labels"]["primus_lens_node_name"]: values(s["values"])
                    for s in metrics[title]["series"]
                }
                for title in ("GPU Utilization", "GPU Memory Utilization", "GPU Power")
            }
            finite = {n for n in nodes if any(math.isfinite(g["util"]) for g in held if g["node"] == n)}
            assert graphs["GPU Utilization"] == {
                n: {round(mean(g["util"] for g in held if g["node"] == n), 6)} for n in finite
            }
            assert graphs["GPU Memory Utilization"] == {
                n: {
                    round(
                        100
                        * sum(g["used"] for g in held if g["node"] == n)
                        / sum(g["total"] for g in held if g["node"] == n),
                        6,
                    )
                }
                for n in nodes
            }
            assert graphs["GPU Power"] == {
                n: {round(mean(g["power"] for g in held if g["node"] == n), 6)} for n in nodes
            }
            named = {"kind": workload["kind"], "name": workload["name"], "namespace": workload["namespace"]}
            fine = world.data("/v1/workloads/gpuUtilizationHistory", cluster.name, **named, **window)
            if finite:
                (series,) = fine["series"]
                assert values(series["values"]) == {round(mean(g["util"] for g in held), 6)}
                seen += 1
            hourly = world.data(
                "/v1/workloads/gpuUtilizationHistory", cluster.name, **named, **span(7200, 3600)
            )
            stored = sorted(hours.get(workload["uid"], []), key=lambda r: r["stat_hour"])
            if stored:
                (series,) = hourly["series"]
                stamp = int(time.time()) - 7200
                assert [p["value"] for p in series["values"]] == pytest.approx(
                    [r["avg_utilization"] for r in stored if r["sample_count"]]
                )
                assert all(p["timestamp"] >= stamp for p in series["values"])
    assert seen > 0


# -- bad input ---------------------------------------------------------------------------------


def test_bad_ranges_are_400s_naming_the_parameter_before_any_query(world):
    cluster = world.fleet.clusters[0]
    node = truth(world.server, cluster.name)["nodes"][0]["name"]
    now = int(time.time())
    asked = cluster.request_count("/prometheus")
    bad = [
        ({"start": now, "end": now - 60}, "start"),
        ({"start": now - 400 * 86400, "end": now}, "366 days"),
        ({"start": now - 86400, "end": now, "step": 1}, "step"),
        ({"start": now - 60, "end": now, "step": 0}, "step"),
        ({"start": now - 60, "end": now, "step": -5}, "step"),
        ({"start": -1, "end": now}, "start"),
        ({"start": now, "end": 10**13}, "end"),
        ({"start": "yesterday", "end": now}, "start"),
        ({"start": str(2**70), "end": now}, "start"),
        ({"start": "1e9", "end": now}, "start"),
        ({"end": now}, "start"),
        ({"start": now}, "end"),
    ]
    for route in (
        "/v1/nodes/gpuUtilizationHistory",
        f"/v1/nodes/{node}/gpuMetrics",
        f"/v1/nodes/{node}/utilizationHistory",
    ):
        for params, named in bad:
            status, body = world.get(route, cluster.name, **params)
            assert status == 400 and body["meta"]["code"] == 4000, (route, params, body)
            assert named in body["meta"]["message"], (route, params, body["meta"]["message"])
    assert cluster.request_count("/prometheus") == asked  # refused before Prometheus was asked
    for name in ("node%0A", "a" * 300, "x;y"):
        assert world.get(f"/v1/nodes/{name}/utilization", cluster.name)[0] == 400
    assert world.get("/v1/workloads/hierarchy", cluster.name, kind="Job", name="a b")[0] == 400


def test_range_bounds():
    assert time_range(0, 11_000 * 60 - 60, 60).points == 11_000
    with pytest.raises(ApiError, match="use step >= 2"):
        time_range(0, 11_000, 1)
    one_day = TimeRange(0, 86_400, 60)
    one_day.bound_answer(MAX_POINTS_PER_ANSWER // one_day.points)
    with pytest.raises(ApiError, match="points in one answer: use step >= "):
        one_day.bound_answer(MAX_POINTS_PER_ANSWER // one_day.points + 1)


def test_prometheus_missing_or_failing_is_a_clear_503(world):
    cluster = world.fleet.clusters[0]
    unconfigured = TestClient(create_app(get_engine(world.url)))
    response = unconfigured.get("/v1/clusters/gpuHeatmap", params={"cluster": cluster.name})
    assert response.status_code == 503 and "LENS_CLUSTERS_FILE" in response.json()["meta"]["message"]
    assert unconfigured.get("/v1/nodes/gpuAllocation", params={"cluster": cluster.name}).status_code == 200
    cluster.set_fault("prometheus", 503)
    try:
        status, body = world.get("/v1/nodes/gpuUtilizationHistory", cluster.name, **span())
        assert status == 503 and body["meta"]["code"] == 5030
        assert "Prometheus unavailable" in body["meta"]["message"] and cluster.name in body["meta"]["message"]
    finally:
        cluster.set_fault("prometheus")
    assert world.get("/v1/nodes/gpuUtilizationHistory", cluster.name, **span())[0] == 200
    errors = [
        line
        for line in world.client.get("/metrics").text.splitlines()
        if line.startswith("lens_api_prometheus_errors_total ")
    ]
    assert errors and float(errors[0].split()[1]) >= 1


def test_docs_work_with_no_internet(world):
    """/docs and /redoc name no other host; every script, style and icon they load is served here."""
    for page, wanted in (
        ("/docs", ("swagger-ui-bundle.js", "swagger-ui.css")),
        ("/redoc", ("redoc.standalone.js",)),
    ):
        html = world.client.get(page).text
        assert "://" not in html.replace("http://www.w3.org", ""), page
        for asset in wanted:
            assert f"/docs-assets/{asset}" in html
            response = world.client.get(f"/docs-assets/{asset}")
            assert response.status_code == 200 and len(response.content) > 10_000, asset
    spec = world.client.get("/openapi.json").json()
    assert {"/v1/clusters/gpuHeatmap", "/v1/nodes/{name}/utilizationHistory", "/v1/workloadMetadata"} <= set(
        spec["paths"]
    )
