"""Owner chains: from a GPU pod up through its ownerReferences to the top-level workload.

Every owner kind is LISTed once (found through discovery), so walking a chain is a dictionary
lookup, never a GET per owner. SaFE `Workload`s own nothing through ownerReferences: their
children carry the label `primus-safe.workload.id=<workload name>` (spec §6.3-6.4).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lens_pipeline.collect.objects import KEPT_METADATA, KindRef, OwnerRef, owner_ref, without_unread_metadata
from lens_pipeline.collect.problems import MalformedObject, Problem, mapping, object_name

if TYPE_CHECKING:
    from lens_pipeline.collect.pods import GpuPod

SAFE_GROUP_VERSION = "amd.com/v1"
SAFE_KIND = "Workload"
SAFE_WORKLOAD_LABEL = "primus-safe.workload.id"
MAX_DEPTH = 16


def plurals_from_discovery(group_version: str, resource_list: object) -> dict[str, tuple[str, bool]]:
    """kind -> (plural, namespaced) from an APIResourceList (sub-resources like `jobs/status` skipped)."""
    resources = mapping({"r": resource_list}, "r").get("resources") or []
    found: dict[str, tuple[str, bool]] = {}
    for resource in resources if isinstance(resources, list) else []:
        if not isinstance(resource, dict) or "/" in str(resource.get("name", "/")):
            continue
        if "list" in (resource.get("verbs") or []) and isinstance(resource.get("kind"), str):
            found.setdefault(resource["kind"], (str(resource["name"]), bool(resource.get("namespaced"))))
    return found


_KEPT_OWNER_METADATA = (*KEPT_METADATA, "annotations", "generation")
# What the chains and a workload's status read of an object whose row is not rebuilt.
_CHAIN_METADATA = ("name", "namespace", "uid", "ownerReferences", "labels")


def project_owner(obj: object, *, whole: bool = True) -> dict | Problem:
    """Keep what a `gpu_workload` row and its snapshot need (not managedFields nor kubectl's
    last-applied annotation: `without_unread_metadata`); a `Problem` when the object has no
    metadata or uid to be found by (its pods' chains then end at it).

    Not `whole`: an object whose row is already built from it (it did not change since), of which
    only what the owner chains and its workload's status read is kept."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        return Problem("Owner", object_name(obj), "no metadata")
    metadata = obj["metadata"]
    uid = metadata.get("uid")
    if not isinstance(uid, str) or not uid or "\x00" in uid:
        return Problem(
            str(obj.get("kind"))[:64], object_name(obj), "metadata.uid should be a string without NUL"
        )
    if not whole:
        safe = obj.get("apiVersion") == SAFE_GROUP_VERSION and obj.get("kind") == SAFE_KIND
        return {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "metadata": {k: metadata[k] for k in _CHAIN_METADATA if k in metadata},
            "spec": obj.get("spec") if safe else None,
            "status": obj.get("status"),
        }
    metadata = without_unread_metadata(metadata)
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {k: metadata[k] for k in _KEPT_OWNER_METADATA if k in metadata},
        "spec": obj.get("spec"),
        "status": obj.get("status"),
    }


def safe_workloads_by_name(objects: Mapping[str, dict]) -> dict[str, str]:
    """SaFE Workload name -> uid, for linking children by their `primus-safe.workload.id` label."""
    return {
        o["metadata"].get("name"): uid
        for uid, o in objects.items()
        if o.get("apiVersion") == SAFE_GROUP_VERSION and o.get("kind") == SAFE_KIND
    }


def parent_uid(metadata: dict, safe_by_name: Mapping[str, str]) -> str:
    """The owner's uid; for a top-level object, the SaFE Workload its label names; else ''."""
    ref = owner_ref(metadata)
    if ref is not None:
        return ref.uid
    labels = metadata.get("labels") or {}
    name = labels.get(SAFE_WORKLOAD_LABEL) if isinstance(labels, dict) else None
    uid = safe_by_name.get(name, "") if name else ""
    return "" if uid == metadata.get("uid") else uid


