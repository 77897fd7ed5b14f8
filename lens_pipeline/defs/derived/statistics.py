"""`workload_gpu_statistics`: each running workload's GPU utilization over time (Lens
`workload_statistic`, spec §1.17, §4.8), with the GPU-seconds it held and held idle; then
`gpu_consumers` (spec §4.2), one row per running top-level workload, what the consumer metrics are
served from. (Per hour: the hourly history, `lens_pipeline.defs.history`.)

Utilization comes from the exporters' per-GPU series, which name the pod holding each GPU: three
range queries grouped by pod over the window since the last run (sum, count, count under the idle
threshold) and two instant ones, whatever the number of workloads. Pods roll up to every workload
above them through `workload_pod_reference`: the pods that held GPUs in the window, so that a run
catching up after an outage counts the pods that have ended since.
"""

import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from dagster import MaterializeResult, MetadataValue

from lens_pipeline import settings
from lens_pipeline.collect.problems import MalformedObject, Problem
from lens_pipeline.collect.statistics import (
    PodKey,
    PodSeries,
    Span,
    Window,
    accumulate,
    consumer_row,
    instant_utilization,
    statistic_row,
    utc_time,
    window_bounds,
    workload_window,
)
from lens_pipeline.collect.stored import stored_count, stored_figure
from lens_pipeline.defs.collectors.common import ClusterTurn, check, prometheus_check
from lens_pipeline.defs.collectors.gpu_pods import gpu_pods
from lens_pipeline.defs.collectors.gpu_workloads import gpu_workloads
from lens_pipeline.defs.collectors.reporting import markdown_table, sync_metadata
from lens_pipeline.defs.derived.common import ROWS_READABLE, cluster_view, rows_readable_check
from lens_pipeline.prom.reader import PromError, PromReader
from lens_pipeline.store.db import write_transaction
from lens_pipeline.store.hourly import pods_of_workloads_between
from lens_pipeline.store.schema import gpu_consumers as gpu_consumers_table
from lens_pipeline.store.schema import workload_statistic as workload_statistic_table
from lens_pipeline.store.statistics import (
    ACTIVE,
    active_workloads,
    claim_statistics_window,
    ended_workload_status,
    gpu_pod_names,
    running_pods_by_workload,
    statistics_cursor,
    stored_statistics,
    write_consumers,
    write_statistics,
)
from lens_pipeline.vendors import VendorProfile


def read_pod_series(
    prom: PromReader,
    profiles: Sequence[VendorProfile],
    start: datetime,
    end: datetime,
    resolution: float,
    idle_below: float,
) -> dict[PodKey, PodSeries]:
    """Every pod's GPUs over the window, from three range queries per vendor."""
    pods: dict[PodKey, PodSeries] = {}
    for profile in profiles:
        for query, attribute in zip(
            profile.pod_utilization_queries(idle_below), ("sums", "counts", "idle"), strict=True
        ):
            for series in prom.matrix(query, start, end, resolution):
                into = getattr(pods.setdefault(profile.pod_key(series.labels), PodSeries()), attribute)
                for t, value in series.points:
                    into[t] = into.get(t, 0.0) + value
    return pods


def read_pod_now(prom: PromReader, profiles: Sequence[VendorProfile]) -> dict[PodKey, tuple[float, float]]:
    """Every pod's (utilization sum, GPU count) now."""
    now: dict[PodKey, list[float]] = {}
    for profile in profiles:
        sum_query, count_query, _ = profile.pod_utilization_queries(0)
        for index, query in enumerate((sum_query, count_query)):
            for sample in prom.vector(query):
                now.setdefault(profile.pod_key(sample.labels), [0.0, 0.0])[index] += sample.value
    return {key: (s, c) for key, (s, c) in now.items()}


def _pod_keys(pods: Sequence[dict[str, Any]]) -> list[PodKey]:
    return [(p["namespace"], p["name"]) for p in pods]


