"""`gpu_devices`: every GPU and InfiniBand NIC from the exporters' metrics in Prometheus, one grouped
query per figure (never one per node) -> `gpu_device`, `rdma_device`, `node_device_changelog`."""

from datetime import UTC, datetime

from dagster import MaterializeResult

from lens_pipeline.collect.devices import (
    GpuSeries,
    gpu_device_rows,
    nodes_without_gpu_series,
    rdma_device_rows,
)
from lens_pipeline.collect.nodes import gpu_models_by_node, has_gpus, ready_status
from lens_pipeline.collect.problems import MalformedObject, object_name
from lens_pipeline.defs.collectors.common import ClusterTurn, CollectorRun, collector
from lens_pipeline.defs.collectors.gpu_nodes import gpu_nodes
from lens_pipeline.defs.collectors.reporting import markdown_table, sync_metadata
from lens_pipeline.defs.collectors.snapshot import ClusterSnapshot
from lens_pipeline.prom.reader import PromError, PromReader
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.devices import write_devices
from lens_pipeline.store.schema import gpu_device
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


# The per-GPU figures of `gpu_device`: NULL when the exporter has no metric for them, its series do
# not name the GPU, or its value is NaN or impossible.
GPU_FIGURES = ("utilization", "temperature", "power", "memory")


def _node_states(snapshot: ClusterSnapshot) -> tuple[set[str], set[str], set[str]]:
    """Every node's name, the nodes that are not Ready (or unreadable), and the Ready GPU nodes."""
    names, not_ready, ready_gpu_nodes = set(), set(), set()
    for node in snapshot.nodes:
        try:
            name = object_name(node)
        except MalformedObject:
            continue
        names.add(name)
        try:
            if ready_status(node) != "Ready":
                not_ready.add(name)
            elif has_gpus(node, snapshot.profiles):
                ready_gpu_nodes.add(name)
        except MalformedObject:
            not_ready.add(name)  # unreadable: keep what is stored
    return names, not_ready, ready_gpu_nodes


def _gpu_series(prom: PromReader, dialect: Dialect, snapshot: ClusterSnapshot) -> GpuSeries:
    """Every vendor's GPU series of the cluster, in one `GpuSeries`."""
    models = gpu_models_by_node(snapshot.nodes, snapshot.profiles)
    found = GpuSeries()
    for profile in dialect.profiles:
        identity = _pairs(prom.vector(profile.identity_query(), keep_nonfinite=True))
        figures = {f: _pairs(prom.vector(profile.figure_query(f))) for f in profile.device_metrics}
        duplicates = [s.labels for s in prom.vector(profile.duplicate_query())]
        one = gpu_device_rows(profile, identity, figures, models, snapshot.node_index, duplicates)
        found.rows += one.rows
        found.unmatched_nodes |= one.unmatched_nodes
        found.without_identity += one.without_identity
        found.without_index += one.without_index
        found.nonfinite += one.nonfinite
        found.out_of_range += one.out_of_range
        found.duplicated |= one.duplicated
    asked = set(device_queries(dialect))
    found.nonfinite += [f"{q}: {n}" for q, n in prom.nonfinite.items() if q in asked]
    return found


