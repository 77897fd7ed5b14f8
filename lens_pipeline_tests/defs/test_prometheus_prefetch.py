"""Prometheus queries asked ahead: `PromReader.prefetch` against the simulator's query API over real
HTTP, and the collectors' run asking each query once with the answers of a direct ask."""

from __future__ import annotations

import threading
import time
from urllib.parse import unquote_plus

import pytest
from dagster import instance_for_test

from lens_pipeline.defs.collectors.gpu_devices import device_queries
from lens_pipeline.defs.partitions import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    CLUSTER_PARTITIONS_NAME,
)
from lens_pipeline.defs.resources import (
    ClusterRegistryResource,
    KubernetesResource,
    LensDatabase,
    PrometheusResource,
)
from lens_pipeline.prom.reader import PromError, PromReader
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.server import SimServer
from lens_pipeline.vendors import PROFILES, shipped_dialect
from lens_pipeline_tests.defs.support import (
    DEAD_URL,
    DIALECT_REQUESTS,
    edit_registry,
    materializations,
    materialize_cluster,
    served_fleet,
)

AMD = "sim-amd-0"
PROFILE = PROFILES["amd"]


@pytest.fixture
def sim(tmp_path):
    with served_fleet(tmp_path, clusters=1, nodes=6, seed=5, vendor="amd") as served:
        yield served


def _reader(server: SimServer) -> PromReader:
    return PromReader(AMD, server.prometheus_url(AMD), timeout_seconds=5, retries=0)


def _asked(fleet: SimFleet) -> int:
    return fleet.cluster(AMD).request_count("/prometheus")


def _wait_until_asked(fleet: SimFleet, count: int) -> None:
    deadline = time.monotonic() + 10
    while _asked(fleet) < count:
        assert time.monotonic() < deadline, f"only {_asked(fleet)} of {count} queries were asked"
        time.sleep(0.02)


def test_prefetched_answers_are_the_direct_answers_asked_once(sim):
    fleet, server, _registry = sim
    queries = [PROFILE.identity_query(), PROFILE.node_utilization_query()]
    direct = {q: _reader(server).vector(q) for q in queries}
    assert all(direct.values())
    fleet.cluster(AMD).request_log.reset()

    reader = _reader(server)
    reader.prefetch([*queries, queries[0]])  # a repeated query is asked once
    _wait_until_asked(fleet, 2)  # asked before anyone took an answer
    assert reader.queries == 0
    assert {q: reader.vector(q) for q in queries} == direct
    assert reader.queries == 2 and _asked(fleet) == 2
    # A prefetched answer is taken once; asking again asks Prometheus again.
    assert reader.vector(queries[0]) == direct[queries[0]]
    assert reader.queries == 3 and _asked(fleet) == 3
    reader.close()


def test_a_prefetched_failure_is_raised_when_its_answer_is_taken(sim):
    fleet, server, _registry = sim
    fleet.cluster(AMD).set_fault("prometheus", 503)
    reader = _reader(server)
    reader.prefetch([PROFILE.identity_query()])
    with pytest.raises(PromError, match="503"):
        reader.vector(PROFILE.identity_query())
    reader.close()


def test_close_drops_answers_nobody_took(sim):
    fleet, server, _registry = sim
    fleet.cluster(AMD).request_log.reset()
    reader = _reader(server)
    reader.prefetch([PROFILE.identity_query()])
    _wait_until_asked(fleet, 1)
    reader.close()
    assert reader.vector(PROFILE.identity_query())  # asked again, not the dropped answer
    assert _asked(fleet) == 2


def _run_of(assets: list[str], registry, tmp_path):
    """One run of `assets` for the AMD cluster, on a fresh instance."""
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [AMD])
        return materialize_cluster(
            assets,
            partition_key=AMD,
            instance=instance,
            resources={
                "registry": ClusterRegistryResource(clusters_file=str(registry)),
                "prometheus": PrometheusResource(timeout_seconds=5),
                "lens_db": LensDatabase(url=f"sqlite:///{tmp_path / 'lens.db'}"),
            },
        )


def _nodes_and_devices_of(instance, clusters: list[str], registry, tmp_path, **resources):
    """One run of `gpu_nodes` and `gpu_devices` over a batch of clusters, failures kept in the result."""
    instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, clusters)
    return materialize_cluster(
        ["gpu_nodes", "gpu_devices"],
        instance=instance,
        tags={ASSET_PARTITION_RANGE_START_TAG: clusters[0], ASSET_PARTITION_RANGE_END_TAG: clusters[-1]},
        raise_on_error=False,
        resources={
            "registry": ClusterRegistryResource(clusters_file=str(registry)),
            "prometheus": PrometheusResource(timeout_seconds=5),
            "lens_db": LensDatabase(url=f"sqlite:///{tmp_path / 'lens.db'}"),
            **resources,
        },
    )


def test_a_malformed_prometheus_url_is_the_parts_error_not_the_runs(sim, tmp_path):
    reader = PromReader(AMD, "http://[bad", timeout_seconds=1, retries=0)
    reader.prefetch([PROFILE.identity_query()])  # nothing to ask with; not an error here
    with pytest.raises(PromError, match="no client for"):
        reader.vector(PROFILE.identity_query())

    # In a batch, the cluster with the bad URL keeps its nodes (without fresh utilization) and
    # loses its devices; the cluster after it is collected in full.
    served = served_fleet(tmp_path, clusters=2, nodes=4, seed=6, vendor="mixed")
    with served as (fleet, _server, registry), instance_for_test() as instance:
        first, second = (c.name for c in fleet)
        edit_registry(registry, lambda d: d["clusters"][0].update(prometheus_url="http://[bad"))
        result = _nodes_and_devices_of(instance, [first, second], registry, tmp_path)
    assert (
        not result.success
    )  # the first cluster's devices failed: the run says so, once every cluster had its turn
    assert sorted(m.partition for m in materializations(result, "gpu_nodes")) == sorted([first, second])
    assert [m.partition for m in materializations(result, "gpu_devices")] == [second]
    (fresh,) = (e for e in result.get_asset_check_evaluations() if e.check_name == "utilization_fresh")
    assert fresh.metadata["clusters_failing"].value == [first]


