"""Benchmark: the collectors of one simulated cluster, first run and no-change run, each against the
bare read of the same cluster.

The simulator runs in a subprocess (its memory is not ours). The collectors are materialized
through Dagster in this process, as the `collect_cluster` job runs them: one run, shared LISTs.
Prints wall time, this process's CPU time and peak RSS, and what the simulator was asked.

After each collection run, the bare read: every request the run made, made again with nothing
done with the answers but parsing them (each LIST paged and fetched ahead by the same reader, each
item dropped; every other Kubernetes GET and every Prometheus query once, parsed with orjson).
What the code controls is the ratio of the run to it: seconds move with the machine and its load,
the floor with them. It is printed for the Kubernetes requests alone and with the Prometheus answers.

One simulator process serves both the Kubernetes API and Prometheus, so the pages of a LIST
wait for its PromQL (one GIL) while the collectors' queries, asked ahead, are evaluated. In a
cluster, kube-apiserver and Prometheus are separate servers: with `--prometheus-apart`, the
cluster's Prometheus is a second simulator process of the same seed (the same fleet, the same
answers). docs/BENCHMARKS.md gives both.

    .venv/bin/python bench/bench_collectors.py --nodes 5000 --pods-per-node 30 [--assets gpu_nodes ...]
        [--database-url postgresql+psycopg2://postgres@127.0.0.1:5432/lens_bench] [--prometheus-apart]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson
import psutil
import urllib3
import yaml
from measure import (
    DATABASE_SERVERS,
    database_cpu_seconds,
    machine_busy_seconds,
    peak_rss_mib,
    process_cpu_seconds,
)

CORES = psutil.cpu_count() or 1
ALL = ("gpu_nodes", "gpu_pods", "gpu_workloads", "gpu_devices", "storage_backends")


def start_simulator(
    work: Path, nodes: int, pods_per_node: float, vendor: str = "amd", extra: tuple[str, ...] = ()
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
            *extra,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for line in sim.stdout:  # type: ignore[union-attr]
            if line.startswith("serving"):
                break
        else:
            raise SystemExit(f"the simulator exited ({sim.wait()}) before serving")
        entry = yaml.safe_load(registry.read_text())["clusters"][0]
    except BaseException:
        stop_simulators([sim])
        raise
    base = entry["prometheus_url"].removesuffix("/prometheus")
    return sim, {**entry, "registry": registry, "base": base, "prometheus_base": base}


def stop_simulators(sims: list[subprocess.Popen]) -> None:
    """Each simulator asked to stop, then killed if it has not within 30 s."""
    for sim in sims:
        sim.terminate()
    for sim in sims:
        try:
            sim.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sim.kill()
            sim.wait()


def prometheus_apart(cluster: dict, prometheus: dict) -> dict:
    """`cluster`, its Prometheus served by another simulator of the same seed (`prometheus`): the
    registry file rewritten to point there."""
    if prometheus["name"] != cluster["name"]:
        raise SystemExit(f"the second simulator serves {prometheus['name']}, not {cluster['name']}")
    document = yaml.safe_load(cluster["registry"].read_text())
    document["clusters"][0]["prometheus_url"] = prometheus["prometheus_url"]
    cluster["registry"].write_text(yaml.safe_dump(document, sort_keys=False))
    return {**cluster, "prometheus_url": prometheus["prometheus_url"], "prometheus_base": prometheus["base"]}


def bases(cluster: dict) -> list[str]:
    """The simulators the cluster is served by: one, or the Kubernetes API's and Prometheus'."""
    return list(dict.fromkeys([cluster["base"], cluster["prometheus_base"]]))


def requests_seen(base: str, reset: bool = False) -> dict:
    if reset:
        urllib.request.urlopen(urllib.request.Request(f"{base}/_requests/reset", method="POST")).read()
        return {}
    return json.load(urllib.request.urlopen(f"{base}/_requests"))["counts"]


def requests_made(base: str) -> list[tuple[str, str]]:
    """(path, query) of every request of the last run, in order (the simulator keeps the last 5,000)."""
    log = json.load(urllib.request.urlopen(f"{base}/_requests"))
    if log["total"] > len(log["recent"]):
        raise SystemExit(
            f"the simulator kept {len(log['recent'])} of {log['total']} requests: raise its log size"
        )
    made = []
    for line in log["recent"]:
        method, target, _status = line.split(" ")
        if method != "GET":
            raise SystemExit(f"the bare read replays GETs only, the run made {line!r}")
        path, _, query = target.partition("?")
        made.append((path, query))
    return made


def bare_read(cluster: dict, made: list[tuple[str, str]]) -> tuple[float, float]:
    """Seconds to make again every request of a run, parsing the answers and keeping nothing: the
    Kubernetes requests alone, then the Prometheus queries. A LIST (a request with `limit=` and no
    `continue=`) is read whole, paged and fetched ahead as `KubeReader` lists, once per path (lens
    watch may have listed it beside the run); a page read with a continue token belongs to it, and
    a watch is not the run's."""
    from lens_pipeline.clusters import load_registry
    from lens_pipeline.kube.reader import KubeReader
    from lens_pipeline.memory import paused_gc

    config = load_registry(cluster["registry"]).get(cluster["name"])
    kube = [(p, q) for p, q in made if not p.startswith("/prometheus/")]
    prom = [(p, q) for p, q in made if p.startswith("/prometheus/")]
    listed: set[str] = set()
    with KubeReader(config) as reader, paused_gc(freeze=False):
        started = time.perf_counter()
        for path, query in kube:
            if "continue=" in query or "watch=" in query:
                continue  # a later page of a list, or lens watch's own watch
            if "limit=500" in query:
                if path in listed:
                    continue  # lens watch listed it too, beside the run
                listed.add(path)
                reader.list(path, _drop)
            else:
                orjson.loads(_get(reader, path, query))
        kube_seconds = time.perf_counter() - started
        pool = urllib3.PoolManager()
        for path, query in prom:
            response = pool.request("GET", f"{cluster['prometheus_base']}{path}?{query}")
            orjson.loads(response.data)
        prom_seconds = time.perf_counter() - started - kube_seconds
    return kube_seconds, prom_seconds


