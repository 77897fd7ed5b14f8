"""The code location loads whole: a broken import or definition fails here, not in production."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from dagster import AssetKey

from lens_pipeline.definitions import defs

ROOT = Path(__file__).resolve().parents[1]


def test_every_definition_resolves():
    repository = defs.get_repository_def()
    repository.load_all_definitions()
    assert {"collect_cluster"} <= {job.name for job in repository.get_all_jobs()}
    assert repository.has_schedule_def("collect_every_minute")
    assert repository.has_sensor_def("cluster_registry_sensor")
    assert repository.has_sensor_def("container_events_sensor")
    asset_keys = {key.to_user_string() for key in repository.asset_graph.get_all_asset_keys()}
    assert {"gpu_nodes", "container_events"} <= asset_keys


def test_every_asset_names_its_table_and_columns_for_the_catalog():
    """The catalog's Columns tab and table lineage: each asset names the table it writes, with the
    columns, types and nullability the schema (and so the migrations) give it."""
    from lens_pipeline.store.schema import lens_metadata, safe_metadata

    graph = defs.get_repository_def().asset_graph
    tables = {f"lens.{t}": table for t, table in lens_metadata.tables.items()}
    tables |= {f"safe.{t}": table for t, table in safe_metadata.tables.items()}
    named = set()
    for key in graph.get_all_asset_keys():
        metadata = graph.get(key).metadata
        table = tables[metadata["dagster/table_name"]]
        named.add(table.name)
        columns = metadata["dagster/column_schema"].columns
        assert [(c.name, c.constraints.nullable) for c in columns] == [
            (c.name, c.nullable) for c in table.columns
        ], key
        assert all(c.type for c in columns)
    assert {"node", "gpu_pods", "workload_statistic", "node_statistic", "node_container"} <= named
    # container_events materializes only when agents send events: no freshness policy to fail.
    assert graph.get(AssetKey("container_events")).freshness_policy is None
    assert graph.get(AssetKey("gpu_nodes")).freshness_policy is not None
    # The hourly history: late when the automation stops.
    for table in ("cluster_gpu_hourly_stats", "workload_gpu_hourly_stats", "gpu_allocation_snapshots"):
        assert graph.get(AssetKey(table)).freshness_policy is not None, table


def test_every_job_runs_its_steps_in_the_run_process():
    """The implicit asset job too (automation, backfills, the UI's materializations): no second
    process that loads the code location again for each step."""
    jobs = defs.get_repository_def().get_all_jobs()
    assert {job.name: job.executor_def.name for job in jobs} == {job.name: "in_process" for job in jobs}


def test_dg_check_defs_passes():
    dg = Path(sys.executable).with_name("dg")
    command = [str(dg) if dg.exists() else shutil.which("dg") or "dg", "check", "defs"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "All definitions loaded successfully" in result.stdout + result.stderr


def test_no_deprecated_dagster_names_in_the_package():
    deprecated = ("AutoMaterializePolicy", "SourceAsset", "compute_kind", "FreshnessPolicy(maximum_lag")
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "lens_pipeline").rglob("*.py")
        for name in deprecated
        if name in path.read_text()
    ]
    assert offenders == []


def test_loading_the_code_location_leaves_the_kubernetes_client_and_pandas_unimported():
    """Every run is a new process that loads the code location: the client's model classes and
    numpy with pandas (a second of CPU on a slow machine) are imported by the runs that use them
    (a collection's first request, an hour of history), not by every container-events run."""
    probe = (
        "import sys, lens_pipeline.definitions as d\n"
        "d.defs.get_repository_def().load_all_definitions()\n"
        "print(sorted(m for m in ('kubernetes', 'pandas', 'numpy') if m in sys.modules))\n"
        "from lens_pipeline.collect.quantity import whole_units\n"
        "assert whole_units('127500m', 'cpu') == 127\n"
        "print('kubernetes' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["[]", "True"], result.stdout
