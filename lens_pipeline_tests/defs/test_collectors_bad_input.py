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
    assert metadata(result, "gpu_nodes")["malformed_objects"] >= 2  # missing metadata, bad capacity
    assert metadata(result, "gpu_pods")["malformed_objects"] >= 3  # no metadata, containers, GPU count
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
    assert not any(name.startswith("malformed-capacity") for name in names)


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
