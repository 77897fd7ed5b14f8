"""`container_events`: the ingest sidecar's event log -> `node_container`, `node_container_devices`,
`node_container_event`, one cluster per partition.

Each chunk of the log is read, applied and written in one transaction together with the cluster's
watermark (`container_event_progress`), so a failed run leaves tables and watermark as they were
and a replayed run adds nothing. Then the log's processed segments older than the retention are
dropped (with their replay keys).
"""

from datetime import UTC, datetime, timedelta

import orjson
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    Config,
    MaterializeResult,
    MetadataValue,
    asset,
)
from google.protobuf.message import DecodeError

from lens_pipeline.collect.containers import ContainerEventRecord, apply_events
from lens_pipeline.collect.problems import Problem
from lens_pipeline.defs.collectors.common import COLLECTOR_RETRY, FRESHNESS, MAX_LOGGED_PROBLEMS
from lens_pipeline.defs.collectors.reporting import markdown_table, problems_metadata
from lens_pipeline.defs.partitions import cluster_partitions
from lens_pipeline.defs.resources import LensDatabase
from lens_pipeline.protowire import WireError
from lens_pipeline.store.containers import container_column_widths, stored_containers, write_container_rows
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.event_log import (
    dead_letter_row,
    last_id,
    processed_up_to,
    prune,
    quarantine,
    read_events,
    set_processed_up_to,
)

WIDTHS = container_column_widths()
# Events per transaction: on SQLite the ingest sidecar waits for the write lock meanwhile.
CHUNK_EVENTS = 2000
# A run stops after this many and the sensor's next run continues: runs stay short.
MAX_EVENTS_PER_RUN = 200_000


class ContainerEventsConfig(Config):
    # Processed log segments older than this are dropped; a replay of their events is logged again.
    log_retention_days: float = 7.0


@asset(
    description=(
        "Container lifecycle events and GPU/InfiniBand device assignments from node agents, through "
        "the `lens ingest` event log: `node_container`, `node_container_devices`, `node_container_event`."
    ),
    partitions_def=cluster_partitions,
    group_name="collectors",
    kinds={"grpc", "sql"},
    retry_policy=COLLECTOR_RETRY,
    freshness_policy=FRESHNESS,
    check_specs=[
        AssetCheckSpec(
            "every_event_readable",
            asset="container_events",
            description="Every logged event's devices could be read.",
        ),
        AssetCheckSpec(
            "no_event_quarantined",
            asset="container_events",
            description="No event had to be set aside (undecodable, or values no table can hold); "
            "those are kept whole in `container_event_dead_letter` and processing moved past them.",
        ),
    ],
)
def container_events(
    context: AssetExecutionContext, config: ContainerEventsConfig, lens_db: LensDatabase
) -> MaterializeResult:
    cluster = context.partition_key
    engine = lens_db.engine()
    started = datetime.now(UTC)
    problems: list[Problem] = []
    quarantined: list[str] = []
    totals = {"events": 0, "containers": 0, "devices": 0, "events_written": 0}
    first_watermark = watermark = horizon = None
    sample: dict[str, dict] = {}
    oldest_received = None
    while True:
        with write_transaction(engine) as conn:
            watermark = processed_up_to(conn, cluster, lock=True)
            if first_watermark is None:
                first_watermark = watermark
            horizon = last_id(conn, cluster)
            if horizon <= watermark:
                break
            chunk = read_events(conn, cluster, watermark, horizon, CHUNK_EVENTS)
            upto = chunk.up_to_id
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
            if records and oldest_received is None:
                oldest_received = records[0].received_at
            rows = apply_events(
                records, stored_containers(conn, cluster, {r.container_id for r in records}), WIDTHS
            )
            problems.extend(rows.problems)
            unusable += [(record.ref, reason) for record, reason in rows.unusable]
            # Kept whole with why, in this transaction: the watermark moves past them.
            quarantine(conn, "processing", [(dead_letter_row(cluster, e), why) for e, why in unusable])
            quarantined += [
                f"log segment {e.id} event {e.index} ({e.container_id[:64]}): {why}" for e, why in unusable
            ]
            written = write_container_rows(conn, cluster, rows)
            set_processed_up_to(conn, cluster, upto, datetime.now(UTC))
        watermark = upto
        totals["events"] += len(chunk.events)
        totals["containers"] += written["containers"]
        totals["devices"] += written["devices"]
        totals["events_written"] += written["events"]
        for row in list(rows.containers.values())[:50]:
            sample.setdefault(row["container_id"], row)
        if upto >= horizon or totals["events"] >= MAX_EVENTS_PER_RUN:
            break
    with write_transaction(engine) as conn:
        pruned = prune(
            conn, cluster, watermark or 0, datetime.now(UTC) - timedelta(days=config.log_retention_days)
        )
    for problem in problems[:MAX_LOGGED_PROBLEMS]:
        context.log.warning(f"cluster {cluster}: skipped {problem}")
    for what in quarantined[:MAX_LOGGED_PROBLEMS]:
        context.log.error(f"cluster {cluster}: quarantined {what}")
    backlog = max(0, (horizon or 0) - (watermark or 0))
    return MaterializeResult(
        metadata={
            "cluster": cluster,
            "events_processed": totals["events"],
            "dagster/row_count": totals["containers"],
            "containers_written": totals["containers"],
            "devices_written": totals["devices"],
            "lifecycle_events_written": totals["events_written"],
            "log_watermark_before": first_watermark or 0,
            "log_watermark": watermark or 0,
            "log_ids_left": backlog,
            "log_events_pruned": pruned,
            "oldest_event_age_seconds": round((started - oldest_received).total_seconds(), 3)
            if oldest_received
            else 0.0,
            "duration_seconds": round((datetime.now(UTC) - started).total_seconds(), 3),
            "containers": markdown_table(
                list(sample.values())[:50],
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
