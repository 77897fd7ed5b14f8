"""Benchmark: the original's call pattern against ours, on the same simulated cluster, in one run.

The original (spec §3 live path, §4.2, §4.3, §4.6, §5) asked the API server per object: each GPU
node GET, each node's pods (the kubelet `/pods` call, here a LIST filtered by `spec.nodeName`),
each GPU pod GET, and each owner of each pod's chain GET. Ours is one paged LIST per kind.

    .venv/bin/python bench/bench_original_pattern.py [--nodes 1000 --pods-per-node 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from lens_pipeline.vendors import GpuResources, gpu_resources

sys.path.insert(0, str(Path(__file__).parent))
from bench_collectors import requests_seen, start_simulator


def original_pattern(cluster_config, resources: GpuResources) -> int:
    """Reads what the original read for nodes, pods and owner chains, one object at a time."""
    from lens_pipeline.collect.objects import KindRef, owner_ref
    from lens_pipeline.collect.owners import plurals_from_discovery
    from lens_pipeline.collect.pods import project_gpu_pod
    from lens_pipeline.kube.reader import KubeReader

    plurals: dict[str, dict] = {}
    with KubeReader(cluster_config, page_size=100_000) as kube:
        names = [n["metadata"]["name"] for n in kube.list("/api/v1/nodes", lambda o: o)]
        gpu_pods = 0
        for name in names:
            kube.get(f"/api/v1/nodes/{name}")  # node info (§4.3)
            on_node = kube.list(
                "/api/v1/pods", lambda o: o, field_selector=f"spec.nodeName={name}"
            )  # kubelet /pods
            for pod in on_node:
                if project_gpu_pod(pod, resources) is None:
                    continue
                gpu_pods += 1
                metadata = kube.get(
                    f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"
                )
                namespace = pod["metadata"]["namespace"]
                for _ in range(8):  # owner chain, one GET per owner (§4.2, §5)
                    ref = owner_ref((metadata or {}).get("metadata") or {})
                    if ref is None:
                        break
                    kind: KindRef = ref.kind_ref
                    if kind.group_version not in plurals:
                        path = "/api/v1" if kind.group_version == "v1" else f"/apis/{kind.group_version}"
                        plurals[kind.group_version] = plurals_from_discovery(
                            kind.group_version, kube.get(path) or {}
                        )
                    plural = plurals[kind.group_version].get(kind.kind)
                    if plural is None:
                        break
                    prefix = "/api/v1" if kind.group_version == "v1" else f"/apis/{kind.group_version}"
                    scope = f"/namespaces/{namespace}" if plural[1] else ""
                    metadata = kube.get(f"{prefix}{scope}/{plural[0]}/{ref.name}")
                    if metadata is None:
                        break
        return gpu_pods


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods-per-node", type=float, default=10.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-original-"))
    sim, cluster = start_simulator(work, args.nodes, args.pods_per_node)
    try:
        from dagster import AssetKey, instance_for_test, materialize

        from lens_pipeline.defs import resources
        from lens_pipeline.defs.cluster_assets import cluster_assets
        from lens_pipeline.defs.resources import ClusterRegistryResource, LensDatabase

        registry = ClusterRegistryResource(clusters_file=str(cluster["registry"]))
        config = registry.cluster(cluster["name"])
        requests_seen(cluster["base"], reset=True)
        started = time.perf_counter()
        gpu_pod_count = original_pattern(config, gpu_resources("amd"))
        theirs_seconds = time.perf_counter() - started
        theirs = sum(n for p, n in requests_seen(cluster["base"]).items() if "/prometheus/" not in p)

        with instance_for_test() as instance:
            instance.add_dynamic_partitions("cluster", [cluster["name"]])
            requests_seen(cluster["base"], reset=True)
            started = time.perf_counter()
            # The three collectors of the multi-asset every run uses (one cluster's turn).
            materialize(
                [cluster_assets],
                selection=[AssetKey(k) for k in ("gpu_nodes", "gpu_pods", "gpu_workloads")],
                partition_key=cluster["name"],
                instance=instance,
                resources={
                    **resources.defs.resources,
                    "registry": registry,
                    "lens_db": LensDatabase(url=f"sqlite:///{work / 'lens.db'}"),
                },
            )
            ours_seconds = time.perf_counter() - started
        ours = sum(n for p, n in requests_seen(cluster["base"]).items() if "/prometheus/" not in p)
        print(f"{args.nodes} GPU nodes, {gpu_pod_count} GPU pods")
        print(
            f"  original pattern: {theirs} Kubernetes requests, {theirs_seconds:.1f} s (reads only, no writes)"
        )
        print(
            f"  lens-pipeline:    {ours} Kubernetes requests, {ours_seconds:.1f} s "
            f"(gpu_nodes + gpu_pods + gpu_workloads, through Dagster, writing SQLite)"
        )
        print(
            f"  ratio: {theirs / ours:.0f}x fewer requests, {theirs_seconds / ours_seconds:.1f}x less wall time"
        )
    finally:
        sim.terminate()
        sim.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
