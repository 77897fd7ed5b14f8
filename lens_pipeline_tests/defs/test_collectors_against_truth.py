"""All collectors of a cluster in one Dagster run, against the simulator's ground truth, through churn.

After any number of churn steps, `gpu_pods`, `gpu_workload` (+ references) and `storage` equal what
the simulator says a correct pipeline stores; a run that sees no change writes no row; the
Kubernetes requests of a run are pages and discovery only.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
from dagster import instance_for_test
from sqlalchemy import select

from lens_pipeline import settings
from lens_pipeline.clusters import load_registry
from lens_pipeline.collect.problems import MalformedObject
from lens_pipeline.defs import resources
from lens_pipeline.defs.cluster_assets import COLLECTOR_KEYS
from lens_pipeline.defs.collectors import common
from lens_pipeline.defs.collectors import gpu_pods as gpu_pods_part
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.defs.resources import ClusterRegistryResource, KubernetesResource, LensDatabase
from lens_pipeline.kube.cache import WatchCache, WatchCacheServer
from lens_pipeline.kube.reader import KubeReader
from lens_pipeline.sim.fleet import SimCluster, SimFleet
from lens_pipeline.sim.kubeobjects import LAST_APPLIED
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.schema import (
    gpu_device,
    gpu_pods,
    gpu_workload,
    gpu_workload_snapshot,
    rdma_device,
    storage,
    workload_pod_reference,
)
from lens_pipeline_tests.defs.support import edit_registry, materializations, materialize_cluster

POD_COLUMNS = (
    "namespace",
    "name",
    "uid",
    "node_name",
    "gpu_allocated",
    "phase",
    "deleted",
    "running",
    "ip",
    "owner_uid",
)
WORKLOAD_COLUMNS = (
    "uid",
    "group_version",
    "kind",
    "namespace",
    "name",
    "parent_uid",
    "labels",
    "annotations",
    "gpu_request",
    "status",
)
DEVICE_COLUMNS = ("gpu_model", "serial", "memory", "utilization", "temperature", "power")
WRITE_COUNTS = ("rows_inserted", "rows_updated", "rows_vanished")


@pytest.fixture(params=["shipped", "everything"])
def fleet_and_registry(tmp_path, request):
    """An AMD and an NVIDIA cluster whose exporters speak as shipped, or in every way real
    deployments change them at once (prefix, honor_labels: false, the node by `instance` only,
    older GFD labels, JuiceFS without quota, dcgm-exporter's `hostname`): the truth is the same."""
    fleet = SimFleet.generate(clusters=2, nodes=16, seed=21, vendor="mixed", dialect=request.param)
    with SimServer(fleet) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [c.name for c in fleet])
        yield fleet, server, write_registry(tmp_path / "clusters.yaml", server), instance


def collect(cluster: str, registry, url: str, instance):
    result = materialize_cluster(
        COLLECTOR_KEYS,
        partition_key=cluster,
        instance=instance,
        resources={
            **resources.defs.resources,
            "registry": ClusterRegistryResource(clusters_file=str(registry)),
            "kubernetes": KubernetesResource(page_size=7, max_retries=1, backoff_seconds=0.05),
            "lens_db": LensDatabase(url=url),
        },
    )
    assert result.success
    return {
        node: {k: v.value for k, v in event.metadata.items()}
        for node in ("gpu_nodes", "gpu_pods", "gpu_workloads", "gpu_devices", "storage_backends")
        for event in materializations(result, node)
    }


def truth(server: SimServer, cluster: str) -> dict:
    with urllib.request.urlopen(f"{server.base_url(cluster)}/_truth") as response:
        return json.load(response)


def table(url: str, t, cluster: str) -> list[dict]:
    with get_engine(url).connect() as conn:
        return [dict(r) for r in conn.execute(select(t).where(t.c.cluster_name == cluster)).mappings()]