def _drop(_item: object) -> None:
    return None


def _get(reader, path: str, query: str) -> bytes:
    from urllib.parse import parse_qsl

    status, body = reader._get(path, parse_qsl(query))
    if status != 200:
        raise SystemExit(f"bare read: GET {path}?{query}: HTTP {status}")
    return body


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=float, default=30.0)
    parser.add_argument("--assets", nargs="+", default=list(ALL), choices=ALL)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--first-only", action="store_true", help="skip the no-change run (for profiling)")
    parser.add_argument(
        "--prometheus-apart",
        action="store_true",
        help="the cluster's Prometheus from a second simulator process (same seed), not the Kubernetes API's",
    )
    parser.add_argument(
        "--watch-cache",
        action="store_true",
        help="`lens watch` between the runs and the API server: a first run while it is cold (it then "
        "starts keeping; into a SQLite database of its own), then, once it serves everything, a first run "
        "into the database and its no-change run; every bare read replays the cold run's requests; last, a "
        "lens watch started afresh, timed until it serves the nodes and the pods, and all it keeps from its "
        "start (and whether that holds every collection the cold run listed)",
    )
    parser.add_argument(
        "--no-managed-fields",
        action="store_true",
        help="the simulated objects without metadata.managedFields (as every pass before the twelfth)",
    )
    args = parser.parse_args()
    extra = ("--no-managed-fields",) if args.no_managed_fields else ()

    work = Path(tempfile.mkdtemp(prefix="bench-collectors-"))
    started = time.perf_counter()
    sims = []
    try:
        sim, cluster = start_simulator(work, args.nodes, args.pods_per_node, extra=extra)
        sims.append(sim)
        if args.prometheus_apart:
            (work / "prometheus").mkdir()
            prometheus_sim, prometheus = start_simulator(
                work / "prometheus", args.nodes, args.pods_per_node, extra=extra
            )
            sims.append(prometheus_sim)
            cluster = prometheus_apart(cluster, prometheus)
        print(
            f"{len(sims)} simulator process(es) ready in {time.perf_counter() - started:.1f} s; "
            f"Kubernetes API {cluster['base']}, Prometheus {cluster['prometheus_url']}"
        )
        url = args.database_url or f"sqlite:///{work / 'lens.db'}"
        if not args.watch_cache:
            labels = ("first run",) if args.first_only else ("first run", "no-change run")
            return run(cluster, [(label, url) for label in labels], args.assets, [s.pid for s in sims])
        # Nothing kept from the start: the first run meets a cold cache (a collection lens watch
        # does not keep from its start, or a run as it starts). `warm_start` times the default.
        watch = start_watch_cache(cluster["registry"], warm="")
        sims.append(watch)
        os.environ["LENS_WATCH_CACHE_URL"] = watch.url  # type: ignore[attr-defined]
        steps = [
            ("first run, watch cache cold", f"sqlite:///{work / 'cold.db'}"),
            ("first run, watch cache warm", url),
            ("no-change run, watch cache warm", url),
        ]
        listed: set[str] = set()
        ran = run(cluster, steps, args.assets, [s.pid for s in sims[:-1]], watch, listed)
        stop_simulators([sims.pop()])
        warm_start(cluster["registry"], listed)
        return ran
    finally:
        stop_simulators(sims)


