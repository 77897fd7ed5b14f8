"""`lens sim`: serve a simulated fleet over HTTP and write the registry the pipeline reads."""

from __future__ import annotations

import argparse
import gc
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from lens_pipeline.sim.dialects import DIALECT_CHOICES
from lens_pipeline.sim.fleet import GENERATION_EPOCH, SimFleet
from lens_pipeline.sim.registry import write_prometheus_configs, write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.sim.vendors import VENDORS

SWITCH_INTERVAL_SECONDS = 0.001


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lens sim", description="Serve a fleet of simulated GPU clusters.")
    parser.add_argument("--clusters", type=int, default=2, help="number of clusters (default 2)")
    parser.add_argument(
        "--nodes",
        type=_node_mix,
        default=[10],
        help="GPU nodes per cluster, or a comma-separated mix taken in turn, e.g. 10,100,1000 (default 10)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed; same seed, same fleet (default 0)")
    parser.add_argument(
        "--vendor",
        choices=("amd", "nvidia", "mixed"),
        default="mixed",
        help="GPU vendor of the clusters; mixed alternates (default mixed)",
    )
    parser.add_argument(
        "--dialect",
        default="shipped",
        metavar="{" + ",".join(DIALECT_CHOICES) + "}",
        help="how the exporters and scrape configs speak (metric prefix, honor_labels: false, the node "
        "by instance only, older GFD labels, JuiceFS without quota, dcgm-exporter's hostname, all of "
        "them); mixed: each in turn; a,b: those in turn (default shipped)",
    )
    parser.add_argument(
        "--pods-per-node", type=float, default=2.0, help="workload pods per GPU node (default 2)"
    )
    parser.add_argument(
        "--pods",
        type=int,
        default=None,
        metavar="N",
        help="pods per cluster in all, DaemonSet pods included (overrides --pods-per-node)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: any free port)")
    parser.add_argument(
        "--continue-ttl",
        type=float,
        default=300.0,
        help="seconds a list continue token stays valid (default 300)",
    )
    parser.add_argument(
        "--registry-out", metavar="FILE", help="write the cluster registry (and kubeconfigs) here"
    )
    parser.add_argument(
        "--prometheus-config",
        metavar="DIR",
        help="write prometheus-<cluster>.yml for a real Prometheus per cluster to scrape the exporters",
    )
    parser.add_argument(
        "--churn",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="step every cluster's churn (pods, workloads, nodes, GPUs, NICs change) every SECONDS",
    )
    parser.add_argument(
        "--history",
        action="store_true",
        help="record every change, so that Prometheus answers range queries over past hours as the "
        "clusters were then (what the hourly history reads)",
    )
    parser.add_argument(
        "--epoch",
        type=_epoch,
        default=GENERATION_EPOCH,
        metavar="WHEN",
        help="generate the clusters as they stand at this past instant, ISO 8601 (UTC unless it says "
        "otherwise): objects made and workloads started up to weeks or months before it "
        "(default 2025-06-01, fixed: same seed, same bytes)",
    )
    parser.add_argument(
        "--gpu-resource",
        type=_gpu_resource,
        action="append",
        default=[],
        metavar="VENDOR=RESOURCE",
        help="advertise and request that vendor's GPUs as RESOURCE instead of the whole-GPU one, as a "
        "device plugin's strategy does: nvidia=nvidia.com/mig-3g.40gb (MIG, mixed strategy), "
        "amd=amd.com/cpx_nps4 (partitions, mixed naming), nvidia=nvidia.com/gpu.shared (renamed "
        "time-slicing); repeatable, one per vendor",
    )
    parser.add_argument(
        "--no-managed-fields",
        action="store_true",
        help="objects without the metadata.managedFields kube-apiserver writes (smaller, less real)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="serve HTTPS from a fresh CA written into the kubeconfigs (kubectl sends tokens only over TLS)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    fleet = SimFleet.generate(
        args.clusters,
        args.nodes,
        args.seed,
        args.vendor,
        args.pods_per_node,
        pods=args.pods,
        continue_ttl=args.continue_ttl,
        dialect=args.dialect,
        history=args.history,
        managed_fields=not args.no_managed_fields,
        epoch=args.epoch,
        gpu_resources=dict(args.gpu_resource),
    )
    generated = time.perf_counter() - started
    # The fleet lives until exit; frozen, the cyclic GC stops rescanning its millions of objects on
    # every request, which otherwise costs more than answering (a 5,000-node query: 0.75 s -> 0.25 s).
    gc.freeze()
    # One process serves what are separate servers in a real cluster (kube-apiserver, Prometheus):
    # a client asking both at once, as a collector does, would see each Kubernetes page wait behind
    # PromQL evaluations for the GIL in the default 5 ms slices, a queue no real pair of servers
    # has. At 5,000 nodes the pod LIST took 2.5 s longer while device queries were evaluated.
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    server = SimServer(fleet, host=args.host, port=args.port, tls=args.tls).start()
    stopped = threading.Event()
    if args.churn > 0:
        threading.Thread(
            target=churn_forever, args=(fleet, args.churn, stopped), name="lens-sim-churn", daemon=True
        ).start()
    # SIGTERM (docker stop, kill) ends the process as cleanly as Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if a shell started us ignoring it
    try:
        if args.registry_out:
            print(f"registry: {write_registry(args.registry_out, server)}")
        if args.prometheus_config:
            for path in write_prometheus_configs(args.prometheus_config, server):
                print(f"prometheus config: {path}")
        print(f"generated in {generated:.1f} s")
        for cluster in fleet:
            print(
                f"{cluster.name} ({cluster.vendor}, {cluster.dialect.name} exporters, {len(cluster.node_names())} GPU nodes): "
                f"{server.base_url(cluster.name)}"
            )
        print("serving; Ctrl-C to stop", flush=True)
        while not stopped.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def _node_mix(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number or numbers separated by commas, got {text!r}"
        ) from None
    if any(n < 0 for n in counts):
        raise argparse.ArgumentTypeError("node counts must be non-negative")
    return counts


def _gpu_resource(text: str) -> tuple[str, str]:
    vendor, _, resource = text.partition("=")
    if vendor not in VENDORS or not VENDORS[vendor].counts_as_gpus(resource):
        raise argparse.ArgumentTypeError(
            f"expected VENDOR=RESOURCE with a GPU resource of that vendor (nvidia=nvidia.com/mig-1g.10gb, "
            f"amd=amd.com/cpx_nps4), got {text!r}"
        )
    return vendor, resource


def _epoch(text: str) -> float:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 date or time, got {text!r}") from None
    epoch = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    if epoch > time.time():
        raise argparse.ArgumentTypeError(
            f"{text} is in the future: clusters are generated as of a past instant"
        )
    return epoch


def churn_forever(fleet: SimFleet, seconds: float, stopped: threading.Event) -> None:
    """Step every cluster's churn every `seconds` until `stopped` is set (run it in a thread)."""
    while not stopped.wait(seconds):
        fleet.churn(1)


if __name__ == "__main__":
    sys.exit(main())
