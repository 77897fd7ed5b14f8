"""`hourly_history`: one cluster's GPU hour, recomputed whole from Prometheus range queries over that
hour and the pods' lives in the Lens tables, into the five hourly tables (spec §1.19, §4.9).

Any closed hour within Prometheus' retention can be materialized or re-materialized (from the UI's
partition grid, a backfill, or `dagster asset materialize --partition 'cluster|hour'`), and gives
the same rows whenever it is computed: the hour's rows are replaced, those that no longer apply go.

A run covers a batch of (cluster, hour) partitions, one hour of many clusters or many hours of one
cluster (the backfill policy cuts backfills so), each in its own transaction: a partition that
fails is named, gets no materialization, and the run goes on (`defs/batches.py`); the run then
ends as failed, which shows that partition red and the others green.
"""

import traceback
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    BackfillPolicy,
    Config,
    FreshnessPolicy,
    MetadataValue,
    multi_asset,
)
from pydantic import Field, field_validator

from lens_pipeline import settings
from lens_pipeline.clusters import ClusterNotFound
from lens_pipeline.collect.history import (
    HOUR,
    SYSTEM_NAMESPACES,
    Dimensions,
    HeldPod,
    HourInputs,
    HourTables,
    PodMemory,
    WorkloadInfo,
    hour_tables,
    step_count,
)
from lens_pipeline.collect.objects import LAST_APPLIED
from lens_pipeline.defs.batches import BatchReport
from lens_pipeline.defs.collectors.common import ClusterAssetsConfig, ClusterTurn, check, table_metadata
from lens_pipeline.defs.collectors.gpu_pods import gpu_pods
from lens_pipeline.defs.collectors.gpu_workloads import gpu_workloads
from lens_pipeline.defs.derived.statistics import read_pod_series
from lens_pipeline.defs.history.automation import HOURLY
from lens_pipeline.defs.history.partitions import history_key, history_partitions, hours_by_cluster
from lens_pipeline.defs.resources import (
    ClusterRegistryResource,
    KubernetesResource,
    LensDatabase,
    PrometheusResource,
    SafeDatabase,
)
from lens_pipeline.prom.reader import PromReader
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.hourly import HOURLY_TABLES, pods_holding, replace_hour_tables, workloads_by_uid
from lens_pipeline.store.statistics import gpu_pod_names
from lens_pipeline.vendors import VendorProfile

GROUP = "history"
CLUSTER, NAMESPACE, LABEL, WORKLOAD, SNAPSHOTS = (
    "cluster_gpu_hourly_stats",
    "namespace_gpu_hourly_stats",
    "label_gpu_hourly_stats",
    "workload_gpu_hourly_stats",
    "gpu_allocation_snapshots",
)
DESCRIPTIONS = {
    CLUSTER: "Each cluster's GPU hour: capacity, allocation (mean over the hour) and allocation rate, "
    "utilization of the allocated GPUs (avg/min/max/p50/p95 over the hour's steps).",
    NAMESPACE: "Each namespace's GPU hour: GPUs allocated, their utilization, workloads holding GPUs.",
    LABEL: "Each value of the configured workload labels and annotations: GPUs allocated, their "
    "utilization, workloads holding GPUs, per hour.",
    WORKLOAD: "Each top-level workload's GPU hour: GPUs allocated, utilization (avg/min/max/p50/p90/p95), "
    "memory per GPU, replicas, GPU-seconds held and held idle.",
    SNAPSHOTS: "The cluster's allocation every few minutes of each hour, with what each namespace "
    "(and its workloads), label and annotation value held.",
}
KEYS = [AssetKey(name) for name in DESCRIPTIONS]
# The five are one multi-asset that cannot be subset: a run of any of them is a run of all five, and
# Dagster's automation asks for all five when it asks for one. So the automation condition sits on
# one only; on each of the five it cost five evaluations of the same condition, each mapping every
# waiting cluster onto all of its hours (docs/BENCHMARKS.md, eighteenth pass). Its materialization
# is reported last, so that an hour whose run stopped amid the five is still missing there.
AUTOMATED = AssetKey(CLUSTER)
REPORTED = [*(key for key in KEYS if key != AUTOMATED), AUTOMATED]
WITH_AUTOMATED = (
    f" Materialized with {CLUSTER}, in the same run: its automation condition asks for the five assets "
    "of the hourly history together."
)
CHECKS = {
    CLUSTER: {
        "gpu_series_present": "Prometheus had GPU series in the hour (else capacity and utilization are unknown)."
    },
    WORKLOAD: {
        "utilization_within_bounds": "Every utilization figure is a percentage between 0 and 100.",
        "utilization_names_known_pods": "Every pod the hour's GPU series name is a GPU pod the Lens "
        "tables know (else its GPUs are counted for nobody).",
    },
}
# The hour is read after the collectors have seen it end: their pods' lives are the hour's. (Each
# (cluster, hour) depends on the cluster's partition: Dagster infers that from the `cluster` dimension.)
UPSTREAM = [gpu_pods.key, gpu_workloads.key]


