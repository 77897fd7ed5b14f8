"""Benchmark: one cluster's pods kept current by list and watch (`lens_pipeline.kube.watch.Reflector`),
against listing them again every minute, as each collection run does today.

The simulator runs in a subprocess with churn (`--churn SECONDS`: a churn step changes pods,
workloads, nodes and devices). In this process: one paged LIST of the pods, then a watch kept for
`--minutes`; then one more LIST, parsed and dropped (what a no-change run pays for the pods, the
bare read's part), and what the reflector kept compared with a LIST's keys and resourceVersions.
Prints wall and CPU of each, the CPU of keeping the pods current per minute, the events applied
and the peak RSS. `--keep raw` keeps each pod's JSON (what a cache serving LISTs would hold),
`--keep gpu` what the collectors cut a pod down to (`project_gpu_pod`).

    .venv/bin/python bench/bench_watch.py --nodes 5000 --pods-per-node 30 --churn 20 --minutes 3 [--keep gpu]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
from bench_collectors import start_simulator, stop_simulators
from measure import process_cpu_seconds

from lens_pipeline.clusters import load_registry
from lens_pipeline.collect.pods import project_gpu_pod
from lens_pipeline.kube.reader import KubeReader
from lens_pipeline.kube.watch import Reflector, object_key
from lens_pipeline.vendors import gpu_resources

PODS = "/api/v1/pods"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _versions(obj: dict) -> tuple[str, str]:
    return object_key(obj), str((obj.get("metadata") or {}).get("resourceVersion"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=float, default=30)
    parser.add_argument("--churn", type=float, default=20.0, help="seconds between churn steps")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--keep", choices=("raw", "gpu"), default="raw")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as work:
        started = time.perf_counter()
        sim, entry = start_simulator(
            Path(work), args.nodes, args.pods_per_node, extra=("--churn", str(args.churn))
        )
        try:
            print(f"simulator ready in {time.perf_counter() - started:.1f} s (churn every {args.churn:g} s)")
            config = load_registry(entry["registry"]).get(entry["name"])
            resources = gpu_resources(config.vendor)
            project = orjson.dumps if args.keep == "raw" else lambda obj: project_gpu_pod(obj, resources)
            reader = KubeReader(config)
            reflector = Reflector(reader, PODS, project)

            wall, cpu = time.perf_counter(), _cpu()
            reflector.relist()
            listed = len(reflector.snapshot().items)
            print(
                f"first LIST kept {listed} pods: wall {time.perf_counter() - wall:.2f} s, "
                f"cpu {_cpu() - cpu:.2f} s, peak RSS {_rss_mib():.0f} MiB"
            )

            stop = threading.Event()
            thread = threading.Thread(target=reflector.run, args=(stop,), daemon=True)
            wall, cpu, sim_cpu = time.perf_counter(), _cpu(), process_cpu_seconds(sim.pid)
            thread.start()
            time.sleep(args.minutes * 60)
            stop.set()
            thread.join(timeout=120)
            watched = time.perf_counter() - wall
            spent, sim_spent = _cpu() - cpu, process_cpu_seconds(sim.pid) - sim_cpu
            stats = reflector.stats
            print(
                f"watched {watched:.0f} s: our cpu {spent:.2f} s ({spent / watched * 60:.2f} s a minute), "
                f"the simulator's {sim_spent:.1f} s; events {dict(sorted(stats.events.items()))}, "
                f"watch requests {stats.watches}, relists {stats.lists - 1}, 410s {stats.expired}, "
                f"failures {stats.failures}"
            )

            wall, cpu = time.perf_counter(), _cpu()
            kept = reflector.snapshot()
            print(
                f"snapshot of {len(kept.items)} kept: wall {time.perf_counter() - wall:.2f} s, cpu {_cpu() - cpu:.2f} s"
            )

            for attempt in range(3):
                wall, cpu = time.perf_counter(), _cpu()
                count = len(reader.list(PODS, lambda _obj: None))
                print(
                    f"a LIST of the {count} pods, parsed and dropped (a run's floor for them): "
                    f"wall {time.perf_counter() - wall:.2f} s, cpu {_cpu() - cpu:.2f} s"
                )
                # What was kept against a LIST, by key and resourceVersion (churn may step between
                # the two reads: then again, after the reflector has seen the step).
                reflector.watch_seconds = 2
                stop = threading.Event()
                catch_up = threading.Thread(target=reflector.run, args=(stop,), daemon=True)
                catch_up.start()
                time.sleep(3)
                truth = reader.list(PODS, _versions)
                stop.set()
                catch_up.join(timeout=60)
                kept = reflector.snapshot()
                if args.keep == "raw":
                    same = [_versions(orjson.loads(raw)) for raw in kept.items] == truth
                else:  # a GPU pod's version is not kept: its key
                    same = kept.keys == [key for key, _ in truth]
                print(f"kept == LIST ({len(truth)} pods){'' if same else ' NOT'} (attempt {attempt + 1})")
                if same:
                    break
            print(f"peak RSS {_rss_mib():.0f} MiB")
        finally:
            stop_simulators([sim])
    return 0


if __name__ == "__main__":
    sys.exit(main())
