"""The fault matrix: one batched run over ten simulated clusters, one of them broken in one way.

For every way a cluster can break (its API refuses or resets connections, answers 503, answers
slower than the cluster's request timeout, lets every continue token expire; its Prometheus answers
503) the matrix proves that each of the nine healthy clusters gets fresh materializations of every
asset and stores what the simulator's truth says, that Dagster shows exactly the broken cluster's
unwritten partitions as failed (the run ends as failed once every cluster had its turn),
that the broken cluster's stored rows stay exactly as they were (only what the working part of it
feeds is written), that the batch's merged checks name the broken cluster and the cause, and that
the broken API is asked no more often than the documented retry budget (docs/OPERATIONS.md).

Two kinds do not break the cluster and prove that it is collected like the others: a continue
token that expires once restarts the list, and malformed objects are counted while the rest is
stored.

The ten clusters, the Dagster instance and the databases are shared by the kinds (one module
fixture, one first batch); each kind breaks a cluster of its own, churns every cluster so there is
news to write, and clears its fault in the end, so the kinds do not depend on one another's order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dagster import AssetKey, AssetPartitionStatus, instance_for_test
from sqlalchemy import Table

from lens_pipeline.defs.cluster_assets import ASSET_KEYS
from lens_pipeline.defs.collectors.schedules import failing_clusters
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME, cluster_partitions
from lens_pipeline.defs.resources import (
    ClusterRegistryResource,
    KubernetesResource,
    LensDatabase,
    PrometheusResource,
    SafeDatabase,
)
from lens_pipeline.sim.fleet import SimCluster, SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.store.db import dispose_engines
from lens_pipeline.store.schema import (
    cluster_overview_cache,
    gpu_device,
    gpu_pods,
    gpu_workload,
    node,
    storage,
)
from lens_pipeline_tests.defs.support import edit_registry, materializations, materialize_cluster
from lens_pipeline_tests.defs.test_batched_runs import _batch
from lens_pipeline_tests.defs.test_collectors_against_truth import (
    POD_COLUMNS,
    WORKLOAD_COLUMNS,
    assert_matches_truth,
    table,
    truth,
)
from lens_pipeline_tests.defs.test_gpu_nodes import assert_table_equals_truth

MAX_RETRIES = 1  # so a Kubernetes request is tried twice at most
PAGE_SIZE = 3  # every node and pod list has more than one page: continue tokens to expire
SLOW_TIMEOUT = 1.0  # the slow cluster's request_timeout_seconds in the registry
SLOW_DELAY = 2.0  # how long its API takes to answer each request

# Each table with the columns that identify a row of one cluster; rows are compared whole.
KEYS: dict[Table, tuple[str, ...]] = {
    node: ("name",),
    gpu_pods: ("uid",),
    gpu_workload: ("uid",),
    gpu_device: ("node_name", "gpu_id"),
    storage: ("kind", "name"),
    cluster_overview_cache: ("cluster_name",),
}
ALL_TABLES = tuple(KEYS)
ASSETS = [k.to_user_string() for k in ASSET_KEYS]


@dataclass
class Matrix:
    fleet: SimFleet
    server: SimServer
    registry: Path
    instance: object
    lens_url: str
    safe_url: str
    names: list[str]
    # Clusters served malformed objects (they stay injected): their tables hold more than the truth.
    tainted: set[str] = field(default_factory=set)

    def run(self):
        return materialize_cluster(
            instance=self.instance,
            tags=_batch(self.names[0], self.names[-1]),
            raise_on_error=False,
            resources={
                "registry": ClusterRegistryResource(clusters_file=str(self.registry)),
                "kubernetes": KubernetesResource(
                    page_size=PAGE_SIZE, max_retries=MAX_RETRIES, backoff_seconds=0.01
                ),
                "prometheus": PrometheusResource(timeout_seconds=2),
                "lens_db": LensDatabase(url=self.lens_url),
                "safe_db": SafeDatabase(url=self.safe_url),
            },
        )


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> Iterator[Matrix]:
    """Ten small clusters of both vendors, and a first batch over them that wrote every table."""
    tmp = tmp_path_factory.mktemp("fault-matrix")
    fleet = SimFleet.generate(clusters=10, nodes=2, seed=5, vendor="mixed")
    names = [c.name for c in fleet]
    with SimServer(fleet) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, names)
        m = Matrix(
            fleet,
            server,
            write_registry(tmp / "clusters.yaml", server),
            instance,
            f"sqlite:///{tmp / 'lens.db'}",
            f"sqlite:///{tmp / 'safe.db'}",
            names,
        )
        first = m.run()
        assert first.success
        for asset in ASSETS:
            assert sorted(e.partition for e in materializations(first, asset)) == sorted(names), asset
        for name in names:
            assert_matches_truth(m.lens_url, server, name)
            assert_table_equals_truth(m.lens_url, server, name)
            assert all(table(m.lens_url, t, name) for t in ALL_TABLES), name  # every table has its rows
        yield m
    dispose_engines()


# -- the fault kinds ---------------------------------------------------------------------------


def _slow(m: Matrix, cluster: SimCluster) -> None:
    def short_timeout(document: dict) -> None:
        (entry,) = [e for e in document["clusters"] if e["name"] == cluster.name]
        entry["request_timeout_seconds"] = SLOW_TIMEOUT

    edit_registry(m.registry, short_timeout)
    cluster.set_fault("kube", delay=SLOW_DELAY)


def _always_gone(m: Matrix, cluster: SimCluster) -> None:
    # Every continue token is too old when it comes back: each continued page answers 410 Gone.
    # (`expire_continue_tokens` expires only the tokens issued so far; the list restarts fine.)
    cluster.continue_ttl = -1.0


@dataclass(frozen=True)
class Fault:
    kind: str
    cluster: int  # which of the ten it breaks
    inject: Callable[[Matrix, SimCluster], None]
    # What the broken cluster still gets written: every asset when the fault does not break it.
    written: frozenset[str]
    # Its tables that must stay exactly as they were before the run.
    untouched: tuple[Table, ...]
    # The merged check (asset, check) of the first part the fault breaks, and what it says of the
    # broken cluster.
    check: tuple[str, str] = ("gpu_nodes", "every_node_readable")
    cause: str = ""
    # The API the fault is on gives up on its cluster: the first failing request stops the others.
    unreachable: bool = False


NOTHING: frozenset[str] = frozenset()
EVERYTHING = frozenset(ASSETS)
FAULTS = [
    Fault(
        "refused",
        0,
        lambda m, c: c.set_fault("kube", connection="refuse"),
        NOTHING,
        ALL_TABLES,
        cause="Remote end closed connection without response",
        unreachable=True,
    ),
    Fault(
        "reset",
        1,
        lambda m, c: c.set_fault("kube", connection="reset"),
        NOTHING,
        ALL_TABLES,
        cause="Connection reset by peer",
        unreachable=True,
    ),
    Fault("http-503", 2, lambda m, c: c.set_fault("kube", 503), NOTHING, ALL_TABLES, cause="HTTP 503"),
    Fault("slow", 3, _slow, NOTHING, ALL_TABLES, cause="Read timed out", unreachable=True),
    Fault("410-once", 4, lambda m, c: c.expire_next_continue(), EVERYTHING, ()),
    # storage_backends is still collected: its lists fit in one page, so no continue token can
    # expire (and the churn never changes storage, so its rows stay as they were too).
    Fault(
        "410-always",
        5,
        _always_gone,
        frozenset({"storage_backends"}),
        ALL_TABLES,
        cause="continue token expired 4 times in a row",
    ),
    # Kubernetes still answers: what it feeds is written; the devices and the overview, read from
    # Prometheus, are not (and the nodes keep their last stored utilization).
    Fault(
        "prometheus-503",
        6,
        lambda m, c: c.set_fault("prometheus", 503),
        EVERYTHING - {"gpu_devices", "cluster_overview_cache"},
        (gpu_device, cluster_overview_cache),
        check=("gpu_devices", "series_well_formed"),
        cause="503",
    ),
    Fault("malformed", 7, lambda m, c: c.inject_malformed(), EVERYTHING, ()),
]
# Clusters 8 and 9 are never broken.


def rows(url: str, cluster: str) -> dict[str, dict[tuple, dict]]:
    """Every row of the cluster in each table, by its key, with every column."""
    return {t.name: {tuple(r[c] for c in key): r for r in table(url, t, cluster)} for t, key in KEYS.items()}


def kube_rows_match_truth(url: str, server: SimServer, cluster: str) -> None:
    """Every pod and workload of the truth is stored as the truth says (other rows may exist)."""
    expected = truth(server, cluster)
    pods = {r["uid"]: r for r in table(url, gpu_pods, cluster)}
    for want in expected["pods"]:
        assert {c: pods[want["uid"]][c] for c in POD_COLUMNS} == {c: want[c] for c in POD_COLUMNS}
    workloads = {r["uid"]: r for r in table(url, gpu_workload, cluster)}
    for want in expected["workloads"]:
        have = workloads[want["uid"]]
        assert {c: have[c] for c in WORKLOAD_COLUMNS} == {c: want[c] for c in WORKLOAD_COLUMNS}


def check(result, asset: str, name: str):
    (evaluation,) = (
        e
        for e in result.get_asset_check_evaluations()
        if e.asset_key == AssetKey(asset) and e.check_name == name
    )
    return evaluation


def causes(result, cluster: str) -> dict[str, str]:
    """Part -> why it was not computed for the cluster, as the batch's merged checks say."""
    out = {}
    for evaluation in result.get_asset_check_evaluations():
        not_computed = evaluation.metadata.get("not_computed")
        if not_computed is not None and cluster in not_computed.value:
            out[evaluation.asset_key.to_user_string()] = not_computed.value[cluster]
    return out


