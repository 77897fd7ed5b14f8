"""Benchmark: one cluster's GPU hour aggregated with pandas (`lens_pipeline.collect.history`, what
the hourly history runs) and with plain Python (below, the same figures, written as loops over
dicts), on the same inputs: a cluster of `--nodes` GPU nodes x 8 GPUs, every GPU held, pods of 1-8
GPUs under a few hundred workloads, 120 steps of 30 s. Both must give the same rows; the median of
`--rounds` runs of each is printed, with the inputs' size.

With `--materialize`, also one whole (cluster, hour) as a run does it, against a simulated cluster of
`--nodes` nodes served over HTTP: its range queries, the Lens tables read, the aggregation and the
writes (the collectors run once first), on `--database-url` (SQLite in a temporary directory
by default).

    .venv/bin/python bench/bench_history.py --nodes 1000 --rounds 5 [--materialize]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections import defaultdict
from typing import Any

from lens_pipeline.collect.history import (
    HOUR,
    MIB_PER_GIB,
    Dimensions,
    HeldPod,
    HourInputs,
    PodMemory,
    WorkloadInfo,
    hour_tables,
)
from lens_pipeline.collect.statistics import PodSeries

START = 1_800_000_000.0
STEP = 30.0


def synthetic_hour(nodes: int, seed: int = 1) -> HourInputs:
    """Every GPU held; a tenth of the pods start or end inside the hour; utilization moves."""
    rng = random.Random(seed)
    steps = [START + k * STEP for k in range(int(HOUR / STEP))]
    namespaces = [f"team-{i}" for i in range(20)]
    workloads = {
        f"w{i}": WorkloadInfo(
            f"w{i}",
            rng.choice(("PyTorchJob", "Deployment", "Job")),
            rng.choice(namespaces),
            f"job-{i}",
            "",
            {"app": f"app-{i % 40}", "team": f"t{i % 7}"},
            {"project": f"p{i % 11}"},
        )
        for i in range(max(1, nodes // 3))
    }
    uids = sorted(workloads)
    pods, utilization, memory = [], {}, {}
    for node in range(nodes):
        free = 8
        while free:
            gpus = min(free, rng.choice((1, 2, 4, 8)))
            free -= gpus
            workload = workloads[rng.choice(uids)]
            name = f"{workload.name}-{node}-{free}"
            bound = START - 600 if rng.random() < 0.9 else START + rng.randrange(120) * STEP + 7
            end = None if rng.random() < 0.9 else START + rng.randrange(120) * STEP + 3
            pods.append(HeldPod(f"{name}-uid", workload.namespace, name, gpus, bound, end, workload.uid))
            base = rng.uniform(0, 100)
            values = {t: [min(100.0, max(0.0, base + rng.gauss(0, 10))) for _ in range(gpus)] for t in steps}
            key = (workload.namespace, name)
            utilization[key] = PodSeries(
                sums={t: sum(v) for t, v in values.items()},
                counts={t: float(len(v)) for t, v in values.items()},
                idle={t: float(sum(x < 5 for x in v)) for t, v in values.items() if any(x < 5 for x in v)},
            )
            memory[key] = PodMemory(
                {t: gpus * 60_000.0 * (sum(v) / gpus) / 100 for t, v in values.items()},
                {t: gpus * 196_608.0 for t in steps},
                {t: float(gpus) for t in steps},
            )
    return HourInputs(
        "bench", START, STEP, {t: nodes * 8.0 for t in steps}, utilization, memory, pods, workloads
    )


# -- the same hour in plain Python -----------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    h = (len(ordered) - 1) * q
    low = math.floor(h)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (h - low) * (ordered[high] - ordered[low])


def _described(steps: dict[int, list[float]], n: int, percentiles: tuple[str, ...] = ()) -> dict[str, Any]:
    """steps: k -> [gpus, util_sum, util_n, idle_n, mem_used, mem_total, mem_n, workloads(set), pods]."""
    util = [s[1] / s[2] for s in steps.values() if s[2] > 0]
    out: dict[str, Any] = {
        "allocated_gpu_count": sum(s[0] for s in steps.values()) / n,
        "active_workload_count": sum(len(s[7]) for s in steps.values()) / n,
        "sample_count": len(util),
    }
    names = ("avg", "min", "max", *percentiles)
    if not util:
        return out | {f"{name}_utilization": None for name in names}
    out |= {
        "avg_utilization": sum(util) / len(util),
        "min_utilization": min(util),
        "max_utilization": max(util),
    }
    return out | {f"{p}_utilization": _quantile(util, int(p[1:]) / 100) for p in percentiles}


def plain_hour_tables(inputs: HourInputs, dimensions: Dimensions | None = None) -> dict[str, Any]:
    dimensions = dimensions or Dimensions()
    n = int(HOUR / inputs.step_seconds)

    def group() -> dict[int, list]:
        return defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, set(), 0])

    cluster, namespaces, workloads = group(), defaultdict(group), defaultdict(group)
    values: dict[tuple[str, str, str], dict[int, list]] = defaultdict(group)
    dimension_values = {
        uid: [
            (kind, key, str(source.get(key) or "")[:255] or dimension.default_value)
            for kind, keys, source, dimension in (
                ("label", dimensions.label_keys, info.labels, dimensions),
                ("annotation", dimensions.annotation_keys, info.annotations, dimensions),
            )
            for key in keys
        ]
        for uid, info in inputs.workloads.items()
    }
    for pod in inputs.pods:
        first = max(0, math.ceil((pod.bound_at - inputs.start) / inputs.step_seconds))
        end = (
            n if pod.end_at is None else min(n, math.ceil((pod.end_at - inputs.start) / inputs.step_seconds))
        )
        series = inputs.utilization.get((pod.namespace, pod.name))
        memory = inputs.memory.get((pod.namespace, pod.name))
        counted = pod.namespace not in dimensions.excluded_namespaces
        targets = [cluster]
        if counted:
            targets.append(namespaces[pod.namespace])
        if pod.workload:
            targets += [values[v] for v in dimension_values[pod.workload]]
            if counted:
                targets.append(workloads[pod.workload])
        for k in range(first, end):
            t = inputs.start + k * inputs.step_seconds
            figures = (
                pod.gpus,
                series.sums.get(t, 0.0) if series else 0.0,
                series.counts.get(t, 0.0) if series else 0.0,
                series.idle.get(t, 0.0) if series else 0.0,
                memory.used.get(t, 0.0) if memory else 0.0,
                memory.total.get(t, 0.0) if memory else 0.0,
                memory.gpus.get(t, 0.0) if memory else 0.0,
            )
            for target in targets:
                into = target[k]
                for i, value in enumerate(figures):
                    into[i] += value
                if pod.workload:
                    into[7].add(pod.workload)
                into[8] += 1
    tables: dict[str, Any] = {"cluster": _described(cluster, n, ("p50", "p95"))}
    tables["namespaces"] = {ns: _described(steps, n) for ns, steps in namespaces.items()}
    tables["labels"] = {key: _described(steps, n) for key, steps in values.items()}
    tables["workloads"] = {}
    for uid, steps in workloads.items():
        row = _described(steps, n, ("p50", "p90", "p95"))
        memory_steps = [s for s in steps.values() if s[6] > 0]
        used = [s[4] / s[6] / MIB_PER_GIB for s in memory_steps]
        replicas = [s[8] for s in steps.values()]
        row |= {
            "avg_gpu_memory_used": sum(used) / len(used) if used else None,
            "max_gpu_memory_used": max(used) if used else None,
            "avg_replica_count": sum(replicas) / len(replicas),
            "max_replica_count": max(replicas),
            "min_replica_count": min(replicas),
            "idle_gpu_seconds": sum(s[3] for s in steps.values()) * inputs.step_seconds,
        }
        tables["workloads"][uid] = row
    return tables


def same(pandas_tables: Any, plain: dict[str, Any]) -> None:
    """Both give the same figures (a few ulps apart: sums in another order)."""

    def close(a: Any, b: Any) -> bool:
        if a is None or b is None:
            return a is b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)

    pairs = [(pandas_tables.cluster, plain["cluster"])]
    pairs += [(r, plain["namespaces"][r["namespace"]]) for r in pandas_tables.namespaces]
    pairs += [
        (r, plain["labels"][(r["dimension_type"], r["dimension_key"], r["dimension_value"])])
        for r in pandas_tables.labels
    ]
    pairs += [(r, plain["workloads"][r["workload_uid"]]) for r in pandas_tables.workloads]
    assert len(pandas_tables.workloads) == len(plain["workloads"])
    assert len(pandas_tables.labels) == len(plain["labels"])
    for row, expected in pairs:
        for key, value in expected.items():
            if key in row:
                assert close(row[key], value), (key, row[key], value)


def materialize_one_hour(nodes: int, database_url: str | None) -> None:
    """One (cluster, hour) of a simulated cluster, as a run does it (the collectors run first)."""
    import tempfile
    from datetime import UTC, datetime, timedelta
    from pathlib import Path

    from dagster import AssetKey, instance_for_test, materialize

    from lens_pipeline.defs import resources
    from lens_pipeline.defs.cluster_assets import cluster_assets
    from lens_pipeline.defs.history.assets import hourly_history
    from lens_pipeline.defs.history.partitions import history_key
    from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
    from lens_pipeline.defs.resources import ClusterRegistryResource, LensDatabase, SafeDatabase
    from lens_pipeline.sim.fleet import SimFleet
    from lens_pipeline.sim.registry import write_registry
    from lens_pipeline.sim.server import SimServer

    work = Path(tempfile.mkdtemp(prefix="bench-history-"))
    began = time.perf_counter()
    fleet = SimFleet.generate(clusters=1, nodes=nodes, seed=1, vendor="amd", history=True)
    (cluster,) = fleet
    print(f"simulated cluster of {nodes} nodes made in {time.perf_counter() - began:.1f} s")
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    with SimServer(fleet) as server, instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [cluster.name])
        registry = write_registry(work / "clusters.yaml", server)
        run = {
            **resources.defs.resources,
            "registry": ClusterRegistryResource(clusters_file=str(registry)),
            "lens_db": LensDatabase(url=database_url or f"sqlite:///{work / 'lens.db'}"),
            "safe_db": SafeDatabase(url=f"sqlite:///{work / 'safe.db'}"),
        }
        collectors = [AssetKey(a) for a in ("gpu_nodes", "gpu_pods", "gpu_workloads")]
        collected = materialize(
            [cluster_assets],
            selection=collectors,
            partition_key=cluster.name,
            instance=instance,
            resources=run,
        )
        assert collected.success
        for attempt in ("first", "again"):
            began = time.perf_counter()
            result = materialize(
                [hourly_history],
                partition_key=history_key(cluster.name, hour),
                instance=instance,
                resources=run,
            )
            assert result.success
            metadata = result.get_asset_materialization_events()[0].materialization.metadata
            print(
                f"one hour materialized ({attempt}): {time.perf_counter() - began:.2f} s in the run, "
                f"{metadata['duration_seconds'].value:.2f} s in the asset"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--materialize", action="store_true", help="also one whole hour against the simulator"
    )
    parser.add_argument("--database-url", default=None, help="Lens database of --materialize")
    args = parser.parse_args()
    started = time.perf_counter()
    inputs = synthetic_hour(args.nodes)
    points = sum(len(s.counts) for s in inputs.utilization.values())
    print(
        f"inputs: {args.nodes} nodes, {len(inputs.pods)} pods, {len(inputs.workloads)} workloads, "
        f"{points} pod-steps; made in {time.perf_counter() - started:.1f} s"
    )
    same(hour_tables(inputs), plain_hour_tables(inputs))
    timings: dict[str, list[float]] = {"pandas": [], "plain Python": []}
    for _ in range(args.rounds):
        for name, aggregate in (("pandas", hour_tables), ("plain Python", plain_hour_tables)):
            began = time.perf_counter()
            aggregate(inputs)  # type: ignore[operator]
            timings[name].append(time.perf_counter() - began)
    for name, values in timings.items():
        print(
            f"{name:>13}: median {statistics.median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f})"
        )
    if args.materialize:
        materialize_one_hour(args.nodes, args.database_url)


if __name__ == "__main__":
    main()
