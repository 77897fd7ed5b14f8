"""The Kubernetes REST API of one simulated cluster: discovery, GET and paged LIST of every served
kind with label/field selectors, expiring continue tokens and server-side tables, as kube-apiserver answers."""

from __future__ import annotations

import base64
import binascii
import hmac
import re
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from lens_pipeline.sim.kinds import BY_PLURAL, GROUP_VERSIONS, ResourceKind, kinds_of
from lens_pipeline.sim.objects import StoredObject
from lens_pipeline.sim.tables import render_table
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


def parse_field_selector(kind: ResourceKind, text: str | None) -> list[Predicate]:
    if not text:
        return []
    fields = kind.field_defaults()
    predicates: list[Predicate] = []
    for part in text.split(","):
        m = _FIELD_REQUIREMENT.fullmatch(part)
        if m is None:
            raise SelectorError(f"invalid selector: {text!r}; can't understand {part.strip()!r}")
        path, op, value = m.groups()
        if path not in fields:
            raise SelectorError(f"field label not supported: {path}")
        absent = fields[path]
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
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [_group(g, v) for g, v in GROUP_VERSIONS.items()],
        }
    if path == "/api/v1":
        return _resource_list("", "v1")
    parts = path.split("/")
    if len(parts) == 3 and parts[1] == "apis" and parts[2] in GROUP_VERSIONS:
        return {"kind": "APIGroup", "apiVersion": "v1", **_group(parts[2], GROUP_VERSIONS[parts[2]])}
    if len(parts) == 4 and parts[1] == "apis" and GROUP_VERSIONS.get(parts[2]) == parts[3]:
        return _resource_list(parts[2], parts[3])
    return None


def _group(group: str, version: str) -> dict[str, Any]:
    group_version = {"groupVersion": f"{group}/{version}", "version": version}
    return {"name": group, "versions": [group_version], "preferredVersion": group_version}


def _resource_list(group: str, version: str) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": [kind.discovery() for kind in sorted(kinds_of(group, version), key=lambda k: k.plural)],
    }


@dataclass(frozen=True)
class Route:
    """A resource path: `/api/v1[/namespaces/{ns}]/{plural}[/{name}]` or the same under `/apis/{group}/{version}`."""

    kind: ResourceKind
    namespace: str | None
    name: str | None


def parse_route(path: str) -> Route | None:
    parts = path.strip("/").split("/")
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not 1 <= len(rest) <= 2:
        return None  # subresources (status, log, scale) are not served
    kind = BY_PLURAL.get(rest[0])
    if kind is None or (kind.group, kind.version) != (group, version):
        return None
    if namespace is not None and not kind.namespaced:
        return None
    name = rest[1] if len(rest) == 2 else None
    if name is not None and namespace is None and kind.namespaced:
        return None
    return Route(kind, namespace, name)


def _wants_table(req: SimRequest) -> bool:
    # kubectl asks for server-side printing: "application/json;as=Table;v=v1;g=meta.k8s.io,...".
    return "as=Table" in req.headers.get("accept", "")


def _forbidden(req: SimRequest, route: Route | None) -> SimResponse:
    user = "system:serviceaccount:lens:lens-collector"
    if route is None:
        return status_response(403, f'forbidden: User "{user}" cannot get path "{req.path}"')
    verb = "get" if route.name else "list"
    kind = route.kind
    scope = f'in the namespace "{route.namespace}"' if route.namespace else "at the cluster scope"
    details: dict[str, Any] = {"kind": kind.plural}
    if kind.group:
        details["group"] = kind.group
    if route.name:
        details["name"] = route.name
    subject = f'{kind.qualified_name} "{route.name}"' if route.name else kind.qualified_name
    message = f'{subject} is forbidden: User "{user}" cannot {verb} resource "{kind.plural}" in API group "{kind.group}" {scope}'
    return status_response(403, message, details=details)


def client_user(cluster_name: str) -> str:
    """The user a client certificate must name to read a simulated cluster."""
    return f"lens-reader:{cluster_name}"


def refused(cluster: SimCluster, req: SimRequest) -> SimResponse | None:
    """What the API server answers before any route: an injected fault, or 401 to a request that
    carries neither the cluster's bearer token nor its reader's client certificate."""
    fault = cluster.fault("kube")
    if fault is not None:
        return status_response(fault, f"injected fault: the simulator answers every API call with {fault}")
    scheme, _, token = req.headers.get("authorization", "").partition(" ")
    by_token = scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), cluster.token)
    # Or a client certificate issued for this cluster's reader (`ServerCertificate.client_pair`).
    if not by_token and req.client_cn != client_user(cluster.name):
        return status_response(401, "Unauthorized")
    return None


