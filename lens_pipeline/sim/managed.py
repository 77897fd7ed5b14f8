"""`metadata.managedFields`, as kube-apiserver writes into every object it stores (server-side apply's
field ownership): one entry per manager and subresource that set fields, each a FieldsV1 set.

Their format is the Kubernetes API reference's (ManagedFieldsEntry, FieldsV1): `f:<name>` for a
field of a struct or a key of a map, `k:<keys>` for an item of a list keyed by its key fields (JSON
of them), `v:<value>` for a value of a set list, `.` for the item, map or set itself; an atomic list
or a value is an empty set. They are often a third or more of an object's bytes, and a client parses
them with everything else: a simulated LIST without them would cost less to read than a real one.
Nothing the collectors keep reads them.
"""

from __future__ import annotations

from typing import Any

import orjson

# Lists whose items are keyed (`listType=map` in the API's schema, by its `listMapKey`s); `_SETS` are
# `listType=set` lists of values; every other list is atomic (one set for the whole list: container
# statuses and taints among them).
_KEYED_BY = {
    "containers": ("name",),
    "initContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "ports": ("containerPort", "protocol"),
    "conditions": ("type",),
    "ownerReferences": ("uid",),
    "addresses": ("type",),
    "podIPs": ("ip",),
    "hostIPs": ("ip",),
}
_SETS = frozenset({"finalizers"})
# Fields that are maps (string keys of the user's choosing), not structs: their set holds "." too.
_MAPS = frozenset(
    {
        "labels",
        "annotations",
        "limits",
        "requests",
        "capacity",
        "allocatable",
        "nodeSelector",
        "matchLabels",
        "parameters",
        "data",
    }
)


# The set with no sub-field, and the sets of maps whose values are all scalars, by their keys:
# shared (never changed; the entries are serialized and let go), since generating 250,000 objects
# builds the same few hundred of them again and again.
_EMPTY: dict[str, Any] = {}
_NESTED_TYPES = frozenset((dict, list))
_FLAT: dict[tuple[str, ...], dict[str, Any]] = {}
_FLAT_MAX = 10_000


def fields_v1(value: Any, name: str = "") -> dict[str, Any]:
    """The FieldsV1 set of every field of `value` (a map's keys, a keyed list's items)."""
    if value.__class__ is dict:
        if _NESTED_TYPES.isdisjoint(map(type, value.values())):
            keys = (name in _MAPS, *value)
            flat = _FLAT.get(keys)
            if flat is None:
                if len(_FLAT) >= _FLAT_MAX:
                    _FLAT.clear()
                flat = {".": _EMPTY} if name in _MAPS else {}
                flat.update((f"f:{key}", _EMPTY) for key in value)
                _FLAT[keys] = flat
            return flat
        fields = {
            f"f:{key}": fields_v1(item, key)
            if item.__class__ is dict or (item.__class__ is list and (key in _KEYED_BY or key in _SETS))
            else _EMPTY  # a value, or an atomic list
            for key, item in value.items()
        }
        return {".": _EMPTY, **fields} if name in _MAPS else fields
    keys = _KEYED_BY.get(name)
    if keys and value.__class__ is list:
        found: dict[str, Any] = {}
        for item in value:
            if item.__class__ is dict and all(k in item for k in keys):
                ident = orjson.dumps({k: item[k] for k in keys}, option=orjson.OPT_SORT_KEYS).decode()
                found[f"k:{ident}"] = {".": _EMPTY, **fields_v1(item)}
        return found
    if name in _SETS and value.__class__ is list and value:
        return {".": _EMPTY, **{f"v:{orjson.dumps(item).decode()}": _EMPTY for item in value}}
    return _EMPTY


def managed_fields(kind: str, api_version: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries a cluster would hold for `obj`: its creator's (metadata and spec) and its status
    writer's (the `status` subresource), at its creation time and its latest condition's."""
    metadata = obj.get("metadata") or {}
    created = metadata.get("creationTimestamp") or "1970-01-01T00:00:00Z"
    owned = bool(metadata.get("ownerReferences"))
    if kind in ("Pod", "Node"):
        creator = "kube-controller-manager" if owned else "kubelet" if kind == "Node" else "kubectl-create"
        status_writer = "kubelet"
    else:
        creator = "kube-controller-manager" if owned else "kubectl-create"
        status_writer = "kube-controller-manager"
    kept = {
        k: v
        for k, v in metadata.items()
        if k in ("labels", "annotations", "ownerReferences", "generateName", "finalizers")
    }
    main: dict[str, Any] = {"f:metadata": fields_v1(kept)} if kept else {}
    # Every other field the creator set: `spec`, or a StorageClass's `provisioner` and `parameters`.
    main.update(
        (f"f:{key}", fields_v1(value, key))
        for key, value in obj.items()
        if key not in ("apiVersion", "kind", "metadata", "status")
    )
    entries = [_entry(creator, api_version, created, main, "")]
    status = obj.get("status")
    if isinstance(status, dict) and status:
        times = [
            c.get("lastTransitionTime")
            for c in status.get("conditions") or ()
            if isinstance(c, dict) and isinstance(c.get("lastTransitionTime"), str)
        ]
        entries.append(
            _entry(
                status_writer,
                api_version,
                max(times, default=created),
                {"f:status": fields_v1(status)},
                "status",
            )
        )
    return entries


def _entry(
    manager: str, api_version: str, time: str, fields: dict[str, Any], subresource: str
) -> dict[str, Any]:
    entry = {
        "manager": manager,
        "operation": "Update",
        "apiVersion": api_version,
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    if subresource:
        entry["subresource"] = subresource
    return entry