def warm_start(registry: Path, listed: set[str]) -> None:
    """A `lens watch` started afresh, as after a restart, keeping what it keeps from its start (its
    default: the nodes, the pods and the owner kinds the cluster serves): how soon it serves the
    nodes and the pods, and all of it, before any run asks; and which of the collections a run
    lists (`listed`, the cold run's) it did not keep, which the first run after a restart finds cold."""
    started = time.monotonic()
    watch = start_watch_cache(registry)
    try:
        nodes_and_pods, everything, kept = None, None, set()
        while everything is None and time.monotonic() - started < 600:
            served, queued = served_collections(watch)
            now = time.monotonic() - started
            if nodes_and_pods is None and served.get("/api/v1/nodes") and served.get("/api/v1/pods"):
                nodes_and_pods = now
            if nodes_and_pods is not None and not queued and all(served.values()):
                everything, kept = now, set(served)
            time.sleep(0.2)
        if everything is None:
            raise SystemExit("the fresh lens watch did not serve what it keeps from its start in time")
        cold = sorted(listed - kept)
        print(
            f"lens watch started afresh: it served the nodes and the pods {nodes_and_pods:.1f} s after it was"
            f" started, all {len(kept)} collections it keeps from its start {everything:.1f} s after"
            f" (CPU {process_cpu_seconds(watch.pid):.2f} s, peak RSS {peak_rss_mib(watch.pid):.0f} MiB);"
            f" of the {len(listed)} collections the cold run listed, "
            + (f"not kept from its start: {', '.join(cold)}" if cold else "every one kept from its start")
        )
    finally:
        stop_simulators([watch])


