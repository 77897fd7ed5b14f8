"""What every Kubernetes object has: the metadata the collectors keep, and owner references."""

from __future__ import annotations

from typing import NamedTuple

from lens_pipeline.collect.problems import MalformedObject

# Metadata every collector keeps of an object (owners keep a little more, see collect.owners).
KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "ownerReferences",
    "labels",
)


class KindRef(NamedTuple):
    """An object kind as ownerReferences name it, and how to list it (a tuple: built 100k times a run)."""

    group_version: str
    kind: str

    def list_path(self, plural: str) -> str:
        prefix = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        return f"{prefix}/{plural}"


class OwnerRef(NamedTuple):
    kind_ref: KindRef
    name: str
    uid: str


def owner_ref(metadata: dict) -> OwnerRef | None:
    """The controller reference, else the first one; None for a top-level object."""
    refs = metadata.get("ownerReferences") or []
    if not isinstance(refs, list):
        raise MalformedObject("metadata.ownerReferences should be a list")
    refs = [r for r in refs if isinstance(r, dict)]
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if ref is None:
        return None
    for field in ("apiVersion", "kind", "name", "uid"):
        if not isinstance(ref.get(field), str) or not ref[field]:
            raise MalformedObject(f"an ownerReference lacks {field}")
    return OwnerRef(KindRef(ref["apiVersion"], ref["kind"]), ref["name"], ref["uid"])