class HistoryConfig(Config):
    """Run configuration of the hourly history (`ops: {hourly_history: {config: ...}}`), as the
    original's `job.gpu_aggregation.config` (§4.9)."""

    step_seconds: int = Field(default=30, ge=1, description="resolution of the range queries (§4.9: 30 s)")
    idle_threshold_percent: float = Field(
        default=5.0, ge=0, le=100, description="a held GPU under this utilization counts as idle"
    )
    label_keys: list[str] = Field(default=["app", "team", "env"], description="workload labels to cut by")
    annotation_keys: list[str] = Field(
        default=["project", "cost-center"], description="workload annotations to cut by"
    )
    default_value: str = Field(default="unknown", description="value of a workload without the key")
    include_system_namespaces: bool = Field(
        default=False,
        description=f"count {', '.join(sorted(SYSTEM_NAMESPACES))} in the namespace and workload figures",
    )
    exclude_namespaces: list[str] = Field(default=[], description="namespaces left out of those figures")
    snapshot_minutes: int = Field(default=5, ge=1, le=60, description="an allocation snapshot every so often")

    @field_validator("step_seconds")
    @classmethod
    def _divides_an_hour(cls, value: int) -> int:
        step_count(value)
        return value

    @field_validator("annotation_keys")
    @classmethod
    def _kept_annotations(cls, value: list[str]) -> list[str]:
        if LAST_APPLIED in value:
            raise ValueError(
                f"{LAST_APPLIED} is not kept (a copy of the spec kubectl writes, docs/DIFFERENCES.md "
                "W15): every workload would count under the default value"
            )
        return value

    def dimensions(self) -> Dimensions:
        excluded = set(self.exclude_namespaces) | (
            set() if self.include_system_namespaces else SYSTEM_NAMESPACES
        )
        return Dimensions(
            label_keys=tuple(self.label_keys),
            annotation_keys=tuple(self.annotation_keys),
            default_value=self.default_value,
            excluded_namespaces=frozenset(excluded),
            snapshot_seconds=60.0 * self.snapshot_minutes,
        )


# Each closed hour is materialized a few minutes after it ends (`hourly_history_automation`): an
# hour and a quarter without one is late, two is failing (the automation stopped, or every hour's
# run fails). Judged across partitions, as Dagster does: a backfill of older hours keeps it fresh.
HOURLY_FRESHNESS = FreshnessPolicy.time_window(
    fail_window=timedelta(hours=2), warn_window=timedelta(minutes=75)
)


