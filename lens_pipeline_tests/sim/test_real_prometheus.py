"""A real Prometheus (Debian's package) scrapes the simulated exporters and answers the pipeline's
PromQL with the same figures as the simulator's own query API; the collectors pointed at it store
what the ground truth says.

CI installs `prometheus`; there this test must not skip.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from dagster import instance_for_test
from fastapi.testclient import TestClient

from lens_pipeline.api.app import create_app
from lens_pipeline.clusters import load_registry
from lens_pipeline.collect.overview import OVERVIEW_FIGURES
from lens_pipeline.defs import resources
from lens_pipeline.defs.resources import (
    ClusterRegistryResource,
    LensDatabase,
    PrometheusResource,
    SafeDatabase,
)
from lens_pipeline.prom.dialect import read_dialect
from lens_pipeline.prom.reader import PromReader
from lens_pipeline.sim.dialects import ExporterDialect
from lens_pipeline.sim.exporters import scrape
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.registry import prometheus_config, write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.schema import cluster_overview_cache, gpu_device, workload_statistic
from lens_pipeline.vendors import Dialect, ExporterOverrides, learn_dialect
from lens_pipeline_tests.conftest import skip_unless
from lens_pipeline_tests.defs.support import materialize_cluster, statistics_config
from lens_pipeline_tests.defs.test_collectors_against_truth import DEVICE_COLUMNS, observable, table, truth
from lens_pipeline_tests.defs.test_derived_against_truth import STATISTICS, gpus_by_pod, workload_gpus
from lens_pipeline_tests.defs.test_gpu_nodes import assert_table_equals_truth
from lens_pipeline_tests.ports import free_port

READY_TIMEOUT = 60.0


def _samples(reader: PromReader, query: str) -> dict[frozenset, float]:
    return {frozenset(s.labels.items()): s.value for s in reader.vector(query)}


@contextmanager
def real_prometheus(fleet: SimFleet, server: SimServer, work: Path) -> Iterator[dict[str, str]]:
    """One real Prometheus per cluster scraping its exporters every second, until every target has
    been scraped; yields each cluster's Prometheus URL."""
    binary = shutil.which("prometheus")
    skip_unless(binary is not None, "Debian's prometheus is not installed (apt-get install prometheus)")
    processes, urls = [], {}
    try:
        for cluster in fleet:
            config = work / f"{cluster.name}.yml"
            config.write_text(yaml.safe_dump(prometheus_config(cluster, server, scrape_interval="1s")))
            port = free_port()
            processes.append(
                subprocess.Popen(
                    [
                        str(binary),
                        f"--config.file={config}",
                        f"--storage.tsdb.path={work / cluster.name}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            )
            urls[cluster.name] = f"http://127.0.0.1:{port}"
        for cluster in fleet:
            _wait_until_scraped(urls[cluster.name], len(scrape(cluster)))
        yield urls
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    work = tmp_path_factory.mktemp("real-prometheus")
    # An AMD and an NVIDIA cluster as shipped, and two whose exporters and scrape configs differ
    # in every way the pipeline must learn (prefix, honor_labels: false, the node by instance only,
    # AMD's default labels, dcgm-exporter's old namespace and no reserved framebuffer...).
    fleet = SimFleet.generate(clusters=4, nodes=5, seed=8, vendor="mixed", dialect="shipped,everything")
    with SimServer(fleet) as server, real_prometheus(fleet, server, work) as urls:
        yield fleet, server, urls, work


def _wait_until_scraped(url: str, targets: int) -> None:
    reader = PromReader("real", url, timeout_seconds=5)
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/-/ready", timeout=2).read()
            up = reader.vector("sum(up)")
            if up and up[0].value == targets:
                time.sleep(1.5)  # one more scrape interval: every target's samples are in
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"Prometheus at {url} did not scrape {targets} targets in {READY_TIMEOUT} s")


def pipeline_queries(dialect: Dialect) -> list[str]:
    (profile,) = dialect.profiles
    return [
        profile.node_utilization_query(),
        profile.identity_query(),
        *(profile.figure_query(figure) for figure in profile.device_metrics),
        dialect.nic.info_query(),
        *profile.utilization_sum_queries(),
        *profile.pod_utilization_queries(101)[:2],  # per pod: utilization sum and GPU count
        profile.pod_utilization_queries(101)[2],  # GPUs under 101 %: all of them
        # The hourly history's: GPUs reported, per pod the memory of its GPUs and their count.
        profile.capacity_query(),
        *profile.pod_memory_queries().values(),
    ]


def test_the_dialect_learned_from_a_real_prometheus_is_the_simulators(scraped):
    """What the pipeline learns from a real Prometheus scraping the exporters (names, `exported_*`
    labels made by Prometheus itself under honor_labels: false, the node by instance) is what it
    learns from the simulator's own query API."""
    fleet, server, urls, _ = scraped
    for cluster in fleet:
        real = read_dialect(PromReader(cluster.name, urls[cluster.name]), "auto", ExporterOverrides())
        simulated = read_dialect(
            PromReader(cluster.name, server.prometheus_url(cluster.name)), "auto", ExporterOverrides()
        )
        assert real == simulated, cluster.name
        (profile,) = real.profiles
        assert not real.missing
        changed = cluster.dialect.name == "everything"
        assert (profile.metric_prefix == "amd_") == (changed and cluster.vendor == "amd")
        # dcgm-exporter's --use-old-namespace `pod_name` is no target's: not renamed.
        renamed = {"amd": "exported_pod", "nvidia": "pod_name"}[cluster.vendor]
        assert profile.pod_label == (renamed if changed else "pod")
        assert real.nic.node_label == ("instance" if changed else "node")


def test_real_prometheus_answers_the_pipeline_queries_like_the_simulator(scraped):
    fleet, server, urls, _ = scraped
    for cluster in fleet:
        real = PromReader(cluster.name, urls[cluster.name])
        simulated = PromReader(cluster.name, server.prometheus_url(cluster.name))
        for query in pipeline_queries(read_dialect(real, cluster.vendor, ExporterOverrides())):
            from_real, from_sim = _samples(real, query), _samples(simulated, query)
            assert from_real.keys() == from_sim.keys(), query
            assert from_real == pytest.approx(from_sim), query
            assert from_real, f"{query} returned nothing"


def registry_on_real_prometheus(tmp_path, server: SimServer, urls: dict[str, str]):
    """The simulator's registry with each cluster's Prometheus replaced by the real one, and
    nothing said of the vendor: `auto`, as a user who lets the pipeline find out."""
    registry = write_registry(tmp_path / "clusters.yaml", server)
    document = yaml.safe_load(registry.read_text())
    for entry in document["clusters"]:
        entry["prometheus_url"] = urls[entry["name"]]
        entry["vendor"] = "auto"
    registry.write_text(yaml.safe_dump(document))
    return registry


def assert_collectors_store_the_truth(
    fleet: SimFleet, server: SimServer, urls: dict[str, str], work: Path
) -> None:
    """`gpu_nodes` and `gpu_devices` of every cluster, each reading its real Prometheus with nothing
    configured: every check passes, and the rows are what the truth says (as far as the dialect
    lets it be known)."""
    registry = registry_on_real_prometheus(work, server, urls)
    url = f"sqlite:///{work / 'lens.db'}"
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", [c.name for c in fleet])
        for cluster in fleet:
            result = materialize_cluster(
                ["gpu_nodes", "gpu_devices"],
                partition_key=cluster.name,
                instance=instance,
                resources={
                    **resources.defs.resources,
                    "registry": ClusterRegistryResource(clusters_file=str(registry)),
                    "lens_db": LensDatabase(url=url),
                },
            )
            assert result.success
            failed = [c.check_name for c in result.get_asset_check_evaluations() if not c.passed]
            assert failed == [], (cluster.name, cluster.dialect.name)
            assert_table_equals_truth(url, server, cluster.name)
            want = truth(server, cluster.name)
            stored = {(r["node_name"], r["gpu_id"]): r for r in table(url, gpu_device, cluster.name)}
            assert len(stored) == len(want["gpu_devices"]) > 0
            for device in want["gpu_devices"]:
                have = stored[(device["node_name"], device["gpu_id"])]
                assert {c: have[c] for c in DEVICE_COLUMNS} == pytest.approx(
                    observable(device, cluster, want["nodes"])
                )


def test_collectors_on_a_real_prometheus_store_the_truth(scraped, tmp_path):
    fleet, server, urls, _ = scraped
    assert_collectors_store_the_truth(fleet, server, urls, tmp_path)


def test_the_overview_truth_is_what_a_real_prometheus_computes(scraped):
    """The truth's Prometheus-derived overview figures (utilization, storage, RDMA rates) agree with
    what a real Prometheus computes from the scraped series. Rates are taken per series, then summed
    (the original's `rate(sum(...))` is wrong); `irate` because a Prometheus seconds old has too
    little history for `rate`'s extrapolation to be exact."""
    fleet, server, urls, _ = scraped
    for cluster in fleet:
        real = PromReader(cluster.name, urls[cluster.name])
        rx_query = "sum(irate(node_infiniband_port_data_received_bytes_total[10s]))"
        deadline = time.monotonic() + READY_TIMEOUT
        while not real.vector(rx_query) and time.monotonic() < deadline:
            time.sleep(0.5)  # a rate needs two scrapes inside its window
        overview = truth(server, cluster.name)["overview"]
        (profile,) = read_dialect(real, cluster.vendor, ExporterOverrides()).profiles
        figures = {
            f"avg({profile.util_metric})": overview["utilization"],
            "sum(juicefs_used_space)": overview["storage_used_space"],
            "sum(juicefs_used_inodes)": overview["storage_used_inodes"],
            "sum(irate(juicefs_fuse_read_size_bytes_sum[10s]))": overview["storage_read_bandwidth"],
            "sum(irate(juicefs_fuse_written_size_bytes_sum[10s]))": overview["storage_write_bandwidth"],
            rx_query: overview["rdma_total_rx"],
            "sum(irate(node_infiniband_port_data_transmitted_bytes_total[10s]))": overview["rdma_total_tx"],
        }
        if overview["storage_total_space"] is not None:  # volumes without quota have no capacity
            figures["sum(juicefs_total_space)"] = overview["storage_total_space"]
        for query, expected in figures.items():
            (sample,) = real.vector(query)
            assert sample.value == pytest.approx(expected, rel=0.02), query


RATE_SECONDS = 20


def _wait_for_history(url: str, seconds: int) -> None:
    """Until every target has been scraped for `seconds` (a `rate` over that window is then exact)."""
    reader = PromReader("real", url, timeout_seconds=5)
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        scrapes = reader.vector(f"min(count_over_time(up[{seconds + 3}s]))")
        if scrapes and scrapes[0].value >= seconds:
            return
        time.sleep(0.5)
    raise AssertionError(f"Prometheus at {url} has not {seconds} s of history")


def test_overview_and_workload_statistics_on_a_real_prometheus_equal_the_truth(scraped, tmp_path):
    """The overview's PromQL (utilization, JuiceFS per volume, RDMA rates) and the per-pod range and
    instant queries of the workload statistics, answered by a real Prometheus scraping the
    simulator: the stored rows are what the ground truth says."""
    fleet, server, urls, _ = scraped
    registry = registry_on_real_prometheus(tmp_path, server, urls)
    url = f"sqlite:///{tmp_path / 'lens.db'}"
    checked = 0
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", [c.name for c in fleet])
        for cluster in fleet:
            # A counter is read when its scrape arrives and stamped when the scrape started: on a busy
            # machine the two differ by up to a second, which is 10 % of a 10 s rate (seen once under
            # the full suite) and 5 % of a 20 s one.
            _wait_for_history(urls[cluster.name], RATE_SECONDS)
            result = materialize_cluster(
                partition_key=cluster.name,
                instance=instance,
                # The window starts after every target was scraped (older points see part of the GPUs).
                run_config=statistics_config({**STATISTICS, "first_window_seconds": 5}),
                resources={
                    **resources.defs.resources,
                    "registry": ClusterRegistryResource(clusters_file=str(registry)),
                    "prometheus": PrometheusResource(rate_window=f"{RATE_SECONDS}s"),
                    "lens_db": LensDatabase(url=url),
                    "safe_db": SafeDatabase(url=f"sqlite:///{tmp_path / 'safe.db'}"),
                },
            )
            assert result.success
            want = truth(server, cluster.name)
            (row,) = table(url, cluster_overview_cache, cluster.name)
            # Rates come from counters scraped with jitter (more so on a busy machine): within 5 %.
            rates = {"storage_read_bandwidth", "storage_write_bandwidth", "rdma_total_rx", "rdma_total_tx"}
            for figure in OVERVIEW_FIGURES:
                expected = want["overview"][figure]
                if expected is None:  # no capacity (JuiceFS without quota): unknown, never a number
                    assert row[figure] is None, figure
                    continue
                assert row[figure] == pytest.approx(expected, rel=0.05 if figure in rates else 1e-9), figure

            gpus = gpus_by_pod(cluster)
            stats = {r["uid"]: r for r in table(url, workload_statistic, cluster.name)}
            for uid, held in workload_gpus(want, gpus).items():
                row = stats[uid]
                if not held:
                    assert row["sample_count"] == 0
                    continue
                util = sum(held) / len(held)
                assert row["sample_count"] > 0
                for figure in ("instant", "avg", "min", "max"):
                    assert row[f"{figure}_gpu_utilization"] == pytest.approx(util), (uid, figure)
                assert row["allocated_gpu_seconds"] == pytest.approx(len(held) * row["sample_count"])
                idle = sum(v < STATISTICS["idle_threshold_percent"] for v in held)
                assert row["idle_gpu_seconds"] == pytest.approx(idle * row["sample_count"])
                checked += 1
    assert checked, "no workload held a GPU"


def test_the_simulators_past_is_what_a_real_prometheus_recorded(tmp_path):
    """A cluster keeping history, scraped by a real Prometheus while its GPUs change: a range query
    over the last seconds gets from the simulator what the real one recorded (steps next to a
    change aside: a scrape lands up to an interval after it)."""
    binary = shutil.which("prometheus")
    skip_unless(binary is not None, "Debian's prometheus is not installed (apt-get install prometheus)")
    fleet = SimFleet.generate(clusters=1, nodes=3, seed=8, vendor="amd", history=True)
    (cluster,) = fleet
    with SimServer(fleet) as server:
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(cluster, server, scrape_interval="1s")))
        port = free_port()
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_until_scraped(url, len(scrape(cluster)))
            start = time.time()
            changes = []
            node = cluster.node_names()[0]
            for value in (11.0, 77.0):  # a GPU held by no pod, and the node's mean, move
                time.sleep(4)
                changes.append(time.time())
                cluster.set_gpu_utilization(node, 0, value)
            time.sleep(4)
            (profile,) = read_dialect(PromReader("real", url), cluster.vendor, ExporterOverrides()).profiles
            queries = [  # the per-node one last: its values are looked at after the loop
                profile.capacity_query(),
                profile.utilization_sum_queries()[0],
                profile.node_utilization_query(),
            ]
            end = datetime_of(time.time() - 1)
            for query in queries:
                real = PromReader("real", url).matrix(query, datetime_of(start), end, 1)
                simulated = PromReader("sim", server.prometheus_url(cluster.name)).matrix(
                    query, datetime_of(start), end, 1
                )
                assert {frozenset(s.labels.items()) for s in real} == {
                    frozenset(s.labels.items()) for s in simulated
                }
                by_labels = {frozenset(s.labels.items()): dict(s.points) for s in simulated}
                compared: dict[frozenset, set[float]] = {}
                for series in real:
                    expected = by_labels[frozenset(series.labels.items())]
                    for t, value in series.points:
                        if min(abs(t - c) for c in changes) > 1.2 and t in expected:
                            assert value == pytest.approx(expected[t]), (query, t)
                            compared.setdefault(series.labels.get(profile.node_label, ""), set()).add(value)
                assert compared, query
            # The changed node's mean took every value in turn, in both (the past is not today's).
            assert len(compared[node]) == 3
        finally:
            process.terminate()
            process.wait(timeout=30)


