"""The derived assets in the same Dagster run as the collectors, against the simulator's ground truth,
through churn, on every dialect: the cached overview row, the GPU consumers, the workload GPU
statistics (with idle GPU time) and SaFE's node statistic equal what the truth implies. (SaFE's
workload statistic reads the hourly history: lens_pipeline_tests/defs/test_hourly_history.py.)"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import pytest
from dagster import instance_for_test
from sqlalchemy import select

from lens_pipeline.collect.overview import OVERVIEW_FIGURES, RDMA_FIGURES, STORAGE_FIGURES
from lens_pipeline.defs import resources
from lens_pipeline.defs.partitions import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    CLUSTER_PARTITIONS_NAME,
)
from lens_pipeline.defs.resources import ClusterRegistryResource, LensDatabase, SafeDatabase
from lens_pipeline.sim.dialects import DIALECTS
from lens_pipeline.sim.fleet import SimCluster, SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.schema import (
    cluster_overview_cache,
    gpu_consumers,
    node,
    node_statistic,
    workload_statistic,
)
from lens_pipeline_tests.defs.support import edit_registry, materialize_cluster, statistics_config
from lens_pipeline_tests.defs.test_collectors_against_truth import assert_matches_truth, table, truth

IDLE_BELOW = 5.0
STATISTICS = {"step_seconds": 1, "idle_threshold_percent": IDLE_BELOW, "first_window_seconds": 60}


def materialize_everything(registry, lens_url: str, safe_url: str, instance, assets=None, **partitions):
    """Every asset (or the named `assets`), for the cluster (`partition_key=`) or the range of
    clusters (`tags=`) given."""
    return materialize_cluster(
        assets,
        instance=instance,
        run_config=statistics_config(STATISTICS),
        resources={
            **resources.defs.resources,
            "registry": ClusterRegistryResource(clusters_file=str(registry)),
            "lens_db": LensDatabase(url=lens_url),
            "safe_db": SafeDatabase(url=safe_url),
        },
        **partitions,
    )


def run_cluster(
    cluster: str, registry, lens_url: str, safe_url: str, instance, failing: frozenset[str] = frozenset()
) -> None:
    """Every asset of `cluster` once; every check passes but those named in `failing`, which fail."""
    result = materialize_everything(registry, lens_url, safe_url, instance, partition_key=cluster)
    assert result.success
    for check in result.get_asset_check_evaluations():
        assert check.passed != (check.check_name in failing), (
            check.asset_key,
            check.check_name,
            check.metadata,
        )


def gpus_by_pod(cluster: SimCluster) -> dict[tuple[str, str], list[float]]:
    """Each pod's GPUs' utilization, as the exporters label them."""
    pods: dict[tuple[str, str], list[float]] = {}
    for _metric, labels, value in cluster.exporter_samples():
        if labels.get("pod"):
            pods.setdefault((labels["namespace"], labels["pod"]), []).append(value)
    return pods


def expected_consumers(want: dict, gpus: dict) -> dict[str, dict]:
    running = {p["uid"]: p for p in want["pods"] if p["running"]}
    out = {}
    for w in want["workloads"]:
        pods = [running[u] for u in w["pod_uids"] if u in running]
        if w["parent_uid"] or w["status"] != "Running":
            continue
        held = [v for p in pods for v in gpus.get((p["namespace"], p["name"]), [])]
        out[w["uid"]] = {
            "gpu_allocated": sum(p["gpu_allocated"] for p in pods),
            "active_pods": len(pods),
            "gpu_utilization": sum(held) / len(held) if held else None,  # unknown, not 0
        }
    return out


def workload_gpus(want: dict, gpus: dict) -> dict[str, list[float]]:
    running = {p["uid"]: p for p in want["pods"] if p["running"]}
    return {
        w["uid"]: [v for u in w["pod_uids"] if u in running for v in gpus.get(_key(running[u]), [])]
        for w in want["workloads"]
        if w["status"] in ("Running", "Pending")
    }


def _key(pod: dict) -> tuple[str, str]:
    return pod["namespace"], pod["name"]


def safe_rows(url: str, t, **where) -> list[dict]:
    with get_engine(url).connect() as conn:
        query = select(t).where(*(t.c[k] == v for k, v in where.items()))
        return [dict(r) for r in conn.execute(query).mappings()]


@pytest.fixture(params=["shipped", "everything"])
def fleet_and_registry(tmp_path, request):
    """An AMD and an NVIDIA cluster whose exporters speak as shipped, or in every way real
    deployments change them at once (prefix, honor_labels: false, the node by `instance` only,
    older GFD labels, JuiceFS without quota, dcgm-exporter's `hostname`): the truth is the same."""
    fleet = SimFleet.generate(clusters=2, nodes=14, seed=33, vendor="mixed", dialect=request.param)
    with SimServer(fleet) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [c.name for c in fleet])
        yield fleet, server, write_registry(tmp_path / "clusters.yaml", server), instance


