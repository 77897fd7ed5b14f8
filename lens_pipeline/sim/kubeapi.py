"""The Kubernetes REST API of one simulated cluster: discovery, GET and paged LIST of nodes and pods
with label/field selectors and expiring continue tokens, answered the way kube-apiserver does."""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from lens_pipeline.sim.wire import SimRequest, SimResponse

if TYPE_CHECKING:
    from lens_pipeline.sim.fleet import SimCluster

Predicate = Callable[[dict[str, Any]], bool]

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Gone",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

EXPIRED_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. You can start "
    "a new list without the continue parameter, or use the continue token in this response to "
    "retrieve the remainder of the results. Continuing with the provided token results in an "
    "inconsistent list - objects that were created, modified, or deleted between the time the first "
    "chunk was returned and now may show up in the list."
)


class SelectorError(ValueError):
    """A label or field selector, limit or continue token the API server would reject with 400."""


def status_response(
    code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None
) -> SimResponse:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
    }
    if details:
        body["details"] = details
    body["code"] = code
    # Priority-and-fairness rejections carry Retry-After (clients then wait and retry); other errors do not.
    headers = {"Retry-After": "1"} if code == 429 else {}
    return SimResponse(code, orjson.dumps(body), headers=headers)


# -- selectors ---------------------------------------------------------------------------------

_LABEL_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_LABEL_VALUE = r"[-A-Za-z0-9_.]*"
_SET_REQUIREMENT = re.compile(rf"\s*({_LABEL_KEY})\s+(in|notin)\s*\(([^()]*)\)\s*")
_EXISTS_REQUIREMENT = re.compile(rf"\s*(!?)\s*({_LABEL_KEY})\s*")
_EQUALITY_REQUIREMENT = re.compile(rf"\s*({_LABEL_KEY})\s*(==|=|!=)\s*({_LABEL_VALUE})\s*")


