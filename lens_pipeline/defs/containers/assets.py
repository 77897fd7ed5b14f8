"""`container_events`: the ingest sidecar's event log -> `node_container`, `node_container_devices`,
`node_container_event`, partitioned by cluster; a run applies one cluster's events or a batch's.

Each chunk of a cluster's log is read, applied and written in one transaction together with the
cluster's watermark (`container_event_progress`), so a failed run leaves tables and watermark as
they were and a replayed run adds nothing. Then the log's processed segments older than the
retention are dropped (with their replay keys).
"""

import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import orjson
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    BackfillPolicy,
    Config,
    DagsterLogManager,
    MaterializeResult,
    MetadataValue,
    multi_asset,
)
from google.protobuf.message import DecodeError
from sqlalchemy import Connection, Engine

from lens_pipeline.collect.containers import ContainerEventRecord, apply_events
from lens_pipeline.collect.problems import Problem
from lens_pipeline.defs.batches import BatchReport, record_materialized_now
from lens_pipeline.defs.collectors.common import COLLECTOR_RETRY, MAX_LOGGED_PROBLEMS, table_metadata
from lens_pipeline.defs.collectors.reporting import markdown_table, problems_metadata
from lens_pipeline.defs.partitions import WORKING, cluster_partitions, clusters_in_runs
from lens_pipeline.defs.resources import LensDatabase
from lens_pipeline.protowire import WireError
from lens_pipeline.store.containers import container_column_widths, stored_containers, write_container_rows
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.event_log import (
    LogChunk,
    dead_letter_row,
    last_id,
    processed_up_to,
    prune,
    quarantine,
    read_events,
    set_processed_up_to,
)
from lens_pipeline.store.schema import node_container

WIDTHS = container_column_widths()
# Events per transaction: on SQLite the ingest sidecar waits for the write lock meanwhile.
CHUNK_EVENTS = 2000
# A cluster's turn stops after this many and the sensor's next run continues: runs stay short.
MAX_EVENTS_PER_RUN = 200_000
# Clusters a run (of the sensor or of a backfill) covers at most: a cluster with nothing new costs
# two queries, so one run keeps up with a large fleet and pays the process start once.
EVENT_CLUSTERS_PER_RUN = 100


class ContainerEventsConfig(Config):
    # Processed log segments older than this are dropped; a replay of their events is logged again.
    log_retention_days: float = 7.0


CONTAINER_EVENTS = AssetKey("container_events")
JOB_NAME = "process_container_events"


@multi_asset(
    name="container_events",
    specs=[
        AssetSpec(
            CONTAINER_EVENTS,
            description=(
                "Container lifecycle events and GPU/InfiniBand device assignments from node agents, "
                "through the `lens ingest` event log: `node_container`, `node_container_devices`, "
                "`node_container_event`."
            ),
            partitions_def=cluster_partitions,
            group_name="collectors",
            kinds={"grpc", "sql"},
            # No freshness policy: it materializes only when node agents sent events, and a quiet
            # cluster sends none for hours. The events that wait are what can be late:
            # `lens_container_events_lag_seconds` and the LensIngestLagging alert.
            metadata=table_metadata(node_container),
            # A cluster of the batch with nothing new, or whose events failed, gets no materialization.
            skippable=True,
        )
    ],
    check_specs=[
        AssetCheckSpec(
            "every_event_readable",
            asset=CONTAINER_EVENTS,
            description="Every logged event's devices could be read.",
        ),
        AssetCheckSpec(
            "no_event_quarantined",
            asset=CONTAINER_EVENTS,
            description="No event had to be set aside (undecodable, or values no table can hold); "
            "those are kept whole in `container_event_dead_letter` and processing moved past them.",
        ),
    ],
    partitions_def=cluster_partitions,
    retry_policy=COLLECTOR_RETRY,
    backfill_policy=BackfillPolicy.multi_run(max_partitions_per_run=EVENT_CLUSTERS_PER_RUN),
)
def container_events(
    context: AssetExecutionContext, config: ContainerEventsConfig, lens_db: LensDatabase
) -> Iterator[AssetMaterialization | AssetCheckResult]:
    """The new events of one cluster or of a batch of clusters, each cluster in its own
    transactions: one that fails is named and the others are applied (`defs/batches.py`)."""
    names = list(context.partition_keys)
    # A cluster another events run is applying is left to it (its watermark row is locked anyway).
    held = clusters_in_runs(
        context.instance, statuses=WORKING, job_names={JOB_NAME}, before_run_id=context.run.run_id
    )
    engine = lens_db.engine()
    report = BatchReport(names)
    untouched: list[str] = []
    for cluster in names:
        if cluster in held:
            context.log.warning(f"cluster {cluster}: another run is applying its events; left to it")
            continue
        try:
            applied = apply_cluster_events(engine, cluster, config, context.log)
        except Exception as exc:
            report.failed(cluster, CONTAINER_EVENTS.path[-1], f"{type(exc).__name__}: {exc}")
            context.log.error(f"cluster {cluster}: container_events failed:\n{traceback.format_exc()}")
            continue
        if applied is None and len(names) > 1:
            untouched.append(cluster)  # nothing new: no materialization that says nothing
            continue
        result = applied or nothing_new(cluster)
        yield AssetMaterialization(asset_key=CONTAINER_EVENTS, partition=cluster, metadata=result.metadata)
        report.checked(cluster, CONTAINER_EVENTS.path[-1], result.check_results or ())
        record_materialized_now(lens_db, cluster, [CONTAINER_EVENTS.path[-1]], context.log)
    yield from report.merged_checks(context.selected_asset_check_keys)
    if report.failures:
        # A failed run marks the partitions it planned and did not materialize as failed: the
        # clusters that simply had nothing new are up to date, and say so.
        for cluster in untouched:
            yield AssetMaterialization(
                asset_key=CONTAINER_EVENTS, partition=cluster, metadata=nothing_new(cluster).metadata
            )
    report.raise_if_failed()


