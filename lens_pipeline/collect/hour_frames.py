"""The hourly history's figures with pandas (`lens_pipeline.collect.history.hour_tables`): one long
frame of (pod, step) rows, summed by step and by each dimension, then described per dimension
(docs/BENCHMARKS.md compares it with plain Python)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any

import numpy as np
import pandas as pd

from lens_pipeline.collect.history import (
    ENDED,
    LABEL_VALUE_LENGTH,
    MIB_PER_GIB,
    PERCENTILES,
    RUNNING,
    UTILIZATION,
    Dimensions,
    HourInputs,
    HourTables,
    Row,
    WorkloadInfo,
    step_count,
)
from lens_pipeline.collect.statistics import PodKey


def tables(inputs: HourInputs, dimensions: Dimensions) -> HourTables:
    """Every table's rows for the hour (without `cluster_name`, `stat_hour` and timestamps)."""
    n = step_count(inputs.step_seconds)
    frame = _pod_steps(inputs, n)
    per_step = _by_step(frame, [])
    capacity = pd.Series(
        {_step(inputs, t): value for t, value in inputs.capacity.items() if 0 <= _step(inputs, t) < n},
        dtype=float,
    )
    workloads = frame[frame["workload"].notna()]
    counted = frame[~frame["namespace"].isin(dimensions.excluded_namespaces)]
    by_workload = _by_step(counted[counted["workload"].notna()], ["workload"], replicas=True)
    by_namespace = _by_step(counted, ["namespace"])
    by_value = _by_dimension_value(_by_step(workloads, ["workload"]), inputs.workloads, dimensions)
    return HourTables(
        cluster=_cluster_row(per_step, capacity, n),
        namespaces=_described(by_namespace, n, ["namespace"]),
        labels=_described(by_value, n, ["dimension_type", "dimension_key", "dimension_value"]),
        workloads=_workload_rows(by_workload, inputs, n),
        snapshots=_snapshots(inputs, n, per_step, capacity, by_namespace, by_value, by_workload, dimensions),
    )


def _step(inputs: HourInputs, t: float) -> int:
    return round((t - inputs.start) / inputs.step_seconds)


# -- the long frame ----------------------------------------------------------------------------

FIGURES = ("util_sum", "util_n", "idle_n", "mem_used", "mem_total", "mem_n")


def _pod_steps(inputs: HourInputs, n: int) -> pd.DataFrame:
    """One row per pod and step at which it held GPUs, with what its GPUs reported then."""
    pods = pd.DataFrame(
        [(p.uid, p.namespace, p.name, p.gpus, p.bound_at, p.end_at, p.workload) for p in inputs.pods],
        columns=["uid", "namespace", "name", "gpus", "bound_at", "end_at", "workload"],
    ).astype({"namespace": "str", "name": "str"})
    step = inputs.step_seconds
    # A pod holds at t when bound_at <= t < end_at: steps first..last-1.
    first = np.ceil((pods["bound_at"].astype(float) - inputs.start) / step).clip(0, n)
    end = pods["end_at"].astype(float).fillna(inputs.start + n * step)
    last = np.ceil((end - inputs.start) / step).clip(0, n)
    held = (last - first).clip(0).astype(int).to_numpy()
    rows = pods.loc[pods.index.repeat(held)].reset_index(drop=True)
    offsets = np.arange(held.sum()) - np.repeat(np.cumsum(held) - held, held)
    rows["k"] = np.repeat(first.to_numpy(dtype=int), held) + offsets
    return rows.merge(_pod_figures(inputs, n), on=["namespace", "name", "k"], how="left").fillna(
        dict.fromkeys(FIGURES, 0.0)
    )


def _pod_figures(inputs: HourInputs, n: int) -> pd.DataFrame:
    """Per (namespace, pod, step): utilization sum and GPUs with a number, GPUs idle, memory."""
    utilization = _long(
        inputs,
        n,
        {key: series.counts for key, series in inputs.utilization.items()},
        {
            "util_sum": {key: series.sums for key, series in inputs.utilization.items()},
            "idle_n": {key: series.idle for key, series in inputs.utilization.items()},
        },
        "util_n",
    )
    memory = _long(
        inputs,
        n,
        {key: memory.gpus for key, memory in inputs.memory.items()},
        {
            "mem_used": {key: memory.used for key, memory in inputs.memory.items()},
            "mem_total": {key: memory.total for key, memory in inputs.memory.items()},
        },
        "mem_n",
    )
    keys = ["namespace", "name", "k"]
    return utilization.merge(memory, on=keys, how="outer").fillna(dict.fromkeys(FIGURES, 0.0))


