"""A simulated node agent: built from the original protocol file alone, it sends real-shaped
container events (spec §2.1) the way Primus-Lens's node-exporter did, and reads acknowledgements.

Wire compatibility is the point, so this client never imports lens-pipeline's own generated
code: it speaks through a private descriptor pool built from what protoc makes of
`lens_pipeline/ingest/contract/exporter.proto` (the original, field for field), the committed
`exporter_contract.pb` (`python -m lens_pipeline.ingest.protogen` writes it; a test compiles the
.proto again and compares), so no protoc is needed to run the simulator. Ack-aware sending (resend
what was not acknowledged) reads fields 7 and 8 of the reply by number, as a newer agent would.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from lens_pipeline.protowire import varint

CONTRACT = Path(__file__).resolve().parents[1] / "ingest" / "contract" / "exporter.proto"
DESCRIPTORS = Path(__file__).resolve().with_name("exporter_contract.pb")
SERVICE = "/exporter.ExporterService/"
K8S_METHOD = SERVICE + "StreamContainerEvents"
DOCKER_METHOD = SERVICE + "StreamDockerContainerEvents"
# lens ingest's added method: `ContainerEventBatch {repeated ContainerEvent events = 1; string source = 2}`.
BATCH_METHOD = SERVICE + "StreamContainerEventBatches"
# Reply fields beyond the original message, read by number from the unknown fields.
ACK_SEQUENCE_FIELD = 7
ERROR_FIELD = 8


@functools.cache
def original_event_class() -> Any:
    """The `ContainerEvent` message class of the original .proto (a private pool)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    descriptors = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTORS.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in descriptors.file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("exporter.ContainerEvent"))


def event(event_type: str, container_id: str, data: dict[str, Any], node: str = "") -> bytes:
    """One serialized original `ContainerEvent`."""
    message = original_event_class()(type=event_type, container_id=container_id, node=node)
    message.data.update(data)
    return message.SerializeToString()


def with_extra_fields(raw: bytes, *, event_id: str | None = None, cluster: str | None = None) -> bytes:
    """An event with the optional fields 5 (event_id) and 6 (cluster) appended, as a newer agent sends."""
    extra = b""
    for number, value in ((5, event_id), (6, cluster)):
        if value is not None:
            encoded = value.encode()
            extra += _varint(number << 3 | 2) + _varint(len(encoded)) + encoded
    return raw + extra


def batch(events: Sequence[bytes], source: str = "k8s") -> bytes:
    """A `ContainerEventBatch` of serialized events, written field by field (not in the original proto)."""
    parts = [_varint(1 << 3 | 2) + _varint(len(raw)) + raw for raw in events]
    if source != "k8s":
        parts.append(_varint(2 << 3 | 2) + _varint(len(source)) + source.encode())
    return b"".join(parts)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# Real-shaped data ------------------------------------------------------------------------------


def amd_gpu(index: int, node_seed: int = 0) -> dict[str, Any]:
    """A DeviceInfo as the AMD agent built it from amd-smi: uuid is the ASIC's device id (the same
    for every card of a model), the serial tells cards apart."""
    return {
        "name": "AMD Instinct MI300X",
        "id": index,
        "path": f"/dev/dri/card{index + 1}",
        "type": "",
        "kind": "GPU",
        "uuid": "0x74a1",
        "serial": f"{0x5C3A000000 + node_seed * 16 + index:X}",
        "slot": f"0000:{0x0C + index * 0x10:02x}:00.0",
    }


def nvidia_gpu(index: int, node_seed: int = 0) -> dict[str, Any]:
    """A DeviceInfo for an NVIDIA card: the UUID (GPU-...) is unique per card."""
    return {
        "name": "NVIDIA H100 80GB HBM3",
        "id": index,
        "path": f"/dev/nvidia{index}",
        "type": "",
        "kind": "GPU",
        "uuid": f"GPU-{node_seed:08x}-{index:04x}-4000-8000-{node_seed * 16 + index:012x}",
        "serial": f"16523{node_seed:05d}{index:02d}",
        "slot": f"0000:{0x18 + index * 0x10:02x}:00.0",
    }


def infiniband(index: int, node_seed: int = 0) -> dict[str, Any]:
    """An RDMA device as found through /dev/infiniband/uverbsN: name = ifname, uuid = node GUID."""
    return {
        "name": f"mlx5_{index}",
        "id": 3 + index,
        "path": f"/dev/infiniband/uverbs{index}",
        "type": "",
        "kind": "rdma",
        "uuid": f"0c42:a103:{node_seed:04x}:{index:04x}",
        "serial": f"mlx5_{index}",
    }


CRI_STATES = {
    "Created": "CONTAINER_CREATED",
    "Running": "CONTAINER_RUNNING",
    "Exit": "CONTAINER_EXITED",
    "OOMKilled": "CONTAINER_EXITED",
    "Deleted": "CONTAINER_EXITED",
}


# A container's start after its creation, in the agent's events (nanoseconds).
STARTED_AFTER_CREATED_NS = 1_500_000_000


