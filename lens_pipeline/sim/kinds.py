"""The one table of Kubernetes resource kinds the simulator serves: group, version, scope, names and
field selectors, from which discovery, routing, paging and error messages are all derived."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResourceKind:
    plural: str
    singular: str
    kind: str
    group: str  # "" is the core group, served under /api/v1
    version: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    # Field selectors beyond metadata.name/metadata.namespace, with the value an absent field matches.
    fields: tuple[tuple[str, str], ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified_name(self) -> str:
        """`deployments.apps`, as kube-apiserver names a resource in its messages (core: `pods`)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def key(self, namespace: str | None, name: str) -> str:
        """Store key: `namespace/name` for namespaced kinds (so a namespace is one key range), else `name`."""
        return f"{namespace}/{name}" if self.namespaced else name

    def field_defaults(self) -> dict[str, str]:
        defaults = {"metadata.name": ""}
        if self.namespaced:
            defaults["metadata.namespace"] = ""
        defaults.update(self.fields)
        return defaults

    def discovery(self) -> dict[str, object]:
        """This kind's entry in an APIResourceList."""
        entry: dict[str, object] = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            # Only reads are served; claiming create/delete would make kubectl offer what fails.
            "verbs": ["get", "list", "watch"],
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        if self.categories:
            entry["categories"] = list(self.categories)
        return entry


_POD_FIELDS = (
    ("spec.nodeName", ""),
    ("spec.restartPolicy", ""),
    ("spec.schedulerName", ""),
    ("spec.serviceAccountName", ""),
    ("spec.hostNetwork", "false"),
    ("status.phase", ""),
    ("status.podIP", ""),
    ("status.nominatedNodeName", ""),
)

KINDS: tuple[ResourceKind, ...] = (
    ResourceKind(
        "namespaces", "namespace", "Namespace", "", "v1", False, ("ns",), (), (("status.phase", ""),)
    ),
    ResourceKind("nodes", "node", "Node", "", "v1", False, ("no",), (), (("spec.unschedulable", "false"),)),
    ResourceKind("pods", "pod", "Pod", "", "v1", True, ("po",), ("all",), _POD_FIELDS),
    ResourceKind("secrets", "secret", "Secret", "", "v1", True, (), (), (("type", ""),)),
    ResourceKind("daemonsets", "daemonset", "DaemonSet", "apps", "v1", True, ("ds",), ("all",)),
    ResourceKind("deployments", "deployment", "Deployment", "apps", "v1", True, ("deploy",), ("all",)),
    ResourceKind(
        "replicasets",
        "replicaset",
        "ReplicaSet",
        "apps",
        "v1",
        True,
        ("rs",),
        ("all",),
        (("status.replicas", ""),),
    ),
    ResourceKind("statefulsets", "statefulset", "StatefulSet", "apps", "v1", True, ("sts",), ("all",)),
    ResourceKind("cronjobs", "cronjob", "CronJob", "batch", "v1", True, ("cj",), ("all",)),
    ResourceKind("jobs", "job", "Job", "batch", "v1", True, (), ("all",), (("status.successful", ""),)),
    ResourceKind("storageclasses", "storageclass", "StorageClass", "storage.k8s.io", "v1", False, ("sc",)),
    ResourceKind("mpijobs", "mpijob", "MPIJob", "kubeflow.org", "v1", True),
    ResourceKind("pytorchjobs", "pytorchjob", "PyTorchJob", "kubeflow.org", "v1", True),
    ResourceKind("rayclusters", "raycluster", "RayCluster", "ray.io", "v1", True),
    ResourceKind("rayjobs", "rayjob", "RayJob", "ray.io", "v1", True),
    ResourceKind("rayservices", "rayservice", "RayService", "ray.io", "v1", True, (), ("all",)),
    # SaFE's Workload is cluster-scoped (+kubebuilder:resource:scope=Cluster); spec.workspace names the
    # namespace its children run in.
    ResourceKind("workloads", "workload", "Workload", "amd.com", "v1", False),
)

BY_PLURAL: dict[str, ResourceKind] = {kind.plural: kind for kind in KINDS}
# (apiVersion, kind) -> kind: how an ownerReference names its owner.
BY_TYPE: dict[tuple[str, str], ResourceKind] = {(kind.api_version, kind.kind): kind for kind in KINDS}
# API groups in the order /apis lists them (kube-apiserver lists built-in groups first).
GROUP_VERSIONS: dict[str, str] = {kind.group: kind.version for kind in KINDS if kind.group}


def kinds_of(group: str, version: str) -> list[ResourceKind]:
    return [kind for kind in KINDS if kind.group == group and kind.version == version]
