"""`gpu_workloads`: the owner chain of every GPU pod, walked to the top from one LIST per owner kind
-> `gpu_workload`, `workload_pod_reference` (each pair once), `gpu_workload_snapshot` (on change)."""

from collections import defaultdict
from collections.abc import Mapping
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
from lens_pipeline.collect.pods import resource_version
from lens_pipeline.collect.problems import MalformedObject, Problem
from lens_pipeline.collect.workloads import snapshot_row, workload_namespace, workload_row, workload_status
from lens_pipeline.defs.collectors.common import (
    ROWS_BUILT_BY,
    ClusterTurn,
    CollectorRun,
    collector,
    rows_built_by,
)
from lens_pipeline.defs.collectors.gpu_pods import gpu_pods
from lens_pipeline.defs.collectors.reporting import markdown_table, sync_metadata
from lens_pipeline.defs.collectors.snapshot import ClusterSnapshot
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.pods import SnapshotWriter
from lens_pipeline.store.schema import gpu_workload, gpu_workload_snapshot
from lens_pipeline.store.workloads import (
    current_workloads,
    stored_workloads,
    workload_versions,
    write_workloads,
)

TABLE_COLUMNS = ("kind", "namespace", "name", "status", "gpu_request", "parent_uid")
SAFE_KIND_REF = KindRef(SAFE_GROUP_VERSION, SAFE_KIND)


def list_owner_kinds(
    snapshot: ClusterSnapshot, start: set[KindRef], known: Mapping[str, str] | None = None
) -> tuple[dict[str, dict], set[KindRef], set[KindRef]]:
    """Every object of every kind reachable upwards from `start`: one LIST per kind, found by discovery.
    `known`: the objects whose stored rows were built from the version listed (`ClusterSnapshot.objects`).

    Returns (objects by uid, kinds listed, kinds the cluster does not serve)."""
    objects: dict[str, dict] = {}
    listed: set[KindRef] = set()
    unserved: set[KindRef] = set()
    pending = set(start)
    while pending:
        kind = pending.pop()
        if kind in listed or kind in unserved:
            continue
        found = snapshot.objects(kind, known)
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
    table=gpu_workload,
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
        versions = workload_versions(conn, run.cluster.name)
    known = current_workloads(stored, versions) if turn.rows_built_by_this_code(gpu_workloads.key) else {}

    # Kinds to list: what GPU pods point at, what stored unfinished workloads are, and SaFE Workloads.
    start = {SAFE_KIND_REF}
    start |= {KindRef(s["group_version"], s["kind"]) for s in stored.values() if s["status"] != "Deleted"}
    # A pod whose ownerReferences are unreadable has no owner here; `resolve_chains` reports it, once.
    start |= {pod.owner.kind_ref for pod in pods if pod.owner is not None}
    objects, listed, unserved = list_owner_kinds(run.snapshot, start, known)
    run.problems += run.snapshot.owner_problems
    unchanged_objects = run.snapshot.unchanged_owners
    chains = resolve_chains(pods, objects, listed)
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
    rows, unreadable, unchanged, top_level = [], [], {}, []
    now = datetime.now(UTC)
    with write_transaction(engine) as conn:
        # Snapshots are sent while the rows are built (on PostgreSQL the database stores them
        # meanwhile); the rest is written at the end.
        snapshots = SnapshotWriter(
            conn, gpu_workload_snapshot, run.cluster.name, "uid", now=now, versions=versions
        )
        for uid in [*below, *still_there]:
            obj = objects[uid]
            try:
                parent = parent_uid(obj["metadata"], safe_by_name)
                if uid in unchanged_objects:
                    # Its object is the one its row was built from: only what the row takes from
                    # elsewhere (pods below, the parent) is compared.
                    status, gpu_request = workload_status(obj, below.get(uid, []))
                    unchanged[uid] = (parent, gpu_request, status)
                    if not parent:
                        top_level.append(_table_row(obj, status, gpu_request))
                    continue
                row = workload_row(obj, parent, below.get(uid, []))
                moved = snapshots.moved(uid, resource_version(obj["metadata"]))
                workload_snapshot = snapshot_row(obj) if moved else None
            except MalformedObject as exc:
                name = str(obj["metadata"].get("name"))[:253]
                run.problems.append(Problem(str(obj.get("kind"))[:64], name, str(exc)))
                unreadable.append(uid)
                continue
            rows.append(row)  # both or neither: an unreadable workload keeps its stored row whole
            if workload_snapshot is not None:
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
            unchanged=unchanged if known else None,
        )
    by_status: dict[str, int] = defaultdict(int)
    for row in rows:
        by_status[row["status"]] += 1
    for values in unchanged.values():
        by_status[values[2]] += 1
    # The top-level workloads rebuilt, and those unchanged since stored (their table rows made above).
    top_level = sorted(
        [*top_level, *(r for r in rows if not r["parent_uid"])], key=lambda r: (r["namespace"], r["name"])
    )
    return run.finish(
        {
            "dagster/row_count": len(rows) + len(unchanged),
            "top_level_workloads": len(top_level),
            **{f"workloads_{status.lower()}": n for status, n in sorted(by_status.items())},
            "owner_kinds_listed": sorted(f"{k.kind}.{k.group_version}" for k in listed),
            "owner_kinds_not_served": sorted(f"{k.kind}.{k.group_version}" for k in unserved),
            **sync_metadata(written["gpu_workload"]),
            "workloads_unchanged_since_stored": len(unchanged),
            "pod_references_added": written["workload_pod_reference"],
            "workload_snapshots_written": written["gpu_workload_snapshot"],
            ROWS_BUILT_BY: rows_built_by(unreadable, turn.gpu_resources),
            "top_level": markdown_table(top_level, TABLE_COLUMNS),
        },
        [run.readable_check("owner_chains_resolved")],
    )


def _table_row(obj: dict, status: str, gpu_request: int) -> dict:
    """A workload of the `top_level` table whose row was not rebuilt."""
    return {
        "kind": obj.get("kind"),
        "namespace": workload_namespace(obj) or "",
        "name": obj["metadata"].get("name") or "",  # sorted with the others: never None
        "status": status,
        "gpu_request": gpu_request,
        "parent_uid": "",
    }
