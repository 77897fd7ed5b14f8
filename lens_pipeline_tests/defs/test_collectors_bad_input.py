"""Bad input never stops a cluster's collection or costs stored rows: malformed objects are counted
problems; a cluster that errors or whose LIST breaks half-way fails its run and keeps its tables."""

from __future__ import annotations

import pytest
from dagster import instance_for_test

from lens_pipeline.defs import resources
from lens_pipeline.defs.cluster_assets import COLLECTOR_KEYS
from lens_pipeline.defs.resources import ClusterRegistryResource, KubernetesResource, LensDatabase
from lens_pipeline.store.schema import gpu_device, gpu_pods, gpu_workload, node, pod_resource, storage
from lens_pipeline_tests.defs.support import (
    failure_message,
    materializations,
    materialize_cluster,
    served_fleet,
)
from lens_pipeline_tests.defs.test_collectors_against_truth import POD_COLUMNS, WORKLOAD_COLUMNS, table, truth

TABLES = (node, gpu_pods, pod_resource, gpu_workload, gpu_device, storage)


@pytest.fixture
def sim(tmp_path):
    served = served_fleet(tmp_path, clusters=1, nodes=8, seed=33, vendor="amd")
    with served as (fleet, server, registry), instance_for_test() as instance:
        cluster = fleet.clusters[0]
        instance.add_dynamic_partitions("cluster", [cluster.name])
        yield cluster, server, registry, instance


def run(cluster, registry, instance, url, **kube):
    return materialize_cluster(
        COLLECTOR_KEYS,
        partition_key=cluster.name,
        instance=instance,
        raise_on_error=False,
        resources={
            **resources.defs.resources,
            "registry": ClusterRegistryResource(clusters_file=str(registry)),
            "kubernetes": KubernetesResource(page_size=5, max_retries=1, backoff_seconds=0.01, **kube),
            "lens_db": LensDatabase(url=url),
        },
    )


def snapshot_tables(url, cluster):
    return {t.name: sorted(table(url, t, cluster), key=lambda r: r["id"]) for t in TABLES}


def metadata(result, asset):
    (event,) = materializations(result, asset)
    return {k: v.value for k, v in event.metadata.items()}


def test_malformed_objects_are_counted_and_the_rest_is_stored(sim, sqlite_url):
    cluster, server, registry, instance = sim
    assert run(cluster, registry, instance, sqlite_url).success
    injected = cluster.inject_malformed()
    assert len(injected) >= 10
    result = run(cluster, registry, instance, sqlite_url)
    assert result.success  # bad objects never fail the cluster's run
    # Nodes: missing metadata, bad and huge capacity; pods: no metadata, containers, bad and huge GPUs.
    assert metadata(result, "gpu_nodes")["malformed_objects"] >= 3
    assert metadata(result, "gpu_pods")["malformed_objects"] >= 4
    owners = metadata(result, "gpu_workloads")
    assert owners["malformed_objects"] >= 3  # unknown owner kind, cycle, owner in another namespace
    examples = " ".join(owners["malformed_examples"])
    assert "not served" in examples and "cycle" in examples and "namespace" in examples
    checks = {
        (e.asset_key.to_user_string(), e.check_name): e.passed for e in result.get_asset_check_evaluations()
    }
    assert not checks[("gpu_nodes", "every_node_readable")] and not checks[("gpu_pods", "every_pod_readable")]
    assert not checks[("gpu_workloads", "owner_chains_resolved")]

    # Everything the injected objects did not touch is exactly as the truth says.
    expected = truth(server, cluster.name)
    pods = {r["uid"]: r for r in table(sqlite_url, gpu_pods, cluster.name)}
    for want in expected["pods"]:
        assert {c: pods[want["uid"]][c] for c in POD_COLUMNS} == {c: want[c] for c in POD_COLUMNS}
    workloads = {r["uid"]: r for r in table(sqlite_url, gpu_workload, cluster.name)}
    for want in expected["workloads"]:
        assert {c: workloads[want["uid"]][c] for c in WORKLOAD_COLUMNS} == {
            c: want[c] for c in WORKLOAD_COLUMNS
        }
    names = {r["name"] for r in table(sqlite_url, node, cluster.name)}
    assert {n["name"] for n in expected["nodes"]} <= names
    assert not any(name.startswith(("malformed-capacity", "malformed-huge")) for name in names)


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ({"status": 503}, "HTTP 503"),
        ({"connection": "reset"}, "gave up after"),
    ],
)
def test_a_failing_cluster_fails_its_run_and_keeps_its_tables(sim, sqlite_url, fault, expected):
    cluster, _server, registry, instance = sim
    assert run(cluster, registry, instance, sqlite_url).success
    before = snapshot_tables(sqlite_url, cluster.name)
    cluster.churn(steps=3)  # there is news, but it cannot be read
    cluster.set_fault("kube", **fault)
    result = run(cluster, registry, instance, sqlite_url)
    assert not result.success
    message = failure_message(result)
    assert cluster.name in message and expected in message and "/api" in message
    assert snapshot_tables(sqlite_url, cluster.name) == before