def datetime_of(t: float):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(round(t), UTC)


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {READY_TIMEOUT} s: {what}")
        time.sleep(0.5)


def test_after_an_exporter_upgrade_the_names_in_use_now_win_on_a_real_prometheus(tmp_path):
    """A real Prometheus scrapes exporters as shipped, then they are upgraded: AMD's exporter gets
    the `amd_` prefix, dcgm-exporter writes `hostname`. For its lookback window Prometheus lists the
    old names beside the new ones; the dialect learned is the one in use now (the names alone give
    the old one), and the collectors store what the truth says."""
    fleet = SimFleet.generate(clusters=2, nodes=3, seed=9, vendor="mixed")
    with SimServer(fleet) as server, real_prometheus(fleet, server, tmp_path) as urls:
        upgraded = ExporterDialect("upgraded", metric_prefix="amd_", lowercase_hostname=True)
        for cluster in fleet:
            cluster.set_dialect(upgraded)
        amd, nvidia = (PromReader(c.name, urls[c.name]) for c in fleet)
        _until(
            lambda: amd.vector("count(amd_gpu_gfx_activity)") and not amd.vector("count(gpu_gfx_activity)"),
            "AMD upgraded",
        )
        _until(
            lambda: (
                nvidia.vector('count(DCGM_FI_DEV_GPU_UTIL{hostname!=""})')
                and not nvidia.vector('count(DCGM_FI_DEV_GPU_UTIL{Hostname!=""})')
            ),
            "NVIDIA upgraded",
        )
        assert {"gpu_gfx_activity", "amd_gpu_gfx_activity"} <= amd.metric_names()
        assert {"Hostname", "hostname"} <= nvidia.label_names("DCGM_FI_DEV_GPU_UTIL")

        (amd_profile,) = read_dialect(amd, "auto", ExporterOverrides()).profiles
        (nvidia_profile,) = read_dialect(nvidia, "auto", ExporterOverrides()).profiles
        assert (amd_profile.util_metric, nvidia_profile.node_label) == ("amd_gpu_gfx_activity", "hostname")
        by_names = [learn_dialect("auto", r.metric_names(), r.label_names).profiles[0] for r in (amd, nvidia)]
        assert (by_names[0].util_metric, by_names[1].node_label) == ("gpu_gfx_activity", "Hostname")

        assert_collectors_store_the_truth(fleet, server, urls, tmp_path)


