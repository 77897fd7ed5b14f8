"""One run's view of one cluster: every LIST made once and shared by all the collectors of the run.

`gpu_nodes`, `gpu_pods` and `gpu_workloads` all read the pod list; in one run (the in-process
executor shares the resource instance) it is fetched once. Objects listed at the resourceVersion
their stored rows were built from are kept only as far as the other collectors read them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cached_property, partial

from lens_pipeline.clusters import ClusterConfig
from lens_pipeline.collect.nodes import NodeIndex, project_node
from lens_pipeline.collect.objects import KindRef
from lens_pipeline.collect.owners import plurals_from_discovery, project_owner
from lens_pipeline.collect.pods import GpuPod, project_gpu_pod
from lens_pipeline.collect.problems import Problem
from lens_pipeline.kube.reader import KubeReader
from lens_pipeline.store.pods import StoredPods
from lens_pipeline.vendors import VendorProfile, gpu_resources, profiles_for


class ClusterSnapshot:
    def __init__(self, cluster: ClusterConfig, reader: KubeReader) -> None:
        self.cluster = cluster
        self.reader = reader
        self.profiles: tuple[VendorProfile, ...] = profiles_for(cluster.vendor)
        self._discovery: dict[str, dict[str, tuple[str, bool]]] = {}
        self._objects: dict[KindRef, list[dict]] = {}
        # Owner objects that could not be indexed (no metadata or uid), found while listing.
        self.owner_problems: list[Problem] = []
        # How the stored pods are read (set by the run's turn, before the pods are listed): without
        # it, every pod is read in full.
        self.read_stored_pods: Callable[[], StoredPods] | None = None
        # Owners listed at the resourceVersion their stored workload row was built from.
        self.unchanged_owners: set[str] = set()

    @cached_property
    def stored_pods(self) -> StoredPods:
        """What is stored of the cluster's pods, read once, before they are listed."""
        return self.read_stored_pods() if self.read_stored_pods is not None else StoredPods()

    @cached_property
    def nodes(self) -> list[dict]:
        return self.reader.list("/api/v1/nodes", project_node)

    @cached_property
    def node_index(self) -> NodeIndex:
        """What Prometheus series may call each node (name, addresses, hostname)."""
        return NodeIndex(self.nodes)

    @cached_property
    def _pods(self) -> list[GpuPod | Problem | None]:
        project = partial(
            project_gpu_pod,
            resources=gpu_resources(self.cluster.vendor),
            known=self.stored_pods.current,
        )
        return [p for p in self.reader.list("/api/v1/pods", project) if p is not None]

    @property
    def gpu_pods(self) -> list[GpuPod]:
        return [p for p in self._pods if isinstance(p, GpuPod)]

    @property
    def pod_problems(self) -> list[Problem]:
        return [p for p in self._pods if isinstance(p, Problem)]

    def drop_pod_details(self) -> None:
        """Forget the listed GPU pods' objects once `gpu_pods` has written them: the collectors after
        it read only what a `GpuPod` holds besides. At the envelope the objects are hundreds of MiB,
        still held while the owner kinds are listed, which is when memory peaks."""
        if "_pods" not in self.__dict__:
            return
        for pod in self.gpu_pods:
            pod.obj = None

    def plural(self, kind: KindRef) -> tuple[str, bool] | None:
        """(plural, namespaced) of a kind through discovery, one request per group-version."""
        if kind.group_version not in self._discovery:
            path = "/api/v1" if kind.group_version == "v1" else f"/apis/{kind.group_version}"
            document = self.reader.get(path)
            self._discovery[kind.group_version] = plurals_from_discovery(kind.group_version, document or {})
        return self._discovery[kind.group_version].get(kind.kind)

    def objects(self, kind: KindRef, known: Mapping[str, str] | None = None) -> list[dict] | None:
        """Every object of a kind (one paged LIST), or None when the cluster does not serve it.

        `known`: uid -> resourceVersion of the objects whose stored rows were built from that
        version; listed at it, an object is cut down to what the owner chains read, and its uid
        goes to `unchanged_owners`."""
        if kind not in self._objects:
            found = self.plural(kind)
            if found is None:
                return None
            project = project_owner
            if known:
                project = partial(_project_known_owner, known=known, unchanged=self.unchanged_owners)
            listed = self.reader.list(kind.list_path(found[0]), project)
            self._objects[kind] = [o for o in listed if not isinstance(o, Problem)]
            self.owner_problems += [o for o in listed if isinstance(o, Problem)]
        return self._objects[kind]


def _project_known_owner(obj: object, known: Mapping[str, str], unchanged: set[str]) -> dict | Problem:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    uid = metadata.get("uid") if isinstance(metadata, dict) else None
    version = known.get(uid) if isinstance(uid, str) else None
    if version is not None and version == metadata.get("resourceVersion"):  # type: ignore[union-attr]
        unchanged.add(uid)
        return project_owner(obj, whole=False)
    return project_owner(obj)
