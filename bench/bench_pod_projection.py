"""Benchmark: what `project_gpu_pod` costs a pod (every pod of every listing passes through it),
on one simulated cluster's pods as its LIST gives them, best of several passes.

    .venv/bin/python bench/bench_pod_projection.py [--nodes 500 --pods-per-node 20 --vendor amd --passes 5]

Run it at two commits (a worktree of the older one on PYTHONPATH) to compare them.
"""

from __future__ import annotations

import argparse
import time

import orjson

from lens_pipeline.collect.pods import project_gpu_pod
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.vendors import gpu_resources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods-per-node", type=float, default=20)
    parser.add_argument("--vendor", default="amd", choices=("amd", "nvidia", "auto"))
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    vendor = "amd" if args.vendor == "auto" else args.vendor
    fleet = SimFleet.generate(
        clusters=1, nodes=args.nodes, seed=3, vendor=vendor, pods_per_node=args.pods_per_node
    )
    (cluster,) = fleet.clusters
    listed = orjson.dumps([entry.obj for entry in cluster.truth_snapshot().objects["pods"]])
    resources = gpu_resources(args.vendor)
    best, gpu_pods, pods = float("inf"), 0, 0
    for _ in range(args.passes):
        batch = orjson.loads(listed)  # a fresh parse each pass, as each run's LIST is
        started = time.perf_counter()
        gpu_pods = sum(1 for pod in batch if project_gpu_pod(pod, resources) is not None)
        best = min(best, time.perf_counter() - started)
        pods = len(batch)
    print(
        f"{pods} pods ({gpu_pods} hold GPUs), vendor {args.vendor}: {best * 1e6 / pods:.2f} µs a pod (best of {args.passes})"
    )


if __name__ == "__main__":
    main()