@dataclass
class Chains:
    """For every GPU pod, its ancestors from the nearest up; plus what could not be followed."""

    ancestors: dict[str, list[str]]  # pod uid -> owner uids, nearest first
    problems: list[Problem]


def resolve_chains(
    pods: Iterable[GpuPod],
    objects: Mapping[str, dict],
    listed_kinds: set[KindRef],
) -> Chains:
    """Walk each pod's chain through `objects` (every listed owner, by uid).

    A reference to a kind that was not listed (unknown to discovery) is a problem; so are cycles
    and owners in another namespace. A reference to a listed kind whose object is gone ends the
    chain quietly: the owner was deleted and the garbage collector has not caught up. The chain
    above a pod's owner is walked once per owner, whatever the number of its pods.
    """
    ancestors: dict[str, list[str]] = {}
    problems: list[Problem] = []
    safe_by_name = safe_workloads_by_name(objects)
    above: dict[OwnerRef, tuple[list[str], list[Problem]]] = {}
    for pod in pods:
        what = f"Pod {pod.namespace}/{pod.name}"
        ref = pod.owner
        if pod.owner_problem is not None:
            problems.append(Problem("Owner", what, pod.owner_problem))
            ancestors[pod.uid] = []
            continue
        if ref is None:
            safe = safe_by_name.get(pod.safe_workload, "") if pod.safe_workload else ""
            ancestors[pod.uid] = [safe] if safe and safe != pod.uid else []
            continue
        owner = objects.get(ref.uid)
        if owner is None:
            if ref.kind_ref not in listed_kinds:
                problems.append(Problem("Owner", what, _unserved(ref)))
            ancestors[pod.uid] = []
            continue
        owner_namespace = owner["metadata"].get("namespace")
        # ownerReferences never cross namespaces; one that seems to is a broken or forged object.
        if owner_namespace and owner_namespace != pod.namespace:
            problems.append(
                Problem(
                    "Owner", what, f"owner {ref.kind_ref.kind} {ref.name} is in namespace {owner_namespace}"
                )
            )
            ancestors[pod.uid] = []
            continue
        if ref not in above:
            above[ref] = _walk_up(ref, owner, objects, listed_kinds, safe_by_name)
        chain, found = above[ref]
        ancestors[pod.uid] = chain
        problems += found
    return Chains(ancestors, problems)


def _unserved(ref: OwnerRef) -> str:
    return f"owner kind {ref.kind_ref.kind} ({ref.kind_ref.group_version}) is not served by the cluster"


def _walk_up(
    ref: OwnerRef,
    owner: dict,
    objects: Mapping[str, dict],
    listed_kinds: set[KindRef],
    safe_by_name: Mapping[str, str],
) -> tuple[list[str], list[Problem]]:
    """The chain from `owner` (what `ref` points at) to the top, and what could not be followed."""
    chain = [ref.uid]
    problems: list[Problem] = []
    current = owner["metadata"]
    what = f"{ref.kind_ref.kind} {current.get('namespace') or ''}/{ref.name}"
    while len(chain) < MAX_DEPTH:
        try:
            ref_above = owner_ref(current)
        except MalformedObject as exc:
            problems.append(Problem("Owner", what, str(exc)))
            break
        if ref_above is None:
            safe = parent_uid(current, safe_by_name)
            if safe and safe not in chain:
                chain.append(safe)
            break
        found = objects.get(ref_above.uid)
        if found is None:
            if ref_above.kind_ref not in listed_kinds:
                problems.append(Problem("Owner", what, _unserved(ref_above)))
            break
        if ref_above.uid in chain:
            problems.append(
                Problem("Owner", what, f"owner cycle through {ref_above.kind_ref.kind} {ref_above.name}")
            )
            break
        owner_namespace = found["metadata"].get("namespace")
        if owner_namespace and owner_namespace != current.get("namespace"):
            problems.append(
                Problem(
                    "Owner",
                    what,
                    f"owner {ref_above.kind_ref.kind} {ref_above.name} is in namespace {owner_namespace}",
                )
            )
            break
        chain.append(ref_above.uid)
        current = found["metadata"]
        what = f"{ref_above.kind_ref.kind} {owner_namespace or ''}/{ref_above.name}"
    return chain, problems