def test_the_read_api_on_a_real_prometheus_answers_as_on_the_simulators(scraped, tmp_path):
    """The read API's series routes (`topk`, `irate` of node_exporter's CPU counters, counts of the
    GPUs a pod holds, by node whatever label names it) give a real Prometheus's answers what they
    give the simulator's: the same nodes, GPUs and figures."""
    fleet, server, urls, _ = scraped
    real_registry = registry_on_real_prometheus(tmp_path, server, urls)
    sim_registry = write_registry(tmp_path / "sim-clusters.yaml", server)
    url = f"sqlite:///{tmp_path / 'lens.db'}"
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", [c.name for c in fleet])
        for cluster in fleet:
            _wait_for_history(urls[cluster.name], 6)  # an irate needs two scrapes in its window
            result = materialize_cluster(
                ["gpu_nodes", "gpu_pods", "gpu_workloads"],
                partition_key=cluster.name,
                instance=instance,
                resources={
                    **resources.defs.resources,
                    "registry": ClusterRegistryResource(clusters_file=str(sim_registry)),
                    "lens_db": LensDatabase(url=url),
                },
            )
            assert result.success
    engine = get_engine(url)
    real = TestClient(create_app(engine, registry=lambda: load_registry(real_registry)))
    simulated = TestClient(create_app(engine, registry=lambda: load_registry(sim_registry)))

    def both(path: str, **params: object) -> tuple[dict, dict]:
        answers = [c.get(path, params=params) for c in (real, simulated)]
        assert [a.status_code for a in answers] == [200, 200], [a.text[:300] for a in answers]
        return answers[0].json()["data"], answers[1].json()["data"]

    def last(graph: dict) -> dict:
        return {tuple(sorted(s["labels"].items())): s["values"][-1]["value"] for s in graph["series"]}

    for cluster in fleet:
        name = cluster.name
        from_real, from_sim = both("/v1/clusters/gpuHeatmap", cluster=name)
        for key in ("utilization", "power", "temperature"):
            pick = {(i["node_name"], i["gpu_id"]): i["value"] for i in from_real[key]["Data"]}
            assert pick == pytest.approx(
                {(i["node_name"], i["gpu_id"]): i["value"] for i in from_sim[key]["Data"]}
            )
            assert pick, key
        now = int(time.time())
        window = {"start": now - 4, "end": now, "step": 1, "cluster": name}
        from_real, from_sim = both("/v1/nodes/gpuUtilizationHistory", **window)
        for key in ("allocationRate", "utilization", "vramUtilization"):
            assert from_real[key][-1]["value"] == pytest.approx(from_sim[key][-1]["value"]), key
        for node in truth(server, name)["nodes"]:
            if node["status"] != "Ready":
                continue
            # irate of two scrapes a second apart: the counters are read a few ms after each
            # scrape's timestamp, and count hundredths of a second. On a busy machine a scrape
            # answered a second late doubles one irate (16 % against 8.1 % once, as a real
            # node_exporter read late would): such a pair is asked again a scrape later, up to
            # five times, so that only a lasting difference fails.
            for _ in range(5):
                from_real, from_sim = both(f"/v1/nodes/{node['name']}/utilization", cluster=name)
                if from_real["cpu_utilization"] == pytest.approx(from_sim["cpu_utilization"], abs=5.0):
                    break
                time.sleep(1.0)
            assert from_real["cpu_utilization"] == pytest.approx(from_sim["cpu_utilization"], abs=5.0)
            assert from_real["mem_utilization"] == pytest.approx(from_sim["mem_utilization"])
            assert from_real["cpu_utilization"] is not None
            from_real, from_sim = both(f"/v1/nodes/{node['name']}/gpuMetrics", **window)
            for key in ("gpu_utilization", "gpu_allocation_rate"):
                assert last(from_real[key]) == pytest.approx(last(from_sim[key])), key
                assert last(from_real[key]), key
        running = [
            w for w in truth(server, name)["workloads"] if w["status"] == "Running" and not w["parent_uid"]
        ]
        for workload in running[:3]:
            from_real, from_sim = both(f"/v1/workloads/{workload['uid']}/metrics", **window)
            for key in ("GPU Utilization", "GPU Memory Utilization", "GPU Power"):
                assert last(from_real[key]) == pytest.approx(last(from_sim[key])), key
