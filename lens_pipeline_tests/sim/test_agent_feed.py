"""The simulated agents' view of a cluster: its running GPU pods, each look parsing only the pods
that changed since the last."""

from __future__ import annotations

from typing import Any

from lens_pipeline.sim import SimFleet
from lens_pipeline.sim.agent_feed import RunningGpuContainers


class _Counting(RunningGpuContainers):
    parsed = 0

    def _container(self, pod: dict[str, Any]) -> Any:
        self.parsed += 1
        return super()._container(pod)


def test_running_gpu_pods_follow_the_cluster_and_unchanged_pods_are_not_parsed_again() -> None:
    cluster = SimFleet.generate(clusters=1, nodes=6, seed=5, vendor="nvidia", pods_per_node=1).clusters[0]
    running = _Counting(cluster)
    first = running()
    pods = len(cluster.simulated_objects("pods"))
    assert running.parsed == pods and first
    assert all(gpus > 0 for _node, _ns, _pod, _uid, gpus in first.values())

    running.parsed = 0
    assert running() == first and running.parsed == 0  # nothing changed: nothing parsed

    node = max(cluster.node_names(), key=cluster.free_gpus)
    name = cluster.add_gpu_pod(node, 1)
    added = running()
    assert running.parsed == 1  # the new pod alone
    [(new_id, new)] = [(cid, c) for cid, c in added.items() if cid not in first]
    assert new[:3] == (node, "default", name) and new[4] == 1

    running.parsed = 0
    cluster.set_pod_phase("default", name, "Succeeded")
    assert running() == first and running.parsed == 1  # not running any more
    cluster.remove_pod("default", name)
    assert running() == first and new_id not in running()
