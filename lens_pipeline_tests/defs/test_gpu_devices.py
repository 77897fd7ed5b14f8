"""`gpu_devices` when the exporters' series are missing, duplicated or impossible, on SQLite,
PostgreSQL and MariaDB: what is stored is never overwritten or deleted for want of a series, the
changelog records no device that did not change, and the checks name what they could not see."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from dagster import instance_for_test

from lens_pipeline.collect.safe import percent
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.defs.resources import ClusterRegistryResource, LensDatabase, SafeDatabase
from lens_pipeline.sim.dialects import ExporterDialect
from lens_pipeline.sim.exporters import NODE_EXPORTER_JOB
from lens_pipeline.sim.fleet import SimCluster, SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.store.db import get_engine, write_transaction
from lens_pipeline.store.devices import write_devices
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.schema import gpu_device, node, node_device_changelog, node_statistic, rdma_device
from lens_pipeline_tests.defs.support import materialize_cluster
from lens_pipeline_tests.defs.test_collectors_against_truth import table, truth
from lens_pipeline_tests.defs.test_derived_against_truth import safe_rows


@pytest.fixture
def world(tmp_path, db_urls):
    """One NVIDIA cluster of 4 GPU nodes, served, with its registry and a Dagster instance."""
    yield from _world(tmp_path, db_urls, SimCluster("sim-nvidia-0", "nvidia", 4, seed=5))


def _world(tmp_path, db_urls, cluster: SimCluster):
    with SimServer(SimFleet([cluster])) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [cluster.name])
        yield cluster, server, write_registry(tmp_path / "clusters.yaml", server), instance, db_urls


def run(world, assets=("gpu_nodes", "gpu_devices")) -> dict[str, tuple[bool, dict]]:
    """The assets once for the cluster; each check's (passed, metadata) by name."""
    cluster, _server, registry, instance, (lens_url, safe_url) = world
    result = materialize_cluster(
        list(assets),
        partition_key=cluster.name,
        instance=instance,
        resources={
            "registry": ClusterRegistryResource(clusters_file=str(registry)),
            "lens_db": LensDatabase(url=lens_url),
            "safe_db": SafeDatabase(url=safe_url),
        },
    )
    assert result.success
    return {
        c.check_name: (c.passed, {k: getattr(v, "value", v) for k, v in c.metadata.items()})
        for c in result.get_asset_check_evaluations()
    }


def devices(world) -> tuple[dict, dict, list]:
    cluster, _server, _registry, _instance, (lens_url, _) = world
    gpus = {(r["node_name"], r["gpu_id"]): r for r in table(lens_url, gpu_device, cluster.name)}
    nics = {(r["node_name"], r["ifname"]): r for r in table(lens_url, rdma_device, cluster.name)}
    changes = sorted(
        (r["node_name"], r["device_type"], r["device_uuid"], r["op"])
        for r in table(lens_url, node_device_changelog, cluster.name)
    )
    return gpus, nics, changes


def test_a_silent_exporter_on_a_ready_node_keeps_its_devices_and_is_named(world):
    """The GPU exporter of one Ready node and node_exporter of another crash-loop: their GPUs and
    NICs stay as stored, the changelog records nothing, and the check fails naming both nodes.
    Once they answer again, the check passes and nothing was lost."""
    cluster = world[0]
    checks = run(world)
    assert checks["every_gpu_node_has_devices"][0]
    before = devices(world)
    gpu_silent, nic_silent = cluster.node_names()[:2]
    assert any(k[0] == gpu_silent for k in before[0]) and any(k[0] == nic_silent for k in before[1])
    cluster.set_exporter_running(gpu_silent, cluster.profile.exporter_job, False)
    cluster.set_exporter_running(nic_silent, NODE_EXPORTER_JOB, False)

    checks = run(world)
    passed, meta = checks["every_gpu_node_has_devices"]
    assert not passed
    assert meta["nodes"] == [gpu_silent] and meta["nic_nodes"] == [nic_silent]
    gpus, nics, changes = devices(world)
    assert changes == before[2]  # no DELETE for devices whose series are missing
    assert {k: r for k, r in gpus.items() if k[0] == gpu_silent} == {
        k: r for k, r in before[0].items() if k[0] == gpu_silent
    }
    assert nics == before[1]  # NICs of the silent node_exporter still live, untouched

    cluster.set_exporter_running(gpu_silent, cluster.profile.exporter_job, True)
    cluster.set_exporter_running(nic_silent, NODE_EXPORTER_JOB, True)
    checks = run(world)
    assert checks["every_gpu_node_has_devices"][0]
    assert set(devices(world)[0]) == set(before[0]) and devices(world)[2] == before[2]