def test_a_list_broken_half_way_never_marks_the_unseen_half(sim, sqlite_url):
    cluster, _server, registry, instance = sim
    assert run(cluster, registry, instance, sqlite_url).success
    before = snapshot_tables(sqlite_url, cluster.name)
    cluster.churn(steps=3)
    cluster.continue_ttl = -1.0  # every continue token is already too old: the second page is 410
    result = run(cluster, registry, instance, sqlite_url)
    assert not result.success  # every attempt (and Dagster's retries) broke off after page one
    assert "continue token expired 4 times in a row" in failure_message(result)
    assert snapshot_tables(sqlite_url, cluster.name) == before  # the unseen half was not marked gone


def test_an_expired_continue_token_restarts_the_list(sim, sqlite_url):
    cluster, server, registry, instance = sim
    cluster.expire_next_continue()  # the next continued page answers 410 Gone, once
    result = run(cluster, registry, instance, sqlite_url)
    assert result.success
    assert metadata(result, "gpu_nodes")["kubernetes_list_restarts"] == 1
    names = {r["name"] for r in table(sqlite_url, node, cluster.name)}
    assert names == {n["name"] for n in truth(server, cluster.name)["nodes"]}


def _check(result, name):
    (evaluation,) = (e for e in result.get_asset_check_evaluations() if e.check_name == name)
    return evaluation.passed, {k: getattr(v, "value", v) for k, v in evaluation.metadata.items()}


