"""Container events -> `node_container`, `node_container_devices`, `node_container_event` rows (spec §2.1, §2.2).

Pure: the events of one cluster's log (oldest first, data already decoded) and the stored rows of
the containers they touch in; the rows to write out. Events are applied in order, so a container's
row is its state after its newest event. Where the original stored the CRI container id as the
container's name (§10.6), the real name is used; an event that leaves a field empty (an early
snapshot has no node) keeps what was known.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lens_pipeline.collect.problems import Problem

SNAPSHOT = "snapshot"
# Container statuses a k8s event type stands for when the data carries no `status` (spec §2.1).
STATUS_TYPES = frozenset({"Created", "Running", "Exit", "Deleted", "OOMKilled"})
CONTAINER_COLUMNS = (
    "container_id",
    "container_name",
    "pod_uid",
    "pod_name",
    "pod_namespace",
    "status",
    "created_at",
    "node_name",
    "source",
)


@dataclass(frozen=True)
class ContainerEventRecord:
    """One logged event with its data decoded: what the asset hands to `apply_events`."""

    log_id: int
    source: str
    event_type: str
    container_id: str
    node_name: str
    data: Mapping[str, Any]
    received_at: datetime
    ref: Any = None  # what the caller needs to find the event again (its place in the log)


@dataclass
class ContainerRows:
    containers: dict[str, dict[str, Any]] = field(default_factory=dict)  # container_id -> row
    devices: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (container, uuid) -> row
    events: dict[tuple[str, str, datetime], dict[str, Any]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    # Events that could not be applied at all, with why: the caller quarantines them.
    unusable: list[tuple[ContainerEventRecord, str]] = field(default_factory=list)


def apply_events(
    events: Iterable[ContainerEventRecord],
    stored: Mapping[str, Mapping[str, Any]],
    widths: Mapping[str, int] | None = None,
) -> ContainerRows:
    """The rows that `events`, applied in order over the `stored` container rows, leave behind.

    Only containers an event touched appear in the result; `updated_at` is the newest event's
    receive time, `created_at` the container's creation time from the runtime (else first seen).
    An event whose rows would hold what the tables cannot (text with NUL, or longer than `widths`
    gives for its column) is not applied: it is returned in `unusable` with why.
    """
    out = ContainerRows()
    for event in events:
        current = out.containers.get(event.container_id) or stored.get(event.container_id)
        try:
            if event.source == "docker":
                row, devices = _docker(event, current)
            else:
                row, devices = _k8s(event, current)
            _storable(widths or {}, row, *devices)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            out.unusable.append((event, f"{type(exc).__name__}: {exc}"))
            continue
        out.containers[event.container_id] = row
        for device in devices:
            if not device["device_uuid"]:
                out.problems.append(
                    Problem(
                        "ContainerEvent",
                        f"log id {event.log_id}",
                        f"container {event.container_id}: {device['device_type']} device without serial or uuid",
                    )
                )
                continue
            device_key = (event.container_id, device["device_uuid"])
            previous = out.devices.get(device_key)
            out.devices[device_key] = {
                **device,
                "created_at": previous["created_at"] if previous else event.received_at,
                "updated_at": event.received_at,
            }
        if event.event_type != SNAPSHOT:
            event_key = (event.container_id, event.event_type, event.received_at)
            out.events[event_key] = {
                "container_id": event.container_id,
                "event_type": event.event_type,
                "created_at": event.received_at,
            }
    return out


def _storable(widths: Mapping[str, int], *rows: Mapping[str, Any]) -> None:
    """ValueError when a row holds what its table cannot: text with NUL (PostgreSQL refuses it) or
    longer than its column (PostgreSQL and MariaDB refuse it, SQLite would keep it)."""
    for row in rows:
        for column, value in row.items():
            if not isinstance(value, str):
                continue
            if "\x00" in value:
                raise ValueError(f"{column} contains a NUL character")
            if column in widths and len(value) > widths[column]:
                raise ValueError(f"{column} is {len(value)} characters, over its column's {widths[column]}")


def _k8s(
    event: ContainerEventRecord, current: Mapping[str, Any] | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = event.data
    labels = _mapping(data.get("labels"))
    metadata = _mapping(data.get("metadata"))
    status = data.get("status") or (event.event_type if event.event_type in STATUS_TYPES else None)
    row = _merge(
        current,
        event,
        {
            "container_name": metadata.get("name") or labels.get("io.kubernetes.container.name"),
            "pod_uid": data.get("pod_uuid") or labels.get("io.kubernetes.pod.uid"),
            "pod_name": data.get("pod_name") or labels.get("io.kubernetes.pod.name"),
            "pod_namespace": data.get("pod_namespace") or labels.get("io.kubernetes.pod.namespace"),
            "status": status,
            "created_at": _from_unix_nanos(data.get("created_at")),
        },
    )
    devices = _mapping(data.get("devices"))
    found = [_device(event.container_id, "gpu", d, gpu_identity(d)) for d in _devices(devices.get("gpu"))]
    found += [
        _device(event.container_id, "ib", d, _first(d, "uuid", "serial"))
        for d in _devices(devices.get("infiniband"))
    ]
    return row, found


def _docker(
    event: ContainerEventRecord, current: Mapping[str, Any] | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = event.data
    name = data.get("Name") or None
    row = _merge(
        current,
        event,
        {
            # Docker reports names with a leading "/".
            "container_name": name.lstrip("/") if isinstance(name, str) else None,
            "status": data.get("Status") or None,
            "created_at": _from_rfc3339(data.get("StartAt")),
        },
    )
    devices = [
        _device(
            event.container_id,
            d.get("DeviceType") or "gpu",
            {"name": d.get("DeviceName"), "id": d.get("DeviceId")},
            _first(d, "DeviceSerial"),
        )
        for d in _devices(data.get("Devices"))
    ]
    return row, devices


def _merge(
    current: Mapping[str, Any] | None, event: ContainerEventRecord, seen: Mapping[str, Any]
) -> dict[str, Any]:
    row: dict[str, Any] = dict(current) if current else dict.fromkeys(CONTAINER_COLUMNS)
    row["container_id"] = event.container_id
    for column, value in seen.items():
        if value not in (None, ""):
            row[column] = value
    if event.node_name:
        row["node_name"] = event.node_name
    row["source"] = event.source
    if row.get("created_at") is None:
        row["created_at"] = event.received_at
    row["updated_at"] = event.received_at
    return row


def gpu_identity(device: Mapping[str, Any]) -> str:
    """What tells one GPU from another. NVIDIA's UUID (`GPU-...`) is unique per card; the AMD
    agent's `uuid` is the ASIC's device id, the same for every card of a model, so its serial is used."""
    uuid = str(device.get("uuid") or "")
    if uuid.startswith("GPU-"):
        return uuid
    return _first(device, "serial", "uuid")


def _device(container_id: str, device_type: str, device: Mapping[str, Any], identity: str) -> dict[str, Any]:
    return {
        "container_id": container_id,
        "device_type": device_type,
        "device_name": _text(device.get("name")),
        "device_no": _int_or_none(device.get("id")),
        "device_uuid": identity,
    }


def _devices(value: Any) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise ValueError(f"a device list must be a list, not {type(value).__name__}")
    return [d for d in value if isinstance(d, Mapping)]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _first(device: Mapping[str, Any], *keys: str) -> str:
    for key in keys:
        value = device.get(key)
        if value not in (None, ""):
            return str(value)[:128]
    return ""


def _text(value: Any) -> str | None:
    return None if value in (None, "") else str(value)[:128]


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or value in (None, ""):
        return None
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


# The times a container can have been created at; every database keeps them (MariaDB's DATETIME
# starts in year 1000). Outside: ValueError, and the event is set aside.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)


def _in_window(when: datetime, what: str) -> datetime:
    if not EARLIEST <= when < LATEST:
        raise ValueError(f"{what} {when.isoformat()} is not a time a container was created at")
    return when


def _from_unix_nanos(value: Any) -> datetime | None:
    """CRI `created_at`: nanoseconds since the epoch (0 or absent: unknown)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return _in_window(datetime.fromtimestamp(value / 1e9, UTC), "created_at")


def _from_rfc3339(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value or value.startswith("0001-01-01"):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return _in_window(parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC), "StartAt")