@multi_asset(
    name="hourly_history",
    specs=[
        AssetSpec(
            key,
            deps=UPSTREAM,
            description=DESCRIPTIONS[key.path[-1]] + ("" if key == AUTOMATED else WITH_AUTOMATED),
            group_name=GROUP,
            kinds={"prometheus", "sql"},
            partitions_def=history_partitions,
            automation_condition=HOURLY if key == AUTOMATED else None,
            metadata=table_metadata(HOURLY_TABLES[key.path[-1]][0]),
            freshness_policy=HOURLY_FRESHNESS,
            # A (cluster, hour) that failed gets no materialization; the run goes on with the others.
            skippable=True,
        )
        for key in KEYS
    ],
    check_specs=[
        AssetCheckSpec(name, asset=asset, description=description)
        for asset, checks in CHECKS.items()
        for name, description in checks.items()
    ],
    partitions_def=history_partitions,
    backfill_policy=BackfillPolicy.multi_run(max_partitions_per_run=settings.history_partitions_per_run()),
    description="One cluster's GPU hour, from Prometheus range queries and the pods' lives in the Lens tables.",
)
def hourly_history(
    context: AssetExecutionContext,
    config: HistoryConfig,
    registry: ClusterRegistryResource,
    kubernetes: KubernetesResource,
    prometheus: PrometheusResource,
    lens_db: LensDatabase,
    safe_db: SafeDatabase,
) -> Iterator[AssetMaterialization | AssetCheckResult]:
    keys = [str(k) for k in context.partition_keys]
    loaded = registry.load()
    report = BatchReport(keys, unit="(cluster, hour) partition")
    for name, hours in hours_by_cluster(keys).items():
        try:
            cluster = loaded.get(name)
        except ClusterNotFound as exc:
            for hour in hours:
                _failed(report, history_key(name, hour), str(exc))
            context.log.error(str(exc))
            continue
        turn = ClusterTurn(context, cluster, kubernetes, prometheus, lens_db, safe_db, ClusterAssetsConfig())
        try:
            for hour in hours:
                key = history_key(name, hour)
                try:
                    metadata, checks = materialize_hour(turn, hour, config)
                except Exception as exc:
                    _failed(report, key, f"{type(exc).__name__}: {exc}")
                    context.log.error(f"{key}: failed:\n{traceback.format_exc()}")
                    continue
                for asset in REPORTED:
                    yield AssetMaterialization(
                        asset_key=asset, partition=key, metadata=metadata[asset.path[-1]]
                    )
                    report.checked(key, asset.path[-1], checks.get(asset.path[-1], ()))
        finally:
            turn.release()
    yield from report.merged_checks(context.selected_asset_check_keys)
    report.raise_if_failed()


def _failed(report: BatchReport, key: str, error: str) -> None:
    for asset in KEYS:
        report.failed(key, asset.path[-1], error)


def read_capacity(
    prom: PromReader, profiles: Sequence[VendorProfile], start: datetime, end: datetime, step: float
) -> dict[float, float]:
    """GPUs the exporters report at each step (every vendor's added up), from one query per vendor."""
    capacity: dict[float, float] = {}
    for profile in profiles:
        for series in prom.matrix(profile.capacity_query(), start, end, step):
            for t, value in series.points:
                capacity[t] = capacity.get(t, 0.0) + value
    return capacity


def read_pod_memory(
    prom: PromReader, profiles: Sequence[VendorProfile], start: datetime, end: datetime, step: float
) -> dict[tuple[str, str], PodMemory]:
    """Each pod's GPUs' memory at each step: used and total MiB (NVIDIA's total is used + free +
    reserved), and how many GPUs report it; one query per figure and vendor."""
    pods: dict[tuple[str, str], PodMemory] = {}
    for profile in profiles:
        queries = profile.pod_memory_queries()
        into_of = {"vram_used": ("used",), "gpus": ("gpus",), "vram_total": ("total",)}
        if "vram_total" not in queries:  # NVIDIA: the parts of the framebuffer make the total
            into_of |= {"vram_used": ("used", "total"), "vram_free": ("total",), "vram_reserved": ("total",)}
        for figure, query in queries.items():
            for series in prom.matrix(query, start, end, step):
                memory = pods.setdefault(profile.pod_key(series.labels), PodMemory())
                for attribute in into_of.get(figure, ()):
                    into = getattr(memory, attribute)
                    for t, value in series.points:
                        into[t] = into.get(t, 0.0) + value
    return pods