def handle_kube(cluster: SimCluster, req: SimRequest) -> SimResponse:
    """Answer one request below the cluster's base URL that is not a simulator endpoint."""
    denied = refused(cluster, req)
    if denied is not None:
        return denied
    path = req.path.rstrip("/") or "/"
    discovery = _discovery(cluster, path)
    route = parse_route(path) if discovery is None else None
    if cluster.forbidden(path):
        return _forbidden(req, route)
    if (discovery is not None or route is not None) and req.method != "GET":
        return status_response(405, f"the simulator serves only GET on {path}")
    if discovery is not None:
        return SimResponse(200, orjson.dumps(discovery))
    if route is None:
        return status_response(404, "the server could not find the requested resource")
    if route.name is not None:
        return _get_object(cluster, req, route)
    return list_objects(cluster, req, route.kind, route.namespace)


def _get_object(cluster: SimCluster, req: SimRequest, route: Route) -> SimResponse:
    kind, name = route.kind, route.name or ""
    entry = cluster.get_object(kind.plural, kind.key(route.namespace, name))
    if entry is None:
        details: dict[str, Any] = {"name": name}
        if kind.group:
            details["group"] = kind.group
        details["kind"] = kind.plural
        return status_response(404, f'{kind.qualified_name} "{name}" not found', details=details)
    if _wants_table(req):
        metadata = {"resourceVersion": str(cluster.resource_version)}
        return SimResponse(200, render_table(kind, [entry], metadata, cluster.now()))
    return SimResponse(200, entry.raw)


# -- watch -------------------------------------------------------------------------------------

# The spellings Go's strconv.ParseBool reads as true (the official Python client sends "True").
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})


def _true(text: str | None) -> bool:
    return text in _TRUE


# How long a watch stays quiet before a bookmark (when asked for: kube-apiserver sends them about
# once a minute, and clients may not count on any).
BOOKMARK_SECONDS = 5.0
# How long a watch from a version the server has not reached waits for it before 504.
TOO_LARGE_WAIT_SECONDS = 3.0
# kube-apiserver ends a watch without timeoutSeconds after its --min-request-timeout (1800 s).
DEFAULT_WATCH_SECONDS = 1800