def test_a_run_asks_each_query_once(sim, tmp_path, monkeypatch):
    fleet, _server, registry = sim
    fleet.cluster(AMD).request_log.reset()
    asked_ahead: list[str] = []
    prefetch = PromReader.prefetch

    def recording(reader: PromReader, queries) -> None:
        asked_ahead.extend(queries)
        prefetch(reader, queries)

    monkeypatch.setattr(PromReader, "prefetch", recording)
    result = _run_of(["gpu_nodes", "gpu_pods", "gpu_devices"], registry, tmp_path)
    asked = {
        name: materializations(result, name)[0].metadata["prometheus_queries"].value
        for name in ("gpu_nodes", "gpu_pods", "gpu_devices")
    }
    # gpu_nodes: the utilization query; gpu_devices: identities, duplicates, each figure, the NICs.
    assert asked == {"gpu_nodes": 1, "gpu_pods": 0, "gpu_devices": 3 + len(PROFILE.device_metrics)}
    # Before them, once for the turn: the exporters' dialect.
    assert _asked(fleet) == sum(asked.values()) + DIALECT_REQUESTS
    # Every query was asked ahead, at the start of the turn: the dialect first, then gpu_nodes'
    # query and gpu_devices', in the order of the parts.
    nodes_query = PROFILE.node_utilization_query()
    assert asked_ahead == [nodes_query, *device_queries(shipped_dialect("amd"))]
    recent = fleet.cluster(AMD).request_log.as_json()["recent"]
    prometheus = [unquote_plus(line.split(" ")[1]) for line in recent if " /prometheus/" in line]
    assert len(prometheus) == len(asked_ahead) + DIALECT_REQUESTS
    assert [line.partition("query=")[2] for line in prometheus[DIALECT_REQUESTS:]] == asked_ahead


def test_forgotten_queries_are_not_asked(sim):
    """A query asked ahead for a part that will not run (its upstream failed) is dropped unasked."""
    fleet, server, _registry = sim
    fleet.cluster(AMD).request_log.reset()
    reader = _reader(server)
    hold = threading.Event()
    held = reader.in_background(hold.wait)  # the queries asked ahead wait behind it
    kept, dropped = PROFILE.identity_query(), PROFILE.node_utilization_query()
    reader.prefetch([kept, dropped])
    reader.forget([dropped])
    hold.set()
    held.result(timeout=10)
    assert reader.vector(kept)
    assert _asked(fleet) == 1
    assert reader.vector(dropped)  # asked now, by the part that does run after all
    assert _asked(fleet) == 2
    reader.close()


def test_a_part_that_fails_has_its_queries_and_those_below_it_forgotten(sim, tmp_path, monkeypatch):
    """A cluster whose Kubernetes API refuses every connection fails `gpu_nodes` before any query is
    taken: neither its query nor `gpu_devices'` (below it) is asked ahead, even when its dialect is
    learned only after the failure. The next cluster of the batch gets all of its queries."""
    from lens_pipeline.defs.collectors import common

    _fleet, server, registry = sim
    dead = "sim-amd-dead-api"
    edit_registry(
        registry,
        lambda d: d["clusters"].insert(
            0,
            {
                "name": dead,
                "server": DEAD_URL,
                "token": "x",
                "request_timeout_seconds": 2,
                "vendor": "amd",
                "prometheus_url": server.prometheus_url(AMD),
            },
        ),
    )
    failed = threading.Event()
    forget, read_dialect = common.ClusterTurn.forget, common.read_dialect

    def forgetting(turn, parts) -> None:
        forget(turn, parts)
        failed.set()

    def after_the_failure(*args, **kwargs):
        failed.wait(timeout=60)  # the dead cluster's dialect is known only once gpu_nodes failed
        return read_dialect(*args, **kwargs)

    asked_ahead: dict[str, list[str]] = {}
    prefetch = PromReader.prefetch

    def recording(reader: PromReader, queries) -> None:
        asked_ahead.setdefault(reader.cluster, []).extend(queries)
        prefetch(reader, queries)

    monkeypatch.setattr(common.ClusterTurn, "forget", forgetting)
    monkeypatch.setattr(common, "read_dialect", after_the_failure)
    monkeypatch.setattr(PromReader, "prefetch", recording)
    with instance_for_test() as instance:
        result = _nodes_and_devices_of(
            instance, [dead, AMD], registry, tmp_path, kubernetes=KubernetesResource(max_retries=0)
        )
    assert failed.is_set()
    assert [m.partition for m in materializations(result, "gpu_devices")] == [AMD]
    assert asked_ahead.get(dead, []) == []
    assert asked_ahead[AMD] == [PROFILE.node_utilization_query(), *device_queries(shipped_dialect("amd"))]


def test_a_view_run_alone_counts_its_own_queries_not_the_dialects(sim, tmp_path):
    """With nothing asked ahead (no collector in the run), the turn learns the dialect when the view
    first needs it: on a reader of its own, so the view's count is its queries alone."""
    fleet, _server, registry = sim
    fleet.cluster(AMD).request_log.reset()
    result = _run_of(["cluster_overview_cache"], registry, tmp_path)
    assert result.success
    asked = materializations(result, "cluster_overview_cache")[0].metadata["prometheus_queries"].value
    assert asked > 0
    assert _asked(fleet) == asked + DIALECT_REQUESTS
