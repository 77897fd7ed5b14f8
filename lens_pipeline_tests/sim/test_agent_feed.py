"""The simulated agents' view of a cluster: its running GPU pods, each look parsing only the pods
that changed since the last; the times of their events, the pods' and the cluster's clock."""

from __future__ import annotations

from typing import Any

from lens_pipeline.ingest.events import ContainerEvent
from lens_pipeline.sim import SimCluster, SimFleet
from lens_pipeline.sim.agent_feed import RunningGpuContainers, _event
from lens_pipeline.sim.kubeobjects import parse_time


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
    assert all(gpus > 0 for _node, _ns, _pod, _uid, gpus, _created in first.values())

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


def test_events_carry_the_pods_start_and_the_agents_clock() -> None:
    """An agent reports a container created when its pod's container started (less the 1.5 s its
    event puts between creation and start), and an exit at the time it saw the container go: the
    simulator's times, whatever its epoch, not fixed ones."""
    epoch, clock = 1_890_000_000.0, [1_900_000_000.0]
    cluster = SimCluster("sim-amd-0", "amd", 4, seed=9, pods_per_node=2, clock=lambda: clock[0], epoch=epoch)
    running = RunningGpuContainers(cluster)
    containers = running()
    assert containers
    pods = {obj["metadata"]["name"]: obj for obj in (e.obj for e in cluster.simulated_objects("pods"))}
    for container_id, container in containers.items():
        pod = pods[container[2]]
        started = parse_time(pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])
        assert epoch - 365 * 86400 <= started <= epoch + 80  # generated as of the epoch
        now_ns = int(clock[0] * 1e9)
        running_event = ContainerEvent.FromString(_event(cluster, container_id, container, "Running", now_ns))
        data = running_event.data.fields
        assert data["created_at"].number_value == started * 1e9 - 1.5e9
        assert data["started_at"].number_value == started * 1e9
        assert data["finished_at"].number_value == 0
        assert data["exit_time"].string_value == "0001-01-01T00:00:00Z"
        assert parse_time(data["last_updated"].string_value) == clock[0]

    # A pod started now, seen gone 90 s later.
    node = max(cluster.node_names(), key=cluster.free_gpus)
    name = cluster.add_gpu_pod(node, 1)
    [(new_id, new)] = [(cid, c) for cid, c in running().items() if cid not in containers]
    assert new[5] == clock[0] * 1e9 - 1.5e9
    clock[0] += 90
    exit_event = ContainerEvent.FromString(_event(cluster, new_id, new, "Exit", int(clock[0] * 1e9)))
    data = exit_event.data.fields
    assert exit_event.type == "Exit" and data["pod_name"].string_value == name
    assert data["finished_at"].number_value == clock[0] * 1e9
    assert parse_time(data["exit_time"].string_value) == clock[0]
    assert parse_time(data["last_updated"].string_value) == clock[0]
