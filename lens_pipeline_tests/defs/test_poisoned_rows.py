"""A poisoned stored row (written by hand, by an older version, or through SQLite's loose typing)
never fails a cluster's view: each view skips the rows it cannot read, counts and names them in a
failing `stored_rows_readable` check, and computes everything else, on every dialect."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from dagster import instance_for_test
from sqlalchemy import select, update

from lens_pipeline.collect.overview import overview_node, readable_nodes
from lens_pipeline.collect.problems import MalformedObject
from lens_pipeline.collect.statistics import Window, accumulate
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.store.db import get_engine, write_transaction
from lens_pipeline.store.schema import (
    cluster_overview_cache,
    gpu_consumers,
    gpu_pods,
    gpu_workload,
    node,
    node_statistic,
    safe_workload_statistic,
    workload_gpu_hourly_stats,
    workload_pod_reference,
    workload_statistic,
)
from lens_pipeline.store.upsert import bulk_upsert
from lens_pipeline_tests.defs.test_collectors_against_truth import table
from lens_pipeline_tests.defs.test_derived_against_truth import materialize_everything, safe_rows

VIEWS = (
    "cluster_overview_cache",
    "workload_gpu_statistics",
    "gpu_consumers",
    "safe_node_statistic",
    "safe_workload_statistic",
)


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ({"name": "n", "taints": ["x"]}, "taints"),
        ({"name": "n", "taints": {"taints": "x"}}, "taints.taints"),
        ({"name": "n", "gpu_count": -5}, "gpu_count"),
        ({"name": "n", "gpu_count": "8"}, "gpu_count"),  # SQLite keeps text in an INTEGER column
        ({"name": "n", "gpu_count": True}, "gpu_count"),
        ({"name": "n", "gpu_allocation": 2**40}, "gpu_allocation"),
        ({"name": "n", "gpu_utilization": float("nan")}, "gpu_utilization"),
        ({"name": "n", "gpu_utilization": "busy"}, "gpu_utilization"),
        ({"name": 5}, "name"),
    ],
)
def test_a_node_row_the_overview_cannot_read_names_its_column(row, column):
    with pytest.raises(MalformedObject, match=column):
        overview_node(row)
    good = {"name": "ok", "gpu_count": 8, "gpu_allocation": 4, "status": "Ready", "taints": None}
    nodes, problems = readable_nodes([good, row])
    assert [n["name"] for n in nodes] == ["ok"] and len(problems) == 1 and column in problems[0].message


@pytest.mark.parametrize(
    ("stored", "column"),
    [
        ({"histogram": {"buckets": [1] * 10}}, "histogram"),
        ({"histogram": [1]}, "histogram"),
        ({"histogram": {"buckets": [{"lower": 0, "upper": 10, "count": -1}] * 10}}, "count"),
        ({"sample_count": -3}, "sample_count"),
        ({"sample_count": 3, "min_gpu_utilization": None, "max_gpu_utilization": 5.0}, "min_gpu_utilization"),
        ({"total_sum": float("inf")}, "total_sum"),
        ({"allocated_gpu_seconds": "lots"}, "allocated_gpu_seconds"),
        ({"idle_gpu_seconds": -1.0}, "idle_gpu_seconds"),
    ],
)
def test_a_statistic_row_that_cannot_be_added_to_names_its_column(stored, column):
    with pytest.raises(MalformedObject, match=column):
        accumulate(stored, Window([], 30))


@pytest.fixture
def served(tmp_path):
    # 14 nodes: running top-level workloads, consumers and a running SaFE Workload.
    fleet = SimFleet.generate(clusters=1, nodes=14, seed=33, vendor="amd")
    with SimServer(fleet) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [c.name for c in fleet])
        yield fleet.clusters[0], write_registry(tmp_path / "clusters.yaml", server), instance


def _poison(url, table_, where, **values):
    with get_engine(url).begin() as conn:
        assert conn.execute(update(table_).where(*where).values(**values)).rowcount >= 1


def _closed_hour(url, cluster_name, workload):
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    row = {
        "cluster_name": cluster_name,
        "workload_uid": workload["uid"],
        "namespace": workload["namespace"],
        "workload_name": workload["name"],
        "workload_type": workload["kind"],
        "stat_hour": hour,
        "avg_utilization": 50.0,
        "max_utilization": 60.0,
        "sample_count": 10,
        "total_sum": 500.0,
        "workload_status": "Running",
        "labels": {},
        "annotations": {},
        "created_at": hour,
        "updated_at": hour,
    }
    with write_transaction(get_engine(url)) as conn:
        bulk_upsert(conn, workload_gpu_hourly_stats, [row])


def _checks(result):
    return {(e.asset_key.to_user_string(), e.check_name): e for e in result.get_asset_check_evaluations()}


def test_poisoned_rows_are_skipped_counted_and_named_by_every_view(served, db_urls):
    cluster, registry, instance = served
    lens_url, safe_url = db_urls
    name = cluster.name
    assert materialize_everything(registry, lens_url, safe_url, instance, partition_key=name).success

    nodes = sorted(r["name"] for r in table(lens_url, node, name))
    workloads = {r["uid"]: r for r in table(lens_url, gpu_workload, name)}
    consumers = {r["uid"]: r for r in table(lens_url, gpu_consumers, name)}
    (safe_uid,) = [u for u, w in workloads.items() if w["kind"] == "Workload" and w["status"] == "Running"]
    statistic_uid = next(
        u for u in workloads if u not in consumers and u != safe_uid and workloads[u]["status"] == "Running"
    )
    consumer_uid = sorted(consumers)[0]
    # The hourly history writes the SaFE Workload's hours (test_hourly_history): one closed hour here.
    _closed_hour(lens_url, name, workloads[safe_uid])
    assert materialize_everything(
        registry, lens_url, safe_url, instance, ["safe_workload_statistic"], partition_key=name
    ).success
    with get_engine(lens_url).connect() as conn:
        pod_uid = conn.scalar(
            select(workload_pod_reference.c.pod_uid).where(
                workload_pod_reference.c.cluster_name == name,
                workload_pod_reference.c.workload_uid == consumer_uid,
            )
        )
    c = lambda t: t.c.cluster_name == name  # noqa: E731
    _poison(lens_url, node, [c(node), node.c.name == nodes[0]], taints=["not", "a", "mapping"])
    _poison(lens_url, node, [c(node), node.c.name == nodes[1]], gpu_count=-5)
    _poison(lens_url, node, [c(node), node.c.name == nodes[2]], gpu_utilization=500.0)  # no SaFE percentage
    _poison(
        lens_url,
        workload_statistic,
        [c(workload_statistic), workload_statistic.c.uid == statistic_uid],
        histogram={"buckets": [1] * 10},
    )
    _poison(lens_url, gpu_pods, [c(gpu_pods), gpu_pods.c.uid == pod_uid], gpu_allocated=-3)
    _poison(
        lens_url,
        workload_gpu_hourly_stats,
        [c(workload_gpu_hourly_stats), workload_gpu_hourly_stats.c.workload_uid == safe_uid],
        total_sum=-1.0,
    )
    kept_consumer = consumers[consumer_uid]

    result = materialize_everything(registry, lens_url, safe_url, instance, list(VIEWS), partition_key=name)
    assert result.success
    checks = _checks(result)
    named = {view: checks[(view, "stored_rows_readable")] for view in VIEWS}
    assert not [v for v, check in named.items() if check.passed]

    def rows(view):
        return " ".join(named[view].metadata["rows"].value)

    assert named["cluster_overview_cache"].metadata["malformed_rows"].value == 2
    assert nodes[0] in rows("cluster_overview_cache") and "taints" in rows("cluster_overview_cache")
    assert nodes[1] in rows("cluster_overview_cache") and "gpu_count" in rows("cluster_overview_cache")
    assert statistic_uid in rows("workload_gpu_statistics") and "histogram" in rows("workload_gpu_statistics")
    assert consumer_uid in rows("gpu_consumers") and "gpu_allocated" in rows("gpu_consumers")
    assert nodes[2] in rows("safe_node_statistic")
    assert safe_uid in rows("safe_workload_statistic") and "total_sum" in rows("safe_workload_statistic")

    # Everything else is computed: the overview over the readable nodes, every other statistic and
    # consumer; the skipped consumer keeps its row; the node without a percentage has NULL in SaFE.
    (overview,) = table(lens_url, cluster_overview_cache, name)
    assert overview["total_nodes"] == len(nodes) - 2
    assert checks[("cluster_overview_cache", "totals_match_node_table")].passed
    stats = {r["uid"]: r for r in table(lens_url, workload_statistic, name)}
    assert stats[statistic_uid]["histogram"] == {"buckets": [1] * 10}  # left as it was
    after = {r["uid"]: r for r in table(lens_url, gpu_consumers, name)}
    assert after.keys() == consumers.keys()
    assert {k: after[consumer_uid][k] for k in ("gpu_allocated", "active_pods")} == {
        k: kept_consumer[k] for k in ("gpu_allocated", "active_pods")
    }
    safe_nodes = {r["node_name"]: r for r in safe_rows(safe_url, node_statistic, cluster=name)}
    assert safe_nodes[nodes[2]]["gpu_utilization"] is None and safe_nodes[nodes[2]]["deleted_at"] is None
    assert all(safe_nodes[n]["gpu_utilization"] is not None for n in nodes[3:] if n in safe_nodes)
    assert safe_rows(safe_url, safe_workload_statistic, workload_uid=safe_uid)  # its earlier row stays