def written(result) -> dict[str, set[str]]:
    """Cluster -> the assets it got materialized in the run."""
    out: dict[str, set[str]] = {}
    for asset in ASSETS:
        for event in materializations(result, asset):
            out.setdefault(event.partition, set()).add(asset)
    return out


def api_requests(cluster: SimCluster) -> dict[str, int]:
    """Requests its Kubernetes API got since the log was reset, by path."""
    counts = cluster.request_log.as_json()["counts"]
    return {path: n for path, n in counts.items() if "/prometheus/" not in path}


@pytest.mark.parametrize("fault", FAULTS, ids=[f.kind for f in FAULTS])
def test_one_broken_cluster_in_a_batch_of_ten(matrix: Matrix, fault: Fault):
    m = matrix
    broken = m.fleet.clusters[fault.cluster]
    healthy = [n for n in m.names if n != broken.name]
    registry_text, continue_ttl = m.registry.read_text(), broken.continue_ttl
    try:
        m.fleet.churn(steps=1)  # news for every cluster, the broken one too: it must not be written
        before = rows(m.lens_url, broken.name)
        fault.inject(m, broken)
        if fault.kind == "malformed":
            m.tainted.add(broken.name)
        broken.request_log.reset()

        result = m.run()
        if fault.kind == "slow":
            time.sleep(SLOW_DELAY)  # requests the client gave up on are logged once answered
        requests = api_requests(broken)
    finally:
        broken.clear_faults()
        broken.continue_ttl = continue_ttl
        m.registry.write_text(registry_text)

    # A cluster that fails a part gets no materialization of it (nor of the parts below it) and is
    # named in the merged checks; the batch then ends as failed, so that Dagster shows exactly those
    # partitions as failed, and the healthy clusters' as materialized.
    broken_parts = EVERYTHING - fault.written
    assert result.success == (not broken_parts)
    by_cluster = written(result)
    for asset in EVERYTHING:
        status = m.instance.get_status_by_partition(AssetKey(asset), m.names, cluster_partitions)
        assert all(status[n] == AssetPartitionStatus.MATERIALIZED for n in healthy), (asset, status)
        expected = AssetPartitionStatus.FAILED if asset in broken_parts else AssetPartitionStatus.MATERIALIZED
        assert status[broken.name] == expected, (asset, status[broken.name])

    # Every healthy cluster got every asset, and stores what its cluster holds.
    unwritten = {n: sorted(EVERYTHING - by_cluster.get(n, set())) for n in healthy}
    assert not any(unwritten.values()), {n: causes(result, n) for n, parts in unwritten.items() if parts}
    for name in healthy:
        if name in m.tainted:
            kube_rows_match_truth(m.lens_url, m.server, name)
        else:
            assert_matches_truth(m.lens_url, m.server, name)
            assert_table_equals_truth(m.lens_url, m.server, name)

    # The broken cluster gets what still works, and its other rows are exactly as they were.
    assert by_cluster.get(broken.name, set()) == fault.written
    after = rows(m.lens_url, broken.name)
    for t in fault.untouched:
        assert after[t.name] == before[t.name], t.name

    assert failing_clusters(m.instance, m.names) == ({broken.name} if broken_parts else set())
    if broken_parts:
        # One merged result per check for the batch: the broken cluster is named, with the cause.
        evaluation = check(result, *fault.check)
        assert not evaluation.passed
        assert evaluation.metadata["clusters_checked"].value == len(healthy)
        not_computed = evaluation.metadata["not_computed"].value
        assert list(not_computed) == [broken.name] and fault.cause in not_computed[broken.name]
    else:
        for evaluation in result.get_asset_check_evaluations():
            computed = evaluation.metadata.get("not_computed")
            assert computed is None or broken.name not in computed.value, evaluation.check_name

    if fault.kind == "prometheus-503":
        assert check(result, "gpu_nodes", "utilization_fresh").metadata["clusters_failing"].value == [
            broken.name
        ]
        kube_rows_match_truth(m.lens_url, m.server, broken.name)
        kept = {k: r["gpu_utilization"] for k, r in before["node"].items()}
        assert {k: r["gpu_utilization"] for k, r in after["node"].items() if k in kept} == kept
    elif fault.kind == "410-once":
        # The list met one 410, started again on a new snapshot, and read it whole.
        restarts = sum(
            e.metadata["kubernetes_list_restarts"].value
            for asset in ASSETS
            for e in materializations(result, asset)
            if e.partition == broken.name and "kubernetes_list_restarts" in e.metadata
        )
        assert restarts == 1
        assert_matches_truth(m.lens_url, m.server, broken.name)
        assert_table_equals_truth(m.lens_url, m.server, broken.name)
    elif fault.kind == "malformed":
        # Counted in the metadata and in a failing (warning) check; every good object is stored.
        meta = {
            asset: {k: v.value for k, v in e.metadata.items()}
            for asset in ("gpu_nodes", "gpu_pods", "gpu_workloads")
            for e in materializations(result, asset)
            if e.partition == broken.name
        }
        assert meta["gpu_nodes"]["malformed_objects"] >= 3  # missing metadata, bad and huge capacity
        assert meta["gpu_pods"]["malformed_objects"] >= 4  # no metadata, containers, bad and huge GPU count
        assert meta["gpu_workloads"]["malformed_objects"] >= 3  # unknown owner kind, cycle, namespace
        readable = check(result, "gpu_nodes", "every_node_readable")
        assert readable.metadata["clusters_failing"].value == [broken.name]
        kube_rows_match_truth(m.lens_url, m.server, broken.name)
        names = {r["name"] for r in table(m.lens_url, node, broken.name)}
        assert {n["name"] for n in truth(m.server, broken.name)["nodes"]} <= names
        assert not any(n.startswith(("malformed-capacity", "malformed-huge")) for n in names)

    # A broken API costs the batch its retry budget and no more: each request is tried
    # MAX_RETRIES + 1 times; once the API proved unreachable, no other request is sent.
    if fault.unreachable:
        assert sum(requests.values()) <= MAX_RETRIES + 1, requests
    elif fault.kind == "http-503":
        assert requests and max(requests.values()) <= MAX_RETRIES + 1, requests