def start_watch_cache(registry: Path, warm: str | None = None) -> subprocess.Popen:
    """`lens watch` on a free port, reading `registry`; its URL as `.url`. `warm`: its `--warm`."""
    import socket

    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
    watch = subprocess.Popen(
        [sys.executable, "-m", "lens_pipeline.cli", "watch", "--registry", str(registry), "--host", "127.0.0.1",
         "--port", str(port), *(() if warm is None else ("--warm", warm))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    watch.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{watch.url}/healthz", timeout=2).read()  # type: ignore[attr-defined]
            return watch
        except OSError:
            if watch.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("lens watch did not start") from None
            time.sleep(0.2)


def served_collections(watch: subprocess.Popen) -> tuple[dict[str, bool], bool]:
    """From lens watch's /metrics: whether each collection it keeps is served, by path, and whether
    some it keeps from its start are still queued to be listed."""
    text = urllib.request.urlopen(f"{watch.url}/metrics", timeout=10).read().decode()  # type: ignore[attr-defined]
    served = {
        line.split('path="')[1].split('"')[0]: line.endswith(" 1")
        for line in text.splitlines()
        if line.startswith("lens_watch_cache_served{")
    }
    return served, "\nlens_watch_cache_warm_queued 0\n" not in text


def wait_until_served(watch: subprocess.Popen, timeout: float = 600, started: float | None = None) -> float:
    """Seconds until the cache serves every collection it keeps (since `started`, time.monotonic())."""
    started = time.monotonic() if started is None else started
    while time.monotonic() - started < timeout:
        served, queued = served_collections(watch)
        if served and not queued and all(served.values()):
            return time.monotonic() - started
        time.sleep(0.5)
    raise SystemExit("the watch cache did not serve everything in time")


def run(
    cluster: dict,
    steps: list[tuple[str, str]],
    asset_names: list[str],
    simulator_pids: list[int],
    watch: subprocess.Popen | None = None,
    listed: set[str] | None = None,
) -> int:
    """Each (label, database URL) of `steps` collected once, in order; with `watch`, the first step
    lists from the API server (the cache is cold), and the others wait until it serves everything.
    `listed` is given the paths the cold run listed (whole collections, not Prometheus)."""
    from dagster import AssetKey, instance_for_test, materialize

    from lens_pipeline.defs import resources
    from lens_pipeline.defs.cluster_assets import cluster_assets
    from lens_pipeline.defs.resources import ClusterRegistryResource, LensDatabase

    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", [cluster["name"]])
        summary: list[tuple[str, float, float, float, float]] = []
        print(f"{', '.join(asset_names)}; database {steps[0][1].split(':')[0]}")
        cold_requests: list[tuple[str, str]] | None = None
        for number, (label, url) in enumerate(steps):
            if watch is not None and number:
                print(f"  (the watch cache served everything after {wait_until_served(watch):.1f} s more)")
            watch_cpu = process_cpu_seconds(watch.pid) if watch is not None else 0.0
            for base in bases(cluster):
                requests_seen(base, reset=True)
            started = time.perf_counter()
            cpu_before = _cpu_seconds()
            # The database server's CPU (SQLite's is the collector's own).
            dialect = url.split(":")[0].split("+")[0]
            server = DATABASE_SERVERS.get(dialect, (None,))[0]
            others_before = _others_cpu(simulator_pids, dialect)
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
                for after, before in zip(_others_cpu(simulator_pids, dialect), others_before, strict=True)
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
            counts: dict[str, int] = {}
            for base in bases(cluster):
                for path, n in requests_seen(base).items():
                    counts[path] = counts.get(path, 0) + n
            kube = sum(n for p, n in counts.items() if "/prometheus/" not in p)
            prom = sum(n for p, n in counts.items() if "/prometheus/" in p)
            print(
                f"  {label}: wall {wall:.2f} s, cpu {cpu:.2f} s, peak RSS {peak:.0f} MiB, Kubernetes requests {kube}, "
                f"Prometheus queries {prom}; {'; '.join(f'{k}: {v}' for k, v in rows.items())}"
            )
            watched = (
                f", of lens watch {process_cpu_seconds(watch.pid) - watch_cpu:.2f} s"
                f" (its peak RSS {peak_rss_mib(watch.pid):.0f} MiB)"
                if watch
                else ""
            )
            print(
                f"    cpu of the simulator(s) {simulator_cpu:.2f} s"
                f"{f', of {server} {database_cpu:.2f} s' if server else ''}{watched}; "
                f"machine busy {machine_busy:.2f} s of {CORES * wall:.2f} core-seconds ({CORES} cores)"
            )
            print(f"    requests: {json.dumps(counts)}")
            made = [r for base in bases(cluster) for r in requests_made(base)]
            if watch is not None:  # the cold run's requests are the API server's whole read
                cold_requests = cold_requests or made
                made = cold_requests
                if listed is not None:
                    listed |= {p for p, q in made if "limit=" in q and "/prometheus/" not in p}
            kube_floor, prom_floor = bare_read(cluster, made)
            floor = kube_floor + prom_floor
            summary.append((label, wall, kube_floor, floor, peak))
            print(
                f"    bare read: Kubernetes {kube_floor:.2f} s (run / bare read {wall / kube_floor:.2f}x), "
                f"with the Prometheus answers {floor:.2f} s ({wall / floor:.2f}x)"
            )
    for label, wall, kube_floor, floor, peak in summary:
        print(
            f"{label}: {wall / kube_floor:.2f}x the bare Kubernetes read ({wall:.2f} s / {kube_floor:.2f} s), "
            f"{wall / floor:.2f}x with Prometheus ({floor:.2f} s); peak RSS {peak:.0f} MiB"
        )
    return 0


def _cpu_seconds() -> float:
    """This process's user + system CPU time: unlike wall time, barely moved by other processes'
    load on the machine (the simulator's own work is not in it)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _others_cpu(simulator_pids: list[int], dialect: str) -> tuple[float, float, float]:
    """CPU seconds of the simulators and of the local server of `dialect` so far, and the whole
    machine's busy seconds: on a small machine they compete with the collectors for the same cores."""
    simulators = sum(map(process_cpu_seconds, simulator_pids))
    return simulators, database_cpu_seconds(dialect), machine_busy_seconds()


if __name__ == "__main__":
    sys.exit(main())
