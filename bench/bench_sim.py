"""Benchmark: the simulator at the Kubernetes scalability envelope (issue 4, item 5).

Starts `python -m lens_pipeline.sim` in a subprocess with one cluster of 5,000 GPU nodes (8 GPUs
each) and 150,000 pods, then, from this process, lists every pod through the official `kubernetes`
client the way the pipeline reads (`raw_get`: the client's request, raw body, orjson; limit=500 and
continue tokens) and prints:

- generation time (the simulator's own figure, and wall time from spawn to serving),
- list throughput (pods/s) and page count per round, with the cyclic GC paused while listing (as
  `lens_pipeline.kube.reader` lists) and, for comparison, as Python ships it; and how much of each
  list was spent waiting for the simulator (request to last byte) versus parsing in this process,
- the simulator's peak RSS (VmHWM from /proc/<pid>/status) after the listing.

    .venv/bin/python bench/bench_sim.py [--nodes 5000] [--pods 150000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from kubernetes import config
from measure import peak_rss_mib

from lens_pipeline.kube.reader import raw_get


def list_pods(api: object, page_size: int) -> tuple[int, int, float, float, set[str]]:
    """(pods, pages, seconds, seconds waiting for the simulator, uids) of one complete paged LIST."""
    started = time.perf_counter()
    pods, pages, token, uids, waiting = 0, 0, None, set(), 0.0
    while True:
        asked = time.perf_counter()
        query = [("limit", page_size)] + ([("continue", token)] if token else [])
        status, body = raw_get(api, "/api/v1/pods", query, (10.0, 120.0))  # type: ignore[arg-type]
        waiting += time.perf_counter() - asked
        page = orjson.loads(body)
        if status != 200:
            raise RuntimeError(f"list failed: HTTP {status}: {page}")
        pages += 1
        pods += len(page["items"])
        uids.update(item["metadata"]["uid"] for item in page["items"])
        token = page["metadata"].get("continue")
        if not token:
            return pods, pages, time.perf_counter() - started, waiting, uids


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--page-size", type=int, default=500)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-sim-"))
    registry = work / "clusters.yaml"
    command = [
        sys.executable, "-m", "lens_pipeline.sim", "--clusters", "1", "--nodes", str(args.nodes),
        "--pods", str(args.pods), "--vendor", "amd", "--seed", str(args.seed), "--registry-out", str(registry),
    ]  # fmt: skip
    print("simulator:", " ".join(command[1:]))
    spawned = time.perf_counter()
    sim = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    results: dict[str, object] = {"nodes": args.nodes, "pods_requested": args.pods}
    try:
        generated = None
        for line in sim.stdout:  # type: ignore[union-attr]
            if line.startswith("generated in"):
                generated = float(line.split()[2])
            if line.startswith("serving"):
                break
        results["generation_seconds"] = generated
        results["spawn_to_serving_seconds"] = round(time.perf_counter() - spawned, 1)
        print(f"generation: {generated:.1f} s (spawn to serving {results['spawn_to_serving_seconds']} s)")

        api = config.new_client_from_config(config_file=str(work / "kubeconfigs" / "sim-amd-0.yaml"))
        for mode in ("GC paused", "default GC"):
            if mode == "GC paused":
                gc.disable()
            rates = []
            for round_ in range(1, args.rounds + 1):
                pods, pages, seconds, waiting, uids = list_pods(api, args.page_size)
                if len(uids) != pods:
                    raise RuntimeError(f"{pods - len(uids)} pods listed twice")
                rates.append(pods / seconds)
                print(
                    f"  list ({mode}) round {round_}: {pods} pods in {pages} pages, {seconds:.2f} s, "
                    f"{pods / seconds:,.0f} pods/s; waiting for the simulator {waiting:.2f} s "
                    f"({waiting / pages * 1000:.1f} ms/page), parsing {seconds - waiting:.2f} s"
                )
            results[f"pods_per_second ({mode})"] = {
                "median": round(statistics.median(rates)),
                "min": round(min(rates)),
                "max": round(max(rates)),
            }
            results["pods_listed"], results["pages"] = pods, pages
            gc.enable()
        results["simulator_peak_rss_mib"] = round(peak_rss_mib(sim.pid))
        print(f"simulator peak RSS: {results['simulator_peak_rss_mib']} MiB")
        print(json.dumps(results))
    finally:
        sim.terminate()
        sim.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
