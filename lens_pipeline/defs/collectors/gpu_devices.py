"""`gpu_devices`: every GPU and InfiniBand NIC from the exporters' metrics in Prometheus, one grouped
query per figure (never one per node) -> `gpu_device`, `rdma_device`, `node_device_changelog`."""

from datetime import UTC, datetime

from dagster import MaterializeResult

from lens_pipeline.collect.devices import gpu_device_rows, nodes_without_gpu_series, rdma_device_rows
from lens_pipeline.collect.nodes import gpu_models_by_node, has_gpus, ready_status
from lens_pipeline.collect.problems import MalformedObject, object_name
from lens_pipeline.defs.collectors.common import ClusterTurn, CollectorRun, collector
from lens_pipeline.defs.collectors.gpu_nodes import gpu_nodes
from lens_pipeline.defs.collectors.reporting import markdown_table, sync_metadata
from lens_pipeline.prom.reader import PromError
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.devices import write_devices
from lens_pipeline.vendors import Dialect


def _pairs(samples):
    return [(s.labels, s.value) for s in samples]


def device_queries(dialect: Dialect) -> list[str]:
    """Every query of a run, in the order asked: per vendor the identities, the duplicates and each
    figure, then the NICs."""
    queries = [
        q
        for p in dialect.profiles
        for q in (p.identity_query(), p.duplicate_query(), *map(p.figure_query, p.device_metrics))
    ]
    return [*queries, dialect.nic.info_query()]


@collector(
    description="GPU and RDMA devices of one cluster from exporter metrics: gpu_device, rdma_device, "
    "node_device_changelog.",
    kinds=frozenset({"prometheus", "sql"}),
    deps=[gpu_nodes],
    checks={
        "devices_on_known_nodes": "Every GPU and InfiniBand series names a node of the cluster.",
        "every_gpu_node_has_devices": "Every Ready GPU node has exporter series for its GPUs.",
        "every_gpu_identified": "Every GPU has a serial number or UUID.",
        "series_well_formed": "No GPU is reported twice, every series has a GPU index, no value is "
        "NaN or infinite, and every sample is readable (a malformed one is skipped and counted).",
    },
    prometheus_queries=lambda turn: device_queries(turn.dialect()),
)
def gpu_devices(turn: ClusterTurn) -> MaterializeResult:
    run = CollectorRun(turn)
    prom = turn.prometheus_reader()
    if prom is None:
        raise RuntimeError(
            f"cluster {run.cluster.name!r}: no prometheus_url in the registry; devices come from metrics"
        )
    snapshot = run.snapshot
    dialect = turn.dialect()
    models = gpu_models_by_node(snapshot.nodes, snapshot.profiles)
    not_ready, ready_gpu_nodes = set(), set()
    for node in snapshot.nodes:
        name = object_name(node)
        try:
            if ready_status(node) != "Ready":
                not_ready.add(name)
            elif has_gpus(node, snapshot.profiles):
                ready_gpu_nodes.add(name)
        except MalformedObject:
            not_ready.add(name)  # unreadable: keep what is stored

    gpus, unmatched, without_identity, without_index, nonfinite, duplicates = [], set(), [], [], [], []
    for profile in dialect.profiles:
        identity = _pairs(prom.vector(profile.identity_query(), keep_nonfinite=True))
        figures = {f: _pairs(prom.vector(profile.figure_query(f))) for f in profile.device_metrics}
        found = gpu_device_rows(profile, identity, figures, models, snapshot.node_index)
        gpus += found.rows
        unmatched |= found.unmatched_nodes
        without_identity += found.without_identity
        without_index += found.without_index
        nonfinite += found.nonfinite
        duplicates += [
            f"{s.labels.get(profile.node_label, '?')}/{s.labels.get(profile.gpu_index_label, '?')}"
            for s in prom.vector(profile.duplicate_query())
        ]
    asked = set(device_queries(dialect))
    nonfinite += [f"{q}: {n}" for q, n in prom.nonfinite.items() if q in asked]
    nic_strangers: set[str] = set()
    try:
        nics, nic_strangers = rdma_device_rows(
            _pairs(prom.vector(dialect.nic.info_query())), dialect.nic, snapshot.node_index
        )
    except PromError as exc:
        turn.log.warning(f"{exc}; RDMA devices left as stored")
        nics = None

    skipped, skipped_examples = prom.malformed_since(run.malformed_samples_mark)

    with write_transaction(turn.lens_db.engine()) as conn:
        written = write_devices(
            conn, run.cluster.name, gpus=gpus, nics=nics, now=datetime.now(UTC), keep_nodes=not_ready
        )
    silent = nodes_without_gpu_series(ready_gpu_nodes, gpus)
    exporter = turn.dialect_metadata()
    return run.finish(
        {
            "dagster/row_count": len(gpus),
            "gpus": len(gpus),
            "rdma_devices": len(nics) if nics is not None else -1,
            **sync_metadata(written["gpu_device"]),
            "changelog_rows": len(written["changes"]),
            "gpu_nodes_without_series": len(silent),
            **exporter,
            "devices": markdown_table(
                gpus, ("node_name", "gpu_id", "gpu_model", "utilization", "temperature", "power", "memory")
            ),
        },
        [
            run.check(
                "devices_on_known_nodes",
                not unmatched and not nic_strangers,
                gpu_series_naming_no_node=len(unmatched),
                gpu_node_labels=sorted(unmatched)[:20],
                infiniband_series_naming_no_node=len(nic_strangers),
                infiniband_node_labels=sorted(nic_strangers)[:20],
                infiniband_node_label=dialect.nic.node_label,
            ),
            run.check(
                "every_gpu_node_has_devices",
                not silent,
                count=len(silent),
                nodes=silent[:20],
                **exporter,
            ),
            run.check(
                "every_gpu_identified",
                not without_identity,
                warn=True,
                count=len(without_identity),
                gpus=without_identity[:20],
            ),
            run.check(
                "series_well_formed",
                not duplicates and not nonfinite and not without_index and not skipped,
                warn=True,
                malformed_samples=skipped,
                malformed_sample_examples=skipped_examples[:20],
                duplicated_gpus=len(duplicates),
                duplicates=duplicates[:20],
                nonfinite_values=len(nonfinite),
                nonfinite=nonfinite[:20],
                series_without_gpu_index=len(without_index),
                without_gpu_index=without_index[:20],
            ),
        ],
    )
