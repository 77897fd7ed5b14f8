"""What every Kubernetes object has: the metadata the collectors keep, and owner references."""

from __future__ import annotations

from typing import NamedTuple

from lens_pipeline.collect.problems import MalformedObject
from lens_pipeline.collect.quantity import INT64_MAX

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

# kubectl's client-side apply keeps the manifest it sent, as JSON, in this annotation of the object
# (kubectl's `GetModifiedConfiguration`): a second copy of the spec, escaped, often most of the
# object's metadata. No collector reads it and nothing we serve shows it, so it is not kept.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def without_unread_metadata(metadata: dict) -> dict:
    """`metadata` without what no collector reads: server-side apply's `managedFields` and kubectl's
    last-applied annotation. The same dict when it has neither (the usual case, on a hot path)."""
    annotations = metadata.get("annotations")
    last_applied = isinstance(annotations, dict) and LAST_APPLIED in annotations
    if not last_applied and "managedFields" not in metadata:
        return metadata
    kept = {k: v for k, v in metadata.items() if k != "managedFields"}
    if last_applied and isinstance(annotations, dict):  # (the second test for mypy)
        kept["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return kept


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
    # Called for every pod and owner several times a run (hundreds of thousands of calls at the
    # envelope): one pass, no intermediate lists.
    refs = metadata.get("ownerReferences")
    if not refs:
        return None
    if not isinstance(refs, list):
        raise MalformedObject("metadata.ownerReferences should be a list")
    ref = None
    for candidate in refs:
        if isinstance(candidate, dict):
            if candidate.get("controller"):
                ref = candidate
                break
            if ref is None:
                ref = candidate
    if ref is None:
        return None
    api_version, kind, name, uid = ref.get("apiVersion"), ref.get("kind"), ref.get("name"), ref.get("uid")
    if not (
        api_version.__class__ is str
        and kind.__class__ is str
        and name.__class__ is str
        and uid.__class__ is str
        and api_version
        and kind
        and name
        and uid
    ):
        for field in ("apiVersion", "kind", "name", "uid"):
            value = ref.get(field)
            if not isinstance(value, str) or not value:
                raise MalformedObject(f"an ownerReference lacks {field}")
    # Checked just above with `__class__ is str` (the fast test on this hot path, which mypy does
    # not read as narrowing).
    return OwnerRef(KindRef(api_version, kind), name, uid)  # type: ignore[arg-type]


def resource_version(metadata: dict) -> int:
    """`metadata.resourceVersion` as the number etcd gives it (a 64-bit revision, stored as one)."""
    value = metadata.get("resourceVersion")
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX:
        return value
    raise MalformedObject(
        f"metadata.resourceVersion should be an integer string below 2^63, got {value!r:.40}"
    )
