"""One run's view of one cluster: every LIST made once and shared by all the collectors of the run.

`gpu_nodes`, `gpu_pods` and `gpu_workloads` all read the pod list; in one run (the in-process
executor shares the resource instance) it is fetched once.
"""

from __future__ import annotations

from functools import cached_property, partial

from lens_pipeline.clusters import ClusterConfig
from lens_pipeline.collect.nodes import NodeIndex, project_node
from lens_pipeline.collect.objects import KindRef
from lens_pipeline.collect.owners import plurals_from_discovery, project_owner
from lens_pipeline.collect.pods import GpuPod, project_gpu_pod
from lens_pipeline.collect.problems import Problem
from lens_pipeline.kube.reader import KubeReader
from lens_pipeline.vendors import VendorProfile, profiles_for


class ClusterSnapshot:
    def __init__(self, cluster: ClusterConfig, reader: KubeReader) -> None:
        self.cluster = cluster
        self.reader = reader
        self.profiles: tuple[VendorProfile, ...] = profiles_for(cluster.vendor)
        self._discovery: dict[str, dict[str, tuple[str, bool]]] = {}
        self._objects: dict[KindRef, list[dict]] = {}
        # Owner objects that could not be indexed (no metadata or uid), found while listing.
        self.owner_problems: list[Problem] = []

    @cached_property
    def nodes(self) -> list[dict]:
        return self.reader.list("/api/v1/nodes", project_node)

    @cached_property
    def node_index(self) -> NodeIndex:
        """What Prometheus series may call each node (name, addresses, hostname)."""
        return NodeIndex(self.nodes)

    @cached_property
    def _pods(self) -> list[GpuPod | Problem | None]:
        project = partial(project_gpu_pod, resources=tuple(p.resource for p in self.profiles))
        return [p for p in self.reader.list("/api/v1/pods", project) if p is not None]

    @property
    def gpu_pods(self) -> list[GpuPod]:
        return [p for p in self._pods if isinstance(p, GpuPod)]

    @property
    def pod_problems(self) -> list[Problem]:
        return [p for p in self._pods if isinstance(p, Problem)]

    def drop_pod_details(self) -> None:
        """Forget the containers and status details of the listed GPU pods once `gpu_pods` has
        written them: the collectors after it read only a pod's metadata, node, phase and GPU
        count. At the envelope the details are hundreds of MiB, still held while the owner kinds
        are listed, which is when memory peaks."""
        if "_pods" not in self.__dict__:
            return
        for pod in self.gpu_pods:
            pod.obj["spec"] = {"nodeName": pod.obj["spec"].get("nodeName")}
            pod.obj["status"] = {"phase": pod.obj["status"].get("phase")}

    def plural(self, kind: KindRef) -> tuple[str, bool] | None:
        """(plural, namespaced) of a kind through discovery, one request per group-version."""
        if kind.group_version not in self._discovery:
            path = "/api/v1" if kind.group_version == "v1" else f"/apis/{kind.group_version}"
            document = self.reader.get(path)
            self._discovery[kind.group_version] = plurals_from_discovery(kind.group_version, document or {})
        return self._discovery[kind.group_version].get(kind.kind)

    def objects(self, kind: KindRef) -> list[dict] | None:
        """Every object of a kind (one paged LIST), or None when the cluster does not serve it."""
        if kind not in self._objects:
            found = self.plural(kind)
            if found is None:
                return None
            listed = self.reader.list(kind.list_path(found[0]), project_owner)
            self._objects[kind] = [o for o in listed if not isinstance(o, Problem)]
            self.owner_problems += [o for o in listed if isinstance(o, Problem)]
        return self._objects[kind]