def hour_inputs(turn: ClusterTurn, hour: datetime, config: HistoryConfig) -> tuple[HourInputs, set]:
    """What the hour is computed from, and the GPU pods the Lens tables know (for the check)."""
    prom = turn.prometheus_reader()
    if prom is None:
        raise RuntimeError(f"cluster {turn.cluster.name}: no prometheus_url in the registry")
    step = float(config.step_seconds)
    last = hour + timedelta(seconds=HOUR - step)
    profiles = turn.dialect().profiles
    capacity = read_capacity(prom, profiles, hour, last, step)
    utilization = read_pod_series(prom, profiles, hour, last, step, config.idle_threshold_percent)
    memory = read_pod_memory(prom, profiles, hour, last, step)
    with turn.lens_db.engine().connect() as conn:
        pods = pods_holding(conn, turn.cluster.name, hour, hour + timedelta(hours=1))
        workloads = workloads_by_uid(conn, turn.cluster.name, [p["workload"] for p in pods if p["workload"]])
        known = gpu_pod_names(conn, turn.cluster.name)
    inputs = HourInputs(
        cluster=turn.cluster.name,
        start=hour.timestamp(),
        step_seconds=step,
        capacity=capacity,
        utilization=utilization,
        memory=memory,
        pods=[
            HeldPod(
                uid=p["uid"],
                namespace=p["namespace"] or "",
                name=p["name"] or "",
                gpus=int(p["gpus"] or 0),
                bound_at=p["bound_at"].timestamp(),
                end_at=p["end_at"].timestamp() if p["end_at"] is not None else None,
                # A pod whose top-level workload's row is gone counts for no workload.
                workload=p["workload"] if p["workload"] in workloads else None,
            )
            for p in pods
        ],
        workloads={
            uid: WorkloadInfo(
                uid=uid,
                kind=w["kind"] or "",
                namespace=w["namespace"] or "",
                name=w["name"] or "",
                parent_uid=w["parent_uid"] or "",
                labels=w["labels"] or {},
                annotations=w["annotations"] or {},
            )
            for uid, w in workloads.items()
        },
    )
    return inputs, known


def materialize_hour(
    turn: ClusterTurn, hour: datetime, config: HistoryConfig
) -> tuple[dict[str, dict[str, Any]], dict[str, list[AssetCheckResult]]]:
    """Compute one (cluster, hour) and replace its rows; the metadata and check results per table."""
    # pandas is imported by the run's first hour (`hour_tables`): here, before its clock starts.
    import lens_pipeline.collect.hour_frames  # noqa: F401

    started = datetime.now(UTC)
    inputs, known = hour_inputs(turn, hour, config)
    tables = hour_tables(inputs, config.dimensions())
    written = write_hour(turn, hour, tables)
    strangers = sorted(f"{ns}/{pod}" for ns, pod in set(inputs.utilization) - known)
    figures = [
        row[f"{name}_utilization"]
        for row in (tables.cluster, *tables.namespaces, *tables.labels, *tables.workloads)
        for name in ("avg", "min", "max", "p50", "p95")
        if row.get(f"{name}_utilization") is not None
    ]
    cluster = tables.cluster
    common = {
        "cluster": turn.cluster.name,
        "hour": hour.isoformat(),
        "duration_seconds": round((datetime.now(UTC) - started).total_seconds(), 3),
    }
    metadata = {table: {**common, "dagster/row_count": rows} for table, rows in written.items()}
    metadata[CLUSTER] |= {
        "total_gpu_capacity": MetadataValue.float(_plotted(cluster["total_gpu_capacity"])),
        "allocated_gpu_count": MetadataValue.float(float(cluster["allocated_gpu_count"])),
        "allocation_rate": MetadataValue.float(_plotted(cluster["allocation_rate"])),
        "avg_utilization": MetadataValue.float(_plotted(cluster["avg_utilization"])),
        "sample_count": cluster["sample_count"],
    }
    metadata[WORKLOAD] |= {
        "idle_gpu_seconds": MetadataValue.float(sum(w["idle_gpu_seconds"] for w in tables.workloads) + 0.0),
        "allocated_gpu_seconds": MetadataValue.float(
            sum(w["allocated_gpu_seconds"] for w in tables.workloads) + 0.0
        ),
    }
    checks = {
        CLUSTER: [
            check(
                "gpu_series_present",
                cluster["total_gpu_capacity"] is not None,
                warn=True,
                hour=hour.isoformat(),
            )
        ],
        WORKLOAD: [
            check("utilization_within_bounds", all(0.0 <= f <= 100.0 for f in figures)),
            check(
                "utilization_names_known_pods",
                not strangers,
                warn=True,
                count=len(strangers),
                pods=strangers[:20],
                **turn.dialect_metadata(),
            ),
        ],
    }
    return metadata, checks


def _plotted(value: float | None) -> float:
    """A figure as the UI plots it over partitions: unknown is NaN, a gap in the plot."""
    return float("nan") if value is None else value


def write_hour(turn: ClusterTurn, hour: datetime, tables: HourTables) -> dict[str, int]:
    """The hour's rows of every table, in one transaction: a failure leaves the hour as it was."""
    with write_transaction(turn.lens_db.engine()) as conn:
        return replace_hour_tables(conn, turn.cluster.name, hour, tables, datetime.now(UTC))
