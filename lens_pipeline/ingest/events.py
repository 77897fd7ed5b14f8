"""What a node agent sends, checked and turned into an event-log row; what is wrong, said plainly.

Pure: a gRPC message (raw bytes of `ContainerEvent`) or an HTTP event (a JSON object) in, an
event-log row (`lens_pipeline.store.event_log.append_events`) or a `Refused` out. No I/O, so the checks are tested on their own and both
transports refuse the same things with the same words.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from google.protobuf.message import DecodeError

from lens_pipeline.clusters import validate_cluster_name
from lens_pipeline.ingest import exporter_pb2
from lens_pipeline.protowire import WireError, length_delimited_fields

ContainerEvent = exporter_pb2.ContainerEvent

SOURCES = ("k8s", "docker")
# "snapshot" for the agent's initial scan; live k8s events carry the container status (spec §2.1);
# "update"/"delete" are the values the original proto's comment names.
EVENT_TYPES = frozenset(
    {"snapshot", "update", "delete", "Created", "Running", "Exit", "Deleted", "OOMKilled"}
)
SNAPSHOT = "snapshot"
# Widths the log and the tables keep, in UTF-8 bytes (a character may take four).
MAX_CONTAINER_ID = 128
MAX_NODE = 253
MAX_EVENT_ID = 128
DEFAULT_MAX_EVENT_BYTES = 1 << 20
# A container's CRI `created_at` (nanoseconds since the epoch) must lie before 2200: a later one is
# no time a runtime reports, and would not fit a timestamp column.
MAX_CREATED_AT_NANOS = 7_258_118_400 * 10**9

# The parts of the agents' data the asset reads, and the JSON kind each must have when present.
_K8S_FIELDS = {
    "pod_name": "string",
    "pod_namespace": "string",
    "pod_uuid": "string",
    "status": "string",
    "created_at": "number",
    "metadata": "struct",
    "labels": "struct",
    "devices": "struct",
}
_DOCKER_FIELDS = {
    "ID": "string",
    "Name": "string",
    "Status": "string",
    "Devices": "list",
    "StartAt": "string",
}
_DEVICE_LISTS = {"k8s": ("gpu", "infiniband"), "docker": ()}
_PB_KIND = {
    "string_value": "string",
    "number_value": "number",
    "bool_value": "bool",
    "struct_value": "struct",
    "list_value": "list",
    "null_value": "null",
}


class Refused(ValueError):
    """An event the log will not take; `reason` is the metric label, the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Origin:
    """Who sends: the stream's or request's transport facts that events do not carry themselves."""

    source: str  # "k8s" | "docker" (gRPC: by method; HTTP: from the body)
    token_cluster: str | None  # the cluster the bearer token belongs to, when tokens are configured
    default_cluster: str
    node: str = ""  # gRPC metadata `node_name`, used when an event leaves `node` empty