def observable(device: dict, cluster: SimCluster, nodes: list[dict]) -> dict:
    """A `gpu_device` row of the truth as the cluster's exporters let it be known: dcgm-exporter
    without the reserved framebuffer series (before 4.3.1-4.4.0) gives used + free, the reserve
    unseen; AMD's default labels have no market name, so the model is the node's product label."""
    known = {c: device[c] for c in DEVICE_COLUMNS}
    if cluster.vendor == "nvidia" and "DCGM_FI_DEV_FB_RESERVED" in cluster.dialect.missing_metrics:
        known["memory"] -= cluster.gpu_product(device["node_name"]).reserved_mib
    if cluster.vendor == "amd" and cluster.dialect.amd_default_labels:
        known["gpu_model"] = next(n["gpu_name"] for n in nodes if n["name"] == device["node_name"])
    return known


def assert_matches_truth(url: str, server: SimServer, cluster: str) -> None:
    expected = truth(server, cluster)
    pods = {r["uid"]: r for r in table(url, gpu_pods, cluster)}
    for want in expected["pods"]:
        assert {c: pods[want["uid"]][c] for c in POD_COLUMNS} == {c: want[c] for c in POD_COLUMNS}
    live = {p["uid"] for p in expected["pods"]}
    for uid, row in pods.items():
        if uid not in live:  # gone from the cluster: kept, marked, never dropped
            assert uid in expected["removed_pods"] and row["deleted"] and not row["running"], row

    workloads = {r["uid"]: r for r in table(url, gpu_workload, cluster)}
    for want in expected["workloads"]:
        have = workloads[want["uid"]]
        assert {c: have[c] for c in WORKLOAD_COLUMNS} == {c: want[c] for c in WORKLOAD_COLUMNS}, want["name"]
        assert (have["end_at"] is None) == (want["status"] in ("Running", "Pending"))
    current = {w["uid"] for w in expected["workloads"]}
    for uid, row in workloads.items():
        if uid in expected["removed_workloads"] and uid not in current:
            assert row["status"] == "Deleted" and row["end_at"] is not None
        elif uid not in current:
            assert row["status"] in ("Done", "Failed", "Deleted"), row

    references = {(r["workload_uid"], r["pod_uid"]) for r in table(url, workload_pod_reference, cluster)}
    for want in expected["workloads"]:
        assert {(want["uid"], p) for p in want["pod_uids"]} <= references

    backends = {(r["kind"], r["name"]) for r in table(url, storage, cluster) if r["deleted_at"] is None}
    assert backends == {(s["kind"], s["name"]) for s in expected["storage"]}

    ready = {n["name"] for n in expected["nodes"] if n["status"] == "Ready"}
    gpus = {(r["node_name"], r["gpu_id"]): r for r in table(url, gpu_device, cluster)}
    for want in expected["gpu_devices"]:
        have = gpus[(want["node_name"], want["gpu_id"])]
        known = observable(want, server.fleet.cluster(cluster), expected["nodes"])
        assert {c: have[c] for c in DEVICE_COLUMNS} == pytest.approx(known)
    seen = {(d["node_name"], d["gpu_id"]) for d in expected["gpu_devices"]}
    assert {k for k in gpus if k[0] in ready} == seen  # vanished GPUs of Ready nodes are gone
    nics = {
        (r["node_name"], r["ifname"]): r for r in table(url, rdma_device, cluster) if r["deleted_at"] is None
    }
    assert {k for k in nics if k[0] in ready} == {
        (n["node_name"], n["ifname"]) for n in expected["rdma_devices"]
    }
    for want in expected["rdma_devices"]:
        assert (nics[(want["node_name"], want["ifname"])]["fw"]) == want["fw"]


def test_every_collector_equals_the_truth_through_churn(fleet_and_registry, lens_url):
    fleet, server, registry, instance = fleet_and_registry
    for cluster in fleet:
        collect(cluster.name, registry, lens_url, instance)
        assert_matches_truth(lens_url, server, cluster.name)
    amd = fleet.clusters[0]
    for _ in range(3):
        amd.churn(steps=4)
        collect(amd.name, registry, lens_url, instance)
        assert_matches_truth(lens_url, server, amd.name)

    # Nothing changed since the last run: no row written by any collector.
    quiet = collect(amd.name, registry, lens_url, instance)
    for asset_name, metadata in quiet.items():
        assert tuple(metadata.get(k, 0) for k in WRITE_COUNTS) == (0, 0, 0), asset_name
    assert quiet["gpu_pods"]["pod_snapshots_written"] == quiet["gpu_pods"]["pod_events_written"] == 0
    assert (
        quiet["gpu_workloads"]["pod_references_added"]
        == quiet["gpu_workloads"]["workload_snapshots_written"]
        == 0
    )


