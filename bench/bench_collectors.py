"""Benchmark: the collectors of one simulated cluster, first run and no-change run.

The simulator runs in a subprocess (its memory is not ours). The collectors are materialized
through Dagster in this process, as the `collect_cluster` job runs them: one run, shared LISTs.
Prints wall time, this process's CPU time and peak RSS, and what the simulator was asked.

    .venv/bin/python bench/bench_collectors.py --nodes 5000 --pods-per-node 30 [--assets gpu_nodes ...]
        [--database-url postgresql+psycopg2://postgres@127.0.0.1:5432/lens_bench]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import yaml
from measure import machine_busy_seconds, postgres_cpu_seconds, process_cpu_seconds

CORES = psutil.cpu_count() or 1
ALL = ("gpu_nodes", "gpu_pods", "gpu_workloads", "gpu_devices", "storage_backends")


def start_simulator(
    work: Path, nodes: int, pods_per_node: float, vendor: str = "amd"
) -> tuple[subprocess.Popen, dict]:
    registry = work / "clusters.yaml"
    sim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lens_pipeline.sim",
            "--clusters",
            "1",
            "--nodes",
            str(nodes),
            "--vendor",
            vendor,
            "--seed",
            "1",
            "--pods-per-node",
            str(pods_per_node),
            "--registry-out",
            str(registry),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    for line in sim.stdout:  # type: ignore[union-attr]
        if line.startswith("serving"):
            break
    entry = yaml.safe_load(registry.read_text())["clusters"][0]
    return sim, {**entry, "registry": registry, "base": entry["prometheus_url"].removesuffix("/prometheus")}


def requests_seen(base: str, reset: bool = False) -> dict:
    if reset:
        urllib.request.urlopen(urllib.request.Request(f"{base}/_requests/reset", method="POST")).read()
        return {}
    return json.load(urllib.request.urlopen(f"{base}/_requests"))["counts"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=float, default=30.0)
    parser.add_argument("--assets", nargs="+", default=list(ALL), choices=ALL)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--first-only", action="store_true", help="skip the no-change run (for profiling)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-collectors-"))
    started = time.perf_counter()
    sim, cluster = start_simulator(work, args.nodes, args.pods_per_node)
    print(f"simulator ready in {time.perf_counter() - started:.1f} s")
    try:
        url = args.database_url or f"sqlite:///{work / 'lens.db'}"
        labels = ("first run",) if args.first_only else ("first run", "no-change run")
        return run(cluster, url, args.assets, labels, sim.pid)
    finally:
        sim.terminate()
        sim.wait(timeout=30)


def run(cluster: dict, url: str, asset_names: list[str], labels: tuple[str, ...], simulator_pid: int) -> int:
    from dagster import AssetKey, instance_for_test, materialize

    from lens_pipeline.defs import resources
    from lens_pipeline.defs.cluster_assets import cluster_assets
    from lens_pipeline.defs.resources import ClusterRegistryResource, LensDatabase

    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", [cluster["name"]])
        print(f"{', '.join(asset_names)}; database {url.split(':')[0]}")
        for label in labels:
            requests_seen(cluster["base"], reset=True)
            started = time.perf_counter()
            cpu_before = _cpu_seconds()
            others_before = _others_cpu(simulator_pid)
            result = materialize(
                [cluster_assets],
                selection=[AssetKey(name) for name in asset_names],
                partition_key=cluster["name"],
                instance=instance,
                resources={
                    **resources.defs.resources,
                    "registry": ClusterRegistryResource(clusters_file=str(cluster["registry"])),
                    "lens_db": LensDatabase(url=url),
                },
            )
            wall = time.perf_counter() - started
            cpu = _cpu_seconds() - cpu_before
            simulator_cpu, database_cpu, machine_busy = (
                after - before
                for after, before in zip(_others_cpu(simulator_pid), others_before, strict=True)
            )
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            rows = {}
            for name in asset_names:
                (event,) = (
                    e
                    for e in result.asset_materializations_for_node("cluster_assets")
                    if e.asset_key.path == [name]
                )
                meta = {k: v.value for k, v in event.metadata.items()}
                rows[name] = f"{meta['dagster/row_count']} rows ({meta['duration_seconds']:.2f} s)"
            counts = requests_seen(cluster["base"])
            kube = sum(n for p, n in counts.items() if "/prometheus/" not in p)
            prom = sum(n for p, n in counts.items() if "/prometheus/" in p)
            print(
                f"  {label}: wall {wall:.2f} s, cpu {cpu:.2f} s, peak RSS {peak:.0f} MiB, Kubernetes requests {kube}, "
                f"Prometheus queries {prom}; {'; '.join(f'{k}: {v}' for k, v in rows.items())}"
            )
            print(
                f"    cpu of the simulator {simulator_cpu:.2f} s, of PostgreSQL {database_cpu:.2f} s; "
                f"machine busy {machine_busy:.2f} s of {CORES * wall:.2f} core-seconds ({CORES} cores)"
            )
            print(f"    requests: {json.dumps(counts)}")
    return 0


def _cpu_seconds() -> float:
    """This process's user + system CPU time: unlike wall time, barely moved by other processes'
    load on the machine (the simulator's own work is not in it)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _others_cpu(simulator_pid: int) -> tuple[float, float, float]:
    """CPU seconds of the simulator and of PostgreSQL so far, and the whole machine's busy seconds:
    on a small machine they compete with the collectors for the same cores."""
    return process_cpu_seconds(simulator_pid), postgres_cpu_seconds(), machine_busy_seconds()


if __name__ == "__main__":
    sys.exit(main())
