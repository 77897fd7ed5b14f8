"""`slim_pod`, what the watch cache keeps of a pod: `project_gpu_pod` of it is `project_gpu_pod` of
the whole pod, for every simulated pod (both vendors, after churn), the malformed ones the simulator
serves, and pods with a field of a type the projection reports; and it is smaller."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from lens_pipeline.collect.pods import GpuPod, project_gpu_pod, slim_pod
from lens_pipeline.collect.problems import Problem
from lens_pipeline.sim import SimFleet
from lens_pipeline.vendors import gpu_resources

RESOURCES = (gpu_resources("amd"), gpu_resources("nvidia"), gpu_resources("auto"))


def _seen(projected: GpuPod | Problem | None) -> Any:
    if isinstance(projected, GpuPod):
        return {name: getattr(projected, name) for name in GpuPod.__slots__}
    return projected if projected is None else str(projected)


def _pods() -> list[Any]:
    fleet = SimFleet.generate(clusters=2, nodes=6, seed=9, vendor="mixed", pods_per_node=3)
    pods = []
    for cluster in fleet:
        cluster.churn(3)
        cluster.inject_malformed()
        pods += [orjson.loads(entry.raw) for entry in cluster.list_snapshot("pods").entries]
    return pods


def _odd(pod: dict) -> list[Any]:
    """The pod with one field of a type the projection refuses, or absent, each in turn."""
    variants: list[Any] = [None, [], "a pod"]
    for path, value in (
        (("metadata",), None),
        (("metadata",), ["x"]),
        (("metadata", "annotations"), ["x"]),
        (("metadata", "labels"), "x"),
        (("metadata", "name"), None),
        (("metadata", "uid"), 7),
        (("spec",), None),
        (("spec",), "x"),
        (("spec", "nodeName"), 3),
        (("spec", "containers"), {"name": "x"}),
        (("spec", "containers"), ["x"]),
        (("spec", "initContainers"), None),
        (("status",), ["Running"]),
        (("status",), None),
        (("status", "phase"), 1),
        (("status", "containerStatuses"), "x"),
    ):
        changed = copy.deepcopy(pod)
        target = changed
        for key in path[:-1]:
            target = target[key]
        if value is None:
            target.pop(path[-1], None)
        else:
            target[path[-1]] = value
        variants.append(changed)
    for falsy in (0, "", [], False):
        changed = copy.deepcopy(pod)
        changed["spec"]["containers"][0]["resources"] = falsy
        variants.append(changed)
    return variants


@pytest.fixture(scope="module")
def pods() -> list[Any]:
    return _pods()


def test_a_slim_pod_projects_as_the_whole_pod(pods) -> None:
    gpu_pod = next(p for p in pods if isinstance(p, dict) and "gpu" in orjson.dumps(p.get("spec")).decode())
    candidates = pods + _odd(gpu_pod)
    seen = {"gpu": 0, "none": 0, "problem": 0}
    for pod in candidates:
        slim = slim_pod(copy.deepcopy(pod))
        for resources in RESOURCES:
            whole = project_gpu_pod(copy.deepcopy(pod), resources)
            assert _seen(project_gpu_pod(slim, resources)) == _seen(whole), (resources, pod)
            seen["gpu" if isinstance(whole, GpuPod) else "problem" if whole else "none"] += 1
    assert all(seen.values()), seen  # GPU pods, pods without GPUs and malformed pods were all met


def test_unchanged_pods_are_recognized_from_the_slim_form_too(pods) -> None:
    for pod in pods[:200]:
        for resources in RESOURCES:
            whole = project_gpu_pod(pod, resources)
            if not isinstance(whole, GpuPod):
                continue
            known = {whole.uid: (pod["metadata"]["resourceVersion"], whole.gpus)}
            again = project_gpu_pod(slim_pod(pod), resources, known)
            assert isinstance(again, GpuPod) and again.obj is None
            assert _seen(again) == {**_seen(whole), "obj": None}


def test_slim_pods_are_a_fraction_of_the_whole(pods) -> None:
    good = [p for p in pods if isinstance(p, dict) and slim_pod(p) is not p]
    whole = sum(len(orjson.dumps(p)) for p in good)
    slim = sum(len(orjson.dumps(slim_pod(p))) for p in good)
    assert len(good) > 0.9 * len(pods) and slim < 0.6 * whole