def test_kubectl_copy_of_a_spec_is_not_kept(fleet_and_registry, lens_url):
    """Workloads applied with kubectl carry the manifest it sent in an annotation (the simulator's,
    as real ones): neither a workload's annotations nor its snapshot keep that copy, and every
    other annotation and the spec itself are kept."""
    fleet, _, registry, instance = fleet_and_registry
    cluster = fleet.clusters[0]
    collect(cluster.name, registry, lens_url, instance)
    listed = {
        entry.obj["metadata"]["uid"]: entry.obj
        for resource in ("deployments", "jobs", "pytorchjobs", "statefulsets", "rayjobs", "mpijobs")
        for entry in cluster.simulated_objects(resource)
    }
    applied = {uid for uid, obj in listed.items() if LAST_APPLIED in obj["metadata"].get("annotations", {})}
    workloads = {r["uid"]: r for r in table(lens_url, gpu_workload, cluster.name)}
    snapshots = {r["uid"]: r["detail"] for r in table(lens_url, gpu_workload_snapshot, cluster.name)}
    assert applied & workloads.keys() and applied & snapshots.keys()  # the case is there to test
    for uid in applied & workloads.keys():
        kept = {k: v for k, v in listed[uid]["metadata"]["annotations"].items() if k != LAST_APPLIED}
        assert workloads[uid]["annotations"] == kept
    assert any(workloads[uid]["annotations"] for uid in applied & workloads.keys())  # others are kept
    for uid in applied & snapshots.keys():
        assert snapshots[uid]["metadata"]["annotations"] == workloads[uid]["annotations"]
        assert snapshots[uid]["spec"] == listed[uid]["spec"]


def test_only_objects_whose_resource_version_moved_are_read_again(fleet_and_registry, lens_url, monkeypatch):
    """A pod or owner listed at the resourceVersion its stored rows were built from is that same
    object (Kubernetes gives every change a new one): its rows are not rebuilt. One that changed, in
    any field the rows store, is read again; and rows built by other code are rebuilt once."""
    fleet, server, registry, instance = fleet_and_registry
    cluster = fleet.clusters[0]
    collect(cluster.name, registry, lens_url, instance)
    quiet = collect(cluster.name, registry, lens_url, instance)
    pods, workloads = quiet["gpu_pods"], quiet["gpu_workloads"]
    assert pods["pods_unchanged_since_stored"] == pods["dagster/row_count"] > 0
    assert workloads["workloads_unchanged_since_stored"] == workloads["dagster/row_count"] > 0

    # A running pod finishes: its phase (stored) and its resourceVersion move; its workload's status
    # may follow.
    running = next(p for p in truth(server, cluster.name)["pods"] if p["phase"] == "Running")
    cluster.set_pod_phase(running["namespace"], running["name"], "Succeeded")
    changed = collect(cluster.name, registry, lens_url, instance)
    assert_matches_truth(lens_url, server, cluster.name)
    assert changed["gpu_pods"]["rows_updated"] >= 1
    assert changed["gpu_pods"]["pods_unchanged_since_stored"] < pods["dagster/row_count"]
    (row,) = [r for r in table(lens_url, gpu_pods, cluster.name) if r["uid"] == running["uid"]]
    assert (row["phase"], row["running"]) == ("Succeeded", False)

    # A row the current code would not build (as after a fix in how rows are derived) stays as long
    # as its object does not change, and is rebuilt once the code that builds rows is another.
    with get_engine(lens_url).begin() as conn:
        conn.execute(gpu_pods.update().where(gpu_pods.c.uid == running["uid"]).values(ip="stale"))
    collect(cluster.name, registry, lens_url, instance)
    assert {r["uid"]: r["ip"] for r in table(lens_url, gpu_pods, cluster.name)}[running["uid"]] == "stale"
    monkeypatch.setattr(common, "rows_version", lambda: "other code")
    rebuilt = collect(cluster.name, registry, lens_url, instance)
    assert rebuilt["gpu_pods"]["pods_unchanged_since_stored"] == 0
    assert rebuilt["gpu_workloads"]["workloads_unchanged_since_stored"] == 0
    assert rebuilt["gpu_pods"]["rows_updated"] == 1  # the stale row, and only it
    assert_matches_truth(lens_url, server, cluster.name)
    again = collect(cluster.name, registry, lens_url, instance)
    assert again["gpu_pods"]["pods_unchanged_since_stored"] == again["gpu_pods"]["dagster/row_count"]


