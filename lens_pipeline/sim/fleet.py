"""Simulated GPU clusters: seeded generation of real-shaped Kubernetes Node and Pod objects and
per-GPU exporter samples, plus the mutations tests and the demo apply to them."""

from __future__ import annotations

import copy
import gc
import hashlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from lens_pipeline.sim.kubeobjects import (
    NODE_ANNOTATIONS,
    Owner,
    base_node_labels,
    container_spec,
    new_uid,
    node_addresses,
    node_conditions,
    node_info,
    parse_time,
    pod_status,
    readiness_taints,
    rfc3339,
    stable_hash,
    suffix,
    tolerations,
)
from lens_pipeline.sim.objects import ListSnapshot, ObjectStore, StoredObject
from lens_pipeline.sim.truth import (
    ACTIVE_PHASES,
    cluster_truth,
    container_gpu_request,
    node_ready_status,
    pod_gpu_request,
)
from lens_pipeline.sim.vendors import VENDORS, GpuDevice, GpuProduct
from lens_pipeline.sim.wire import RequestLog

# Generated timestamps count back from a fixed instant so the same seed gives byte-identical objects.
GENERATION_EPOCH = datetime(2025, 6, 1, tzinfo=UTC).timestamp()
KUBE_VERSION = "v1.30.4"
LAGGING_KUBE_VERSION = "v1.29.8"
GPUS_PER_NODE = 8
CPU_NODES = 2
CONTINUE_TTL_SECONDS = 300.0
PHASES = ("Pending", "Running", "Succeeded", "Failed")
WORKLOAD_NAMESPACES = ("ml-train", "ml-infer", "research", "default")
WORKLOAD_NAMES = ("llama-pretrain", "mixtral-sft", "bert-finetune", "vllm-serve", "sd-train", "eval-harness")
# Mutations reachable through POST <base>/_control.
CONTROL_ACTIONS = frozenset(
    {
        "set_node_ready",
        "remove_node",
        "add_gpu_pod",
        "set_pod_phase",
        "remove_pod",
        "inject_raw_node",
        "set_fault",
        "expire_continue_tokens",
        "set_gpu_utilization",
    }
)
FAULT_TARGETS = ("kube", "prometheus")

Sample = tuple[str, dict[str, str], float]
T = TypeVar("T")


@dataclass
class NodeGpus:
    """Per-GPU state of one simulated GPU node."""

    product: GpuProduct
    devices: list[GpuDevice]
    utilization: list[float]
    # (namespace, pod, container) of the running container holding each device, or None.
    owners: list[tuple[str, str, str] | None]


# -- the cluster -------------------------------------------------------------------------------