def nothing_new(cluster: str) -> MaterializeResult:
    return MaterializeResult(metadata={"cluster": cluster, "events_processed": 0})


def apply_cluster_events(
    engine: Engine, cluster: str, config: ContainerEventsConfig, log: DagsterLogManager
) -> MaterializeResult | None:
    """Apply the cluster's events past its watermark, a chunk per transaction (with the watermark,
    so a failure leaves both as they were); None when there was nothing past it."""
    started = datetime.now(UTC)
    progress = Progress()
    while True:
        with write_transaction(engine) as conn:
            watermark = processed_up_to(conn, cluster, lock=True)
            progress.start(watermark)
            horizon = last_id(conn, cluster)
            if horizon <= watermark:
                break
            _apply_chunk(
                conn, cluster, read_events(conn, cluster, watermark, horizon, CHUNK_EVENTS), progress
            )
        if progress.watermark >= horizon or progress.events >= MAX_EVENTS_PER_RUN:
            break
    if progress.events == 0:
        return None
    with write_transaction(engine) as conn:
        pruned = prune(
            conn, cluster, progress.watermark, datetime.now(UTC) - timedelta(days=config.log_retention_days)
        )
    for problem in progress.problems[:MAX_LOGGED_PROBLEMS]:
        log.warning(f"cluster {cluster}: skipped {problem}")
    for what in progress.quarantined[:MAX_LOGGED_PROBLEMS]:
        log.error(f"cluster {cluster}: quarantined {what}")
    return _result(cluster, progress, horizon, pruned, started)


@dataclass
class Progress:
    """What a cluster's chunks applied so far."""

    first_watermark: int | None = None
    watermark: int = 0
    events: int = 0
    containers: int = 0
    devices: int = 0
    events_written: int = 0
    oldest_received: datetime | None = None
    problems: list[Problem] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    sample: dict[str, dict] = field(default_factory=dict)

    def start(self, watermark: int) -> None:
        if self.first_watermark is None:
            self.first_watermark = watermark
        self.watermark = watermark


def _apply_chunk(conn: Connection, cluster: str, chunk: LogChunk, progress: Progress) -> None:
    records, unusable = [], []
    for logged in chunk.events:
        try:
            data = logged.data()
        except (DecodeError, WireError, orjson.JSONDecodeError, UnicodeDecodeError) as exc:
            unusable.append((logged, f"undecodable data: {exc}"))
            continue
        records.append(
            ContainerEventRecord(
                logged.id,
                logged.source,
                logged.event_type,
                logged.container_id,
                logged.node_name,
                data,
                logged.received_at,
                ref=logged,
            )
        )
    if records and progress.oldest_received is None:
        progress.oldest_received = records[0].received_at
    rows = apply_events(records, stored_containers(conn, cluster, {r.container_id for r in records}), WIDTHS)
    progress.problems.extend(rows.problems)
    unusable += [(record.ref, reason) for record, reason in rows.unusable]
    # Kept whole with why, in this transaction: the watermark moves past them.
    quarantine(conn, "processing", [(dead_letter_row(cluster, e), why) for e, why in unusable])
    progress.quarantined += [
        f"log segment {e.id} event {e.index} ({e.container_id[:64]}): {why}" for e, why in unusable
    ]
    written = write_container_rows(conn, cluster, rows)
    set_processed_up_to(conn, cluster, chunk.up_to_id, datetime.now(UTC))
    progress.watermark = chunk.up_to_id
    progress.events += len(chunk.events)
    progress.containers += written["containers"]
    progress.devices += written["devices"]
    progress.events_written += written["events"]
    for row in list(rows.containers.values())[:50]:
        progress.sample.setdefault(row["container_id"], row)


def _result(
    cluster: str, progress: Progress, horizon: int, pruned: int, started: datetime
) -> MaterializeResult:
    oldest = progress.oldest_received
    problems, quarantined = progress.problems, progress.quarantined
    return MaterializeResult(
        metadata={
            "cluster": cluster,
            "events_processed": progress.events,
            # This run's: not `dagster/row_count`, which is what the partition holds in all.
            "containers_written": progress.containers,
            "devices_written": progress.devices,
            "lifecycle_events_written": progress.events_written,
            "log_watermark_before": progress.first_watermark or 0,
            "log_watermark": progress.watermark,
            "log_ids_left": max(0, horizon - progress.watermark),
            "log_events_pruned": pruned,
            "oldest_event_age_seconds": round((started - oldest).total_seconds(), 3) if oldest else 0.0,
            "duration_seconds": round((datetime.now(UTC) - started).total_seconds(), 3),
            "containers": markdown_table(
                list(progress.sample.values())[:50],
                ("container_id", "container_name", "pod_name", "status", "node_name"),
            ),
            "events_quarantined": len(quarantined),
            **problems_metadata(problems),
        },
        check_results=[
            AssetCheckResult(
                check_name="every_event_readable",
                passed=not problems,
                severity=AssetCheckSeverity.WARN,
                metadata={"unreadable_events": len(problems)},
            ),
            AssetCheckResult(
                check_name="no_event_quarantined",
                passed=not quarantined,
                severity=AssetCheckSeverity.WARN,
                metadata={
                    "quarantined": len(quarantined),
                    "events": MetadataValue.json(quarantined[:20]),
                    "where": "table container_event_dead_letter",
                },
            ),
        ],
    )