@collector(
    table=gpu_device,
    description="GPU and RDMA devices of one cluster from exporter metrics: gpu_device, rdma_device, "
    "node_device_changelog.",
    kinds=frozenset({"prometheus", "sql"}),
    deps=[gpu_nodes],
    checks={
        "devices_on_known_nodes": "Every GPU and InfiniBand series names a node of the cluster.",
        "every_gpu_node_has_devices": "Every Ready GPU node has exporter series for its GPUs, and every "
        "node with stored InfiniBand NICs has series for them (else their stored devices are kept as "
        "they were, and named here).",
        "every_gpu_identified": "Every GPU has a serial number or UUID.",
        "every_gpu_figure_known": "Every GPU has its utilization, temperature, power and memory: the "
        "exporter has their metrics and they name the GPU (else that figure is NULL).",
        "series_well_formed": "No GPU is reported twice (else its stored row is kept as it was), every "
        "series has a GPU index, no value is NaN, infinite or impossible (else that figure is NULL), "
        "and every sample is readable (a malformed one is skipped and counted).",
    },
    prometheus_queries=device_queries,
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
    names, not_ready, ready_gpu_nodes = _node_states(snapshot)
    found = _gpu_series(prom, dialect, snapshot)
    gpus = found.rows
    # A Ready GPU node that no series names: its exporter is down or its series name it otherwise;
    # its GPUs are not gone, so their stored rows stay (and the check names the node).
    silent = nodes_without_gpu_series(ready_gpu_nodes, found.nodes)
    nic_strangers: set[str] = set()
    try:
        nics, nic_strangers = rdma_device_rows(
            _pairs(prom.vector(dialect.nic.info_query())), dialect.nic, snapshot.node_index
        )
    except PromError as exc:
        turn.log.warning(f"{exc}; RDMA devices left as stored")
        nics = None
    nic_nodes = {r["node_name"] for r in nics or ()}

    skipped, skipped_examples = prom.malformed_since(run.malformed_samples_mark)

    with write_transaction(turn.lens_db.engine()) as conn:
        written = write_devices(
            conn,
            run.cluster.name,
            gpus=gpus,
            nics=nics,
            now=datetime.now(UTC),
            keep_gpus_of=not_ready | set(silent),
            keep_gpus=found.duplicated,
            keep_nics_of=not_ready | (names - nic_nodes),
        )
    nic_silent = sorted({node for node, _ in written["kept_nics"]} - not_ready)
    duplicated = [f"{node}/{gpu}" for node, gpu in sorted(found.duplicated)]
    unknown = {
        figure: [f"{r['node_name']}/{r['gpu_id']}" for r in gpus if r[figure] is None]
        for figure in GPU_FIGURES
    }
    partly_known = sorted({gpu for without in unknown.values() for gpu in without})
    exporter = turn.dialect_metadata()
    return run.finish(
        {
            "dagster/row_count": len(gpus),
            "gpus": len(gpus),
            "rdma_devices": len(nics) if nics is not None else -1,
            **sync_metadata(written["gpu_device"]),
            "changelog_rows": len(written["changes"]),
            "gpu_nodes_without_series": len(silent),
            "gpus_kept_unseen": len(written["kept_gpus"]),
            **exporter,
            "devices": markdown_table(
                gpus, ("node_name", "gpu_id", "gpu_model", "utilization", "temperature", "power", "memory")
            ),
        },
        [
            run.check(
                "devices_on_known_nodes",
                not found.unmatched_nodes and not nic_strangers,
                gpu_series_naming_no_node=len(found.unmatched_nodes),
                gpu_node_labels=sorted(found.unmatched_nodes)[:20],
                infiniband_series_naming_no_node=len(nic_strangers),
                infiniband_node_labels=sorted(nic_strangers)[:20],
                infiniband_node_label=dialect.nic.node_label,
            ),
            run.check(
                "every_gpu_node_has_devices",
                not silent and not nic_silent,
                count=len(silent),
                nodes=silent[:20],
                nodes_with_stored_nics_without_series=len(nic_silent),
                nic_nodes=nic_silent[:20],
                kept="the stored GPUs and NICs of these nodes are kept as they were, with no changelog row",
                **exporter,
            ),
            run.check(
                "every_gpu_identified",
                not found.without_identity,
                warn=True,
                count=len(found.without_identity),
                gpus=found.without_identity[:20],
            ),
            run.check(
                "every_gpu_figure_known",
                not dialect.missing and not partly_known,
                warn=True,
                missing_metrics=list(dialect.missing),
                gpus_with_unknown_figures=len(partly_known),
                **{f"gpus_without_{figure}": len(without) for figure, without in unknown.items()},
                **{f"without_{figure}": without[:20] for figure, without in unknown.items() if without},
            ),
            run.check(
                "series_well_formed",
                not (
                    found.duplicated
                    or found.nonfinite
                    or found.without_index
                    or found.out_of_range
                    or skipped
                ),
                warn=True,
                malformed_samples=skipped,
                malformed_sample_examples=skipped_examples[:20],
                duplicated_gpus=len(duplicated),
                duplicates=duplicated[:20],
                nonfinite_values=len(found.nonfinite),
                nonfinite=found.nonfinite[:20],
                out_of_range_values=len(found.out_of_range),
                out_of_range=found.out_of_range[:20],
                series_without_gpu_index=len(found.without_index),
                without_gpu_index=found.without_index[:20],
            ),
        ],
    )
