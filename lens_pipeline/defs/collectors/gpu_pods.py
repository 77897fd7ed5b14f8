"""`gpu_pods`: every pod holding GPUs of the cluster's vendor -> `gpu_pods`, `pod_resource`,
`pod_snapshot` (on change only) and `gpu_pods_event` (each condition that became True)."""

import heapq
from datetime import UTC, datetime

from dagster import MaterializeResult

from lens_pipeline.collect.nodes import gpu_models_by_node
from lens_pipeline.collect.objects import resource_version
from lens_pipeline.collect.pods import (
    GpuPod,
    condition_events,
    gpu_pod_row,
    pod_resource_row,
    pod_snapshot_row,
)
from lens_pipeline.collect.problems import MalformedObject, Problem, object_name
from lens_pipeline.defs.collectors.common import (
    ROWS_BUILT_BY,
    ClusterTurn,
    CollectorRun,
    collector,
    rows_built_by,
)
from lens_pipeline.defs.collectors.gpu_nodes import gpu_nodes
from lens_pipeline.defs.collectors.reporting import TABLE_ROWS, markdown_table, sync_metadata
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.pods import SnapshotWriter, write_pods
from lens_pipeline.store.schema import gpu_pods as gpu_pods_table
from lens_pipeline.store.schema import pod_snapshot

TABLE_COLUMNS = ("namespace", "name", "node_name", "gpu_allocated", "phase", "running", "deleted", "ip")


@collector(
    table=gpu_pods_table,
    description="GPU pods of one cluster: gpu_pods, pod_resource, pod_snapshot, gpu_pods_event.",
    deps=[gpu_nodes],
    checks={
        "every_pod_readable": "Every Pod object could be read.",
        "pods_on_known_nodes": "Every scheduled GPU pod runs on a node the cluster lists.",
    },
)
def gpu_pods(turn: ClusterTurn) -> MaterializeResult:
    run = CollectorRun(turn)
    snapshot = run.snapshot
    run.problems += snapshot.pod_problems
    models = gpu_models_by_node(snapshot.nodes, snapshot.profiles)
    stored = snapshot.stored_pods
    pods = snapshot.gpu_pods
    now = datetime.now(UTC)

    pod_rows, resource_rows, events, unreadable = [], [], [], set()
    # Pods listed at the version their stored rows were built from: only their node's GPU model,
    # which their `pod_resource` row names, can have changed.
    unchanged = {p.uid: models.get(p.node_name, "") for p in pods if p.obj is None}
    with write_transaction(turn.lens_db.engine()) as conn:
        # Snapshots are sent while the rows are built (on PostgreSQL the database stores them
        # meanwhile); the rest is written at the end.
        snapshots = SnapshotWriter(
            conn, pod_snapshot, run.cluster.name, "pod_uid", now=now, versions=stored.versions
        )
        for pod in pods:
            if pod.obj is None:
                continue
            try:
                rows = (gpu_pod_row(pod), pod_resource_row(pod, models.get(pod.node_name, "")))
                # A pod whose resourceVersion did not move is the object already stored in full, and
                # read without error then: its snapshot and condition events are not built again.
                moved = snapshots.moved(pod.uid, resource_version(pod.obj["metadata"]))
                if moved:
                    new_snapshot, new_events = pod_snapshot_row(pod), condition_events(pod)
            except MalformedObject as exc:
                run.problems.append(Problem("Pod", f"{pod.namespace}/{pod.name}", str(exc)))
                unreadable.add(pod.uid)
                continue
            pod_rows.append(rows[0])
            resource_rows.append(rows[1])
            if moved:
                snapshots.add(new_snapshot)
                events += new_events
        written = write_pods(
            conn,
            run.cluster.name,
            pods=pod_rows,
            resources=resource_rows,
            snapshots=snapshots,
            events=events,
            now=now,
            unreadable=unreadable,
            unchanged=unchanged if stored.current else None,
        )
    del events, pod_rows, resource_rows

    snapshot.drop_pod_details()
    readable = [p for p in pods if p.uid not in unreadable]
    node_names = {object_name(n) for n in snapshot.nodes}
    orphans = sorted({p.node_name for p in readable if p.node_name and p.node_name not in node_names})
    return run.finish(
        {
            "dagster/row_count": len(readable),
            "running_pods": sum(p.running for p in readable),
            "gpus_held_by_running_pods": sum(p.gpus for p in readable if p.running),
            **sync_metadata(written["gpu_pods"]),
            "pods_unchanged_since_stored": len(unchanged),
            ROWS_BUILT_BY: rows_built_by(unreadable, turn.gpu_resources),
            "pod_resource_rows_written": written["pod_resource"].written,
            "pod_snapshots_written": written["pod_snapshot"],
            "pod_events_written": written["gpu_pods_event"],
            "pods": markdown_table(
                [
                    _table_row(p)
                    for p in heapq.nsmallest(TABLE_ROWS, readable, key=lambda p: (p.namespace, p.name))
                ],
                TABLE_COLUMNS,
                total=len(readable),
            ),
        },
        [
            run.readable_check("every_pod_readable"),
            run.check("pods_on_known_nodes", not orphans, warn=True, unknown_nodes=orphans[:50]),
        ],
    )


def _table_row(pod: GpuPod) -> dict:
    return {
        "namespace": pod.namespace,
        "name": pod.name,
        "node_name": pod.node_name,
        "gpu_allocated": pod.gpus,
        "phase": pod.phase,
        "running": pod.running,
        "deleted": pod.deleting,
        "ip": pod.ip,
    }
