"""`storage_backends`: JuiceFS (and future) StorageClasses and their Secrets -> `storage`."""

from datetime import UTC, datetime

from dagster import MaterializeResult

from lens_pipeline.collect.problems import MalformedObject, Problem, object_name
from lens_pipeline.collect.storage import driver_for, secret_ref, storage_row
from lens_pipeline.defs.collectors.common import ClusterTurn, CollectorRun, collector
from lens_pipeline.defs.collectors.reporting import markdown_table, sync_metadata
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.schema import storage
from lens_pipeline.store.storage import write_storage


@collector(
    table=storage,
    description="Storage backends of one cluster (JuiceFS first): the `storage` table.",
    checks={"every_backend_readable": "Every storage class a driver knows could be read with its Secret."},
)
def storage_backends(turn: ClusterTurn) -> MaterializeResult:
    run = CollectorRun(turn)
    reader = run.snapshot.reader
    rows = []
    for storage_class in reader.list("/apis/storage.k8s.io/v1/storageclasses", lambda o: o):
        if not isinstance(storage_class, dict) or driver_for(storage_class) is None:
            continue
        try:
            ref = secret_ref(storage_class)
            # One GET per backend's Secret: listing every Secret of the cluster would read them all.
            secret = reader.get(f"/api/v1/namespaces/{ref[0]}/secrets/{ref[1]}") if ref else None
            rows.append(storage_row(storage_class, secret))
        except MalformedObject as exc:
            run.problems.append(Problem("StorageClass", object_name(storage_class), str(exc)))
    rows = sorted({(r["kind"], r["name"]): r for r in rows}.values(), key=lambda r: (r["kind"], r["name"]))
    with write_transaction(turn.lens_db.engine()) as conn:
        result = write_storage(
            conn, run.cluster.name, rows, now=datetime.now(UTC), keep_all=bool(run.problems)
        )
    return run.finish(
        {
            "dagster/row_count": len(rows),
            **sync_metadata(result),
            "backends": markdown_table(rows, ("kind", "name", "status")),
        },
        [run.readable_check("every_backend_readable")],
    )