@cluster_view(
    description="GPU utilization of every running workload (Lens `workload_statistic`): "
    "avg/p50/p90/p95/min/max/instant, GPU-seconds held and held idle.",
    table=workload_statistic_table,
    deps=[gpu_pods, gpu_workloads],
    kinds=frozenset({"prometheus", "sql"}),
    checks={
        **ROWS_READABLE,
        "utilization_within_bounds": "Every figure is a percentage between 0 and 100.",
        "idle_within_allocated": "No workload has more idle GPU-seconds than GPU-seconds held.",
        "prometheus_fresh": "Prometheus answered this run, every sample readable (a malformed one is "
        "skipped and counted).",
        "utilization_names_known_pods": "Every pod the GPU utilization series name is a GPU pod of the "
        "cluster (else its GPUs are attributed to nobody).",
    },
)
def workload_gpu_statistics(turn: ClusterTurn) -> MaterializeResult:
    started = now = datetime.now(UTC)
    cluster = turn.cluster
    engine = turn.lens_db.engine()
    config = turn.config.statistics
    resolution = float(config.step_seconds)
    with engine.connect() as conn:
        workloads = active_workloads(conn, cluster.name)
        known_pods = gpu_pod_names(conn, cluster.name)
        stored = stored_statistics(conn, cluster.name)
        cursor = statistics_cursor(conn, cluster.name)
    first, last = window_bounds(
        cursor.timestamp() if cursor else None,
        now.timestamp(),
        config.first_window_seconds,
        config.max_window_seconds,
        resolution,
        oldest=(now - timedelta(days=settings.history_days())).timestamp(),
    )
    with engine.connect() as conn:
        pods_of = pods_of_workloads_between(conn, cluster.name, utc_time(first), utc_time(last + resolution))
    prom = turn.prometheus_reader()
    mark = turn.malformed_samples_mark()
    asked_before = prom.queries if prom is not None else 0  # the turn's reader: count this part's
    prom_error = "no prometheus_url in the registry" if prom is None else None
    series: dict[PodKey, PodSeries] = {}
    current: dict[PodKey, tuple[float, float]] = {}
    if prom is not None:
        profiles = turn.dialect().profiles
        try:
            if last >= first:
                series = read_pod_series(
                    prom, profiles, utc_time(first), utc_time(last), resolution, config.idle_threshold_percent
                )
            current = read_pod_now(prom, profiles)
        except PromError as exc:
            turn.log.warning(f"{exc}; statistics keep their stored figures this run")
            prom_error = str(exc)
    queried = prom_error is None and last >= first

    windows: dict[str, Window] = {}
    for workload in workloads:
        pods = _pod_keys(pods_of.get(workload["uid"], []))
        series_of = (series[p] for p in pods if p in series)
        windows[workload["uid"]] = (
            workload_window(series_of, resolution) if queried else Window([], resolution)
        )
    # Rows of workloads that ended since: their final status, no more points.
    active = {w["uid"] for w in workloads}
    ended = [uid for uid, row in stored.items() if uid not in active and row["workload_status"] in ACTIVE]
    with engine.connect() as conn:
        finals = ended_workload_status(conn, cluster.name, ended)

    rows: list[dict[str, Any]] = []
    malformed: list[Problem] = []
    span = Span(first, last, queried, now)
    for workload in workloads:
        uid = workload["uid"]
        try:
            if prom_error is None:
                instant = instant_utilization(
                    current[p] for p in _pod_keys(pods_of.get(uid, [])) if p in current
                )
            else:  # Prometheus did not answer: what is stored stands, it is not unknown now
                instant = stored_figure(stored[uid], "instant_gpu_utilization") if uid in stored else None
            row = statistic_row(cluster.name, workload, stored.get(uid), windows[uid], instant, span)
        except MalformedObject as exc:  # a stored row that is not what its columns hold
            malformed.append(
                Problem("workload", f"{workload.get('namespace')}/{workload.get('name')} {uid}", str(exc))
            )
            del windows[uid]
            continue
        rows.append(row)
    for uid in ended:
        try:
            accumulate(stored[uid], Window([], resolution))  # its figures, read back checked
        except MalformedObject as exc:
            malformed.append(Problem("workload_statistic", uid, str(exc)))
            continue
        final = finals.get(uid, {"status": "Deleted", "end_at": None})
        rows.append({**stored[uid], "workload_status": final["status"], "updated_at": now})
        if final["end_at"] is not None:
            rows[-1]["stat_end_time"] = final["end_at"]
        rows[-1].pop("id")

    with write_transaction(engine) as conn:
        claimed = claim_statistics_window(conn, cluster.name, cursor)
        if claimed:
            write_statistics(conn, rows)
        else:
            turn.log.warning(f"cluster {cluster.name}: another run added this window first; nothing written")

    figures_in_bounds = all(
        _percent_or_unknown(row, name) for row in rows for name in ("avg", "min", "max", "instant")
    )
    over_idle = [
        r["workload_name"] for r in rows if r["idle_gpu_seconds"] > r["allocated_gpu_seconds"] + 1e-6
    ]
    # Series naming no GPU pod of the cluster: the pod label is not the workload's (an exporter
    # scraped with honor_labels: false while no GPU is held, so no `exported_pod` to learn from).
    # Only the pods holding GPUs now: the window's may have ended since.
    strangers = sorted(f"{ns}/{pod}" for ns, pod in set(current) - known_pods)
    return MaterializeResult(
        metadata={
            "cluster": cluster.name,
            # The cluster's rows (what the partition holds, whoever wrote them), and this run's.
            "dagster/row_count": len(rows),
            "rows_written": len(rows) if claimed else 0,
            "workloads": len(workloads),
            "window_already_added": not claimed,
            "window_start": utc_time(first).isoformat() if queried else "",
            "window_end": utc_time(last).isoformat() if queried else "",
            "window_points": int((last - first) // resolution) + 1 if queried else 0,
            # Behind by more than a run reads (after an outage): the next runs catch up.
            "seconds_behind": round(max(0.0, now.timestamp() - last - resolution), 3) if queried else 0,
            "idle_gpu_seconds": MetadataValue.float(float(sum(w.idle_gpu_seconds for w in windows.values()))),
            "allocated_gpu_seconds": MetadataValue.float(
                float(sum(w.allocated_gpu_seconds for w in windows.values()))
            ),
            "prometheus_queries": prom.queries - asked_before if prom is not None else 0,
            "duration_seconds": round((datetime.now(UTC) - started).total_seconds(), 3),
        },
        check_results=[
            check("utilization_within_bounds", figures_in_bounds),
            check("idle_within_allocated", not over_idle, over=over_idle[:50]),
            rows_readable_check(turn, malformed),
            prometheus_check("prometheus_fresh", turn, mark, prom_error),
            check(
                "utilization_names_known_pods",
                not strangers,
                warn=True,
                count=len(strangers),
                pods=strangers[:20],
                **turn.dialect_metadata(),
            ),
        ],
    )


CONSUMER_COLUMNS = (
    "kind",
    "namespace",
    "name",
    "gpu_allocated",
    "gpu_utilization",
    "active_pods",
    "idle_gpu_seconds",
)


@cluster_view(
    description="GPU consumers: every running top-level workload with the GPUs its running pods hold, "
    "their utilization and its idle GPU time (`gpu_consumers`, the `consumer_pod_*` metrics).",
    table=gpu_consumers_table,
    deps=[workload_gpu_statistics],
    checks={
        **ROWS_READABLE,
        "allocated_within_cluster": "The consumers together hold no more GPUs than the running pods.",
    },
)
def gpu_consumers(turn: ClusterTurn) -> MaterializeResult:
    now = datetime.now(UTC)
    cluster = turn.cluster
    engine = turn.lens_db.engine()
    with engine.connect() as conn:
        workloads = active_workloads(conn, cluster.name)
        pods_of = running_pods_by_workload(conn, cluster.name)
        stats = stored_statistics(conn, cluster.name)
    rows: list[dict[str, Any]] = []
    malformed: list[Problem] = []
    unreadable: list[str] = []
    for workload in workloads:
        if workload["parent_uid"] or workload["status"] != "Running":
            continue
        uid = workload["uid"]
        try:
            rows.append(consumer_row(workload, pods_of.get(uid, []), stats.get(uid, {})))
        except MalformedObject as exc:  # a stored row that is not what its columns hold
            name = f"{workload.get('namespace')}/{workload.get('name')} {uid}"
            malformed.append(Problem("consumer", name, str(exc)))
            unreadable.append(uid)  # its stored consumer row stays
    with write_transaction(engine) as conn:
        result = write_consumers(conn, cluster.name, rows, now=now, unreadable=unreadable)
    held = sum(r["gpu_allocated"] for r in rows)
    running: dict[tuple[str, str], int] = {}
    for pods in pods_of.values():
        for pod in pods:
            with contextlib.suppress(MalformedObject):  # counted with its consumer above
                running[(pod["namespace"], pod["name"])] = stored_count(pod, "gpu_allocated")
    return MaterializeResult(
        metadata={
            "cluster": cluster.name,
            "dagster/row_count": len(rows),
            "gpu_allocated": held,
            "consumers": markdown_table(sorted(rows, key=lambda r: -r["gpu_allocated"]), CONSUMER_COLUMNS),
            **sync_metadata(result),
        },
        check_results=[
            check(
                "allocated_within_cluster",
                held <= sum(running.values()),
                held=held,
                running=sum(running.values()),
            ),
            rows_readable_check(turn, malformed),
        ],
    )


def _percent_or_unknown(row: dict[str, Any], name: str) -> bool:
    """A figure is a percentage, or unknown (None): the instant one while no series names the
    workload's GPUs, the others only while it has no sample at all."""
    value = row[f"{name}_gpu_utilization"]
    if value is None:
        return name == "instant" or not row["sample_count"]
    return isinstance(value, int | float) and 0.0 <= value <= 100.0
