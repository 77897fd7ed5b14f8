"""Churn: seeded and replayable, it moves every kind of state a collector reads, and never breaks
what a real cluster guarantees (no over-allocation, resolvable owner chains, truth = served objects)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lens_pipeline.kube.reader import raw_get
from lens_pipeline.sim import SimCluster, SimFleet, SimServer, write_registry
from lens_pipeline_tests.sim.support import (
    COLLECTIONS,
    api_client,
    control,
    http,
    list_raw,
    owner_walk,
    truth,
)

SEED = 23
CLOCK = 1_800_000_000.0


def _fixed_clock() -> float:
    return CLOCK


@pytest.fixture(scope="module")
def churned(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SimCluster, SimServer, Path, list[dict]]]:
    """A cluster checked after every one of 40 churn steps; the events of each step are kept."""
    fleet = SimFleet.generate(clusters=1, nodes=16, seed=SEED, vendor="nvidia", pods_per_node=3)
    registry = tmp_path_factory.mktemp("sim-churn") / "clusters.yaml"
    with SimServer(fleet) as server:
        write_registry(registry, server)
        yield fleet.clusters[0], server, registry, []


def _everything(registry: Path, name: str) -> dict[str, list[dict]]:
    api = api_client(registry, name)
    return {path: list_raw(api, path)[0] for path, _ in COLLECTIONS}


def _check_invariants(cluster: SimCluster, server: SimServer, registry: Path) -> None:
    objects = _everything(registry, cluster.name)
    facts = truth(server, cluster.name)
    resource = cluster.profile.resource
    # No node holds more GPUs than it has (vanished GPUs included).
    for row in facts["nodes"]:
        assert 0 <= row["gpu_allocation"] <= row["gpu_count"], row["name"]
        node = next(n for n in objects["/api/v1/nodes"] if n["metadata"]["name"] == row["name"])
        assert row["gpu_count"] == int(node["status"]["allocatable"][resource])
    # Every pod's owner chain resolves, as real controllers and the garbage collector keep it.
    chains = owner_walk(objects)
    assert all(chain is not None for chain in chains.values())
    # The truth's pods are exactly the served pods that ask for GPUs.
    pods = {p["metadata"]["uid"]: p for p in objects["/api/v1/pods"]}

    def asks_for_gpus(pod: dict) -> bool:
        containers = pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
        return any(resource in c["resources"].get(s, {}) for c in containers for s in ("requests", "limits"))

    assert [row["uid"] for row in facts["pods"]] == [
        p["metadata"]["uid"]
        for p in sorted(pods.values(), key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
        if asks_for_gpus(p)
    ]
    for row in facts["pods"]:
        pod = pods[row["uid"]]
        assert row["phase"] == pod["status"]["phase"] and row["node_name"] == pod["spec"].get("nodeName", "")
        assert row["deleted"] == ("deletionTimestamp" in pod["metadata"])
    assert not set(facts["removed_pods"]) & set(pods)
    # Workloads are the served owners of those pods, each pod listed under every owner above it.
    served = {o["metadata"]["uid"]: o for items in objects.values() for o in items}
    for row in facts["workloads"]:
        assert served[row["uid"]]["kind"] == row["kind"]
        for pod_uid in row["pod_uids"]:
            above = chains[pod_uid]
            assert row["uid"] in above or (
                row["kind"] == "Workload"
                and served[above[-1]]["metadata"]["labels"]["primus-safe.workload.id"] == row["name"]
            )
        if row["status"] == "Running":
            assert row["gpu_request"] > 0 or row["kind"] == "Workload"
    assert not set(facts["removed_workloads"]) & set(served)


def test_churn_keeps_the_invariants_step_after_step(churned) -> None:
    cluster, server, registry, events = churned
    _check_invariants(cluster, server, registry)
    for _ in range(40):
        version = cluster.resource_version
        events.append(cluster.churn(1))
        _check_invariants(cluster, server, registry)
        # Every change to an object bumps resourceVersion (NICs are no Kubernetes objects).
        changed_objects = any(not name.startswith("nic_") for name in events[-1])
        assert (cluster.resource_version > version) == changed_objects, events[-1]


def test_churn_moves_everything_a_collector_reads() -> None:
    # A seed whose one CronJob is not deleted before it fires (with SEED it is, since the simulator
    # also runs RayServices).
    cluster = SimCluster("sim-nvidia-0", "nvidia", 16, 26, 3.0)
    seen: set[str] = set()
    for _ in range(100):
        seen |= set(cluster.churn(1))
    assert seen >= {
        "pod_started", "pod_evicted", "pod_removed", "pod_terminating", "container_restarted",
        "workload_scheduled", "workload_finished", "workload_failed", "workload_scaled", "workload_deleted",
        "workload_created", "cronjob_fired", "node_not_ready", "node_ready", "taint_added", "taint_removed",
        "node_cordoned", "node_uncordoned", "gpu_lost", "gpu_returned", "nic_lost", "nic_returned",
    }  # fmt: skip


def test_churn_through_control_and_the_truth_follows(churned) -> None:
    cluster, server, _, _ = churned
    before = truth(server, cluster.name)
    status, body = control(server, cluster.name, action="churn", steps=3)
    assert status == 200 and sum(body["result"].values()) > 0
    after = truth(server, cluster.name)
    assert after != before
    assert set(before["removed_pods"]) <= set(after["removed_pods"])
    assert control(server, cluster.name, action="churn", steps=-1)[0] == 400


def _digest(cluster: SimCluster, server: SimServer) -> dict[str, str]:
    out = {}
    for path, _ in [*COLLECTIONS, ("/_truth", "")]:
        request_path = f"{server.base_url(cluster.name)}{path}"
        status, body = http(request_path, cluster.token)
        assert status == 200
        out[path] = hashlib.sha256(json.dumps(body, sort_keys=False).encode()).hexdigest()
    return out


def test_same_seed_same_lists_and_truth_after_churn() -> None:
    def served_after(seed: int, steps: int) -> dict[str, str]:
        cluster = SimCluster("sim-nvidia-0", "nvidia", 10, seed, 3.0, clock=_fixed_clock)
        cluster.churn(steps)
        with SimServer(SimFleet([cluster])) as server:
            return _digest(cluster, server)

    first, second = served_after(SEED, 15), served_after(SEED, 15)
    assert first == second
    other = served_after(SEED + 1, 15)
    assert all(
        first[path] != other[path] for path in ("/api/v1/pods", "/apis/apps/v1/deployments", "/_truth")
    )


REPLAY = textwrap.dedent(
    """
    import hashlib, sys
    from lens_pipeline.sim import SimCluster
    cluster = SimCluster("sim-amd-0", "amd", 8, int(sys.argv[1]), 3.0, clock=lambda: 1_800_000_000.0)
    cluster.churn(10)
    digest = hashlib.sha256()
    for resource in sorted(cluster.truth_snapshot().objects):
        for entry in cluster.truth_snapshot().objects[resource]:
            digest.update(entry.raw)
    print(digest.hexdigest())
    """
)


def test_replay_does_not_depend_on_the_process_hash_seed() -> None:
    """Set order changes with PYTHONHASHSEED; nothing the simulator serves may."""
    digests = {
        subprocess.run(
            [sys.executable, "-c", REPLAY, str(SEED)],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()
        for hash_seed in ("1", "2")
    }  # fmt: skip
    assert len(digests) == 1


def test_gpus_and_nics_vanish_and_return() -> None:
    cluster = SimCluster("sim-amd-0", "amd", 4, SEED, 0.0)
    node = next(n for n in cluster.node_names() if cluster.node_status(n) == "Ready")
    pod = cluster.add_gpu_pod(node, 1)
    busy = [labels["gpu_id"] for _, labels, _ in cluster.exporter_samples() if labels.get("pod") == pod]
    assert busy == ["0"]
    with pytest.raises(ValueError, match="allocated"):
        cluster.set_gpu_present(node, 0, False)
    cluster.set_gpu_present(node, 5, False)
    obj = cluster.node(node)
    assert obj["status"]["capacity"]["amd.com/gpu"] == obj["status"]["allocatable"]["amd.com/gpu"] == "7"
    assert len(cluster.gpu_utilization_samples()[node]) == 7
    gpu_ids = {labels["gpu_id"] for _, labels, _ in cluster.exporter_samples() if labels["hostname"] == node}
    assert gpu_ids == {"0", "1", "2", "3", "4", "6", "7"}
    assert next(r for r in cluster.truth()["nodes"] if r["name"] == node)["gpu_count"] == 7
    cluster.set_gpu_present(node, 5, True)
    assert cluster.node(node)["status"]["capacity"]["amd.com/gpu"] == "8"

    nics = cluster.nics()[node]
    assert [n.device for n in nics] == [f"mlx5_{i}" for i in range(8)]
    assert {(n.port, n.link_layer) for n in nics} == {(1, "InfiniBand")} and len(
        {n.node_guid for n in nics}
    ) == 8
    cluster.set_nic_present(node, "mlx5_3", False)
    assert "mlx5_3" not in [n.device for n in cluster.nics()[node]]
    cluster.set_nic_present(node, "mlx5_3", True)
    assert len(cluster.nics()[node]) == 8


def test_taints_and_cordons_keep_new_pods_off(churned) -> None:
    cluster = SimCluster("sim-nvidia-0", "nvidia", 3, SEED, 0.5)
    nodes = cluster.node_names()
    for node in nodes:
        cluster.add_taint(node, "lens.sim/maintenance", "NoSchedule", "true")
    cluster.cordon(nodes[0])
    spec = cluster.node(nodes[0])["spec"]
    assert spec["unschedulable"] and {t["key"] for t in spec["taints"]} >= {
        "lens.sim/maintenance",
        "node.kubernetes.io/unschedulable",
    }
    before = {r["uid"] for r in cluster.truth()["pods"] if r["node_name"]}
    cluster.churn(5)
    assert {r["uid"] for r in cluster.truth()["pods"] if r["node_name"] and r["phase"] == "Running"} <= before
    cluster.remove_taint(nodes[1], "lens.sim/maintenance")
    cluster.cordon(nodes[0], False)
    assert "unschedulable" not in cluster.node(nodes[0])["spec"]


def test_lens_sim_churns_in_the_background(tmp_path) -> None:
    """`lens sim --churn` changes the clusters as it serves them, generated as of `--epoch`."""
    registry = tmp_path / "clusters.yaml"
    process = subprocess.Popen(
        [sys.executable, "-m", "lens_pipeline.sim", "--clusters", "1", "--nodes", "4", "--churn", "0.2",
         "--epoch", "2026-01-01T00:00:00Z", "--registry-out", str(registry)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            if line.startswith("serving"):
                break
        api = api_client(registry, "sim-amd-0")
        _status, body = raw_get(api, "/api/v1/nodes", [], (10.0, 60.0))
        made = sorted(node["metadata"]["creationTimestamp"] for node in json.loads(body)["items"])
        assert "2024-11-25" < made[0] <= made[-1] < "2025-12-02"  # 30 to 400 days before the epoch
        versions = []
        for _ in range(2):
            _status, body = raw_get(api, "/api/v1/pods", [("limit", 1)], (10.0, 60.0))
            versions.append(int(json.loads(body)["metadata"]["resourceVersion"]))
            time.sleep(0.6)
        assert versions[1] > versions[0]
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_on_a_full_cluster_a_service_waits_where_a_job_may_have_run() -> None:
    """Where no node has room, a Deployment's or StatefulSet's pod (restartPolicy Always: the kubelet
    restarts its containers whatever their exit) waits Pending and unscheduled; it never starts out
    Succeeded or Failed, as the pods of a Job or a PyTorchJob may (their work ran earlier)."""
    cluster = SimCluster("crowded", "amd", 4, seed=3, pods_per_node=40, clock=_fixed_clock)
    pods = [entry.obj for entry in cluster.simulated_objects("pods")]
    served = [
        pod
        for pod in pods
        if (pod["metadata"].get("ownerReferences") or [{}])[0].get("kind") in ("ReplicaSet", "StatefulSet")
    ]
    assert {pod["spec"]["restartPolicy"] for pod in served} == {"Always"}
    assert {(pod["status"]["phase"], bool(pod["spec"].get("nodeName"))) for pod in served} == {
        ("Running", True),
        ("Pending", False),
    }
    ended = {pod["status"]["phase"] for pod in pods if pod["spec"]["restartPolicy"] != "Always"}
    assert {"Succeeded", "Failed"} <= ended


def _finished_rayjobs(cluster: SimCluster) -> dict[str, str]:
    """Each finished RayJob's name and jobStatus, after checking it as KubeRay leaves one with
    `shutdownAfterJobFinishes: false`: the submitter's pod ended as the job did, and the cluster's
    head and workers run on, holding GPUs they no longer use."""
    jobs = {entry.obj["metadata"]["name"]: entry.obj for entry in cluster.simulated_objects("rayjobs")}
    finished = {
        name: job["status"]["jobStatus"]
        for name, job in jobs.items()
        if job["status"].get("jobDeploymentStatus") in ("Complete", "Failed")
    }
    clusters = {
        entry.obj["metadata"]["name"]: entry.obj["metadata"]["ownerReferences"][0]["name"]
        for entry in cluster.simulated_objects("rayclusters")
        if entry.obj["metadata"].get("ownerReferences")
    }
    state = cluster._state
    for entry in cluster.simulated_objects("pods"):
        pod = entry.obj
        (owner,) = pod["metadata"].get("ownerReferences") or [{"kind": None}]
        if owner["kind"] == "Job" and owner["name"] in finished:
            assert (
                pod["status"]["phase"]
                == {"SUCCEEDED": "Succeeded", "FAILED": "Failed"}[finished[owner["name"]]]
            )
        elif owner["kind"] == "RayCluster" and clusters.get(owner["name"]) in finished:
            assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"]
            devices = state.gpus[pod["spec"]["nodeName"]]
            held = [
                devices.utilization[index]
                for index, holder in enumerate(devices.owners)
                if holder and holder[:2] == (pod["metadata"]["namespace"], pod["metadata"]["name"])
            ]
            assert all(value < 3.3 for value in held), held
    return finished


def test_a_finished_rayjob_keeps_its_cluster_running_with_its_gpus_idle() -> None:
    cluster = SimCluster("ray", "amd", 40, seed=5, pods_per_node=6, clock=_fixed_clock)
    generated = _finished_rayjobs(cluster)
    assert generated
    cluster.churn(30)
    churned = _finished_rayjobs(cluster)
    assert churned.keys() - generated.keys()  # some finished during the churn