def test_a_stored_object_this_code_refuses_is_reported_at_every_run(
    fleet_and_registry, sqlite_url, monkeypatch
):
    """Rows that earlier code stored for an object this code refuses stay as they were (nothing is
    lost); they are not taken for this code's rows, so the unchanged object is read in full and
    reported again at every run, not only at the first."""
    fleet, _server, registry, instance = fleet_and_registry
    cluster = fleet.clusters[0]
    collect(cluster.name, registry, sqlite_url, instance)
    stored = {r["uid"]: r for r in table(sqlite_url, gpu_pods, cluster.name)}
    refused = sorted(stored)[0]
    build = gpu_pods_part.gpu_pod_row

    def stricter(pod):
        if pod.uid == refused:
            raise MalformedObject("a check this code adds")
        return build(pod)

    monkeypatch.setattr(gpu_pods_part, "gpu_pod_row", stricter)
    monkeypatch.setattr(common, "rows_version", lambda: "stricter code")
    for _ in range(2):
        pods = collect(cluster.name, registry, sqlite_url, instance)["gpu_pods"]
        assert pods["malformed_objects"] == 1
        assert pods["pods_unchanged_since_stored"] == 0
        assert pods["rows_built_by"].startswith("not recorded: 1 objects unreadable")
        assert {r["uid"]: r for r in table(sqlite_url, gpu_pods, cluster.name)}[refused] == stored[refused]
    monkeypatch.setattr(gpu_pods_part, "gpu_pod_row", build)  # readable again: recorded, fast again
    recorded = collect(cluster.name, registry, sqlite_url, instance)["gpu_pods"]["rows_built_by"]
    assert recorded.startswith("stricter code for ")
    again = collect(cluster.name, registry, sqlite_url, instance)["gpu_pods"]
    assert again["pods_unchanged_since_stored"] == again["dagster/row_count"]


