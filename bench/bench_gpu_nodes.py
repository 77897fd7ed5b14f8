"""Benchmark: `gpu_nodes` for one simulated cluster of 5,000 GPU nodes.

Starts the simulator in a subprocess (so its memory is not ours), materializes `gpu_nodes` twice
through Dagster (first run, then a run that sees no change) and prints wall time, the asset's own
time, this process's peak RSS, and the Kubernetes/Prometheus requests the simulator saw.

    .venv/bin/python bench/bench_gpu_nodes.py [--nodes 5000] [--database-url URL]

Default database: a fresh SQLite file. Pass a PostgreSQL URL of an empty database to bench that.
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

import yaml


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=float, default=2.0)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-gpu-nodes-"))
    registry = work / "clusters.yaml"
    sim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lens_pipeline.sim",
            "--clusters",
            "1",
            "--nodes",
            str(args.nodes),
            "--vendor",
            "amd",
            "--seed",
            "1",
            "--pods-per-node",
            str(args.pods_per_node),
            "--registry-out",
            str(registry),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for line in sim.stdout:  # type: ignore[union-attr]
            if line.startswith("serving"):
                break
        cluster = yaml.safe_load(registry.read_text())["clusters"][0]
        base = cluster["prometheus_url"].removesuffix("/prometheus")
        return run(
            cluster["name"], registry, base, args.database_url or f"sqlite:///{work / 'lens.db'}", args.nodes
        )
    finally:
        sim.terminate()
        sim.wait(timeout=30)


def run(cluster: str, registry: Path, base: str, database_url: str, nodes: int) -> int:
    # Imported here so that the numbers below include nothing the simulator did.
    from dagster import instance_for_test, materialize

    from lens_pipeline.defs import resources
    from lens_pipeline.defs.collectors.gpu_nodes import gpu_nodes
    from lens_pipeline.defs.resources import ClusterRegistryResource, LensDatabase

    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", [cluster])
        print(f"gpu_nodes, 1 cluster of {nodes} GPU nodes, database {database_url.split(':')[0]}")
        for label in ("first run", "no-change run"):
            urllib.request.urlopen(urllib.request.Request(f"{base}/_requests/reset", method="POST")).read()
            started = time.perf_counter()
            result = materialize(
                [gpu_nodes],
                partition_key=cluster,
                instance=instance,
                resources={
                    **resources.defs.resources,
                    "registry": ClusterRegistryResource(clusters_file=str(registry)),
                    "lens_db": LensDatabase(url=database_url),
                },
            )
            wall = time.perf_counter() - started
            (event,) = result.asset_materializations_for_node("gpu_nodes")
            meta = {k: v.value for k, v in event.metadata.items()}
            seen = json.load(urllib.request.urlopen(f"{base}/_requests"))
            peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(
                f"  {label}: run wall {wall:.2f} s, asset {meta['duration_seconds']:.2f} s, peak RSS {peak_mib:.0f} MiB, "
                f"rows {meta['dagster/row_count']} (inserted {meta['rows_inserted']}, updated {meta['rows_updated']}), "
                f"k8s requests {meta['kubernetes_requests']} = pages {meta['kubernetes_pages']} "
                f"(simulator saw {json.dumps(seen['counts'])}), "
                f"prometheus queries {meta['prometheus_queries']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
