"""Seeded generation of a simulated cluster's starting state: GPU and CPU nodes with their devices
and NICs, namespaces, JuiceFS storage, the DaemonSets every node runs, and workloads up to a pod count."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime
from typing import Any

from lens_pipeline.sim import catalog
from lens_pipeline.sim.catalog import SAFE_WORKSPACES, SPAWN_WEIGHTS, WORKLOAD_NAMESPACES
from lens_pipeline.sim.kubeobjects import (
    NODE_ANNOTATIONS,
    base_node_labels,
    juicefs_storage_class,
    local_storage_class,
    namespace_object,
    new_uid,
    node_addresses,
    node_conditions,
    node_info,
    readiness_taints,
    rfc3339,
    secret_object,
)
from lens_pipeline.sim.nics import node_nics
from lens_pipeline.sim.state import ClusterState, NodeGpus
from lens_pipeline.sim.vendors import GpuDevice
from lens_pipeline.sim.workloads import Controllers

# Generated timestamps count back from an instant, by default this fixed one, so that the same seed
# gives byte-identical objects; the demo moves it near its start (`SimCluster(..., epoch=)`).
GENERATION_EPOCH = datetime(2025, 6, 1, tzinfo=UTC).timestamp()
KUBE_VERSION = "v1.30.4"
LAGGING_KUBE_VERSION = "v1.29.8"
NICS_PER_GPU_NODE = 8
# Share of new workloads that come through SaFE (a Workload above a PyTorchJob or Deployment).
SAFE_SHARE = 0.1
# (kind, outcome) of the first workloads, None for a random draw.
FIRST_ROUND: tuple[tuple[str, str | None], ...] = (
    ("pytorchjob", "Running"),
    ("deployment", "Running"),
    ("job", "Pending"),
    ("mpijob", "Failed"),
    ("rayjob", "Succeeded"),
    ("cronjob", None),
    ("statefulset", "Running"),
    ("safe", None),
    ("pod", None),
    ("rayservice", "Running"),
)
# (namespace, secret, JuiceFS volume name, StorageClass): the volumes every cluster mounts.
JUICEFS_VOLUMES = (
    ("juicefs", "juicefs-secret-data", "primus-data", "juicefs-data"),
    ("juicefs", "juicefs-secret-ckpt", "primus-ckpt", "juicefs-ckpt"),
)


def populate(
    state: ClusterState,
    rng: random.Random,
    *,
    gpu_nodes: int,
    cpu_nodes: int,
    gpus_per_node: int,
    workload_pods: int | None,
    total_pods: int | None,
    epoch: float = GENERATION_EPOCH,
) -> None:
    """Fill an empty cluster as it stands at `epoch` (every object made, and every workload
    started or ended, by then). `total_pods` (DaemonSet pods included) wins over `workload_pods`."""
    for i in range(gpu_nodes):
        _gpu_node(state, rng, f"{state.name}-gpu-{i + 1:05d}", i + 1, gpus_per_node, epoch)
    for j in range(cpu_nodes):
        _cpu_node(state, rng, f"{state.name}-cpu-{j + 1:03d}", 60001 + j, epoch)
    _namespaces(state, rng, epoch)
    _storage(state, rng, epoch)
    ctl = Controllers(state, rng)
    profile = state.profile
    all_nodes = sorted(state.node_index)
    with state.staging(), ctl.deferred_status():
        made = 0
        for name, namespace, nodes, image in (
            ("kube-proxy", "kube-system", all_nodes, "registry.k8s.io/kube-proxy:v1.30.4"),
            ("node-exporter", "monitoring", all_nodes, "quay.io/prometheus/node-exporter:v1.8.1"),
            (
                profile.exporter_job,
                profile.exporter_namespace,
                state.gpu_node_names(),
                profile.exporter_image,
            ),
        ):
            made += len(catalog.spawn_daemonset(ctl, name, namespace, nodes, image, epoch).pods)
        target = total_pods - made if total_pods is not None else workload_pods or 0
        kinds, weights = list(SPAWN_WEIGHTS), list(SPAWN_WEIGHTS.values())
        # One of every kind (and pods in every phase) first, so that even a small cluster shows them all.
        first_round = list(FIRST_ROUND)
        made = 0
        while made < target:
            kind, outcome = first_round.pop(0) if first_round else (None, None)
            if target - made <= 2:
                spawned = catalog.spawn(ctl, "pod", epoch)  # lands the count exactly
            elif kind == "safe" or (kind is None and rng.random() < SAFE_SHARE):
                spawned = catalog.spawn_safe_workload(ctl, epoch, outcome, state.name)
            else:
                spawned = catalog.spawn(ctl, kind or rng.choices(kinds, weights)[0], epoch, outcome)
            made += len(spawned.pods)
    # Busy devices drew their utilization when assigned; idle ones mostly read 0, sometimes a blip.
    for gpus in state.gpus.values():
        for index, owner in enumerate(gpus.owners):
            if owner is None and rng.random() < 0.5:
                gpus.utilization[index] = round(rng.uniform(0.0, 4.0), profile.util_decimals)
    state.changed()


def _gpu_node(
    state: ClusterState, rng: random.Random, name: str, index: int, gpus_per_node: int, epoch: float
) -> None:
    profile = state.profile
    product = rng.choices(profile.products, weights=[p.weight for p in profile.products])[0]
    draw = rng.random()
    ready = draw >= 0.03
    cordoned = 0.03 <= draw < 0.05
    kubelet = LAGGING_KUBE_VERSION if rng.random() < 0.1 else KUBE_VERSION
    created = epoch - rng.uniform(30, 400) * 86400
    transition = epoch - rng.uniform(600, 30 * 86400)
    devices = [
        GpuDevice(i, str(uuid.UUID(int=rng.getrandbits(128))), f"{rng.getrandbits(48):012X}")
        for i in range(gpus_per_node)
    ]
    labels = base_node_labels(name, index)
    labels[profile.product_label] = product.node_label
    if state.dialect.legacy_gfd and profile.legacy_driver_labels:
        # GPU feature discovery before v0.15.0: the version in parts, no `.full` label.
        labels.update(zip(profile.legacy_driver_labels, profile.driver_version.split("."), strict=True))
    else:
        labels[profile.driver_label] = profile.driver_version
    labels.update(profile.extra_node_labels(product, gpus_per_node))
    taints: list[dict[str, Any]] = []
    if rng.random() < 0.2:
        taints.append({"key": profile.taint_key, "value": "present", "effect": "NoSchedule"})
    if cordoned:
        taints.append(
            {
                "key": "node.kubernetes.io/unschedulable",
                "effect": "NoSchedule",
                "timeAdded": rfc3339(transition),
            }
        )
    taints = readiness_taints(taints, ready, transition)
    cpu = "192" if profile.name == "amd" else "224"
    memory_ki = 2113 * 1024 * 1024 - rng.randint(0, 60000)
    node = _node_object(
        state,
        rng,
        name,
        index,
        created,
        labels,
        taints,
        ready,
        transition,
        kubelet,
        cpu,
        memory_ki,
        {profile.resource: str(gpus_per_node)},
        epoch,
    )
    if cordoned:
        node["spec"]["unschedulable"] = True
    state.gpus[name] = NodeGpus(product, devices, [0.0] * len(devices), [None] * len(devices))
    state.nics[name] = node_nics(rng, NICS_PER_GPU_NODE)
    state.put("nodes", node)


def _cpu_node(state: ClusterState, rng: random.Random, name: str, index: int, epoch: float) -> None:
    created = epoch - rng.uniform(30, 400) * 86400
    labels = base_node_labels(name, index)
    labels["node-role.kubernetes.io/control-plane"] = ""
    memory_ki = 512 * 1024 * 1024 - rng.randint(0, 60000)
    node = _node_object(
        state, rng, name, index, created, labels, [], True, created, KUBE_VERSION, "64", memory_ki, {}, epoch
    )
    state.put("nodes", node)


def _node_object(
    state: ClusterState,
    rng: random.Random,
    name: str,
    index: int,
    created: float,
    labels: dict[str, str],
    taints: list[dict[str, Any]],
    ready: bool,
    transition: float,
    kubelet: str,
    cpu: str,
    memory_ki: int,
    resources: dict[str, str],
    heartbeat: float,
) -> dict[str, Any]:
    addresses, cidr = node_addresses(index, name)
    state.node_index[name] = index
    capacity = {
        "cpu": cpu,
        "ephemeral-storage": "3750686856Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": f"{memory_ki}Ki",
        "pods": "110",
        **resources,
    }
    allocatable = {
        **capacity,
        "cpu": f"{int(cpu) * 1000 - 500}m",
        "ephemeral-storage": "3456622272334",
        "memory": f"{memory_ki - 10 * 1024 * 1024}Ki",
    }
    spec: dict[str, Any] = {"podCIDR": cidr, "podCIDRs": [cidr]}
    if taints:
        spec["taints"] = taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": new_uid(rng),
            "resourceVersion": "",
            "creationTimestamp": rfc3339(created),
            "labels": labels,
            "annotations": dict(NODE_ANNOTATIONS),
        },
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": node_conditions(ready, heartbeat, transition),
            "addresses": addresses,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": node_info(rng, kubelet),
        },
    }


def _namespaces(state: ClusterState, rng: random.Random, epoch: float) -> None:
    created = epoch - 400 * 86400
    names = {
        "default",
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "monitoring",
        "juicefs",
        state.profile.exporter_namespace,
        *WORKLOAD_NAMESPACES,
        *SAFE_WORKSPACES,
    }
    for name in sorted(names):
        state.put("namespaces", namespace_object(name, new_uid(rng), created))


def _storage(state: ClusterState, rng: random.Random, epoch: float) -> None:
    created = epoch - 300 * 86400
    for index, (namespace, secret, volume, storage_class) in enumerate(JUICEFS_VOLUMES):
        data = {
            "name": volume,
            "metaurl": f"redis://juicefs-meta.{namespace}.svc.cluster.local:6379/{index + 1}",
            "storage": "s3",
            "bucket": f"https://s3.us-west-2.amazonaws.com/lens-sim-{volume}",
        }
        state.put("secrets", secret_object(secret, namespace, new_uid(rng), created, data))
        state.put(
            "storageclasses",
            juicefs_storage_class(
                storage_class, new_uid(rng), created, namespace, secret, default=index == 0
            ),
        )
    state.put("storageclasses", local_storage_class("local-path", new_uid(rng), created))
    state.put(
        "secrets", secret_object("wandb-config", "ml-train", new_uid(rng), created, {"entity": "lens-sim"})
    )