def test_bad_prometheus_answers_are_counted_and_named_and_overwrite_nothing(sim, sqlite_url):
    """A GPU reported twice, a NaN utilization, series for a node that does not exist, series
    without a GPU index, InfiniBand series naming no node, a label holding NUL (a malformed sample,
    skipped): each counted and named in a failing
    check, the other GPUs stored as the truth says, and no GPU row written for what names no node."""
    cluster, server, registry, instance = sim
    assert run(cluster, registry, instance, sqlite_url).success
    node_name = cluster.node_names()[0]
    labels = next(lab for _m, lab, _v in cluster.exporter_samples() if lab["hostname"] == node_name)
    cluster.set_gpu_utilization(node_name, 1, float("nan"))
    util = cluster.profile.util_metric
    cluster.inject_series("device-metrics-exporter-again", "10.9.0.1:5000", [(util, dict(labels), 12.0)])
    ghost = {**labels, "hostname": "ghost-node", "gpu_id": "0", "serial_number": "GHOST"}
    cluster.inject_series(
        "device-metrics-exporter", "10.9.0.2:5000", [(util, ghost, 50.0)], node="ghost-node"
    )
    odd = {k: v for k, v in labels.items() if k != "gpu_id"}
    cluster.inject_series("odd-exporter", "10.9.0.3:5000", [(util, odd, 3.0)])
    ib = {"device": "mlx5_9", "board_id": "X", "firmware_version": "1", "hca_type": "MT4129"}
    cluster.inject_series(
        "node-exporter", "10.9.0.4:9100", [("node_infiniband_info", ib, 1.0)], node="ghost-ib"
    )

    # A label holding NUL: no Prometheus answer should carry one, and no text column stores one.
    nul = {**labels, "hostname": "nul\x00node", "gpu_id": "0"}
    cluster.inject_series("nul-exporter", "10.9.0.5:5000", [(util, nul, 7.0)])

    result = run(cluster, registry, instance, sqlite_url)
    assert result.success
    passed, meta = _check(result, "utilization_fresh")
    assert not passed and meta["malformed_samples"] == 1 and "NUL" in meta["malformed_sample_examples"][0]
    assert metadata(result, "gpu_nodes")["prometheus_malformed_samples"] == 1
    passed, meta = _check(result, "series_well_formed")
    assert not passed
    assert meta["malformed_samples"] >= 1  # each device query that returns the series skips it
    assert meta["duplicated_gpus"] >= 1 and f"{node_name}/{labels['gpu_id']}" in meta["duplicates"]
    assert meta["nonfinite_values"] == 1 and meta["nonfinite"] == [f"{node_name}/1"]
    assert meta["series_without_gpu_index"] == 1 and meta["without_gpu_index"] == [f"{node_name}/(none)"]
    passed, meta = _check(result, "devices_on_known_nodes")
    assert not passed and meta["gpu_node_labels"] == ["ghost-node"]
    assert meta["infiniband_series_naming_no_node"] == 1 and meta["infiniband_node_labels"] == ["ghost-ib"]

    stored = {(r["node_name"], r["gpu_id"]): r for r in table(sqlite_url, gpu_device, cluster.name)}
    assert "ghost-node" not in {n for n, _ in stored}
    assert stored[(node_name, 1)]["utilization"] is None  # unknown now: not a number, not zero
    want = {(d["node_name"], d["gpu_id"]): d for d in truth(server, cluster.name)["gpu_devices"]}
    for key, expected in want.items():
        if key != (node_name, 1):
            assert stored[key]["serial"] == expected["serial"]
            assert stored[key]["utilization"] == pytest.approx(expected["utilization"]), key


def _gpus(value):
    """A mutation: the pod's first container asks for `value` GPUs."""
    return lambda pod: pod["spec"]["containers"][0]["resources"]["requests"].update({"amd.com/gpu": value})


def _capacity(resource, value):
    return lambda node: node["status"]["capacity"].update({resource: value})


def _containers_over_the_bound(pod):
    container = pod["spec"]["containers"][0]
    container["resources"]["requests"]["amd.com/gpu"] = "40000"
    pod["spec"]["containers"] = [container, {**container, "name": "second"}]


