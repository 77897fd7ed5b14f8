"""What the sidecar takes and what it refuses, with the reasons an operator reads (pure)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from lens_pipeline.ingest.events import (
    ContainerEvent,
    Origin,
    Refused,
    _json_shape,
    _pb_shape,
    event_key,
    from_grpc,
    from_json,
)
from lens_pipeline.sim import node_agent as agent
from lens_pipeline.store.event_log import LoggedEvent
from lens_pipeline_tests.ingest.support import container_id, gpu_container

NOW = datetime(2026, 11, 22, 6, 0, tzinfo=UTC)
K8S = Origin("k8s", None, "east")


def _event(**fields) -> bytes:
    message = ContainerEvent(
        type=fields.pop("type", "Running"), container_id=fields.pop("container_id", container_id(1))
    )
    data = fields.pop("data", gpu_container(1, "Running"))
    if data is not None:
        message.data.update(data)
    for key, value in fields.items():
        setattr(message, key, value)
    return message.SerializeToString()


def test_a_real_shaped_event_becomes_a_log_row():
    row = from_grpc(_event(node="node-1"), K8S, NOW)
    assert row["cluster_name"] == "east"
    assert (row["source"], row["event_type"], row["container_id"], row["node_name"]) == (
        "k8s",
        "Running",
        container_id(1),
        "node-1",
    )
    assert row["needs_processing"] is True
    assert row["payload_format"] == "event" and row["received_at"] == NOW


def test_the_original_clients_bytes_are_understood():
    raw = agent.event("snapshot", container_id(1), gpu_container(1, "Running"))
    row = from_grpc(raw, Origin("k8s", None, "east", node="node-7"), NOW)
    assert row["event_type"] == "snapshot" and row["node_name"] == "node-7"  # node from stream metadata


@pytest.mark.parametrize(
    ("raw", "reason", "words"),
    [
        (_event(container_id=""), "missing_container_id", "no container_id"),
        (_event(type="restart"), "unknown_type", "unknown event type 'restart'"),
        (_event(type=""), "unknown_type", "unknown event type ''"),
        (_event(data=None), "missing_data", "has no data"),
        (_event(data={"devices": {"gpu": "card0"}}), "malformed_data", "data.devices.gpu must be a list"),
        (
            _event(data={"devices": {"gpu": [1, 2]}}),
            "malformed_data",
            "data.devices.gpu[0] must be an object",
        ),
        (
            _event(data={"devices": {"gpu": [{}, {"id": 1}, "card2", 3]}}),
            "malformed_data",
            "data.devices.gpu[2] must be an object",  # the first that is not
        ),
        (
            _event(data={"devices": {"gpu": None, "infiniband": [{}, 5]}}),
            "malformed_data",
            "data.devices.infiniband[1] must be an object",
        ),
        (_event(data={"created_at": "yesterday"}), "malformed_data", "data.created_at must be a number"),
        (_event(data={"created_at": -1}), "malformed_data", "nanoseconds since the epoch"),
        (_event(data={"status": "Run\x00ning"}), "malformed_data", "data.status contains a NUL"),
        (_event(data={"pod_name": 7}), "malformed_data", "data.pod_name must be a string"),
        (_event(data={"devices": []}), "malformed_data", "data.devices must be a struct"),
        (b"\x0a\x03\xff\xfe\xfd", "malformed", "invalid UTF-8"),  # field 1 (type) with invalid UTF-8
        (b"\x12\x05abc", "malformed", "not a ContainerEvent"),  # truncated
        (_event(container_id="x" * 129), "malformed", "over 128"),
    ],
)
def test_malformed_events_are_refused_with_a_reason(raw, reason, words):
    with pytest.raises(Refused) as refused:
        from_grpc(raw, K8S, NOW)
    assert refused.value.reason == reason
    assert words in str(refused.value)


def test_an_event_over_the_limit_is_refused():
    raw = _event()
    with pytest.raises(Refused, match=f"event of {len(raw)} bytes is over the limit of 100 bytes"):
        from_grpc(raw, K8S, NOW, max_bytes=100)


def test_the_token_decides_the_cluster():
    token = Origin("k8s", "west", "east")
    assert from_grpc(_event(), token, NOW)["cluster_name"] == "west"
    assert from_grpc(_event(cluster="west"), token, NOW)["cluster_name"] == "west"
    with pytest.raises(Refused, match="names cluster 'north'") as refused:
        from_grpc(_event(cluster="north"), token, NOW)
    assert refused.value.reason == "wrong_cluster"
    with pytest.raises(Refused, match="DNS-1123"):
        from_grpc(_event(cluster="Bad,Name"), K8S, NOW)


def test_the_same_event_has_the_same_key_and_an_event_id_wins():
    first = from_grpc(_event(), K8S, NOW)
    # Go marshals map entries in random order: the key must not depend on it.
    reordered = ContainerEvent(type="Running", container_id=container_id(1))
    reordered.data.update(dict(reversed(list(gpu_container(1, "Running").items()))))
    again = from_grpc(reordered.SerializeToString(), K8S, NOW)
    assert first["event_key"] == again["event_key"]
    assert from_grpc(_event(type="Exit"), K8S, NOW)["event_key"] != first["event_key"]
    with_id = from_grpc(_event(event_id="node-1/42"), K8S, NOW)
    other_data = from_grpc(_event(event_id="node-1/42", data={"status": "x"}), K8S, NOW)
    assert with_id["event_key"] == other_data["event_key"] == event_key("east", "", "", "", "node-1/42", b"")


def test_events_the_original_ignored_are_logged_but_need_no_processing():
    no_gpu = gpu_container(1, "Running", gpus=0)
    assert from_grpc(_event(data=no_gpu), K8S, NOW)["needs_processing"] is False
    assert from_grpc(_event(type="snapshot", data=no_gpu), K8S, NOW)["needs_processing"] is True


def test_http_events_are_checked_the_same_way():
    event = {
        "type": "Running",
        "source": "k8s",
        "node": "n1",
        "container_id": "c1",
        "data": gpu_container(1, "Running"),
    }
    row = from_json(event, K8S, NOW)
    assert row["payload_format"] == "json" and row["node_name"] == "n1"
    docker = {
        **event,
        "source": "docker",
        "data": agent.docker_container("c1", name="/x", status="up", started_at=""),
    }
    assert from_json(docker, K8S, NOW)["source"] == "docker"
    for broken, reason in (
        ({k: v for k, v in event.items() if k != "node"}, "missing_field"),
        ({**event, "source": "podman"}, "unknown_source"),
        ({**event, "data": [1]}, "malformed_data"),
        ({**event, "container_id": 5}, "malformed"),
        ("not an object", "malformed"),
    ):
        with pytest.raises(Refused) as refused:
            from_json(broken, K8S, NOW)
        assert refused.value.reason == reason


@pytest.mark.parametrize(
    ("source", "data", "gpus_or_words"),
    [
        ("k8s", gpu_container(1, "Running", gpus=3, nics=2), 3),
        ("k8s", {"pod_name": None, "status": None, "devices": None}, 0),  # null: as if absent
        ("k8s", {"devices": {"gpu": None, "infiniband": [{}]}}, 0),
        ("k8s", {"devices": {"gpu": [{}, {}], "infiniband": None}}, 2),
        ("docker", {"ID": "c1", "Devices": [{"PathOnHost": "/dev/kfd"}, {}]}, 2),
        ("docker", {"ID": "c1", "Devices": None}, 0),
        ("docker", {"ID": "c1", "Devices": [{}, "card1"]}, "data.Devices[1] must be an object"),
        ("docker", {"ID": 7}, "data.ID must be a string, not a number"),
        ("k8s", {"labels": "a=b"}, "data.labels must be a struct, not a string"),
        ("k8s", {"devices": {"gpu": {}}}, "data.devices.gpu must be a list of devices"),
    ],
)
def test_both_transports_count_gpus_and_refuse_the_same_data_with_the_same_words(source, data, gpus_or_words):
    """gRPC checks the data `Struct` where HTTP checks the JSON object: the same fields, the same
    counts, the same words, and only the events the original would process need processing."""
    origin = Origin(source, None, "east")
    message = ContainerEvent(type="Running", container_id=container_id(1))
    message.data.update(data)
    event = {"type": "Running", "source": source, "node": "n1", "container_id": "c1", "data": data}
    if isinstance(gpus_or_words, str):
        for transport in (
            lambda: from_grpc(message.SerializeToString(), origin, NOW),
            lambda: from_json(event, origin, NOW),
        ):
            with pytest.raises(Refused, match=re.escape(gpus_or_words)) as refused:
                transport()
            assert refused.value.reason == "malformed_data"
        return
    assert _pb_shape(message.data, source) == _json_shape(data, source) == gpus_or_words
    needs = source == "docker" or gpus_or_words > 0
    assert from_grpc(message.SerializeToString(), origin, NOW)["needs_processing"] is needs
    assert from_json(event, origin, NOW)["needs_processing"] is needs


def test_an_event_with_number_fields_is_read_back_from_the_log():
    """A stored event is the agent's bytes as sent; numbers in it (an agent echoing `sequence`)
    are stepped over when the log reads its `data` back, never a reason to lose the event."""
    data = gpu_container(1, "Running")
    row = from_grpc(_event(node="node-1", sequence=2**40, data=data), K8S, NOW)
    assert row["payload_format"] == "event"
    logged = LoggedEvent(
        id=1,
        index=0,
        cluster="east",
        source="k8s",
        event_type="Running",
        container_id=container_id(1),
        node_name="node-1",
        event_id=None,
        needs_processing=True,
        payload=row["payload"],
        payload_format=row["payload_format"],
        received_at=NOW,
    )
    assert logged.data() == data