def test_derived_tables_equal_the_truth_through_churn(fleet_and_registry, db_urls):
    fleet, server, registry, instance = fleet_and_registry
    lens_url, safe_url = db_urls
    ensure_schema(get_engine(lens_url), "lens")
    # Per workload: the samples and GPU-seconds the test expects, accumulated run by run.
    expected: dict[str, dict[str, dict]] = {c.name: {} for c in fleet}
    idle_seen = 0.0
    for step in range(3):
        if step:
            fleet.churn(steps=3)
        for cluster in fleet:
            before = {r["uid"]: r for r in table(lens_url, workload_statistic, cluster.name)}
            # Volumes without quota have no capacity: the overview says so, and stores NULL.
            failing = frozenset() if cluster.dialect.juicefs_quota else frozenset({"storage_capacity_known"})
            run_cluster(cluster.name, registry, lens_url, safe_url, instance, failing)
            want, gpus = truth(server, cluster.name), gpus_by_pod(cluster)

            # The overview row is the truth's (Prometheus figures included).
            (row,) = table(lens_url, cluster_overview_cache, cluster.name)
            # Unknown figures (no capacity) are NULL in both, never a number.
            unknown = {f for f in OVERVIEW_FIGURES if want["overview"][f] is None}
            assert {f for f in OVERVIEW_FIGURES if row[f] is None} == unknown
            assert {f: row[f] for f in OVERVIEW_FIGURES if f not in unknown} == pytest.approx(
                {f: v for f, v in want["overview"].items() if f not in unknown}, rel=1e-9
            )

            # Consumers: running top-level workloads, no row for any other.
            consumers = {r["uid"]: r for r in table(lens_url, gpu_consumers, cluster.name)}
            wanted = expected_consumers(want, gpus)
            assert consumers.keys() == wanted.keys()
            for uid, figures in wanted.items():
                assert {k: consumers[uid][k] for k in figures} == pytest.approx(figures), uid

            # Workload statistics: this run's new points all carry the workload's current
            # utilization; the running figures fold them in.
            stats = {r["uid"]: r for r in table(lens_url, workload_statistic, cluster.name)}
            for uid, held in workload_gpus(want, gpus).items():
                row = stats[uid]
                previous = before.get(uid, {"sample_count": 0})
                new_points = row["sample_count"] - previous["sample_count"]
                acc = expected[cluster.name].setdefault(
                    uid, {"n": 0, "sum": 0.0, "min": None, "max": None, "held": 0.0, "idle": 0.0}
                )
                if held:
                    assert new_points > 0, (step, uid)
                    util = sum(held) / len(held)
                    acc["n"] += new_points
                    acc["sum"] += util * new_points
                    acc["min"] = util if acc["min"] is None else min(acc["min"], util)
                    acc["max"] = util if acc["max"] is None else max(acc["max"], util)
                    acc["held"] += len(held) * new_points
                    acc["idle"] += sum(v < IDLE_BELOW for v in held) * new_points
                    assert row["instant_gpu_utilization"] == pytest.approx(util)
                else:
                    # No series names its GPUs now: unknown, never 0.
                    assert new_points == 0 and row["instant_gpu_utilization"] is None
                assert row["sample_count"] == acc["n"]
                if acc["n"]:
                    assert row["avg_gpu_utilization"] == pytest.approx(acc["sum"] / acc["n"])
                    assert row["min_gpu_utilization"] == pytest.approx(acc["min"])
                    assert row["max_gpu_utilization"] == pytest.approx(acc["max"])
                    # Percentiles come from 10-wide buckets: within a bucket of the samples.
                    for p in ("p50", "p90", "p95"):
                        assert acc["min"] - 10 <= row[f"{p}_gpu_utilization"] <= acc["max"] + 10
                else:  # never a sample: every figure unknown
                    assert all(
                        row[f"{f}_gpu_utilization"] is None
                        for f in ("avg", "min", "max", "p50", "p90", "p95")
                    )
                assert row["allocated_gpu_seconds"] == pytest.approx(acc["held"])  # step is 1 s
                assert row["idle_gpu_seconds"] == pytest.approx(acc["idle"])
                idle_seen += acc["idle"]

            # SaFE node statistic: every GPU node live, with its utilization; nodes gone, soft-deleted.
            nodes = {r["node_name"]: r for r in safe_rows(safe_url, node_statistic, cluster=cluster.name)}
            live = {n["name"]: n for n in want["nodes"] if n["gpu_count"] > 0}
            assert {k for k, r in nodes.items() if r["deleted_at"] is None} == live.keys()
            for name, n in live.items():
                # None while a node's exporter is down (NotReady): unknown, not 0.
                assert nodes[name]["gpu_utilization"] == (
                    None
                    if n["gpu_utilization"] is None
                    else Decimal(str(n["gpu_utilization"])).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
                )

    assert idle_seen > 0, "the simulator should hold some GPUs idle"


