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
from lens_pipeline.kube.reader import KubeReader, raw_get
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


def _version_now(reader: KubeReader) -> str:
    """The cluster's resourceVersion now (a LIST of one node)."""
    status, body = raw_get(reader.api, "/api/v1/nodes", [("limit", 1)], (5.0, 30.0))
    assert status == 200, body[:200]
    return orjson.loads(body)["metadata"]["resourceVersion"]


def _check(reader: KubeReader, reflector: Reflector, keep: str, attempts: int = 8) -> tuple[bool | None, str]:
    """What the reflector kept against a LIST, both at one resourceVersion: a LIST made while the
    cluster did not change (its version the same before and after), and the reflector brought to
    that version by watching until a bookmark (sent after a quiet spell) with nothing changed since."""
    for attempt in range(1, attempts + 1):
        before = _version_now(reader)
        truth = reader.list(PODS, _versions)
        if _version_now(reader) != before:
            continue  # churn stepped during the LIST
        bookmarks = reflector.stats.events.get("BOOKMARK", 0)
        stop = threading.Event()
        thread = threading.Thread(target=reflector.run, args=(stop,), daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while reflector.stats.events.get("BOOKMARK", 0) == bookmarks and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        thread.join(timeout=120)
        if _version_now(reader) != before:
            continue  # churn stepped before the bookmark: the reflector may be past the LIST
        kept = reflector.snapshot()
        if keep == "raw":
            same = [_versions(orjson.loads(raw)) for raw in kept.items] == truth
        else:  # a GPU pod's version is not kept: its key
            same = kept.keys == [key for key, _ in truth]
        verdict = "equal to" if same else "NOT equal to"
        return (
            same,
            f"kept {verdict} a LIST at the same resourceVersion ({len(truth)} pods; attempt {attempt})",
        )
    return None, f"not checked: the cluster changed during each of {attempts} attempts"


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

            wall, cpu = time.perf_counter(), _cpu()
            count = len(reader.list(PODS, lambda _obj: None))
            print(
                f"a LIST of the {count} pods, parsed and dropped (a run's floor for them): "
                f"wall {time.perf_counter() - wall:.2f} s, cpu {_cpu() - cpu:.2f} s"
            )
            same, said = _check(reader, reflector, args.keep)
            print(said)
            print(f"peak RSS {_rss_mib():.0f} MiB")
        finally:
            stop_simulators([sim])
    return 1 if same is False else 0


if __name__ == "__main__":
    sys.exit(main())