class SimCluster:
    """One fake GPU cluster. All state changes go through its methods, under its lock."""

    def __init__(
        self,
        name: str,
        vendor: str,
        nodes: int,
        seed: int,
        pods_per_node: float = 2.0,
        *,
        gpus_per_node: int = GPUS_PER_NODE,
        cpu_nodes: int = CPU_NODES,
        continue_ttl: float = CONTINUE_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if vendor not in VENDORS:
            raise ValueError(f"cluster {name!r}: vendor must be one of {sorted(VENDORS)}, got {vendor!r}")
        self.name = name
        self.vendor = vendor
        self.profile = VENDORS[vendor]
        self.seed = seed
        self.gpus_per_node = gpus_per_node
        self.continue_ttl = continue_ttl
        self.kube_version = KUBE_VERSION
        # Derived, not random, so a registry written twice for the same fleet is identical.
        self.token = hashlib.sha256(f"lens-sim:{seed}:{name}".encode()).hexdigest()[:40]
        self.request_log = RequestLog()
        self._clock = clock
        self._rng = random.Random(seed + stable_hash(name))
        self._lock = threading.RLock()
        self._resource_version = 0
        self._version = 0  # bumps on every change, including samples, to invalidate cached series
        self._stores = {"nodes": ObjectStore("nodes"), "pods": ObjectStore("pods")}
        self._gpus: dict[str, NodeGpus] = {}
        self._node_index: dict[str, int] = {}
        self._raw_nodes: set[str] = set()
        self._pods_on_node: dict[str, set[str]] = {}
        self._pod_ip_serial: dict[str, int] = {}
        self._faults: dict[str, int | None] = dict.fromkeys(FAULT_TARGETS)
        self._memo: dict[str, tuple[int, Any]] = {}
        # Generation allocates millions of acyclic dicts; cyclic GC passes over them cost ~40% of the time.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._generate(nodes, cpu_nodes, pods_per_node)
        finally:
            if gc_was_enabled:
                gc.enable()

    def __repr__(self) -> str:
        return f"SimCluster({self.name!r}, vendor={self.vendor!r}, nodes={len(self._gpus)})"

    # -- reading -------------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    @property
    def resource_version(self) -> int:
        return self._resource_version

    def node_names(self) -> list[str]:
        """Names of the simulated GPU nodes, sorted."""
        with self._lock:
            return sorted(self._gpus)

    def get_object(self, kind: str, key: str) -> StoredObject | None:
        with self._lock:
            return self._stores[kind].get(key)

    def node(self, name: str) -> dict[str, Any]:
        """A deep copy of a node object (mutating it does not change the cluster)."""
        return copy.deepcopy(self._require(self._stores["nodes"], name, "node").obj)

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self._require(self._stores["pods"], f"{namespace}/{name}", "pod").obj)

    def node_address(self, name: str) -> str:
        """InternalIP of a simulated node ("" when unknown), as the exporter's scrape address."""
        with self._lock:
            entry = self._stores["nodes"].get(name)
            addresses = (
                entry.obj.get("status", {}).get("addresses", []) if entry and name in self._node_index else []
            )
            return next((a["address"] for a in addresses if a.get("type") == "InternalIP"), "")

    def pods_on_node(self, node: str) -> list[str]:
        """`namespace/name` keys of the pods bound to `node`, sorted."""
        with self._lock:
            return sorted(self._pods_on_node.get(node, ()))

    def list_snapshot(self, kind: str) -> ListSnapshot:
        with self._lock:
            return self._stores[kind].snapshot(self._resource_version, self.now(), self.continue_ttl)

    def find_snapshot(self, kind: str, snapshot_id: int) -> ListSnapshot | None:
        with self._lock:
            return self._stores[kind].find_snapshot(snapshot_id, self.now(), self.continue_ttl)

    def fault(self, target: str) -> int | None:
        return self._faults[target]

    def gpu_utilization_samples(self) -> dict[str, list[float]]:
        """Per-GPU utilization of every node whose exporter is up (a NotReady node's is down)."""
        with self._lock:
            return {
                name: list(gpus.utilization) for name, gpus in self._gpus.items() if self._exporter_up(name)
            }

    def memo(self, name: str, build: Callable[[], T]) -> T:
        """A value derived from the cluster's state, rebuilt only after the state changed."""
        with self._lock:
            hit = self._memo.get(name)
            if hit is not None and hit[0] == self._version:
                return hit[1]
            value = build()
            self._memo[name] = (self._version, value)
            return value

    def exporter_samples(self) -> list[Sample]:
        """(metric, labels, value) of every exporter series, as the per-node exporters expose them.
        Shared and cached: callers must not modify it."""
        return self.memo("exporter_samples", self._build_exporter_samples)

    def _build_exporter_samples(self) -> list[Sample]:
        with self._lock:
            profile = self.profile
            samples: list[Sample] = []
            for name in sorted(self._gpus):
                if not self._exporter_up(name):
                    continue
                gpus = self._gpus[name]
                for device, value, owner in zip(gpus.devices, gpus.utilization, gpus.owners, strict=True):
                    labels = profile.device_labels(name, device, gpus.product, profile.driver_version)
                    if owner is not None:
                        pod_label, namespace_label, container_label = profile.workload_labels
                        labels.update(
                            {pod_label: owner[1], namespace_label: owner[0], container_label: owner[2]}
                        )
                    samples.append((profile.util_metric, labels, value))
            return samples

    def truth_inputs(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, list[float]]]:
        """Simulated (not injected) node objects, all pod objects and the utilization samples, taken together."""
        with self._lock:
            store = self._stores["nodes"]
            nodes = [store.get(key).obj for key in sorted(self._node_index)]
            return nodes, self._stores["pods"].objects(), self.gpu_utilization_samples()

    def truth(self) -> dict[str, Any]:
        """The ground truth served at `<base>/_truth`."""
        return cluster_truth(self)

    def request_count(self, path_prefix: str | None = None) -> int:
        """Requests answered below the base URL whose path starts with `path_prefix` (simulator endpoints excluded)."""
        return self.request_log.count(path_prefix)

    # -- mutations -----------------------------------------------------------------------------

    def set_node_ready(self, name: str, ready: bool | None) -> None:
        """Ready True/False; None means the kubelet stopped reporting (status Unknown)."""
        with self._lock:
            entry = self._require_simulated_node(name)
            node = copy.deepcopy(entry.obj)
            now = self.now()
            conditions = node["status"]["conditions"]
            previous = next(c for c in conditions if c["type"] == "Ready")
            wanted = {True: "True", False: "False", None: "Unknown"}[ready]
            transition = now if previous["status"] != wanted else parse_time(previous["lastTransitionTime"])
            node["status"]["conditions"] = node_conditions(ready, now, transition)
            taints = readiness_taints(node["spec"].get("taints", []), ready, now)
            if taints:
                node["spec"]["taints"] = taints
            else:
                node["spec"].pop("taints", None)
            self._put_node(name, node)

    def remove_node(self, name: str) -> None:
        """Delete a node (simulated or injected) and every pod bound to it."""
        with self._lock:
            self._require(self._stores["nodes"], name, "node")
            for key in sorted(self._pods_on_node.get(name, ())):
                self._delete_pod(key)
            self._stores["nodes"].remove(name)
            self._next_resource_version()
            self._gpus.pop(name, None)
            self._node_index.pop(name, None)
            self._raw_nodes.discard(name)
            self._pods_on_node.pop(name, None)
            self._changed()

    def add_gpu_pod(self, node: str, gpus: int, phase: str = "Running", namespace: str = "default") -> str:
        """Bind a new Job pod requesting `gpus` GPUs to `node`; returns its name. Refuses to over-allocate."""
        with self._lock:
            self._require_simulated_node(node)
            self._check_phase(phase)
            if phase in ACTIVE_PHASES:
                self._check_fits(node, gpus, f"new pod on {node}")
            rng = self._rng
            job = f"sim-job-{suffix(rng, 6)}"
            owner = Owner("Job", "batch/v1", job, new_uid(rng))
            labels = {
                "batch.kubernetes.io/job-name": job,
                "job-name": job,
                "batch.kubernetes.io/controller-uid": owner.uid,
                "controller-uid": owner.uid,
            }
            name = self._unique_pod_name(namespace, f"{job}-")
            now = self.now()
            self._create_pod(
                name=name,
                namespace=namespace,
                node=node,
                phase=phase,
                owner=owner,
                labels=labels,
                containers=[("main", gpus)],
                init_gpus=0,
                image=self.profile.workload_image,
                created=now,
                started=now,
                changed=now,
                deleting=False,
                restart_policy="Never",
            )
            return name

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> None:
        with self._lock:
            key = f"{namespace}/{name}"
            entry = self._require(self._stores["pods"], key, "pod")
            self._check_phase(phase)
            pod = copy.deepcopy(entry.obj)
            node = pod["spec"].get("nodeName")
            old_phase = pod["status"].get("phase")
            if phase in ACTIVE_PHASES and old_phase not in ACTIVE_PHASES and node:
                self._check_fits(node, pod_gpu_request(pod, self.profile.resource), f"pod {key}")
            if phase != "Pending" and not node:
                raise ValueError(
                    f"cluster {self.name}: pod {key} is not bound to a node, it can only be Pending"
                )
            now = self.now()
            created = parse_time(pod["metadata"]["creationTimestamp"])
            started = parse_time(pod["status"]["startTime"]) if "startTime" in pod["status"] else now
            restarts = {
                s["name"]: s.get("restartCount", 0) for s in pod["status"].get("containerStatuses", [])
            }
            host_ip = pod["status"].get("hostIP", "")
            pod["status"] = pod_status(
                phase,
                pod["spec"],
                created,
                started,
                now,
                pod["status"].get("podIP") or self._pod_ip(node or ""),
                host_ip,
                restarts,
            )
            self._release_devices(key, node)
            self._put_pod(key, pod)
            if phase == "Running":
                self._assign_devices(key, pod)

    def remove_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            key = f"{namespace}/{name}"
            self._require(self._stores["pods"], key, "pod")
            self._delete_pod(key)

    def inject_raw_node(self, obj: dict[str, Any]) -> str:
        """Serve `obj` verbatim in the Node list (for malformed-input tests); it is never in the truth.
        Returns the key it is stored and fetched under."""
        with self._lock:
            metadata = obj.get("metadata") if isinstance(obj, dict) else None
            name = metadata.get("name") if isinstance(metadata, dict) else None
            if not isinstance(name, str) or not name:
                name = f"zz-unnamed-{self._resource_version + 1}"
            if name in self._stores["nodes"]:
                raise ValueError(f"cluster {self.name}: node {name!r} already exists")
            self._next_resource_version()
            self._stores["nodes"].put(name, obj)
            self._raw_nodes.add(name)
            self._changed()
            return name

    def set_fault(self, target: str, status: int | None) -> None:
        """Every request to `target` ("kube" or "prometheus") answers `status` until cleared with None."""
        if target not in FAULT_TARGETS:
            raise ValueError(
                f"cluster {self.name}: fault target must be one of {FAULT_TARGETS}, got {target!r}"
            )
        if status is not None and not 400 <= int(status) <= 599:
            raise ValueError(f"cluster {self.name}: fault status must be an HTTP error code, got {status!r}")
        self._faults[target] = None if status is None else int(status)

    def expire_continue_tokens(self) -> None:
        """Every continue token issued so far answers 410 Gone, as after an etcd compaction."""
        with self._lock:
            for store in self._stores.values():
                store.expire_snapshots()

    def set_gpu_utilization(self, node: str, gpu: int, value: float) -> None:
        with self._lock:
            self._require_simulated_node(node)
            self._gpus[node].utilization[gpu] = round(float(value), self.profile.util_decimals)
            self._changed()

    # -- internals -----------------------------------------------------------------------------

    def _require(self, store: ObjectStore, key: str, what: str) -> StoredObject:
        entry = store.get(key)
        if entry is None:
            raise LookupError(f"cluster {self.name}: {what} {key!r} not found")
        return entry

    def _require_simulated_node(self, name: str) -> StoredObject:
        entry = self._require(self._stores["nodes"], name, "node")
        if name in self._raw_nodes:
            raise ValueError(f"cluster {self.name}: node {name!r} was injected raw and cannot be changed")
        return entry

    def _check_phase(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"cluster {self.name}: phase must be one of {PHASES}, got {phase!r}")

    def _check_fits(self, node: str, gpus: int, what: str) -> None:
        capacity = int(
            self._stores["nodes"].get(node).obj["status"]["capacity"].get(self.profile.resource, 0)
        )
        allocated = self._allocated_gpus(node)
        if allocated + gpus > capacity:
            raise ValueError(
                f"cluster {self.name}: {what} needs {gpus} GPUs but node {node} has "
                f"{capacity - allocated} of {capacity} free"
            )

    def _allocated_gpus(self, node: str) -> int:
        pods = self._stores["pods"]
        total = 0
        for key in self._pods_on_node.get(node, ()):
            pod = pods.get(key).obj
            if pod["status"].get("phase") in ACTIVE_PHASES:
                total += pod_gpu_request(pod, self.profile.resource)
        return total

    def _exporter_up(self, node: str) -> bool:
        return node_ready_status(self._stores["nodes"].get(node).obj) == "Ready"

    def _changed(self) -> None:
        self._version += 1

    def _next_resource_version(self) -> str:
        self._resource_version += 1
        self._changed()
        return str(self._resource_version)

    def _put_node(self, name: str, node: dict[str, Any]) -> None:
        node["metadata"]["resourceVersion"] = self._next_resource_version()
        self._stores["nodes"].put(name, node)

    def _put_pod(self, key: str, pod: dict[str, Any]) -> None:
        pod["metadata"]["resourceVersion"] = self._next_resource_version()
        self._stores["pods"].put(key, pod)
        node = pod["spec"].get("nodeName")
        if node:
            self._pods_on_node.setdefault(node, set()).add(key)

    def _delete_pod(self, key: str) -> None:
        pod = self._stores["pods"].remove(key)
        if pod is None:
            return
        node = pod["spec"].get("nodeName")
        self._release_devices(key, node)
        if node:
            self._pods_on_node.get(node, set()).discard(key)
        self._next_resource_version()

    def _assign_devices(self, key: str, pod: dict[str, Any]) -> None:
        """Give each container of a running pod the lowest free devices, as the device plugin does."""
        node = pod["spec"].get("nodeName")
        gpus = self._gpus.get(node)
        if gpus is None:
            return
        namespace, name = key.split("/", 1)
        free = [i for i, owner in enumerate(gpus.owners) if owner is None]
        for container in pod["spec"]["containers"]:
            wanted = container_gpu_request(container, self.profile.resource)
            for index in free[:wanted]:
                gpus.owners[index] = (namespace, name, container["name"])
                gpus.utilization[index] = round(self._rng.uniform(35.0, 100.0), self.profile.util_decimals)
            free = free[wanted:]
        self._changed()

    def _release_devices(self, key: str, node: str | None) -> None:
        gpus = self._gpus.get(node or "")
        if gpus is None:
            return
        namespace, name = key.split("/", 1)
        for index, owner in enumerate(gpus.owners):
            if owner is not None and owner[0] == namespace and owner[1] == name:
                gpus.owners[index] = None
                gpus.utilization[index] = 0.0
        self._changed()

    def _pod_ip(self, node: str) -> str:
        """The next address of the node's pod CIDR (wrapping after 250, as IPAM reuses freed ones)."""
        index = self._node_index.get(node, 0)
        serial = self._pod_ip_serial[node] = self._pod_ip_serial.get(node, 0) + 1
        return f"10.{128 + (index >> 8) % 128}.{index & 255}.{2 + (serial - 1) % 250}"

    def _unique_pod_name(self, namespace: str, prefix: str) -> str:
        while True:
            name = f"{prefix}{suffix(self._rng)}"
            if f"{namespace}/{name}" not in self._stores["pods"]:
                return name

    # -- generation ----------------------------------------------------------------------------

    def _generate(self, gpu_nodes: int, cpu_nodes: int, pods_per_node: float) -> None:
        rng = self._rng
        for i in range(gpu_nodes):
            self._generate_gpu_node(rng, f"{self.name}-gpu-{i + 1:05d}", i + 1)
        for j in range(cpu_nodes):
            self._generate_cpu_node(rng, f"{self.name}-cpu-{j + 1:03d}", 60001 + j)
        exporter = Owner("DaemonSet", "apps/v1", self.profile.exporter_job, new_uid(rng))
        for name in sorted(self._gpus):
            self._generate_exporter_pod(rng, name, exporter)
        self._generate_workloads(rng, round(gpu_nodes * pods_per_node))
        # Busy devices drew their utilization when assigned; idle ones mostly read 0, sometimes a blip.
        for gpus in self._gpus.values():
            for index, owner in enumerate(gpus.owners):
                if owner is None and rng.random() < 0.5:
                    gpus.utilization[index] = round(rng.uniform(0.0, 4.0), self.profile.util_decimals)
        self._changed()

    def _generate_gpu_node(self, rng: random.Random, name: str, index: int) -> None:
        profile = self.profile
        product = rng.choices(profile.products, weights=[p.weight for p in profile.products])[0]
        draw = rng.random()
        ready = draw >= 0.03
        cordoned = 0.03 <= draw < 0.05
        kubelet = LAGGING_KUBE_VERSION if rng.random() < 0.1 else KUBE_VERSION
        created = GENERATION_EPOCH - rng.uniform(30, 400) * 86400
        transition = GENERATION_EPOCH - rng.uniform(600, 30 * 86400)
        devices = [
            GpuDevice(i, str(uuid.UUID(int=rng.getrandbits(128))), f"{rng.getrandbits(48):012X}")
            for i in range(self.gpus_per_node)
        ]
        labels = base_node_labels(name, index)
        labels[profile.product_label] = product.node_label
        labels[profile.driver_label] = profile.driver_version
        labels.update(profile.extra_node_labels(product, self.gpus_per_node))
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
        resources = {profile.resource: str(self.gpus_per_node)}
        node = self._node_object(
            rng, name, index, created, labels, taints, ready, transition, kubelet, cpu, memory_ki, resources
        )
        if cordoned:
            node["spec"]["unschedulable"] = True
        self._gpus[name] = NodeGpus(product, devices, [0.0] * len(devices), [None] * len(devices))
        self._put_node(name, node)

    def _generate_cpu_node(self, rng: random.Random, name: str, index: int) -> None:
        created = GENERATION_EPOCH - rng.uniform(30, 400) * 86400
        labels = base_node_labels(name, index)
        labels["node-role.kubernetes.io/control-plane"] = ""
        memory_ki = 512 * 1024 * 1024 - rng.randint(0, 60000)
        node = self._node_object(
            rng, name, index, created, labels, [], True, created, KUBE_VERSION, "64", memory_ki, {}
        )
        self._put_node(name, node)

    def _node_object(
        self,
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
    ) -> dict[str, Any]:
        addresses, cidr = node_addresses(index, name)
        self._node_index[name] = index
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
                "conditions": node_conditions(ready, GENERATION_EPOCH, transition),
                "addresses": addresses,
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": node_info(rng, kubelet),
            },
        }

    def _generate_exporter_pod(self, rng: random.Random, node: str, owner: Owner) -> None:
        profile = self.profile
        name = self._unique_pod_name(profile.exporter_namespace, f"{profile.exporter_job}-")
        self._create_pod(
            name=name,
            namespace=profile.exporter_namespace,
            node=node,
            phase="Running",
            owner=owner,
            labels={
                "app.kubernetes.io/name": profile.exporter_job,
                "controller-revision-hash": "6d9f8c7b5d",
                "pod-template-generation": "1",
            },
            containers=[(profile.exporter_job, 0)],
            init_gpus=0,
            image=profile.exporter_image,
            **self._generated_times(rng, "Running", GENERATION_EPOCH - rng.uniform(1, 30) * 86400),
            deleting=False,
            restart_policy="Always",
        )

    def _generate_workloads(self, rng: random.Random, target: int) -> None:
        resource_names = sorted(self._gpus)
        schedulable = [
            n
            for n in resource_names
            if self._exporter_up(n) and not self._stores["nodes"].get(n).obj["spec"].get("unschedulable")
        ]
        any_node = resource_names + sorted(set(self._node_index) - set(self._gpus))
        free = dict.fromkeys(resource_names, self.gpus_per_node)
        made, serial = 0, 0
        while made < target and any_node:
            serial += 1
            namespace = rng.choice(WORKLOAD_NAMESPACES)
            is_job = rng.random() < 0.6
            gpus = rng.choice((1, 2, 4, 8, 8)) if rng.random() >= 0.15 else 0
            containers = [("main", gpus)]
            if gpus >= 2 and rng.random() < 0.1:
                containers = [("worker", gpus // 2), ("worker-2", gpus - gpus // 2)]
            if rng.random() < 0.2:
                containers.append(("log-shipper", 0))
            init_gpus = rng.choice((1, 2, 4, 8)) if gpus and rng.random() < 0.05 else 0
            effective = max(gpus, init_gpus)
            base = f"{rng.choice(WORKLOAD_NAMES)}-{serial:04d}"
            uid = new_uid(rng)
            if is_job:
                owner = Owner("Job", "batch/v1", base, uid)
                labels = {
                    "batch.kubernetes.io/job-name": base,
                    "job-name": base,
                    "batch.kubernetes.io/controller-uid": uid,
                    "controller-uid": uid,
                }
                prefix = f"{base}-"
            else:
                template_hash = suffix(rng, 10)
                owner = Owner("ReplicaSet", "apps/v1", f"{base}-{template_hash}", uid)
                labels = {"app": base, "pod-template-hash": template_hash}
                prefix = f"{base}-{template_hash}-"
            created = GENERATION_EPOCH - rng.uniform(60, 14 * 86400)
            for _ in range(min(target - made, rng.randint(1, 4))):
                made += 1
                if is_job:
                    phase = rng.choices(PHASES, weights=(8, 65, 17, 10))[0]
                else:
                    phase = rng.choices(PHASES, weights=(10, 90, 0, 0))[0]
                node: str | None
                if phase in ACTIVE_PHASES and effective:
                    candidates = (rng.choice(schedulable) for _ in range(8)) if schedulable else iter(())
                    node = next((n for n in candidates if free[n] >= effective), None)
                    if node is None:
                        phase = "Pending"
                    else:
                        free[node] -= effective
                elif effective:
                    node = rng.choice(resource_names)
                else:
                    node = rng.choice(any_node)
                self._create_pod(
                    name=self._unique_pod_name(namespace, prefix),
                    namespace=namespace,
                    node=node,
                    phase=phase,
                    owner=owner,
                    labels=dict(labels),
                    containers=containers,
                    init_gpus=init_gpus,
                    image=self.profile.workload_image,
                    **self._generated_times(rng, phase, created),
                    deleting=phase == "Running" and rng.random() < 0.02,
                    restart_policy="Never" if is_job else "Always",
                )

    @staticmethod
    def _generated_times(rng: random.Random, phase: str, created: float) -> dict[str, float]:
        """created, started and last phase change of a generated pod, all before GENERATION_EPOCH."""
        started = min(created + rng.uniform(1, 30), GENERATION_EPOCH)
        if phase == "Pending":
            changed = started
        elif phase == "Running":
            changed = min(started + rng.uniform(5, 120), GENERATION_EPOCH)
        else:
            changed = min(started + rng.uniform(60, 6 * 3600), GENERATION_EPOCH)
        return {"created": created, "started": started, "changed": changed}

    def _create_pod(
        self,
        *,
        name: str,
        namespace: str,
        node: str | None,
        phase: str,
        owner: Owner,
        labels: dict[str, str],
        containers: list[tuple[str, int]],
        init_gpus: int,
        image: str,
        created: float,
        started: float,
        changed: float,
        deleting: bool,
        restart_policy: str,
    ) -> None:
        rng = self._rng
        resource = self.profile.resource
        spec: dict[str, Any] = {
            "containers": [
                container_spec(
                    cname, image, resource, cgpus, cpu=max(2, cgpus * 12), memory_gi=max(4, cgpus * 128)
                )
                for cname, cgpus in containers
            ],
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "schedulerName": "default-scheduler",
            "tolerations": tolerations(self.profile, any(g for _, g in containers) or init_gpus > 0),
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        }
        if init_gpus:
            spec["initContainers"] = [
                container_spec("warmup", image, resource, init_gpus, cpu=2, memory_gi=16)
            ]
        if node:
            spec["nodeName"] = node
        key = f"{namespace}/{name}"
        metadata: dict[str, Any] = {
            "name": name,
            "generateName": name[: name.rfind("-") + 1],
            "namespace": namespace,
            "uid": new_uid(rng),
            "resourceVersion": "",
            "creationTimestamp": rfc3339(created),
            "labels": labels,
            "ownerReferences": [owner.reference()],
        }
        if deleting:
            metadata["deletionTimestamp"] = rfc3339(changed + 20)
            metadata["deletionGracePeriodSeconds"] = 30
        restarts = {cname: rng.choice((0, 0, 0, 0, 1, 2)) for cname, _ in containers}
        host_ip = ""
        if node:
            node_obj = self._stores["nodes"].get(node).obj
            host_ip = next(a["address"] for a in node_obj["status"]["addresses"] if a["type"] == "InternalIP")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": spec,
            "status": pod_status(
                phase, spec, created, started, changed, self._pod_ip(node or ""), host_ip, restarts
            ),
        }
        self._put_pod(key, pod)
        if phase == "Running":
            self._assign_devices(key, pod)


class SimFleet:
    """The clusters one simulator serves, by name."""

    def __init__(self, clusters: Iterable[SimCluster]) -> None:
        self.clusters: list[SimCluster] = list(clusters)
        self._by_name = {cluster.name: cluster for cluster in self.clusters}
        if len(self._by_name) != len(self.clusters):
            raise ValueError("cluster names in a fleet must be unique")

    def __iter__(self) -> Iterator[SimCluster]:
        return iter(self.clusters)

    def __len__(self) -> int:
        return len(self.clusters)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def cluster(self, name: str) -> SimCluster:
        try:
            return self._by_name[name]
        except KeyError:
            raise LookupError(f"no simulated cluster named {name!r}; have {sorted(self._by_name)}") from None

    @classmethod
    def generate(
        cls,
        clusters: int,
        nodes: int,
        seed: int,
        vendor: str = "mixed",
        pods_per_node: float = 2.0,
        **cluster_options: Any,
    ) -> SimFleet:
        """Clusters `sim-<vendor>-<i>`; "mixed" alternates amd and nvidia starting with amd."""
        if vendor not in (*VENDORS, "mixed"):
            raise ValueError(f"vendor must be one of {[*VENDORS, 'mixed']}, got {vendor!r}")
        made = []
        for i in range(clusters):
            cluster_vendor = ("amd", "nvidia")[i % 2] if vendor == "mixed" else vendor
            made.append(
                SimCluster(
                    f"sim-{cluster_vendor}-{i}", cluster_vendor, nodes, seed, pods_per_node, **cluster_options
                )
            )
        return cls(made)