def test_every_dialect_alone_on_both_vendors_gives_the_truth(tmp_path, db_urls):
    """Each way real exporters and scrape configs differ, on an AMD and an NVIDIA cluster, in one
    batched run with nothing configured: every table equals the truth, and only the checks that
    should fail do (storage without quota), naming only the clusters concerned."""
    fleet = SimFleet.generate(clusters=2 * len(DIALECTS), nodes=3, seed=4, vendor="mixed", dialect="mixed")
    assert {(c.vendor, c.dialect.name) for c in fleet} == {
        (v, d) for v in ("amd", "nvidia") for d in DIALECTS
    }
    lens_url, safe_url = db_urls
    names = [c.name for c in fleet]
    with SimServer(fleet) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, names)
        registry = write_registry(tmp_path / "clusters.yaml", server)
        # Nothing configured: not even the vendor.
        edit_registry(registry, lambda document: [e.update(vendor="auto") for e in document["clusters"]])
        result = materialize_everything(
            registry,
            lens_url,
            safe_url,
            instance,
            tags={ASSET_PARTITION_RANGE_START_TAG: names[0], ASSET_PARTITION_RANGE_END_TAG: names[-1]},
        )
        assert result.success
        uncapped = sorted(c.name for c in fleet if not c.dialect.juicefs_quota)
        for check in result.get_asset_check_evaluations():
            failing = check.metadata["clusters_failing"].value
            expected = uncapped if check.check_name == "storage_capacity_known" else []
            assert failing == expected, (check.check_name, check.metadata)
        for cluster in fleet:
            assert_matches_truth(lens_url, server, cluster.name)
            want = truth(server, cluster.name)["overview"]
            (row,) = table(lens_url, cluster_overview_cache, cluster.name)
            assert {f for f in OVERVIEW_FIGURES if row[f] is None} == {
                f for f, v in want.items() if v is None
            }
            assert {f: row[f] for f in OVERVIEW_FIGURES if want[f] is not None} == pytest.approx(
                {f: v for f, v in want.items() if v is not None}, rel=1e-9
            ), cluster.dialect.name
            nodes = {n["name"]: n for n in table(lens_url, node, cluster.name)}
            for expected_node in truth(server, cluster.name)["nodes"]:
                assert nodes[expected_node["name"]]["driver_version"] == expected_node["driver_version"]