MALFORMED_POD_MUTATIONS = {
    "no metadata": lambda pod: pod.pop("metadata"),
    "metadata a list": lambda pod: pod.update(metadata=[1]),
    "name a number": lambda pod: pod["metadata"].update(name=5),
    "no uid": lambda pod: pod["metadata"].pop("uid"),
    "NUL in the name": lambda pod: pod["metadata"].update(name=pod["metadata"]["name"] + "\x00"),
    "resourceVersion not a number": lambda pod: pod["metadata"].update(resourceVersion="abc"),
    "resourceVersion past 2^63": lambda pod: pod["metadata"].update(resourceVersion="9" * 25),
    "creation time not a time": lambda pod: pod["metadata"].update(creationTimestamp="yesterday"),
    "owners a mapping": lambda pod: pod["metadata"].update(ownerReferences={"x": 1}),
    "NUL in an owner's uid": lambda pod: pod["metadata"].update(
        ownerReferences=[{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u\x00"}]
    ),
    "labels a list": lambda pod: pod["metadata"].update(labels=[1, 2]),
    "no spec": lambda pod: pod.pop("spec"),
    "containers a mapping": lambda pod: pod["spec"].update(containers={"a": 1}),
    "GPUs not a number": _gpus("lots"),
    "GPU count 1e20": _gpus("99999999999999999999"),
    "GPU count 1e20 as an exponent": _gpus("1e20"),
    "GPU count negative": _gpus("-1"),
    "GPU count fractional": _gpus("1500m"),
    "GPU count in Arabic-Indic digits": _gpus("\u0663"),
    "GPUs over the bound summed over containers": _containers_over_the_bound,
    "node a number": lambda pod: pod["spec"].update(nodeName=12),
    "status a list": lambda pod: pod.update(status=[1]),
    "phase a number": lambda pod: pod["status"].update(phase=7),
    "NUL in the IP": lambda pod: pod["status"].update(podIP="10.0.0.1\x00"),
    "conditions a mapping": lambda pod: pod["status"].update(conditions={"x": 1}),
    "restart count past 2^31": lambda pod: pod["status"].update(
        containerStatuses=[{"name": "main", "restartCount": 1 << 40}]
    ),
}
MALFORMED_NODE_MUTATIONS = {
    "name a number": lambda node: node["metadata"].update(name=5),
    "GPU capacity not a quantity": _capacity("amd.com/gpu", "eight"),
    "GPU capacity 1e20": _capacity("amd.com/gpu", "99999999999999999999"),
    "GPU capacity negative": _capacity("amd.com/gpu", "-8"),
    "GPU capacity fractional": _capacity("amd.com/gpu", "7500m"),
    "CPU capacity 1e20": _capacity("cpu", "1e20"),
    "capacity a list": lambda node: node["status"].update(capacity=[1]),
    "conditions a mapping": lambda node: node["status"].update(conditions={"a": 1}),
    "taints a mapping": lambda node: node["spec"].update(taints={"a": 1}),
    "addresses a mapping": lambda node: node["status"].update(addresses={"a": 1}),
    "labels a list": lambda node: node["metadata"].update(labels=[1]),
    "NUL in the OS image": lambda node: node["status"]["nodeInfo"].update(osImage="Ubuntu\x00"),
}
# A ReplicaSet above a well-formed GPU pod, broken one way: the pod is stored, the owner counted.
MALFORMED_OWNER_MUTATIONS = {
    "no metadata": lambda owner: owner.pop("metadata"),
    "uid a number": lambda owner: owner["metadata"].update(uid=5),
    "kind a number": lambda owner: owner.update(kind=7),
    "no apiVersion": lambda owner: owner.pop("apiVersion"),
    "name a mapping": lambda owner: owner["metadata"].update(name={"a": 1}),
    "namespace a mapping": lambda owner: owner["metadata"].update(namespace={"a": 1}),
    "NUL in the name": lambda owner: owner["metadata"].update(name=owner["metadata"]["name"] + "\x00"),
    "creation time not a time": lambda owner: owner["metadata"].update(creationTimestamp="soon"),
    "resourceVersion past 2^63": lambda owner: owner["metadata"].update(resourceVersion="9" * 25),
    "labels a list": lambda owner: owner["metadata"].update(labels=[1]),
    "owners a mapping": lambda owner: owner["metadata"].update(ownerReferences={"x": 1}),
}
# A SaFE Workload above a well-formed GPU pod (linked by its label), broken one way.
MALFORMED_SAFE_MUTATIONS = {
    "GPU count 1e20": lambda w: w["spec"]["resource"].update(gpu="99999999999999999999"),
    "replicas 1e20": lambda w: w["spec"]["resource"].update(replica=1e20),
    "GPUs x replicas past 2^31": lambda w: w["spec"]["resource"].update(gpu="65536", replica=65536),
    "GPU count fractional": lambda w: w["spec"]["resource"].update(gpu="0.5"),
    "spec a list": lambda w: w.update(spec=[1]),
}


def _inject_broken_owners(cluster, rng, count):
    """`count` owners (ReplicaSets and SaFE Workloads), each broken one way and above one new,
    well-formed, unscheduled GPU pod of its own. Returns (owner uids, pod uids)."""
    import copy

    from lens_pipeline.sim.controllers import safe_workload

    template = copy.deepcopy(cluster.pod(*_gpu_pod_keys(cluster)[0].split("/", 1)))
    template["spec"].pop("nodeName", None)
    template["status"] = {"phase": "Pending"}
    template["metadata"].pop("ownerReferences", None)
    namespace = template["metadata"]["namespace"]
    owners, pods = [], []
    for index in range(count):
        pod = copy.deepcopy(template)
        # An annotation may hold a NUL (Kubernetes allows any text there): the pod is stored.
        pod["metadata"].update(
            name=f"owned-{index}", uid=f"owned-uid-{index}", labels={}, annotations={"note": "a\x00b"}
        )
        uid, name = f"broken-owner-uid-{index}", f"broken-owner-{index}"
        if index % 2:
            owner = safe_workload(
                name, uid, 1.7e9, {}, {}, namespace, 1, 1, ("", "v1", "Pod"), "img", "amd.com/gpu"
            )
            rng.choice(list(MALFORMED_SAFE_MUTATIONS.values()))(owner)
            pod["metadata"]["labels"] = {"primus-safe.workload.id": name}
            cluster.inject_raw("workloads", owner)
        else:
            owner = {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": uid,
                    "resourceVersion": "5",
                    "creationTimestamp": "2025-06-01T00:00:00Z",
                },
                "spec": {"replicas": 1},
                "status": {"replicas": 1},
            }
            pod["metadata"]["ownerReferences"] = [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": uid, "controller": True}
            ]
            rng.choice(list(MALFORMED_OWNER_MUTATIONS.values()))(owner)
            cluster.inject_raw("replicasets", owner)
        cluster.inject_raw("pods", pod)
        owners.append(uid)
        pods.append(pod["metadata"]["uid"])
    return owners, pods


NODE_COLUMNS = ("name", "address", "gpu_name", "gpu_count", "status", "cpu_count", "os")


def test_ten_thousand_generated_malformed_objects_and_series_are_counted_and_lose_nothing(sim, lens_url):
    """Real objects of the cluster, each broken in one of many ways (seeded): missing or mistyped
    fields, NUL characters, numbers past what a column holds (GPU counts of 1e20, negative or
    fractional; versions past 2^63), broken owners above good pods; and thousands of Prometheus
    series naming no node or no GPU. On every dialect the run succeeds, every broken object is
    counted, and every row of the real objects is as the truth says."""
    import copy
    import random

    cluster, server, registry, instance = sim
    assert run(cluster, registry, instance, lens_url).success
    rng = random.Random(5)
    real_pods = [cluster.pod(*key.split("/", 1)) for key in _gpu_pod_keys(cluster)]
    real_nodes = [cluster.node(name) for name in cluster.node_names()]
    pods, nodes = set(), set()
    for index in range(7000):
        pod = copy.deepcopy(rng.choice(real_pods))
        pod["metadata"]["name"] = f"broken-{index}"
        pod["metadata"]["uid"] = f"broken-uid-{index}"
        # Under no real owner: a pod read whole at listing (GPU count, node, phase) but broken in
        # a field read later still holds GPUs on its node, yet adds nothing to a real workload.
        pod["metadata"].pop("ownerReferences", None)
        rng.choice(list(MALFORMED_POD_MUTATIONS.values()))(pod)
        pods.add(cluster.inject_raw("pods", pod))
    for index in range(1000):
        broken = copy.deepcopy(rng.choice(real_nodes))
        broken["metadata"]["name"] = f"broken-node-{index}"
        rng.choice(list(MALFORMED_NODE_MUTATIONS.values()))(broken)
        nodes.add(cluster.inject_raw("nodes", broken))
    owners, owned_pods = _inject_broken_owners(cluster, rng, 1000)
    odd = copy.deepcopy(real_nodes[0])
    odd["metadata"]["name"] = "odd-node"
    odd["metadata"]["annotations"] = {"note": "a\x00b"}  # any text, NUL included: stored
    cluster.inject_raw("nodes", odd)
    util, labels = cluster.profile.util_metric, {"gpu_id": "0", "serial_number": "S"}
    series = [(util, {**labels, "hostname": f"ghost-{i}"}, 1.0) for i in range(1500)]
    series += [(util, {"hostname": cluster.node_names()[0], "gpu_id": f"x{i}"}, 1.0) for i in range(500)]
    cluster.inject_series("stray-exporter", "10.9.9.9:5000", series)
    assert len(pods) + len(nodes) + len(owners) + len(series) >= 10_000

    result = run(cluster, registry, instance, lens_url)
    assert result.success
    assert metadata(result, "gpu_pods")["malformed_objects"] == len(pods)
    assert metadata(result, "gpu_nodes")["malformed_objects"] >= len(nodes)
    assert metadata(result, "gpu_workloads")["malformed_objects"] >= len(owners)
    _passed, devices = _check(result, "devices_on_known_nodes")
    assert devices["gpu_series_naming_no_node"] == 1500
    _passed, formed = _check(result, "series_well_formed")
    assert formed["series_without_gpu_index"] == 500

    expected = truth(server, cluster.name)
    stored = {r["uid"]: r for r in table(lens_url, gpu_pods, cluster.name)}
    for want in expected["pods"]:
        assert {c: stored[want["uid"]][c] for c in POD_COLUMNS} == {c: want[c] for c in POD_COLUMNS}
    assert not any(uid.startswith("broken") for uid in stored)
    assert set(owned_pods) <= set(stored)  # a good pod under a broken owner is stored all the same
    workloads = {r["uid"]: r for r in table(lens_url, gpu_workload, cluster.name)}
    for want in expected["workloads"]:
        assert {c: workloads[want["uid"]][c] for c in WORKLOAD_COLUMNS} == {
            c: want[c] for c in WORKLOAD_COLUMNS
        }
    assert not set(owners) & set(workloads)
    stored_nodes = {r["name"]: r for r in table(lens_url, node, cluster.name)}
    for want in expected["nodes"]:
        assert {c: stored_nodes[want["name"]][c] for c in NODE_COLUMNS} == {c: want[c] for c in NODE_COLUMNS}
    assert not any(n.startswith("broken") for n in stored_nodes)
    # PostgreSQL's jsonb holds no NUL: it is U+FFFD in the stored document, on every dialect.
    assert stored_nodes["odd-node"]["annotations"] == {"note": "a\ufffdb"}
    devices_stored = {(r["node_name"], r["gpu_id"]) for r in table(lens_url, gpu_device, cluster.name)}
    assert {(d["node_name"], d["gpu_id"]) for d in expected["gpu_devices"]} <= devices_stored
    assert not any(n.startswith("ghost") for n, _ in devices_stored)


def _gpu_pod_keys(cluster) -> list[str]:
    return [f"{p['namespace']}/{p['name']}" for p in cluster.truth()["pods"]]


UNREADABLE_OWNER_REFERENCES = {
    "owners a mapping": {"x": 1},
    "an owner without uid": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs"}],
    "an owner's kind a number": [{"apiVersion": "apps/v1", "kind": 7, "name": "rs", "uid": "u"}],
}


@pytest.mark.parametrize("references", UNREADABLE_OWNER_REFERENCES.values(), ids=UNREADABLE_OWNER_REFERENCES)
def test_a_pod_with_unreadable_owner_references_is_counted_once_by_each_collector(
    sim, sqlite_url, references
):
    """`gpu_pods` refuses the pod's rows and `gpu_workloads` cannot walk up from it: one object, one
    count in each."""
    import copy

    cluster, _server, registry, instance = sim
    before = run(cluster, registry, instance, sqlite_url)
    pod = copy.deepcopy(cluster.pod(*_gpu_pod_keys(cluster)[0].split("/", 1)))
    pod["metadata"].update(name="unreadable-owners", uid="unreadable-owners-uid", ownerReferences=references)
    cluster.inject_raw("pods", pod)
    after = run(cluster, registry, instance, sqlite_url)
    for asset in ("gpu_pods", "gpu_workloads"):
        counted = metadata(after, asset)["malformed_objects"] - metadata(before, asset)["malformed_objects"]
        assert counted == 1, asset
    (example,) = [
        e for e in metadata(after, "gpu_workloads")["malformed_examples"] if "unreadable-owners" in e
    ]
    assert "ownerReference" in example