def _long(
    inputs: HourInputs,
    n: int,
    counts: Mapping[PodKey, Mapping[float, float]],
    figures: Mapping[str, Mapping[PodKey, Mapping[float, float]]],
    count_column: str,
) -> pd.DataFrame:
    """One row per pod and step at which `counts` has a value, with the other figures at that step
    (0 where they have none); flattened with C-level list operations, not a loop per point."""
    namespaces: list[str] = []
    names: list[str] = []
    times: list[float] = []
    values: dict[str, list[float]] = {column: [] for column in (count_column, *figures)}
    for key, by_time in counts.items():
        steps = list(by_time)
        namespaces.extend([key[0]] * len(steps))
        names.extend([key[1]] * len(steps))
        times.extend(steps)
        values[count_column].extend(by_time.values())
        for column, of_pod in figures.items():
            values[column].extend(map(of_pod.get(key, {}).get, steps, repeat(0.0)))
    k = np.rint((np.asarray(times, dtype=float) - inputs.start) / inputs.step_seconds).astype(int)
    frame = pd.DataFrame(
        {
            "namespace": pd.Series(namespaces, dtype="str"),
            "name": pd.Series(names, dtype="str"),
            "k": k,
            **values,
        }
    )
    return frame[(frame["k"] >= 0) & (frame["k"] < n)].astype(dict.fromkeys(values, float))


def _by_step(frame: pd.DataFrame, keys: list[str], replicas: bool = False) -> pd.DataFrame:
    """Figures summed per dimension value and step, with the utilization of that step (NaN when no
    GPU reported a number) and how many workloads (and, with `replicas`, pods) held GPUs."""
    aggregations: dict[str, Any] = {
        "gpus": ("gpus", "sum"),
        "util_sum": ("util_sum", "sum"),
        "util_n": ("util_n", "sum"),
        "idle_n": ("idle_n", "sum"),
        "mem_used": ("mem_used", "sum"),
        "mem_total": ("mem_total", "sum"),
        "mem_n": ("mem_n", "sum"),
        "workloads": ("workload", "nunique"),
    }
    if replicas:
        aggregations["replicas"] = ("uid", "count")
    summed = frame.groupby([*keys, "k"]).agg(**aggregations).reset_index()
    summed["u"] = summed["util_sum"] / summed["util_n"].where(summed["util_n"] > 0)
    return summed


def _by_dimension_value(
    by_workload: pd.DataFrame, workloads: Mapping[str, WorkloadInfo], dimensions: Dimensions
) -> pd.DataFrame:
    """The workloads' steps summed per label and annotation value of the workload (a workload
    without the key counts under the default value)."""
    values = [
        (uid, kind, key, _dimension_value(source.get(key), dimensions.default_value))
        for uid, info in workloads.items()
        for kind, keys, source in (
            ("label", dimensions.label_keys, info.labels),
            ("annotation", dimensions.annotation_keys, info.annotations),
        )
        for key in keys
    ]
    mapping = pd.DataFrame(values, columns=["workload", "dimension_type", "dimension_key", "dimension_value"])
    joined = by_workload.merge(mapping, on="workload")
    keys = ["dimension_type", "dimension_key", "dimension_value", "k"]
    summed = joined.groupby(keys)[["gpus", "util_sum", "util_n"]].sum()
    summed["workloads"] = joined.groupby(keys)["workload"].nunique()
    summed = summed.reset_index()
    summed["u"] = summed["util_sum"] / summed["util_n"].where(summed["util_n"] > 0)
    return summed


def _dimension_value(value: Any, default: str) -> str:
    text = "" if value is None else str(value)
    return text[:LABEL_VALUE_LENGTH] if text else default


# -- the hour ----------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    """A figure as stored: NaN (nothing measured) is NULL."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _cluster_row(per_step: pd.DataFrame, capacity: pd.Series, n: int) -> Row:
    utilization = per_step["u"].dropna()
    allocated = float(per_step["gpus"].sum()) / n
    mean_capacity = float(capacity.mean()) if not capacity.empty else None
    return {
        "total_gpu_capacity": mean_capacity,
        "allocated_gpu_count": allocated,
        "allocation_rate": 100.0 * allocated / mean_capacity if mean_capacity else None,
        **_described_utilization(utilization, ("p50", "p95")),
        "sample_count": len(utilization),
    }


def _described_utilization(utilization: pd.Series, percentiles: Sequence[str] = ()) -> Row:
    if utilization.empty:
        return {f"{name}_utilization": None for name in (*UTILIZATION, *percentiles)}
    return {
        **{f"{name}_utilization": float(getattr(utilization, how)()) for name, how in UTILIZATION.items()},
        **{f"{name}_utilization": float(utilization.quantile(PERCENTILES[name])) for name in percentiles},
    }


def _described(per_step: pd.DataFrame, n: int, keys: list[str], percentiles: Sequence[str] = ()) -> list[Row]:
    """Per dimension value: mean allocation and workloads over every step of the hour, utilization
    over the steps with a number."""
    if per_step.empty:
        return []
    groups = per_step.groupby(keys)
    table = pd.DataFrame(
        {
            "allocated_gpu_count": groups["gpus"].sum() / n,
            "active_workload_count": groups["workloads"].sum() / n,
            "sample_count": groups["u"].count(),
            **{f"{name}_utilization": getattr(groups["u"], how)() for name, how in UTILIZATION.items()},
            **{f"{name}_utilization": groups["u"].quantile(PERCENTILES[name]) for name in percentiles},
        }
    ).reset_index()
    return [
        {k: (_number(v) if k.endswith("_utilization") else v) for k, v in row.items()}
        | {"sample_count": int(row["sample_count"])}
        for row in table.to_dict("records")
    ]