def from_grpc(raw: bytes, origin: Origin, received_at: Any, max_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> dict:
    """An event-log row from one gRPC message, or `Refused`. The row keeps the message as received
    (the asset decodes it again): only events without an `event_id` pay for the deterministic
    serialization their replay key needs."""
    if len(raw) > max_bytes:
        raise Refused("oversized", f"event of {len(raw)} bytes is over the limit of {max_bytes} bytes")
    try:
        event = ContainerEvent.FromString(raw)
    except DecodeError as exc:
        raise Refused(
            "malformed", f"not a ContainerEvent (invalid protobuf, or invalid UTF-8 in a string): {exc}"
        ) from None
    _check_ids(event.type, event.container_id, event.node)
    if not event.HasField("data"):
        raise Refused("missing_data", f"event {event.type!r} of container {event.container_id!r} has no data")
    gpus = _pb_shape(event.data, origin.source)
    cluster = _cluster(event.cluster if event.HasField("cluster") else "", origin)
    event_id = _event_id(event.event_id if event.HasField("event_id") else "")
    content = b"" if event_id else event.data.SerializeToString(deterministic=True)
    return _row(
        origin,
        cluster,
        event.type,
        event.container_id,
        event.node,
        event_id,
        gpus,
        content,
        raw,
        "event",
        received_at,
    )


def from_json(event: Any, origin: Origin, received_at: Any, max_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> dict:
    """A row from one HTTP event `{"type","source","node","container_id","data"}`, or `Refused`."""
    if not isinstance(event, Mapping):
        raise Refused("malformed", f"an event must be a JSON object, not {type(event).__name__}")
    missing = [k for k in ("type", "source", "node", "container_id", "data") if k not in event]
    if missing:
        raise Refused("missing_field", f"event lacks required fields {missing}")
    source = event["source"]
    if source not in SOURCES:
        raise Refused("unknown_source", f"source {source!r} is not one of {list(SOURCES)}")
    for key in ("type", "node", "container_id", "event_id", "cluster"):
        required = key in ("type", "node", "container_id")
        if (required or event.get(key) is not None) and not isinstance(event.get(key), str):
            raise Refused("malformed", f"{key} must be a string, not {type(event.get(key)).__name__}")
    _check_ids(event["type"], event["container_id"], event["node"])
    data = event["data"]
    if not isinstance(data, Mapping):
        raise Refused("malformed_data", f"data must be a JSON object, not {type(data).__name__}")
    try:
        payload = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:  # an integer past 64 bits, from a caller that parsed it so
        raise Refused("malformed_data", f"data cannot be stored as JSON: {exc}") from None
    if len(payload) > max_bytes:
        raise Refused(
            "oversized", f"event data of {len(payload)} bytes is over the limit of {max_bytes} bytes"
        )
    origin = Origin(source, origin.token_cluster, origin.default_cluster, origin.node)
    gpus = _json_shape(data, source)
    cluster = _cluster(event.get("cluster") or "", origin)
    event_id = _event_id(event.get("event_id") or "")
    return _row(
        origin,
        cluster,
        event["type"],
        event["container_id"],
        event["node"],
        event_id,
        gpus,
        payload,
        payload,
        "json",
        received_at,
    )


def split_batch(raw: bytes) -> tuple[list[bytes], str]:
    """The serialized events of a `ContainerEventBatch` and its source, without decoding the events
    (each is then checked alone, so one bad event does not sink its neighbours)."""
    events: list[bytes] = []
    source = "k8s"
    try:
        for number, value in length_delimited_fields(raw):
            if number == 1:
                events.append(value)
            elif number == 2:
                source = value.decode()
    except WireError as exc:
        raise Refused("malformed", f"not a ContainerEventBatch: {exc}") from None
    except UnicodeDecodeError:
        raise Refused("malformed", "not a ContainerEventBatch: invalid UTF-8 in its source") from None
    if source not in SOURCES:
        raise Refused("unknown_source", f"batch source {source!r} is not one of {list(SOURCES)}")
    return events, source


def _check_text(name: str, value: str, max_bytes: int) -> None:
    """A text field the log and the tables keep: at most `max_bytes` in UTF-8, no NUL."""
    size = len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise Refused("malformed", f"{name} is {size} bytes in UTF-8, over {max_bytes}")
    if "\x00" in value:
        raise Refused("malformed", f"{name} contains a NUL character")


def metadata_node(value: object) -> str:
    """The gRPC metadata `node_name` (the original agent's), held to an event's `node` limits: it
    fills the `node` of every event of the stream that names none."""
    if not isinstance(value, str):
        raise Refused("malformed", "metadata node_name must be text")
    _check_text("metadata node_name", value, MAX_NODE)
    return value


def _check_ids(event_type: str, container_id: str, node: str) -> None:
    if not container_id:
        raise Refused("missing_container_id", f"event {event_type!r} has no container_id")
    _check_text("container_id", container_id, MAX_CONTAINER_ID)
    if event_type not in EVENT_TYPES:
        raise Refused(
            "unknown_type",
            f"container {container_id!r}: unknown event type {event_type!r:.80}; expected one of {sorted(EVENT_TYPES)}",
        )
    _check_text("node", node, MAX_NODE)


def _cluster(named: str, origin: Origin) -> str:
    if origin.token_cluster is not None:
        if named and named != origin.token_cluster:
            raise Refused(
                "wrong_cluster", f"event names cluster {named!r} but the token belongs to another cluster"
            )
        return origin.token_cluster
    cluster = named or origin.default_cluster
    if cluster not in _VALID_CLUSTERS:
        problem = validate_cluster_name(cluster)
        if problem:
            raise Refused("bad_cluster", f"cluster name {problem}")
        if len(_VALID_CLUSTERS) < MAX_REMEMBERED_CLUSTERS:
            _VALID_CLUSTERS.add(cluster)
    return cluster


# Cluster names found valid, so that each event of a stream does not match its name again (bounded:
# names come from the agents).
_VALID_CLUSTERS: set[str] = set()
MAX_REMEMBERED_CLUSTERS = 10_000


def _event_id(event_id: str) -> str | None:
    _check_text("event_id", event_id, MAX_EVENT_ID)
    return event_id or None


def _check_value(key: str, kind: str, value: Any) -> None:
    """Values of the read fields that no table could hold: a NUL in text, a creation time that is
    no time (NaN, infinite, negative, after 2200)."""
    if kind == "string" and isinstance(value, str) and "\x00" in value:
        raise Refused("malformed_data", f"data.{key} contains a NUL character")
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if key == "created_at" and number and not (math.isfinite(value) and 0 <= value < MAX_CREATED_AT_NANOS):
        raise Refused(
            "malformed_data",
            f"data.created_at must be nanoseconds since the epoch before 2200, not {value!r:.40}",
        )


# The same expectations as the protobuf `Value` member each field must be set in (or null_value).
_PB_EXPECTED = {
    source: tuple((key, f"{kind}_value") for key, kind in fields.items())
    for source, fields in (("k8s", _K8S_FIELDS), ("docker", _DOCKER_FIELDS))
}
_PB_NULL = (None, "null_value")


def _pb_shape(data: Any, source: str) -> int:
    """Check the Struct's fields the asset reads; the number of GPU devices (no GPU: the original
    ignored the event).

    Every event of every stream passes here: each field is looked up once, asked whether it holds
    the expected member (the kind it does hold is asked only to say what is wrong), and only the
    values a check reads (text for NUL, the creation time) are converted to Python."""
    fields = data.fields
    for key, member in _PB_EXPECTED[source]:
        if key not in fields:
            continue
        value = fields[key]
        if not value.HasField(member):
            found = value.WhichOneof("kind")
            if found in _PB_NULL:
                continue
            raise Refused(
                "malformed_data",
                f"data.{key} must be a {_PB_KIND[member]}, not a {_PB_KIND.get(found, found)}",
            )
        if member == "string_value":
            if "\x00" in value.string_value:
                raise Refused("malformed_data", f"data.{key} contains a NUL character")
        elif key == "created_at":
            _check_value(key, "number", value.number_value)
    if source == "docker":
        devices = fields["Devices"].list_value.values if "Devices" in fields else ()
        _pb_objects(devices, "data.Devices")
        return len(devices)
    if "devices" not in fields:
        return 0
    gpus = 0
    lists = fields["devices"].struct_value.fields
    for name in _DEVICE_LISTS[source]:
        if name not in lists:
            continue
        value = lists[name]
        if not value.HasField("list_value"):
            if value.WhichOneof("kind") in _PB_NULL:
                continue
            raise Refused("malformed_data", f"data.devices.{name} must be a list of devices")
        values = value.list_value.values
        _pb_objects(values, f"data.devices.{name}")
        if name == "gpu":
            gpus = len(values)
    return gpus


def _pb_objects(values: Any, where: str) -> None:
    for item in values:
        if not item.HasField("struct_value"):
            index = next(i for i, value in enumerate(values) if not value.HasField("struct_value"))
            raise Refused("malformed_data", f"{where}[{index}] must be an object")


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "struct"
    if isinstance(value, list):
        return "list"
    return type(value).__name__


def _json_shape(data: Mapping[str, Any], source: str) -> int:
    """`_pb_shape` for an event's JSON `data`."""
    expected = _K8S_FIELDS if source == "k8s" else _DOCKER_FIELDS
    for key, kind in expected.items():
        if key in data:
            found = _json_kind(data[key])
            if found not in (kind, "null"):
                raise Refused("malformed_data", f"data.{key} must be a {kind}, not a {found}")
            _check_value(key, kind, data[key])
    if source == "docker":
        devices = data.get("Devices") or []
        for index, device in enumerate(devices):
            if not isinstance(device, Mapping):
                raise Refused("malformed_data", f"data.Devices[{index}] must be an object")
        return len(devices)
    gpus = 0
    lists = data.get("devices") or {}
    for name in _DEVICE_LISTS[source]:
        value = lists.get(name)
        if value is None:
            continue
        if not isinstance(value, list):
            raise Refused("malformed_data", f"data.devices.{name} must be a list of devices")
        for index, device in enumerate(value):
            if not isinstance(device, Mapping):
                raise Refused("malformed_data", f"data.devices.{name}[{index}] must be an object")
        if name == "gpu":
            gpus = len(value)
    return gpus


def event_key(
    cluster: str, source: str, container_id: str, event_type: str, event_id: str | None, content: bytes
) -> bytes:
    """What makes two events the same: the agent's event id when it sends one, else the content
    (`content`: the data serialized deterministically, Go's random map order undone)."""
    if event_id:
        material = b"\0".join((b"id", cluster.encode(), event_id.encode()))
    else:
        material = b"\0".join(
            (b"ev", cluster.encode(), source.encode(), container_id.encode(), event_type.encode(), content)
        )
    return hashlib.sha256(material).digest()


def _row(
    origin: Origin,
    cluster: str,
    event_type: str,
    container_id: str,
    node: str,
    event_id: str | None,
    gpus: int,
    content: bytes,
    payload: bytes,
    payload_format: str,
    received_at: Any,
) -> dict:
    return {
        "cluster_name": cluster,
        "event_key": event_key(cluster, origin.source, container_id, event_type, event_id, content),
        "source": origin.source,
        "event_type": event_type,
        "container_id": container_id,
        "node_name": node or origin.node,
        "event_id": event_id,
        # The original ignored k8s events without GPUs, except (later) snapshots (spec §2.1, §2.2).
        "needs_processing": origin.source == "docker" or event_type == SNAPSHOT or gpus > 0,
        "payload": payload,
        "payload_format": payload_format,
        "received_at": received_at,
    }
