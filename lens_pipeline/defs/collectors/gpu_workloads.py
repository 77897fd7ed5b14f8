"""`gpu_workloads`: the owner chain of every GPU pod, walked to the top from one LIST per owner kind
-> `gpu_workload`, `workload_pod_reference` (each pair once), `gpu_workload_snapshot` (on change)."""

from collections import defaultdict
from datetime import UTC, datetime

from dagster import MaterializeResult

from lens_pipeline.collect.objects import KindRef, owner_ref
from lens_pipeline.collect.owners import (
    SAFE_GROUP_VERSION,
    SAFE_KIND,
    parent_uid,
    resolve_chains,
    safe_workloads_by_name,
)
from lens_pipeline.collect.problems import MalformedObject, Problem
from lens_pipeline.collect.workloads import snapshot_row, workload_row
from lens_pipeline.defs.collectors.common import ClusterTurn, CollectorRun, collector
from lens_pipeline.defs.collectors.gpu_pods import gpu_pods
from lens_pipeline.defs.collectors.reporting import markdown_table, sync_metadata
from lens_pipeline.defs.collectors.snapshot import ClusterSnapshot
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.pods import SnapshotWriter
from lens_pipeline.store.schema import gpu_workload_snapshot
from lens_pipeline.store.workloads import stored_workloads, write_workloads

TABLE_COLUMNS = ("kind", "namespace", "name", "status", "gpu_request", "parent_uid")
SAFE_KIND_REF = KindRef(SAFE_GROUP_VERSION, SAFE_KIND)


def list_owner_kinds(
    snapshot: ClusterSnapshot, start: set[KindRef]
) -> tuple[dict[str, dict], set[KindRef], set[KindRef]]:
    """Every object of every kind reachable upwards from `start`: one LIST per kind, found by discovery.

    Returns (objects by uid, kinds listed, kinds the cluster does not serve)."""
    objects: dict[str, dict] = {}
    listed: set[KindRef] = set()
    unserved: set[KindRef] = set()
    pending = set(start)
    while pending:
        kind = pending.pop()
        if kind in listed or kind in unserved:
            continue
        found = snapshot.objects(kind)
        if found is None:
            unserved.add(kind)
            continue
        listed.add(kind)
        for obj in found:
            objects[obj["metadata"]["uid"]] = obj
            try:
                ref = owner_ref(obj["metadata"])
            except MalformedObject:
                continue  # reported when a chain walks through it
            if ref is not None:
                pending.add(ref.kind_ref)
    return objects, listed, unserved


@collector(
    description="Workloads above GPU pods (Deployments, Jobs, PyTorchJobs, SaFE Workloads...): gpu_workload, "
    "workload_pod_reference, gpu_workload_snapshot.",
    deps=[gpu_pods],
    checks={"owner_chains_resolved": "Every GPU pod's owner chain could be followed to its top."},
)
def gpu_workloads(turn: ClusterTurn) -> MaterializeResult:
    run = CollectorRun(turn)
    pods = run.snapshot.gpu_pods
    engine = turn.lens_db.engine()
    with engine.connect() as conn:
        stored = stored_workloads(conn, run.cluster.name)

    # Kinds to list: what GPU pods point at, what stored unfinished workloads are, and SaFE Workloads.
    start = {SAFE_KIND_REF}
    start |= {KindRef(s["group_version"], s["kind"]) for s in stored.values() if s["status"] != "Deleted"}
    for pod in pods:
        try:
            ref = owner_ref(pod.metadata)
        except MalformedObject as exc:
            run.problems.append(Problem("Pod", pod.metadata["name"], str(exc)))
            continue
        if ref is not None:
            start.add(ref.kind_ref)
    objects, listed, unserved = list_owner_kinds(run.snapshot, start)
    run.problems += run.snapshot.owner_problems
    chains = resolve_chains(((p.uid, p.metadata) for p in pods), objects, listed)
    run.problems += chains.problems

    below: dict[str, list] = defaultdict(list)
    references = set()
    for pod in pods:
        for uid in chains.ancestors.get(pod.uid, []):
            below[uid].append(pod)
            references.add((uid, pod.uid))
    # Stored workloads whose object still exists but has no GPU pod below it any more: Done, not Deleted.
    still_there = [
        u for u, s in stored.items() if u not in below and s["status"] != "Deleted" and u in objects
    ]
    safe_by_name = safe_workloads_by_name(objects)
    rows, unreadable = [], []
    now = datetime.now(UTC)
    with write_transaction(engine) as conn:
        # Snapshots are sent while the rows are built (on PostgreSQL the database stores them
        # meanwhile); the rest is written at the end.
        snapshots = SnapshotWriter(conn, gpu_workload_snapshot, run.cluster.name, "uid", now=now)
        for uid in [*below, *still_there]:
            obj = objects[uid]
            try:
                row = workload_row(obj, parent_uid(obj["metadata"], safe_by_name), below.get(uid, []))
                workload_snapshot = snapshot_row(obj)
            except MalformedObject as exc:
                name = str(obj["metadata"].get("name"))[:253]
                run.problems.append(Problem(str(obj.get("kind"))[:64], name, str(exc)))
                unreadable.append(uid)
                continue
            rows.append(row)  # both or neither: an unreadable workload keeps its stored row whole
            snapshots.add(workload_snapshot)
        written = write_workloads(
            conn,
            run.cluster.name,
            workloads=rows,
            references=references,
            snapshots=snapshots,
            stored=stored,
            now=now,
            unreadable=unreadable,
        )
    by_status: dict[str, int] = defaultdict(int)
    for row in rows:
        by_status[row["status"]] += 1
    top_level = sorted((r for r in rows if not r["parent_uid"]), key=lambda r: (r["namespace"], r["name"]))
    return run.finish(
        {
            "dagster/row_count": len(rows),
            "top_level_workloads": len(top_level),
            **{f"workloads_{status.lower()}": n for status, n in sorted(by_status.items())},
            "owner_kinds_listed": sorted(f"{k.kind}.{k.group_version}" for k in listed),
            "owner_kinds_not_served": sorted(f"{k.kind}.{k.group_version}" for k in unserved),
            **sync_metadata(written["gpu_workload"]),
            "pod_references_added": written["workload_pod_reference"],
            "workload_snapshots_written": written["gpu_workload_snapshot"],
            "top_level": markdown_table(top_level, TABLE_COLUMNS),
        },
        [run.readable_check("owner_chains_resolved")],
    )