def _workload_rows(by_workload: pd.DataFrame, inputs: HourInputs, n: int) -> list[Row]:
    step = inputs.step_seconds
    memory = by_workload[by_workload["mem_n"] > 0].assign(
        used=lambda f: f["mem_used"] / f["mem_n"] / MIB_PER_GIB,
        total=lambda f: f["mem_total"] / f["mem_n"] / MIB_PER_GIB,
    )
    groups = by_workload.groupby("workload")
    figures = pd.DataFrame(
        {
            "total_sum": groups["u"].sum(),
            "gpu_steps": groups["gpus"].sum(),
            "idle_steps": groups["idle_n"].sum(),
            "avg_replica_count": groups["replicas"].mean(),
            "max_replica_count": groups["replicas"].max(),
            "min_replica_count": groups["replicas"].min(),
            "last_step": groups["k"].max(),
        }
    ).join(
        memory.groupby("workload").agg(
            avg_gpu_memory_used=("used", "mean"),
            max_gpu_memory_used=("used", "max"),
            avg_gpu_memory_total=("total", "mean"),
        )
    )
    described = {r["workload"]: r for r in _described(by_workload, n, ["workload"], tuple(PERCENTILES))}
    rows = []
    for uid, row in figures.to_dict("index").items():
        info, hour = inputs.workloads[str(uid)], described[uid]
        rows.append(
            {
                "workload_uid": info.uid,
                "namespace": info.namespace,
                "workload_name": info.name,
                "workload_type": info.kind,
                "allocated_gpu_count": hour["allocated_gpu_count"],
                "requested_gpu_count": hour["allocated_gpu_count"],
                **{k: v for k, v in hour.items() if k.endswith("_utilization")},
                **{
                    k: _number(row[k])
                    for k in ("avg_gpu_memory_used", "max_gpu_memory_used", "avg_gpu_memory_total")
                },
                "avg_replica_count": float(row["avg_replica_count"]),
                "max_replica_count": int(row["max_replica_count"]),
                "min_replica_count": int(row["min_replica_count"]),
                # Still holding GPUs at the hour's last step, or not any more.
                "workload_status": RUNNING if row["last_step"] == n - 1 else ENDED,
                "sample_count": hour["sample_count"],
                "owner_uid": info.parent_uid,
                "owner_name": "",
                "labels": dict(info.labels),
                "annotations": dict(info.annotations),
                "total_sum": float(row["total_sum"]),
                "allocated_gpu_seconds": float(row["gpu_steps"]) * step,
                "idle_gpu_seconds": float(row["idle_steps"]) * step,
            }
        )
    return sorted(rows, key=lambda r: r["workload_uid"])


# -- snapshots ---------------------------------------------------------------------------------


def _snapshots(
    inputs: HourInputs,
    n: int,
    per_step: pd.DataFrame,
    capacity: pd.Series,
    by_namespace: pd.DataFrame,
    by_value: pd.DataFrame,
    by_workload: pd.DataFrame,
    dimensions: Dimensions,
) -> list[Row]:
    """The cluster's allocation every `snapshot_seconds`, with what each namespace (and its
    workloads), label and annotation value held then."""
    every = max(1, round(dimensions.snapshot_seconds / inputs.step_seconds))
    taken = range(0, n, every)
    cluster = per_step.set_index("k")
    workloads: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for w in by_workload[by_workload["k"].isin(taken)].to_dict("records"):
        info = inputs.workloads[str(w["workload"])]
        workloads.setdefault((w["k"], info.namespace), []).append(
            {"uid": info.uid, "name": info.name, "namespace": info.namespace, "kind": info.kind}
            | _held(w, count=False)
        )
    details: dict[int, dict[str, dict[str, Any]]] = {
        k: {"namespaces": {}, "labels": {}, "annotations": {}} for k in taken
    }
    for row in by_namespace[by_namespace["k"].isin(taken)].to_dict("records"):
        held = workloads.get((row["k"], row["namespace"]), [])
        details[row["k"]]["namespaces"][row["namespace"]] = _held(row) | {"workloads": held}
    for row in by_value[by_value["k"].isin(taken)].to_dict("records"):
        into = details[row["k"]]["labels" if row["dimension_type"] == "label" else "annotations"]
        into[f"{row['dimension_key']}:{row['dimension_value']}"] = _held(row)
    return [
        {
            "snapshot_time": inputs.start + k * inputs.step_seconds,
            "dimension_type": "cluster",
            "dimension_key": None,
            "dimension_value": None,
            "total_gpu_capacity": int(capacity.get(k, 0)),
            "allocated_gpu_count": int(cluster["gpus"].get(k, 0)),
            "allocation_details": details[k],
        }
        for k in taken
    ]


def _held(row: Mapping[str, Any], count: bool = True) -> dict[str, Any]:
    held = {"allocatedGpu": int(row["gpus"]), "utilization": _number(row["u"])}
    return held | {"workloadCount": int(row["workloads"])} if count else held