def test_conflicting_series_for_one_gpu_keep_its_stored_row(world):
    """A second series for a stored GPU with another UUID (a stale exporter, a second scrape job):
    no fake card replacement. The GPU keeps its stored row, the changelog records nothing, and the
    check counts and names it."""
    cluster = world[0]
    run(world)
    before = devices(world)
    node_name = cluster.node_names()[1]
    labels = next(
        dict(lab)
        for _m, lab, _v in cluster.exporter_samples()
        if lab["Hostname"] == node_name and lab["gpu"] == "3"
    )
    impostor = {**labels, "UUID": "GPU-00000000-dead-beef-0000-000000000000"}
    cluster.inject_series(
        "dcgm-exporter-stale", "10.9.0.1:9400", [(cluster.profile.util_metric, impostor, 1.0)]
    )

    checks = run(world)
    passed, meta = checks["series_well_formed"]
    assert not passed and meta["duplicated_gpus"] == 1 and meta["duplicates"] == [f"{node_name}/3"]
    gpus, _nics, changes = devices(world)
    assert changes == before[2]
    assert gpus[(node_name, 3)] == before[0][(node_name, 3)]
    expected = {(d["node_name"], d["gpu_id"]): d for d in truth(world[1], cluster.name)["gpu_devices"]}
    for key, want in expected.items():
        assert gpus[key]["serial"] == want["serial"], key


def test_impossible_utilization_is_unknown_and_the_safe_statistics_still_write(world):
    """A GPU reporting 1e6 % (and one at -5 %): their `gpu_device.utilization` is NULL, their node's
    mean is the other GPUs', `safe_node_statistic` writes every node (PostgreSQL's NUMERIC(5,2)
    would overflow on 1e6), and the check names both."""
    cluster, server = world[0], world[1]
    first, second = cluster.node_names()[:2]
    cluster.set_gpu_utilization(first, 0, 1e6)
    cluster.set_gpu_utilization(second, 2, -5.0)
    checks = run(world, ("gpu_nodes", "gpu_devices", "safe_node_statistic"))
    passed, meta = checks["series_well_formed"]
    assert not passed and meta["out_of_range_values"] == 2
    assert sorted(meta["out_of_range"]) == [f"{first}/0 utilization=1e+06", f"{second}/2 utilization=-5"]
    gpus, _nics, _changes = devices(world)
    assert gpus[(first, 0)]["utilization"] is None and gpus[(second, 2)]["utilization"] is None
    assert gpus[(first, 0)]["temperature"] is not None  # the other figures are still known

    lens_url, safe_url = world[4]
    nodes = {r["name"]: r for r in table(lens_url, node, cluster.name)}
    for name in (first, second):
        others = [
            d["utilization"]
            for d in truth(server, cluster.name)["gpu_devices"]
            if d["node_name"] == name and 0 <= d["utilization"] <= 100
        ]
        assert nodes[name]["gpu_utilization"] == pytest.approx(sum(others) / len(others))
    assert checks["one_row_per_gpu_node"][0]
    stats = {r["node_name"]: r for r in safe_rows(safe_url, node_statistic, cluster=cluster.name)}
    assert set(stats) == set(cluster.node_names())
    assert all(0 <= float(r["gpu_utilization"]) <= 100 for r in stats.values())


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (0.0, Decimal("0.00")),
        (99.996, Decimal("100.00")),
        (1e6, None),
        (-0.5, None),
        (math.nan, None),
    ],
)
def test_a_safe_percentage_outside_0_100_is_unknown(value, expected):
    assert percent(value) == expected


def test_a_figure_metric_missing_from_prometheus_fails_a_warning_naming_it(tmp_path, db_urls):
    """An exporter configured without the power and used-memory metrics: those figures are NULL on
    every GPU, and `every_gpu_figure_known` says which metrics are missing and names the GPUs."""
    lacking = ExporterDialect("lacking", missing_metrics=("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED"))
    cluster = SimCluster("sim-nvidia-0", "nvidia", 2, seed=5, dialect=lacking)
    for world in _world(tmp_path, db_urls, cluster):
        passed, meta = run(world)["every_gpu_figure_known"]
        assert not passed
        assert meta["missing_metrics"] == ["dcgm-exporter: no series for power, vram_used"]
        gpus, _nics, _changes = devices(world)
        assert all(
            r["power"] is None and r["memory"] is None and r["temperature"] is not None for r in gpus.values()
        )
        assert meta["gpus_without_power"] == meta["gpus_without_memory"] == len(gpus) > 0
        assert meta["gpus_without_temperature"] == 0
        assert meta["without_power"][:2] == [f"{cluster.node_names()[0]}/0", f"{cluster.node_names()[0]}/1"]


def test_a_gpu_seen_without_its_serial_keeps_the_stored_one(lens_url):
    """The series of a stored GPU lose their serial label (a relabelling, a VM guest): its figures
    are written, its serial stays, and the changelog records no replaced card."""
    engine = get_engine(lens_url)
    ensure_schema(engine, "lens")
    row = {
        "node_name": "n1",
        "gpu_id": 0,
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "memory": 81559,
        "utilization": 10.0,
        "temperature": 40.0,
        "power": 300.0,
        "serial": "GPU-a",
    }
    first = datetime(2026, 11, 1, tzinfo=UTC)
    with write_transaction(engine) as conn:
        write_devices(conn, "c1", gpus=[row], nics=None, now=first)
    with write_transaction(engine) as conn:
        written = write_devices(
            conn,
            "c1",
            gpus=[{**row, "serial": "", "utilization": 55.0}],
            nics=None,
            now=first + timedelta(minutes=1),
        )
    assert written["changes"] == []
    (stored,) = table(lens_url, gpu_device, "c1")
    assert (stored["serial"], stored["utilization"]) == ("GPU-a", 55.0)
    assert [r["op"] for r in table(lens_url, node_device_changelog, "c1")] == ["CREATE"]