def watch_objects(
    cluster: SimCluster, req: SimRequest, kind: ResourceKind, namespace: str | None
) -> SimResponse:
    """A watch, as kube-apiserver streams it: one JSON event a line (ADDED, MODIFIED, DELETED,
    BOOKMARK, ERROR). Without a resourceVersion (or "0") it starts with an ADDED event for every
    object there is; from a resourceVersion, with the changes after it, or a 410 Expired ERROR
    event when they are no longer kept. Selectors filter on each object as it is after the change
    (the API server also sends DELETED for an object that stops matching; the simulator does not)."""
    predicates = parse_label_selector(req.param("labelSelector")) + parse_field_selector(
        kind, req.param("fieldSelector")
    )
    if req.param("sendInitialEvents") is not None:
        raise SelectorError("sendInitialEvents is not served by the simulator")
    text = req.param("resourceVersion") or "0"
    try:
        since = int(text)
        if since < 0:
            raise ValueError
    except ValueError:
        raise SelectorError(f"resourceVersion: Invalid value: {text!r}") from None
    seconds_text = req.param("timeoutSeconds")
    try:
        seconds = int(seconds_text) if seconds_text else DEFAULT_WATCH_SECONDS
    except ValueError:
        raise SelectorError(f"timeoutSeconds must be an integer, got {seconds_text!r}") from None
    initial: list[StoredObject] = []
    if since == 0:
        snapshot = cluster.list_snapshot(kind.plural)
        initial, since = snapshot.entries, snapshot.resource_version
    elif since > cluster.resource_version:
        # A version this server has not reached (another server behind a load balancer was ahead,
        # or etcd was restored): kube-apiserver's watch cache waits 3 s for it, then says so.
        deadline = time.monotonic() + TOO_LARGE_WAIT_SECONDS
        while cluster.resource_version < since and time.monotonic() < deadline:
            cluster.wait_for_change(cluster.resource_version, deadline - time.monotonic())
        if cluster.resource_version < since:
            return status_response(
                504,
                f"Timeout: Too large resource version: {since}, current: {cluster.resource_version}",
                reason="Timeout",
                details={
                    "causes": [
                        {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
                    ],
                    "retryAfterSeconds": 1,
                },
            )
    bookmarks = _true(req.param("allowWatchBookmarks"))
    watch = _Watch(
        cluster, kind, namespace, predicates, _wants_table(req), since, initial, bookmarks, seconds
    )
    return SimResponse(200, b"", stream=watch)


class _Watch:
    """One watch as a `Stream`: the changes of its kind after `since`, matched and encoded, each
    time the cluster says the kind changed; bookmarks when quiet; 410 once they are not all kept."""

    def __init__(
        self,
        cluster: SimCluster,
        kind: ResourceKind,
        namespace: str | None,
        predicates: list[Predicate],
        table: bool,
        since: int,
        initial: list[StoredObject],
        bookmarks: bool,
        seconds: int,
    ) -> None:
        self.cluster, self.kind, self.predicates, self.table = cluster, kind, predicates, table
        self.prefix = f"{namespace}/" if namespace is not None else ""
        self.since, self.initial, self.bookmarks = since, initial, bookmarks
        self.quiet_since = time.monotonic()
        self.deadline = self.quiet_since + (seconds if seconds > 0 else DEFAULT_WATCH_SECONDS)

    def opening(self) -> Iterator[bytes]:
        initial, self.initial = self.initial, []
        for entry in initial:
            if self._matches(entry.key, entry.raw):
                yield self._event("ADDED", entry)

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        return self.cluster.subscribe(self.kind.plural, wake)

    def step(self, now: float) -> tuple[bytes, bool]:
        if now >= self.deadline:
            return b"", True
        changes, oldest, current = self.cluster.changes_since(self.kind.plural, self.since)
        if changes is None:
            status = status_response(
                410, f"too old resource version: {self.since} ({oldest})", reason="Expired"
            )
            return b'{"type":"ERROR","object":' + status.body + b"}\n", True
        out = [
            self._event(change.type, StoredObject(change.key, change.raw))
            for change in changes
            if self._matches(change.key, change.raw)
        ]
        if out:
            self.quiet_since = now
        self.since = current
        if self.bookmarks and now - self.quiet_since >= BOOKMARK_SECONDS:
            self.quiet_since = now
            bookmark = {
                "kind": self.kind.kind,
                "apiVersion": self.kind.api_version,
                "metadata": {"resourceVersion": str(current)},
            }
            out.append(b'{"type":"BOOKMARK","object":' + orjson.dumps(bookmark) + b"}\n")
        return b"".join(out), False

    def due(self) -> float:
        if self.bookmarks:
            return min(self.deadline, self.quiet_since + BOOKMARK_SECONDS)
        return self.deadline

    def _matches(self, key: str, raw: bytes) -> bool:
        if not key.startswith(self.prefix):
            return False
        if not self.predicates:
            return True
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return False
        return isinstance(obj, dict) and all(predicate(obj) for predicate in self.predicates)

    def _event(self, kind: str, entry: StoredObject) -> bytes:
        if self.table:
            metadata = {"resourceVersion": str(self.cluster.resource_version)}
            obj = render_table(self.kind, [entry], metadata, self.cluster.now())
        else:
            obj = entry.raw
        return b'{"type":"' + kind.encode() + b'","object":' + obj + b"}\n"


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
    cluster: SimCluster, req: SimRequest, kind: ResourceKind, namespace: str | None
) -> SimResponse:
    """One page of a LIST, served from an immutable snapshot so continued pages stay consistent."""
    try:
        if _true(req.param("watch")):
            return watch_objects(cluster, req, kind, namespace)
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
        snapshot = cluster.list_snapshot(kind.plural)
        start_key = ""
    else:
        snapshot = cluster.find_snapshot(kind.plural, token.snapshot_id)
        expired = snapshot is None or now - token.issued > cluster.continue_ttl
        if cluster.take_continue_fault() or expired:
            return status_response(410, EXPIRED_MESSAGE, reason="Expired")
        start_key = token.start
    assert snapshot is not None

    keys = snapshot.keys
    lo, hi = 0, len(keys)
    if namespace is not None:
        # Keys are "namespace/name"; "0" sorts right after "/", closing the namespace's range.
        lo, hi = bisect_left(keys, f"{namespace}/"), bisect_left(keys, f"{namespace}0")
    position = max(lo, bisect_left(keys, start_key))

    items: list[StoredObject] = []
    entries = snapshot.entries
    if predicates:
        while position < hi and (limit is None or len(items) < limit):
            entry = entries[position]
            position += 1
            obj = entry.obj
            if all(predicate(obj) for predicate in predicates):
                items.append(entry)
    else:
        end = hi if limit is None else min(hi, position + limit)
        items = entries[position:end]
        position = end

    metadata: dict[str, Any] = {"resourceVersion": str(snapshot.resource_version)}
    if limit is not None and position < hi:
        # "\x00" makes the next page start strictly after the last key examined, as etcd keys do.
        next_token = ContinueToken(snapshot.resource_version, keys[position - 1] + "\x00", snapshot.id, now)
        metadata["continue"] = next_token.encode()
        if not predicates:
            metadata["remainingItemCount"] = hi - position
    if _wants_table(req):
        return SimResponse(200, render_table(kind, items, metadata, now))
    body = b"".join(
        (
            b'{"kind":"',
            kind.list_kind.encode(),
            b'","apiVersion":"',
            kind.api_version.encode(),
            b'","metadata":',
            orjson.dumps(metadata),
            b',"items":[',
            b",".join([entry.raw for entry in items]),
            b"]}",
        )
    )
    return SimResponse(200, body)