def k8s_container(
    container_id: str,
    *,
    name: str,
    pod_name: str,
    pod_namespace: str,
    pod_uid: str,
    status: str,
    created_ns: int,
    gpus: Sequence[dict[str, Any]] = (),
    nics: Sequence[dict[str, Any]] = (),
    exit_code: int = 0,
    finished_ns: int | None = None,
    updated_ns: int | None = None,
) -> dict[str, Any]:
    """`model.Container`: the CRI ContainerStatus fields inlined, plus what the agent adds. Its
    times follow `created_ns`: started 1.5 s later; an exited container finished at `finished_ns`
    (an hour after its creation when not given); the agent's last update at `updated_ns` (else the
    latest of those)."""
    exited = status in ("Exit", "OOMKilled", "Deleted")
    started_ns = created_ns + STARTED_AFTER_CREATED_NS if status != "Created" else 0
    finished = (finished_ns if finished_ns is not None else created_ns + 3_600_000_000_000) if exited else 0
    updated = updated_ns if updated_ns is not None else max(created_ns, started_ns, finished)
    return {
        "id": container_id,
        "metadata": {"name": name, "attempt": 0},
        "state": CRI_STATES.get(status, "CONTAINER_UNKNOWN"),
        "created_at": created_ns,
        "started_at": started_ns,
        "finished_at": finished,
        "exit_code": exit_code,
        "image": {"image": "docker.io/rocm/pytorch:rocm6.2_ubuntu22.04_py3.10_pytorch_2.3.0"},
        "image_ref": "docker.io/rocm/pytorch@sha256:" + "ab" * 32,
        "reason": "OOMKilled" if status == "OOMKilled" else ("Completed" if exited else ""),
        "message": "",
        "labels": {
            "io.kubernetes.container.name": name,
            "io.kubernetes.pod.name": pod_name,
            "io.kubernetes.pod.namespace": pod_namespace,
            "io.kubernetes.pod.uid": pod_uid,
        },
        "annotations": {
            "io.kubernetes.container.hash": "6f0c7d2e",
            "io.kubernetes.container.restartCount": "0",
            "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
            "io.kubernetes.container.terminationMessagePolicy": "File",
            "io.kubernetes.pod.terminationGracePeriod": "30",
        },
        "mounts": [],
        "log_path": f"/var/log/pods/{pod_namespace}_{pod_name}_{pod_uid}/{name}/0.log",
        "pod_name": pod_name,
        "pod_namespace": pod_namespace,
        "pod_uuid": pod_uid,
        "devices": {"gpu": list(gpus), "infiniband": list(nics)},
        "status": status,
        "pid": 0 if exited else 41_000 + len(name),
        "oom_killed": status == "OOMKilled",
        "exit_time": _go_time(finished) if exited else "0001-01-01T00:00:00Z",
        "last_updated": _go_time(updated),
    }


def _go_time(nanos: int) -> str:
    """A `time.Time` as Go's encoding/json writes it (RFC 3339, nanoseconds without trailing zeros)."""
    seconds, fraction = divmod(nanos, 1_000_000_000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{text}.{fraction:09d}".rstrip("0").rstrip(".") + "Z"


def docker_container(
    container_id: str, *, name: str, status: str, started_at: str, devices: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """`model.DockerContainerInfo` as the original serialized it (Go field names, no json tags)."""
    return {
        "ID": container_id,
        "Name": name,
        "Labels": {"com.docker.compose.project": "train"},
        "Cmd": ["python", "train.py"],
        "Devices": list(devices),
        "Mounts": [],
        "StartAt": started_at,
        "Status": status,
    }


# Streaming -------------------------------------------------------------------------------------


@dataclass
class StreamResult:
    acked: int = 0  # every event up to this position was acknowledged
    errors: dict[int, str] = field(default_factory=dict)  # position -> why it was refused
    code: grpc.StatusCode | None = None  # None: the server closed the stream normally
    details: str = ""
    replies: int = 0


def stream_events(
    channel: grpc.Channel,
    events: Iterable[bytes],
    *,
    method: str = K8S_METHOD,
    metadata: Sequence[tuple[str, str]] = (),
    timeout: float | None = 60.0,
) -> StreamResult:
    """Send `events` on one stream and read the replies until the server closes it."""
    call = channel.stream_stream(method, request_serializer=None, response_deserializer=None)
    result = StreamResult()
    try:
        for raw in call(iter(events), metadata=tuple(metadata), timeout=timeout):
            result.replies += 1
            reply = read_reply(raw)
            if reply.type == "ack":
                result.acked = max(result.acked, reply.sequence)
            elif reply.type == "error":
                result.errors[reply.sequence] = reply.error
    except grpc.RpcError as exc:
        result.code, result.details = exc.code(), exc.details() or ""
    return result


@dataclass(frozen=True)
class Reply:
    type: str  # "ack" | "error"
    sequence: int
    error: str


def read_reply(raw: bytes) -> Reply:
    """A server reply: `type` through the original message, fields 7 and 8 from the bytes."""
    sequence, error = _extra_fields(raw)
    return Reply(original_event_class().FromString(raw).type, sequence, error)


def _extra_fields(data: bytes) -> tuple[int, str]:
    """Fields 7 (sequence) and 8 (error): unknown to the original message, read from the bytes."""
    sequence, error = 0, ""
    i = 0
    while i < len(data):
        key, i = varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(data, i)
            if number == ACK_SEQUENCE_FIELD:
                sequence = value
        elif wire == 2:
            length, i = varint(data, i)
            if number == ERROR_FIELD:
                error = data[i : i + length].decode()
            i += length
        else:
            raise ValueError(f"unexpected wire type {wire} in a reply")
    return sequence, error


def paced(events: Sequence[bytes], per_second: float) -> Iterator[bytes]:
    """Yield events at a steady rate (a live agent, not a replay)."""
    start = time.monotonic()
    for index, raw in enumerate(events):
        delay = start + index / per_second - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield raw
