"""The partition sensor and the per-minute schedule, evaluated against a real ephemeral instance."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import yaml
from dagster import (
    AssetMaterialization,
    DagsterRun,
    DagsterRunStatus,
    SensorResult,
    SkipReason,
    build_schedule_context,
    build_sensor_context,
    instance_for_test,
)
from dagster._core.remote_origin import (  # noqa: TID251 (no public way to make a run QUEUED: it must carry its origin)
    InProcessCodeLocationOrigin,
    LoadableTargetOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)

from lens_pipeline.defs.collectors.schedules import collect_every_minute, collection_requests
from lens_pipeline.defs.fleet.sensors import cluster_registry_sensor
from lens_pipeline.defs.partitions import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    BATCH_TAG,
    CLUSTER_PARTITIONS_NAME,
    CLUSTER_TAG,
)
from lens_pipeline.defs.resources import ClusterRegistryResource


def _write_registry(tmp_path, names):
    kubeconfig = tmp_path / "kc.yaml"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    path = tmp_path / "clusters.yaml"
    path.write_text(yaml.safe_dump({"clusters": [{"name": n, "kubeconfig": "kc.yaml"} for n in names]}))
    return path


def _tick(instance, registry_path):
    context = build_sensor_context(
        instance=instance, resources={"registry": ClusterRegistryResource(clusters_file=str(registry_path))}
    )
    result = cluster_registry_sensor(context)
    if isinstance(result, SensorResult):
        for request in result.dynamic_partitions_requests or []:
            if type(request).__name__ == "AddDynamicPartitionsRequest":
                instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
            else:
                for key in request.partition_keys:
                    instance.delete_dynamic_partition(request.partitions_def_name, key)
    return result


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        yield instance


def _partitions(instance):
    return sorted(instance.get_dynamic_partitions(CLUSTER_PARTITIONS_NAME))


def test_a_cluster_disabled_in_the_registry_loses_its_partition_and_gets_it_back(instance, tmp_path):
    path = _write_registry(tmp_path, ["east", "west"])
    _tick(instance, path)
    assert _partitions(instance) == ["east", "west"]
    document = yaml.safe_load(path.read_text())
    document["clusters"][1] = {"name": "west", "enabled": False}
    path.write_text(yaml.safe_dump(document))
    _tick(instance, path)
    assert _partitions(instance) == ["east"]
    document["clusters"][1] = {"name": "west", "kubeconfig": "kc.yaml"}
    path.write_text(yaml.safe_dump(document))
    result = _tick(instance, path)
    assert _partitions(instance) == ["east", "west"]
    assert isinstance(result, SensorResult) and result.run_requests  # its first collection again


def test_sensor_adds_new_clusters_with_a_first_run_and_removes_gone_ones(instance, tmp_path):
    path = _write_registry(tmp_path, ["east", "west"])
    result = _tick(instance, path)
    assert isinstance(result, SensorResult)
    assert _partitions(instance) == ["east", "west"]
    # The new clusters' first collection, without waiting for the schedule: one batch run.
    (first,) = result.run_requests
    assert (first.tags[ASSET_PARTITION_RANGE_START_TAG], first.tags[ASSET_PARTITION_RANGE_END_TAG]) == (
        "east",
        "west",
    )
    assert result.cursor == "1"
    assert isinstance(_tick(instance, path), SkipReason)  # nothing changed

    _write_registry(tmp_path, ["west", "north"])
    result = _tick(instance, path)
    assert _partitions(instance) == ["north", "west"]
    assert [r.partition_key for r in result.run_requests] == ["north"]


def test_a_cluster_with_a_run_in_flight_is_removed_only_after_it_ends(instance, tmp_path):
    path = _write_registry(tmp_path, ["east", "west"])
    _tick(instance, path)
    run = DagsterRun(
        job_name="collect_cluster",
        run_id="r-east-1",
        status=DagsterRunStatus.STARTED,
        tags={"dagster/partition": "east", CLUSTER_TAG: "east"},
    )
    instance.add_run(run)
    _write_registry(tmp_path, ["west"])
    _tick(instance, path)
    assert _partitions(instance) == ["east", "west"]

    instance.report_run_failed(run)
    _tick(instance, path)
    assert _partitions(instance) == ["west"]


def test_an_unreadable_registry_removes_nothing(instance, tmp_path):
    path = _write_registry(tmp_path, ["east"])
    _tick(instance, path)
    path.write_text("{{ not yaml")
    _tick(instance, path)
    path.unlink()
    _tick(instance, path)
    assert _partitions(instance) == ["east"]


def test_a_broken_entry_keeps_its_partition(instance, tmp_path):
    path = _write_registry(tmp_path, ["east", "west"])
    _tick(instance, path)
    document = yaml.safe_load(path.read_text())
    document["clusters"][0]["kubeconfig"] = "missing.yaml"
    path.write_text(yaml.safe_dump(document))
    _tick(instance, path)
    assert _partitions(instance) == ["east", "west"]


def test_schedule_requests_batches_of_clusters_in_partition_order(instance, monkeypatch):
    monkeypatch.setenv("LENS_CLUSTERS_PER_RUN", "2")
    instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, ["b", "a", "c"])
    tick = datetime(2026, 11, 22, 10, 5, tzinfo=UTC)
    requests = collect_every_minute(build_schedule_context(instance=instance, scheduled_execution_time=tick))
    spans = [
        (
            r.partition_key,
            r.tags.get(ASSET_PARTITION_RANGE_START_TAG),
            r.tags.get(ASSET_PARTITION_RANGE_END_TAG),
        )
        for r in requests
    ]
    assert spans == [(None, "b", "a"), ("c", None, None)]
    assert requests[0].tags[BATCH_TAG] == "b..a" and requests[1].tags[CLUSTER_TAG] == "c"
    assert len({r.run_key for r in requests}) == 2 and all(tick.isoformat() in r.run_key for r in requests)


def _code_location_job(job_name: str) -> RemoteJobOrigin:
    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="lens_pipeline.definitions"))
    return RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job_name)


@pytest.mark.parametrize(
    "status",
    [
        DagsterRunStatus.NOT_STARTED,
        DagsterRunStatus.QUEUED,
        DagsterRunStatus.STARTING,
        DagsterRunStatus.STARTED,
    ],
)
def test_schedule_leaves_out_clusters_a_run_holds(instance, status):
    """From its request to its end: a run waiting in the run queue (behind a backfill filling the
    code location's limit) will collect its clusters too, so another request would only pile up."""
    instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, ["a", "b", "c", "d"])
    for name in ("a", "b", "c", "d"):
        instance.report_runless_asset_event(AssetMaterialization("gpu_nodes", partition=name))
    instance.add_run(
        DagsterRun(
            job_name="collect_cluster",
            run_id="r-bc",
            status=status,
            tags={ASSET_PARTITION_RANGE_START_TAG: "b", ASSET_PARTITION_RANGE_END_TAG: "c"},
            # Dagster keeps a queued run's origin, for the run queue to launch it from.
            remote_job_origin=_code_location_job("collect_cluster"),
        )
    )
    tick = datetime(2026, 11, 22, 10, 6, tzinfo=UTC)
    requests = collect_every_minute(build_schedule_context(instance=instance, scheduled_execution_time=tick))
    assert [r.partition_key for r in requests] == ["a", "d"]
    # Once it has ended, its clusters are asked for again.
    instance.delete_run("r-bc")
    instance.add_run(
        DagsterRun(
            job_name="collect_cluster",
            run_id="r-bc-done",
            status=DagsterRunStatus.SUCCESS,
            tags={ASSET_PARTITION_RANGE_START_TAG: "b", ASSET_PARTITION_RANGE_END_TAG: "c"},
        )
    )
    order = ["a", "b", "c", "d"]
    covered = []
    for r in collect_every_minute(
        build_schedule_context(instance=instance, scheduled_execution_time=tick + timedelta(minutes=1))
    ):
        start, end = r.tags.get(ASSET_PARTITION_RANGE_START_TAG), r.tags.get(ASSET_PARTITION_RANGE_END_TAG)
        covered += [r.partition_key] if r.partition_key else order[order.index(start) : order.index(end) + 1]
    assert sorted(covered) == order


def test_requests_split_batches_around_busy_and_lone_clusters():
    names = [f"c{i}" for i in range(7)]
    requests = collection_requests(names, busy={"c2"}, alone={"c4"}, batch_size=2, tick="t")
    spans = [
        r.partition_key
        or f"{r.tags[ASSET_PARTITION_RANGE_START_TAG]}..{r.tags[ASSET_PARTITION_RANGE_END_TAG]}"
        for r in requests
    ]
    assert spans == ["c0..c1", "c3", "c4", "c5..c6"]


def test_schedule_skips_without_clusters(instance):
    result = collect_every_minute(build_schedule_context(instance=instance))
    assert isinstance(result, SkipReason)