def test_a_run_lists_each_kind_once(fleet_and_registry, sqlite_url):
    fleet, _server, registry, instance = fleet_and_registry
    cluster = fleet.clusters[1]
    cluster.request_log.reset()
    collect(cluster.name, registry, sqlite_url, instance)
    counts = cluster.request_log.as_json()["counts"]
    config = ClusterRegistryResource(clusters_file=str(registry)).cluster(cluster.name)
    with KubeReader(config, page_size=100_000) as counter:
        for path, requests in counts.items():
            method, url = path.split(" ", 1)
            assert method == "GET"
            if "/prometheus/" in url or "/secrets/" in url:
                continue  # queries; one GET per storage backend's Secret
            document = counter.get(url)
            if document is not None and "items" in document:
                objects = len(counter.list(url, lambda o: o))
                assert requests == max(1, -(-objects // 7)), (url, requests, objects)  # pages, once
            else:
                assert requests == 1, (url, requests)  # discovery, once per group-version


def test_rows_built_for_another_gpu_resource_are_built_again(fleet_and_registry, sqlite_url):
    """A pod's GPUs are counted in its cluster's vendor's resource. Once the registry names another
    vendor, the stored rows (of the first vendor's GPUs) are no one's: an unchanged pod is read in
    full again rather than taken to hold as many GPUs of the other vendor's resource."""
    fleet, _server, registry, instance = fleet_and_registry
    amd = next(c for c in fleet if c.vendor == "amd")
    first = collect(amd.name, registry, sqlite_url, instance)["gpu_pods"]
    assert first["dagster/row_count"] > 0
    assert first["rows_built_by"].endswith(" for amd.com/gpu, amd.com/<spx|dpx|tpx|qpx|cpx>_nps<N>")

    def say_nvidia(document: dict) -> None:
        (entry,) = [c for c in document["clusters"] if c["name"] == amd.name]
        entry["vendor"] = "nvidia"

    edit_registry(registry, say_nvidia)
    pods = collect(amd.name, registry, sqlite_url, instance)["gpu_pods"]
    assert pods["pods_unchanged_since_stored"] == 0
    assert pods["dagster/row_count"] == 0  # its pods ask for amd.com/gpu: none holds nvidia.com/gpu
    assert pods["rows_built_by"].endswith(
        " for nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-<profile>[.shared]"
    )


def test_collectors_reading_the_watch_cache_equal_the_truth_through_churn(
    fleet_and_registry, sqlite_url, monkeypatch
):
    """With `lens watch` between the runs and the API server: the first run finds the cache cold,
    which starts keeping what it asked for, and waits for its lists rather than list the API server
    beside it; every run reads from the cache, and says so; what they store is the truth all the
    same, and a run that sees no change writes no row. The cache asks for a token, which the runs
    take from the environment, as deployed."""
    fleet, server, registry, instance = fleet_and_registry
    cluster = fleet.clusters[0]
    monkeypatch.setenv(settings.LENS_WATCH_CACHE_TOKEN, "t0ken,older")
    # The runs send the first token of the list; the cache here accepts that one only.
    cache = WatchCache(load_registry(registry).clusters, watch_seconds=2, tokens=["t0ken"])
    httpd = WatchCacheServer(cache)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    kubernetes = KubernetesResource(
        page_size=7, max_retries=1, backoff_seconds=0.05, watch_cache_url=httpd.url
    )

    def run() -> dict:
        result = materialize_cluster(
            COLLECTOR_KEYS,
            partition_key=cluster.name,
            instance=instance,
            resources={
                **resources.defs.resources,
                "registry": ClusterRegistryResource(clusters_file=str(registry)),
                "kubernetes": kubernetes,
                "lens_db": LensDatabase(url=sqlite_url),
            },
        )
        assert result.success
        return {
            n: {k: v.value for k, v in e.metadata.items()}
            for n in COLLECTED
            for e in materializations(result, n)
        }

    def caught_up() -> bool:
        config = load_registry(registry).get(cluster.name)
        via, direct = KubeReader(config, cache_url=httpd.url, cache_token="t0ken"), KubeReader(config)
        for path in ("/api/v1/pods", "/api/v1/nodes", "/apis/apps/v1/replicasets"):
            if (
                via.list(path, _version) != direct.list(path, _version)
                or via.stats.sources[path] != "watch cache"
            ):
                return False
        return True

    try:
        cluster.request_log.reset()
        first = run()
        assert_matches_truth(sqlite_url, server, cluster.name)
        first_sources = {
            path: s for m in first.values() for path, s in m.get("kubernetes_list_sources", {}).items()
        }
        assert first_sources and set(first_sources.values()) == {"watch cache"}, first_sources
        # The API server was listed once per collection, by the cache (first pages; watches apart).
        listed = [
            line.split("?")[0]
            for line in cluster.request_log.as_json()["recent"]
            if "limit=" in line and "continue=" not in line and "watch=true" not in line
        ]
        assert listed and len(listed) == len(set(listed)), listed
        _until(caught_up)
        for _ in range(2):
            cluster.churn(steps=4)
            _until(caught_up)
            read = run()
            assert_matches_truth(sqlite_url, server, cluster.name)
            sources = {
                path: s for m in read.values() for path, s in m.get("kubernetes_list_sources", {}).items()
            }
            assert sources and set(sources.values()) == {"watch cache"}, sources
            assert "/api/v1/pods" in sources and "/api/v1/nodes" in sources
        quiet = run()
        for asset_name, metadata in quiet.items():
            assert tuple(metadata.get(k, 0) for k in WRITE_COUNTS) == (0, 0, 0), asset_name
        assert cache.refused == 0  # every run bore the first token
    finally:
        cache.close()
        httpd.shutdown()
        httpd.server_close()


COLLECTED = ("gpu_nodes", "gpu_pods", "gpu_workloads", "gpu_devices", "storage_backends")


def _version(obj: dict) -> tuple[str, str]:
    return obj["metadata"]["uid"], obj["metadata"]["resourceVersion"]


def _until(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.1)
