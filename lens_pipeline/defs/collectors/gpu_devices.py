"""`gpu_devices`: every GPU and InfiniBand NIC from the exporters' metrics in Prometheus, one grouped
query per figure (never one per node) -> `gpu_device`, `rdma_device`, `node_device_changelog`."""

from datetime import UTC, datetime

from dagster import MaterializeResult

from lens_pipeline.collect.devices import gpu_device_rows, rdma_device_rows
from lens_pipeline.collect.nodes import gpu_models_by_node, ready_status
from lens_pipeline.collect.problems import MalformedObject, object_name
from lens_pipeline.defs.collectors.common import ClusterStep, CollectorRun, collector
from lens_pipeline.defs.collectors.gpu_nodes import gpu_nodes
from lens_pipeline.defs.collectors.reporting import markdown_table, sync_metadata
from lens_pipeline.prom.reader import PromError
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.devices import write_devices
from lens_pipeline.vendors import INFINIBAND, VendorProfile, profiles_for


def _pairs(samples):
    return [(s.labels, s.value) for s in samples]


def device_queries(profiles: tuple[VendorProfile, ...]) -> list[str]:
    """Every query of a run, in the order asked: per vendor the identities then each figure, then NICs."""
    queries = [q for p in profiles for q in (p.identity_query(), *map(p.figure_query, p.device_metrics))]
    return [*queries, INFINIBAND.info_query()]


@collector(
    description="GPU and RDMA devices of one cluster from exporter metrics: gpu_device, rdma_device, "
    "node_device_changelog.",
    kinds=frozenset({"prometheus", "sql"}),
    deps=[gpu_nodes],
    checks={"devices_on_known_nodes": "Every device belongs to a node of the cluster."},
    prometheus_queries=lambda step: device_queries(profiles_for(step.cluster.vendor)),
)
def gpu_devices(step: ClusterStep) -> MaterializeResult:
    run = CollectorRun(step)
    prom = step.prometheus_reader()
    if prom is None:
        raise RuntimeError(
            f"cluster {run.cluster.name!r}: no prometheus_url in the registry; devices come from metrics"
        )
    snapshot = run.snapshot
    models = gpu_models_by_node(snapshot.nodes, snapshot.profiles)
    not_ready, known_nodes = set(), set()
    for node in snapshot.nodes:
        name = object_name(node)
        known_nodes.add(name)
        try:
            if ready_status(node) != "Ready":
                not_ready.add(name)
        except MalformedObject:
            not_ready.add(name)  # unreadable: keep what is stored

    gpus = []
    for profile in snapshot.profiles:
        identity = _pairs(prom.vector(profile.identity_query()))
        figures = {f: _pairs(prom.vector(profile.figure_query(f))) for f in profile.device_metrics}
        gpus += gpu_device_rows(profile, identity, figures, models)
    try:
        nics = rdma_device_rows(_pairs(prom.vector(INFINIBAND.info_query())), INFINIBAND)
    except PromError as exc:
        step.log.warning(f"{exc}; RDMA devices left as stored")
        nics = None

    with write_transaction(step.lens_db.engine()) as conn:
        written = write_devices(
            conn, run.cluster.name, gpus=gpus, nics=nics, now=datetime.now(UTC), keep_nodes=not_ready
        )
    strangers = sorted({r["node_name"] for r in [*gpus, *(nics or [])]} - known_nodes)
    return run.finish(
        {
            "dagster/row_count": len(gpus),
            "gpus": len(gpus),
            "rdma_devices": len(nics) if nics is not None else -1,
            **sync_metadata(written["gpu_device"]),
            "changelog_rows": len(written["changes"]),
            "devices": markdown_table(
                gpus, ("node_name", "gpu_id", "gpu_model", "utilization", "temperature", "power", "memory")
            ),
        },
        [run.check("devices_on_known_nodes", not strangers, unknown_nodes=strangers[:50])],
    )
