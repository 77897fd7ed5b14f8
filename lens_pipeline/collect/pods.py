"""Pods: which hold GPUs, how many, on which node."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lens_pipeline.collect.problems import MalformedObject, Problem, mapping, object_name
from lens_pipeline.collect.quantity import whole_units

# Phases in which a bound pod holds its devices, as the scheduler counts them.
HOLDING_PHASES = frozenset({"Pending", "Running"})


def container_gpus(container: object, resource: str) -> int:
    """A container's GPU request; extended resources default their request to the limit."""
    if not isinstance(container, dict):
        raise MalformedObject("a container is not an object")
    resources = mapping(container, "resources")
    requests = mapping(resources, "requests")
    limits = mapping(resources, "limits")
    value = requests.get(resource, limits.get(resource))
    return 0 if value is None else whole_units(value, f"container {container.get('name')!r} {resource}")


def pod_gpus(pod: dict, resource: str) -> int:
    """The GPUs a pod takes: max(sum over containers, largest init container), as the scheduler counts."""
    spec = mapping(pod, "spec")
    containers = spec.get("containers") or []
    init_containers = spec.get("initContainers") or []
    if not isinstance(containers, list) or not isinstance(init_containers, list):
        raise MalformedObject("spec.containers and spec.initContainers should be lists")
    app = sum(container_gpus(c, resource) for c in containers)
    init = max((container_gpus(c, resource) for c in init_containers), default=0)
    return max(app, init)


@dataclass(frozen=True)
class GpuHolding:
    """What one pod holds on one node, for allocation figures."""

    node_name: str
    resource: str
    gpus: int


def project_holding(pod: dict, resources: tuple[str, ...]) -> GpuHolding | Problem | None:
    """Cut a Pod down to the GPUs it holds on its node (None when it holds none)."""
    try:
        if not isinstance(pod, dict):
            raise MalformedObject("item is not an object")
        phase = mapping(pod, "status").get("phase")
        node_name = mapping(pod, "spec").get("nodeName")
        if phase not in HOLDING_PHASES or not isinstance(node_name, str) or not node_name:
            return None
        for resource in resources:
            gpus = pod_gpus(pod, resource)
            if gpus:
                return GpuHolding(node_name, resource, gpus)
        return None
    except MalformedObject as exc:
        return Problem("Pod", object_name(pod), str(exc))


def allocation_by_node(holdings: Iterable[GpuHolding]) -> dict[tuple[str, str], int]:
    """GPUs held per (node, resource): a node counts only its own vendor's resource."""
    allocated: dict[tuple[str, str], int] = {}
    for holding in holdings:
        key = (holding.node_name, holding.resource)
        allocated[key] = allocated.get(key, 0) + holding.gpus
    return allocated