def _split_requirements(text: str) -> list[str]:
    """Split at commas outside parentheses, so `k in (a,b)` stays one requirement."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _labels_of(obj: dict[str, Any]) -> dict[str, Any]:
    # Injected malformed objects may lack metadata or labels; they then simply have no labels.
    metadata = obj.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    return labels if isinstance(labels, dict) else {}


def parse_label_selector(text: str | None) -> list[Predicate]:
    """Equality (`k=v`, `k==v`, `k!=v`), existence (`k`, `!k`) and set (`k in (a,b)`, `k notin (a)`)."""
    if not text:
        return []
    predicates: list[Predicate] = []
    for part in _split_requirements(text):
        if m := _SET_REQUIREMENT.fullmatch(part):
            key, op = m.group(1), m.group(2)
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            if op == "in":
                predicates.append(lambda o, k=key, vs=values: _labels_of(o).get(k) in vs)
            else:
                predicates.append(lambda o, k=key, vs=values: _labels_of(o).get(k) not in vs)
        elif m := _EQUALITY_REQUIREMENT.fullmatch(part):
            key, op, value = m.groups()
            if op == "!=":
                predicates.append(lambda o, k=key, v=value: _labels_of(o).get(k) != v)
            else:
                predicates.append(lambda o, k=key, v=value: _labels_of(o).get(k) == v)
        elif m := _EXISTS_REQUIREMENT.fullmatch(part):
            negated, key = m.groups()
            if negated:
                predicates.append(lambda o, k=key: k not in _labels_of(o))
            else:
                predicates.append(lambda o, k=key: k in _labels_of(o))
        else:
            raise SelectorError(f"unable to parse requirement: {part.strip()!r} in labelSelector {text!r}")
    return predicates


# Field selectors each kind supports in kube-apiserver, with the value of an absent field.
_FIELDS: dict[str, dict[str, str]] = {
    "nodes": {"metadata.name": "", "spec.unschedulable": "false"},
    "pods": {
        "metadata.name": "",
        "metadata.namespace": "",
        "spec.nodeName": "",
        "spec.restartPolicy": "",
        "spec.schedulerName": "",
        "spec.serviceAccountName": "",
        "spec.hostNetwork": "false",
        "status.phase": "",
        "status.podIP": "",
        "status.nominatedNodeName": "",
    },
}
_FIELD_REQUIREMENT = re.compile(r"\s*([A-Za-z.]+)\s*(==|=|!=)\s*([^,]*?)\s*")


def _field_value(obj: dict[str, Any], path: str, absent: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return absent
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(kind: str, text: str | None) -> list[Predicate]:
    if not text:
        return []
    predicates: list[Predicate] = []
    for part in text.split(","):
        m = _FIELD_REQUIREMENT.fullmatch(part)
        if m is None:
            raise SelectorError(f"invalid selector: {text!r}; can't understand {part.strip()!r}")
        path, op, value = m.groups()
        if path not in _FIELDS[kind]:
            raise SelectorError(f"field label not supported: {path}")
        absent = _FIELDS[kind][path]
        if op == "!=":
            predicates.append(lambda o, p=path, a=absent, v=value: _field_value(o, p, a) != v)
        else:
            predicates.append(lambda o, p=path, a=absent, v=value: _field_value(o, p, a) == v)
    return predicates


# -- continue tokens ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ContinueToken:
    resource_version: int
    start: str
    snapshot_id: int
    issued: float

    def encode(self) -> str:
        # Same outer shape as kube-apiserver's token; snapshot and issued are the simulator's own.
        payload = {
            "v": "meta.k8s.io/v1",
            "rv": self.resource_version,
            "start": self.start,
            "snapshot": self.snapshot_id,
            "issued": self.issued,
        }
        return base64.urlsafe_b64encode(orjson.dumps(payload)).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, token: str) -> ContinueToken:
        try:
            payload = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
            return cls(
                int(payload["rv"]), str(payload["start"]), int(payload["snapshot"]), float(payload["issued"])
            )
        except (binascii.Error, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SelectorError(f"continue key is not valid: {exc}") from exc


# -- handlers ----------------------------------------------------------------------------------


def _discovery(cluster: SimCluster, path: str) -> dict[str, Any] | None:
    if path == "/version":
        major, minor, _ = cluster.kube_version.removeprefix("v").split(".")
        return {
            "major": major,
            "minor": minor,
            "gitVersion": cluster.kube_version,
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2024-08-14T19:29:15Z",
            "goVersion": "go1.22.5",
            "compiler": "gc",
            "platform": "linux/amd64",
        }
    if path == "/api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}],
        }
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
    if path == "/api/v1":
        verbs = ["get", "list"]
        return {
            "kind": "APIResourceList",
            "groupVersion": "v1",
            "resources": [
                {
                    "name": "nodes",
                    "singularName": "node",
                    "namespaced": False,
                    "kind": "Node",
                    "verbs": verbs,
                    "shortNames": ["no"],
                },
                {
                    "name": "pods",
                    "singularName": "pod",
                    "namespaced": True,
                    "kind": "Pod",
                    "verbs": verbs,
                    "shortNames": ["po"],
                    "categories": ["all"],
                },
            ],
        }
    return None


_NODE = re.compile(r"/api/v1/nodes/([^/]+)")
_NAMESPACED_PODS = re.compile(r"/api/v1/namespaces/([^/]+)/pods")
_POD = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)")


def handle_kube(cluster: SimCluster, req: SimRequest) -> SimResponse:
    """Answer one request below the cluster's base URL that is not a simulator endpoint."""
    fault = cluster.fault("kube")
    if fault is not None:
        return status_response(fault, f"injected fault: the simulator answers every API call with {fault}")
    scheme, _, token = req.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), cluster.token):
        return status_response(401, "Unauthorized")

    path = req.path.rstrip("/") or "/"
    discovery = _discovery(cluster, path)
    known = (
        discovery is not None
        or path in ("/api/v1/nodes", "/api/v1/pods")
        or any(pattern.fullmatch(path) for pattern in (_NODE, _NAMESPACED_PODS, _POD))
    )
    if known and req.method != "GET":
        return status_response(405, f"the simulator serves only GET on {path}")
    if discovery is not None:
        return SimResponse(200, orjson.dumps(discovery))
    if path == "/api/v1/nodes":
        return list_objects(cluster, req, "nodes", "NodeList", namespace=None)
    if path == "/api/v1/pods":
        return list_objects(cluster, req, "pods", "PodList", namespace=None)
    if m := _NAMESPACED_PODS.fullmatch(path):
        return list_objects(cluster, req, "pods", "PodList", namespace=m.group(1))
    if m := _NODE.fullmatch(path):
        return _get_object(cluster, "nodes", m.group(1), m.group(1))
    if m := _POD.fullmatch(path):
        return _get_object(cluster, "pods", f"{m.group(1)}/{m.group(2)}", m.group(2))
    return status_response(404, "the server could not find the requested resource")


