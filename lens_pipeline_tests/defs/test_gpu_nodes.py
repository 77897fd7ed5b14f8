"""`gpu_nodes` materialized through Dagster, against simulated clusters over real HTTP, on every dialect.

The simulator computes its ground truth with its own code (`/_truth`); the `node` table must equal
it row for row, stay untouched by a run that sees no change, and follow the cluster when it changes.
"""

from __future__ import annotations

import gc
import json
import urllib.request
from pathlib import Path

import pytest
from dagster import AssetKey, instance_for_test
from sqlalchemy import select

from lens_pipeline.defs.cluster_assets import cluster_assets
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.defs.resources import (
    ClusterRegistryResource,
    KubernetesResource,
    LensDatabase,
    PrometheusResource,
)
from lens_pipeline.sim.server import SimServer
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.schema import node
from lens_pipeline_tests.defs.support import (
    DIALECT_REQUESTS,
    add_unreachable_cluster,
    failure_message,
    materializations,
    materialize_cluster,
    served_fleet,
)

AMD, NVIDIA = "sim-amd-0", "sim-nvidia-1"
TRUTH_COLUMNS = (
    "name",
    "address",
    "gpu_name",
    "gpu_count",
    "gpu_allocation",
    "gpu_utilization",
    "status",
    "k8s_status",
    "cpu",
    "cpu_count",
    "memory",
    "k8s_version",
    "kubelet_version",
    "containerd_version",
    "os",
    "driver_version",
    "taints",
    "labels",
    "annotations",
)


@pytest.fixture
def sim(tmp_path):
    with served_fleet(tmp_path, clusters=2, nodes=12, seed=11, vendor="mixed") as served:
        yield served


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [AMD, NVIDIA, "unreachable"])
        yield instance


def run(cluster: str, registry: Path, lens_url: str, instance, raise_on_error: bool = True):
    return materialize_cluster(
        ["gpu_nodes"],
        partition_key=cluster,
        instance=instance,
        raise_on_error=raise_on_error,
        resources={
            "registry": ClusterRegistryResource(clusters_file=str(registry)),
            "kubernetes": KubernetesResource(page_size=5, max_retries=1, backoff_seconds=0.05),
            "prometheus": PrometheusResource(timeout_seconds=5),
            "lens_db": LensDatabase(url=lens_url),
        },
    )


def truth(server: SimServer, cluster: str) -> list[dict]:
    with urllib.request.urlopen(f"{server.base_url(cluster)}/_truth") as response:
        return json.load(response)["nodes"]


def stored(lens_url: str, cluster: str) -> list[dict]:
    with get_engine(lens_url).connect() as conn:
        rows = conn.execute(
            select(node).where(node.c.cluster_name == cluster).order_by(node.c.name)
        ).mappings()
        return [dict(r) for r in rows]


def assert_table_equals_truth(lens_url: str, server: SimServer, cluster: str) -> None:
    expected = truth(server, cluster)
    actual = [{c: row[c] for c in TRUTH_COLUMNS} for row in stored(lens_url, cluster)]
    assert [r["name"] for r in actual] == [r["name"] for r in expected]
    for have, want in zip(actual, expected, strict=True):
        want = {c: want[c] for c in TRUTH_COLUMNS}
        if want["gpu_utilization"] is not None:
            assert have["gpu_utilization"] == pytest.approx(want["gpu_utilization"], abs=1e-6), want["name"]
            have["gpu_utilization"] = want["gpu_utilization"]
        assert have == want


def materialization_metadata(result) -> dict:
    (event,) = materializations(result, "gpu_nodes")
    return {k: v.value for k, v in event.metadata.items()}


def test_node_table_follows_the_cluster(sim, instance, lens_url):
    fleet, server, registry = sim
    for cluster in (AMD, NVIDIA):
        first = run(cluster, registry, lens_url, instance)
        assert first.success
        assert_table_equals_truth(lens_url, server, cluster)
        meta = materialization_metadata(first)
        assert meta["rows_inserted"] == len(truth(server, cluster)) > 0
        assert meta["malformed_objects"] == 0
    # Both vendors are real: AMD rows carry AMD products, NVIDIA rows NVIDIA products.
    assert {r["gpu_name"].split("_")[0] for r in stored(lens_url, AMD)} == {"AMD"}
    assert {r["gpu_name"].split("-")[0] for r in stored(lens_url, NVIDIA)} == {"NVIDIA"}

    before = stored(lens_url, AMD)
    again = run(AMD, registry, lens_url, instance)
    meta = materialization_metadata(again)
    assert (meta["rows_inserted"], meta["rows_updated"], meta["rows_vanished"]) == (0, 0, 0)
    assert stored(lens_url, AMD) == before  # not one byte, not one updated_at

    cluster = fleet.cluster(AMD)
    rows = truth(server, AMD)
    with_room = next(
        r["name"] for r in rows if r["gpu_allocation"] < r["gpu_count"] and r["status"] == "Ready"
    )
    others = [r["name"] for r in rows if r["name"] != with_room]
    gpu_names = [others[0], others[1], with_room]
    cluster.set_node_ready(gpu_names[0], False)
    cluster.remove_node(gpu_names[1])
    cluster.add_gpu_pod(gpu_names[2], 1)
    changed = run(AMD, registry, lens_url, instance)
    assert_table_equals_truth(lens_url, server, AMD)
    meta = materialization_metadata(changed)
    assert meta["rows_vanished"] == 1 and meta["rows_updated"] >= 2
    rows = {r["name"]: r for r in stored(lens_url, AMD)}
    assert rows[gpu_names[0]]["status"] == "NotReady"
    assert gpu_names[1] not in rows
    assert stored(lens_url, NVIDIA) != []  # the other cluster's rows are its own