def test_first_overview_without_prometheus_stores_the_kubernetes_figures(tmp_path, db_urls):
    """A cluster registered without `prometheus_url` has no previous row to keep figures from:
    its first overview (selected with the Kubernetes collectors it reads; `gpu_devices` needs
    Prometheus) stores the node counts and the allocation rate, leaves every figure only Prometheus
    knows unknown (NULL, never 0), and says so in a warning check."""
    fleet = SimFleet.generate(clusters=1, nodes=4, seed=8, vendor="amd")
    (cluster,) = fleet
    lens_url, safe_url = db_urls
    with SimServer(fleet) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [cluster.name])
        registry = write_registry(tmp_path / "clusters.yaml", server)
        edit_registry(registry, lambda document: document["clusters"][0].pop("prometheus_url"))
        result = materialize_cluster(
            ["gpu_nodes", "storage_backends", "cluster_overview_cache"],
            instance=instance,
            partition_key=cluster.name,
            resources={
                "registry": ClusterRegistryResource(clusters_file=str(registry)),
                "lens_db": LensDatabase(url=lens_url),
                "safe_db": SafeDatabase(url=safe_url),
            },
        )
        assert result.success
        fresh = {
            c.check_name: c.passed
            for c in result.get_asset_check_evaluations()
            if c.check_name == "prometheus_fresh"
        }
        assert fresh == {"prometheus_fresh": False}
        (row,) = table(lens_url, cluster_overview_cache, cluster.name)
        want = truth(server, cluster.name)["overview"]
        assert row["total_nodes"] == want["total_nodes"] and row["allocation_rate"] == pytest.approx(
            want["allocation_rate"]
        )
        prometheus_only = ("utilization", *STORAGE_FIGURES, *RDMA_FIGURES)
        assert {figure: row[figure] for figure in prometheus_only} == dict.fromkeys(prometheus_only)


def test_a_prometheus_that_fails_leaves_the_stored_utilization_standing(tmp_path):
    """The statistics keep their stored figures when Prometheus does not answer, the instant
    utilization too: it is not unknown because one query timed out (no usage series vanishing, no
    null summary for a minute)."""
    fleet = SimFleet.generate(clusters=1, nodes=14, seed=33, vendor="amd")
    (cluster,) = fleet.clusters
    lens_url, safe_url = f"sqlite:///{tmp_path / 'lens.db'}", f"sqlite:///{tmp_path / 'safe.db'}"
    with SimServer(fleet) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [cluster.name])
        registry = write_registry(tmp_path / "clusters.yaml", server)
        run_cluster(cluster.name, registry, lens_url, safe_url, instance)
        before = {r["uid"]: r for r in table(lens_url, workload_statistic, cluster.name)}
        known = {uid: r["instant_gpu_utilization"] for uid, r in before.items()}
        assert any(v is not None for v in known.values())
        consumers = {r["uid"]: r["gpu_utilization"] for r in table(lens_url, gpu_consumers, cluster.name)}
        cluster.set_fault("prometheus", 503)
        # The run fails for the parts that read Prometheus alone (devices, overview); the statistics
        # are written, keeping what was stored.
        result = materialize_everything(
            registry, lens_url, safe_url, instance, partition_key=cluster.name, raise_on_error=False
        )
        assert not result.success
        after = {r["uid"]: r for r in table(lens_url, workload_statistic, cluster.name)}
        assert {uid: after[uid]["instant_gpu_utilization"] for uid in known} == known
        assert any(after[uid]["updated_at"] > before[uid]["updated_at"] for uid in known)  # written
        assert {
            r["uid"]: r["gpu_utilization"] for r in table(lens_url, gpu_consumers, cluster.name)
        } == consumers
