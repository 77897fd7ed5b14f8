"""Container events applied in order -> container, device and lifecycle rows (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lens_pipeline.collect.containers import ContainerEventRecord, apply_events, gpu_identity
from lens_pipeline.sim import node_agent as agent
from lens_pipeline_tests.ingest.support import CREATED_NS, container_id, gpu_container

T0 = datetime(2026, 11, 22, 6, 0, tzinfo=UTC)


def _record(log_id, event_type, data, *, source="k8s", node="node-1", cid=None):
    return ContainerEventRecord(
        log_id, source, event_type, cid or container_id(1), node, data, T0 + timedelta(seconds=log_id)
    )


def test_a_container_gets_its_real_name_pod_devices_and_lifecycle():
    rows = apply_events(
        [
            _record(1, "snapshot", gpu_container(1, "Running"), node=""),
            _record(2, "Exit", gpu_container(1, "Exit")),
        ],
        stored={},
    )
    container = rows.containers[container_id(1)]
    assert container["container_name"] == "trainer"  # not the CRI id (spec §10.6)
    assert (container["pod_name"], container["pod_namespace"]) == ("train-1", "ml")
    assert container["pod_uid"] == "00000000-0000-4000-8000-000000000001"
    assert container["status"] == "Exit" and container["node_name"] == "node-1"
    assert container["created_at"] == datetime.fromtimestamp((CREATED_NS + 1_000_000_000) / 1e9, UTC)
    assert container["updated_at"] == T0 + timedelta(seconds=2)
    assert sorted((d["device_type"], d["device_no"], d["device_uuid"]) for d in rows.devices.values()) == [
        ("gpu", 0, "5C3A000010"),
        ("gpu", 1, "5C3A000011"),
        ("ib", 3, "0c42:a103:0001:0000"),
    ]
    assert [(e["event_type"], e["created_at"]) for e in rows.events.values()] == [
        ("Exit", T0 + timedelta(seconds=2))
    ]


def test_an_event_without_a_field_keeps_what_was_stored():
    stored = {container_id(1): {"container_id": container_id(1), "node_name": "node-9", "status": "Running"}}
    data = {"status": "", "devices": {"gpu": [agent.amd_gpu(0)]}}
    rows = apply_events([_record(1, "snapshot", data, node="")], stored)
    assert rows.containers[container_id(1)]["node_name"] == "node-9"
    assert rows.containers[container_id(1)]["status"] == "Running"


def test_nvidia_gpus_are_told_apart_by_uuid_and_amd_gpus_by_serial():
    assert gpu_identity(agent.nvidia_gpu(3, 1)).startswith("GPU-")
    assert gpu_identity(agent.amd_gpu(3, 1)) == agent.amd_gpu(3, 1)["serial"]
    rows = apply_events([_record(1, "Running", gpu_container(1, "Running", vendor="nvidia", gpus=8))], {})
    assert len({d["device_uuid"] for d in rows.devices.values() if d["device_type"] == "gpu"}) == 8


def test_docker_containers_and_their_devices():
    data = agent.docker_container(
        "d1",
        name="/train",
        status="running",
        started_at="2026-11-22T05:00:00Z",
        devices=[{"DeviceType": "", "DeviceSerial": "S1", "DeviceName": "MI300X", "DeviceId": "2"}],
    )
    rows = apply_events([_record(1, "snapshot", data, source="docker", cid="d1")], {})
    assert rows.containers["d1"]["container_name"] == "train"
    assert rows.containers["d1"]["created_at"] == datetime(2026, 11, 22, 5, 0, tzinfo=UTC)
    assert next(iter(rows.devices.values())) | {"created_at": None, "updated_at": None} == {
        "container_id": "d1",
        "device_type": "gpu",
        "device_name": "MI300X",
        "device_no": 2,
        "device_uuid": "S1",
        "created_at": None,
        "updated_at": None,
    }
    assert rows.events == {}  # a snapshot is not a lifecycle event


def test_a_device_without_identity_is_a_problem_not_a_row():
    data = {"devices": {"gpu": [{"name": "x", "id": 0}]}}
    rows = apply_events([_record(1, "Running", data)], {})
    assert rows.devices == {} and "without serial or uuid" in str(rows.problems[0])