def test_requests_are_pages_only(sim, instance, sqlite_url):
    fleet, _server, registry = sim
    cluster = fleet.cluster(AMD)
    cluster.request_log.reset()
    result = run(AMD, registry, sqlite_url, instance)
    meta = materialization_metadata(result)
    # Page size 5 in these tests: every Kubernetes request is one page of a LIST, never a GET per object.
    node_objects = len(cluster.node_names()) + 2  # + the CPU-only nodes, listed and skipped
    assert cluster.request_count("/api/v1/nodes") == -(-node_objects // 5)
    assert cluster.request_count("/api/v1/pods") == meta["kubernetes_pages"] - -(-node_objects // 5)
    assert meta["kubernetes_requests"] == meta["kubernetes_pages"]
    assert meta["prometheus_queries"] == 1
    # Besides the query, the turn's dialect: metric names, the GPU series' labels and, since their
    # `pod` could be the scrape target's, the exporter targets' jobs and labels; the NICs' labels.
    assert cluster.request_count("/prometheus") == 1 + DIALECT_REQUESTS
    assert cluster.request_count() == meta["kubernetes_pages"] + 1 + DIALECT_REQUESTS
    assert gc.isenabled()  # paused for the cluster's turn only


def test_malformed_nodes_are_counted_and_stored_rows_survive(sim, instance, sqlite_url):
    fleet, _server, registry = sim
    assert run(AMD, registry, sqlite_url, instance).success
    cluster = fleet.cluster(AMD)
    victim = next(n for n in cluster.node_names() if "gpu" in n)
    kept = next(r for r in stored(sqlite_url, AMD) if r["name"] == victim)
    cluster.remove_node(victim)
    cluster.inject_raw_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": victim, "labels": {"amd.com/gpu.product-name": "X"}},
        }
    )  # no status at all
    cluster.inject_raw_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "bad-capacity"},
            "status": {"capacity": {"amd.com/gpu": "eight"}},
        }
    )
    cluster.inject_raw_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "no-labels"},
            "status": {"capacity": {"amd.com/gpu": "4", "cpu": "8", "memory": "1Gi"}},
        }
    )
    result = run(AMD, registry, sqlite_url, instance)
    assert result.success
    meta = materialization_metadata(result)
    assert meta["malformed_objects"] == 2
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert not checks["every_node_readable"].passed and checks["allocation_within_capacity"].passed
    rows = {r["name"]: r for r in stored(sqlite_url, AMD)}
    assert rows[victim] == kept  # unreadable this run: the stored row is intact
    assert rows["no-labels"]["gpu_name"] == "Unknown" and rows["no-labels"]["gpu_count"] == 4
    assert "bad-capacity" not in rows


def test_prometheus_failure_keeps_stored_utilization(sim, instance, sqlite_url):
    fleet, _server, registry = sim
    assert run(NVIDIA, registry, sqlite_url, instance).success
    before = {r["name"]: r["gpu_utilization"] for r in stored(sqlite_url, NVIDIA)}
    fleet.cluster(NVIDIA).set_fault("prometheus", 503)
    result = run(NVIDIA, registry, sqlite_url, instance)
    assert result.success
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert not checks["utilization_fresh"].passed
    assert "503" in checks["utilization_fresh"].metadata["error"].value
    assert {r["name"]: r["gpu_utilization"] for r in stored(sqlite_url, NVIDIA)} == before


def test_an_unreachable_cluster_fails_alone_with_a_clear_error(sim, instance, sqlite_url):
    _fleet, _server, registry = sim
    add_unreachable_cluster(registry, "unreachable")
    assert run(AMD, registry, sqlite_url, instance).success
    before = stored(sqlite_url, AMD)
    result = run("unreachable", registry, sqlite_url, instance, raise_on_error=False)
    assert not result.success
    message = failure_message(result)
    assert "unreachable" in message and "GET /api/v1/" in message and "Connection refused" in message
    assert stored(sqlite_url, AMD) == before
    assert run(AMD, registry, sqlite_url, instance).success  # the others go on


def test_the_asset_has_checks_and_is_partitioned():
    assert cluster_assets.partitions_def.name == CLUSTER_PARTITIONS_NAME
    assert {k.name for k in cluster_assets.check_keys if k.asset_key == AssetKey("gpu_nodes")} == {
        "allocation_within_capacity",
        "every_node_readable",
        "utilization_fresh",
        "every_gpu_node_has_utilization",
    }
    assert AssetKey("gpu_nodes") in cluster_assets.keys