def _get_object(cluster: SimCluster, kind: str, key: str, name: str) -> SimResponse:
    entry = cluster.get_object(kind, key)
    if entry is None:
        return status_response(404, f'{kind} "{name}" not found', details={"name": name, "kind": kind})
    return SimResponse(200, entry.raw)


def _parse_limit(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    try:
        limit = int(text)
    except ValueError as exc:
        raise SelectorError(f"limit must be an integer, got {text!r}") from exc
    # kube-apiserver treats limit <= 0 as "no limit".
    return limit if limit > 0 else None


def list_objects(
    cluster: SimCluster, req: SimRequest, kind: str, list_kind: str, namespace: str | None
) -> SimResponse:
    """One page of a LIST, served from an immutable snapshot so continued pages stay consistent."""
    try:
        if req.param("watch") in ("true", "1"):
            raise SelectorError("the simulator does not serve watches")
        limit = _parse_limit(req.param("limit"))
        predicates = parse_label_selector(req.param("labelSelector")) + parse_field_selector(
            kind, req.param("fieldSelector")
        )
        token_text = req.param("continue")
        token = ContinueToken.decode(token_text) if token_text else None
    except SelectorError as exc:
        return status_response(400, str(exc))

    now = cluster.now()
    if token is None:
        snapshot = cluster.list_snapshot(kind)
        start_key = ""
    else:
        snapshot = cluster.find_snapshot(kind, token.snapshot_id)
        if snapshot is None or now - token.issued > cluster.continue_ttl:
            return status_response(410, EXPIRED_MESSAGE, reason="Expired")
        start_key = token.start

    keys = snapshot.keys
    lo, hi = 0, len(keys)
    if namespace is not None:
        # Pod keys are "namespace/name"; "0" sorts right after "/", closing the namespace's range.
        lo, hi = bisect_left(keys, f"{namespace}/"), bisect_left(keys, f"{namespace}0")
    position = max(lo, bisect_left(keys, start_key))

    items: list[bytes] = []
    entries = snapshot.entries
    while position < hi and (limit is None or len(items) < limit):
        entry = entries[position]
        position += 1
        if all(predicate(entry.obj) for predicate in predicates):
            items.append(entry.raw)

    metadata: dict[str, Any] = {"resourceVersion": str(snapshot.resource_version)}
    if limit is not None and position < hi:
        # "\x00" makes the next page start strictly after the last key examined, as etcd keys do.
        next_token = ContinueToken(snapshot.resource_version, keys[position - 1] + "\x00", snapshot.id, now)
        metadata["continue"] = next_token.encode()
        if not predicates:
            metadata["remainingItemCount"] = hi - position
    body = b"".join(
        (
            b'{"kind":"',
            list_kind.encode(),
            b'","apiVersion":"v1","metadata":',
            orjson.dumps(metadata),
            b',"items":[',
            b",".join(items),
            b"]}",
        )
    )
    return SimResponse(200, body)
