"""`lens ingest` over real sockets: an agent built from the original proto streams real-shaped
events; the `container_events` asset, run through Dagster, stores exactly what they imply."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import pytest
from dagster import instance_for_test, materialize
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from sqlalchemy import select

from lens_pipeline.defs.containers.assets import container_events
from lens_pipeline.defs.resources import LensDatabase
from lens_pipeline.ingest.config import Tokens
from lens_pipeline.sim import node_agent as agent
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.schema import node_container, node_container_devices, node_container_event
from lens_pipeline_tests.ingest.support import (
    channel,
    container_id,
    gpu_container,
    ingest_server,
    logged,
    post_json,
    post_json_to,
)
from lens_pipeline_tests.ports import free_port


def _materialize(lens_url: str, cluster: str = "east") -> dict:
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", [cluster])
        result = materialize(
            [container_events],
            partition_key=cluster,
            resources={"lens_db": LensDatabase(url=lens_url)},
            instance=instance,
        )
        assert result.success
        return result.asset_materializations_for_node("container_events")[0].metadata


def _table(lens_url: str, table, *columns: str) -> set[tuple]:
    with get_engine(lens_url).connect() as conn:
        return {tuple(row) for row in conn.execute(select(*(table.c[c] for c in columns)))}


def _log_count(lens_url: str) -> int:
    return len(logged(lens_url))


def test_an_original_agent_streams_and_the_tables_hold_what_the_events_imply(lens_url):
    k8s = [
        *(agent.event("snapshot", container_id(i), gpu_container(i, "Running")) for i in (1, 2)),
        *(
            agent.event("snapshot", container_id(i), gpu_container(i, "Running", vendor="nvidia", gpus=8))
            for i in (3, 4)
        ),
        agent.event(
            "Running", container_id(5), gpu_container(5, "Running", gpus=0), node="node-b"
        ),  # no GPU: ignored
        agent.event("Exit", container_id(1), gpu_container(1, "Exit"), node="node-a"),
        agent.event("OOMKilled", container_id(2), gpu_container(2, "OOMKilled"), node="node-a"),
    ]
    docker_data = agent.docker_container(
        "d" * 64,
        name="/bench",
        status="running",
        started_at="2026-11-22T05:00:00Z",
        devices=[{"DeviceType": "gpu", "DeviceSerial": "DS1", "DeviceName": "MI300X", "DeviceId": "0"}],
    )
    with ingest_server(lens_url) as server, channel(server) as ch:
        result = agent.stream_events(ch, k8s, metadata=[("node_name", "node-a")])
        assert (result.code, result.acked, result.errors) == (None, len(k8s), {})
        docker = agent.stream_events(
            ch, [agent.event("snapshot", "d" * 64, docker_data, "node-c")], method=agent.DOCKER_METHOD
        )
        assert docker.acked == 1
        replay = agent.stream_events(ch, k8s, metadata=[("node_name", "node-a")])
        assert replay.acked == len(k8s)
    assert _log_count(lens_url) == len(k8s) + 1  # the replay added nothing

    metadata = _materialize(lens_url)
    assert metadata["events_processed"].value == len(k8s)  # the no-GPU event needs no processing
    assert _table(
        lens_url,
        node_container,
        "cluster_name",
        "container_id",
        "container_name",
        "pod_name",
        "status",
        "node_name",
        "source",
    ) == {
        ("east", container_id(1), "trainer", "train-1", "Exit", "node-a", "k8s"),
        ("east", container_id(2), "trainer", "train-2", "OOMKilled", "node-a", "k8s"),
        ("east", container_id(3), "trainer", "train-3", "Running", "node-a", "k8s"),
        ("east", container_id(4), "trainer", "train-4", "Running", "node-a", "k8s"),
        ("east", "d" * 64, "bench", None, "running", "node-c", "docker"),
    }
    expected_devices = {
        *((container_id(i), "gpu", agent.amd_gpu(g, i)["serial"]) for i in (1, 2) for g in range(2)),
        *((container_id(i), "gpu", agent.nvidia_gpu(g, i)["uuid"]) for i in (3, 4) for g in range(8)),
        *((container_id(i), "ib", agent.infiniband(0, i)["uuid"]) for i in (1, 2, 3, 4)),
        ("d" * 64, "gpu", "DS1"),
    }
    assert (
        _table(lens_url, node_container_devices, "container_id", "device_type", "device_uuid")
        == expected_devices
    )
    assert {(c, t) for c, t in _table(lens_url, node_container_event, "container_id", "event_type")} == {
        (container_id(1), "Exit"),
        (container_id(2), "OOMKilled"),
    }

    # Nothing new: the next run writes nothing; a new event moves one container on.
    assert _materialize(lens_url)["events_processed"].value == 0
    with ingest_server(lens_url) as server, channel(server) as ch:
        more = [
            agent.event(
                "Deleted", container_id(3), gpu_container(3, "Deleted", vendor="nvidia", gpus=8), "node-a"
            )
        ]
        assert agent.stream_events(ch, more).acked == 1
    assert _materialize(lens_url)["events_processed"].value == 1
    assert ("east", container_id(3), "Deleted") in _table(
        lens_url, node_container, "cluster_name", "container_id", "status"
    )
    assert len(_table(lens_url, node_container_devices, "container_id", "device_uuid")) == len(
        expected_devices
    )


def test_bad_input_gets_an_error_per_event_and_the_stream_goes_on(sqlite_url):
    good = [agent.event("Running", container_id(i), gpu_container(i, "Running"), "n1") for i in range(1, 4)]
    bad_utf8 = good[0].replace(container_id(1).encode(), b"\xff" * 64)  # container_id is not UTF-8
    oversized = agent.event(
        "Running", container_id(9), {**gpu_container(9, "Running"), "blob": "x" * 9000}, "n1"
    )
    events = [
        good[0],
        bad_utf8,
        agent.event("Running", "", gpu_container(1, "Running")),  # missing container_id
        good[1],
        oversized,
        agent.event("Rebooted", container_id(8), gpu_container(8, "Running")),  # unknown type
        agent.event("Running", container_id(7), {"devices": {"gpu": "all"}}),  # data of the wrong shape
        good[2],
    ]
    with ingest_server(sqlite_url, max_event_bytes=8192) as server, channel(server) as ch:
        result = agent.stream_events(ch, events)
        assert result.code is None and result.acked == len(events)
        assert sorted(result.errors) == [2, 3, 5, 6, 7]
        assert "invalid UTF-8" in result.errors[2]
        assert "no container_id" in result.errors[3]
        assert "over the limit of 8192 bytes" in result.errors[5]
        assert "unknown event type 'Rebooted'" in result.errors[6]
        assert "data.devices.gpu must be a list" in result.errors[7]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics").read().decode()
    assert _log_count(sqlite_url) == 3
    assert 'primus_lens_jobs_container_event_recv_total{cluster="east",source="k8s"} 8.0' in metrics
    for reason, count in (
        ("malformed", 1),
        ("missing_container_id", 1),
        ("oversized", 1),
        ("unknown_type", 1),
        ("malformed_data", 1),
    ):
        assert (
            f'primus_lens_jobs_container_event_error_total{{cluster="east",reason="{reason}",source="k8s"}} {count}.0'
            in metrics
        )
    assert "primus_lens_jobs_event_processing_duration_seconds_bucket" in metrics
    assert "primus_lens_jobs_upstream_connected" in metrics


def test_a_wrong_or_missing_token_is_refused_and_writes_nothing(sqlite_url):
    tokens = Tokens({"east": "east-secret", "west": "west-secret"})
    raw = agent.event("Running", container_id(1), gpu_container(1, "Running"), "n1")
    with ingest_server(sqlite_url, tokens=tokens) as server, channel(server) as ch:
        for metadata in ([], [("authorization", "Bearer nope")], [("authorization", "Basic east-secret")]):
            result = agent.stream_events(ch, [raw], metadata=metadata)
            assert result.code == grpc.StatusCode.UNAUTHENTICATED and result.acked == 0
        status, _ = post_json(server, "/v1/container-events", _http_event(1), token="nope")
        assert status == 401
        assert _log_count(sqlite_url) == 0
        result = agent.stream_events(ch, [raw], metadata=[("authorization", "Bearer west-secret")])
        assert (result.code, result.acked) == (None, 1)
        status, answer = post_json(server, "/v1/container-events", _http_event(2), token="east-secret")
        assert (status, answer) == (200, {"total": 1, "success": 1, "error": 0})
    assert {(e.cluster, e.container_id) for e in logged(sqlite_url)} == {
        ("west", container_id(1)),
        ("east", container_id(2)),
    }


def test_a_metadata_node_name_past_the_limits_is_invalid_argument_naming_it(sqlite_url):
    """The original agent names its node in the stream's metadata; it fills every event that names
    none, so it is held to the same limits as an event's `node` (253 bytes of UTF-8, no NUL): a
    longer one ends the stream at once with INVALID_ARGUMENT naming it, nothing logged, counted."""
    raw = agent.event("Running", container_id(1), gpu_container(1, "Running"), "")
    with ingest_server(sqlite_url) as server, channel(server) as ch:
        result = agent.stream_events(ch, [raw], metadata=[("node_name", "n" * 1000)])
        assert result.code == grpc.StatusCode.INVALID_ARGUMENT and result.acked == 0
        assert "metadata node_name is 1000 bytes in UTF-8, over 253" in result.details
        result = agent.stream_events(ch, [raw], metadata=[("node_name", "n" * 253)])
        assert (result.code, result.acked) == (None, 1)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics").read().decode()
    assert [e.node_name for e in logged(sqlite_url)] == ["n" * 253]
    assert (
        'primus_lens_jobs_container_event_error_total{cluster="east",reason="malformed",source="k8s"} 1.0'
        in metrics
    )


def _http_event(index: int, **overrides) -> dict:
    return {
        "type": "Running",
        "source": "k8s",
        "node": "node-h",
        "container_id": container_id(index),
        "data": gpu_container(index, "Running"),
        **overrides,
    }


def test_the_http_form_answers_as_the_later_original(sqlite_url):
    with ingest_server(sqlite_url, max_event_bytes=8192) as server:
        assert post_json(server, "/v1/container-events", _http_event(1)) == (
            200,
            {"total": 1, "success": 1, "error": 0},
        )
        status, answer = post_json(
            server,
            "/v1/container-events/batch",
            {"events": [_http_event(2), _http_event(3, type="Nope"), _http_event(4)]},
        )
        assert status == 206 and (answer["total"], answer["success"], answer["error"]) == (3, 2, 1)
        assert answer["errors"][0]["index"] == 1 and answer["errors"][0]["reason"] == "unknown_type"
        status, answer = post_json(
            server, "/v1/container-events/batch", {"events": [_http_event(5, source="podman")]}
        )
        assert status == 400 and answer["error"] == 1
        assert post_json(server, "/v1/container-events", b"{not json")[0] == 400
        assert post_json(server, "/v1/container-events", b'{"type": "\xff"}')[0] == 400  # invalid UTF-8
        assert post_json(server, "/v1/container-events", b"x" * (17 << 20))[0] == 413
        # The same event again (same container_id + type + data) is acknowledged and not stored twice.
        assert post_json(server, "/v1/container-events", _http_event(1))[0] == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/healthz") as response:
            assert json.loads(response.read()) == {"status": "SERVING"}
        # The log writer cannot commit (what it reports while the database is away): unready, alive.
        server._set_health_threadsafe(False)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/healthz")
        assert refused.value.code == 503
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/livez") as response:
            assert json.loads(response.read()) == {"status": "alive"}
        server._set_health_threadsafe(True)
    assert _log_count(sqlite_url) == 3
    metadata = _materialize(sqlite_url)
    assert metadata["containers_written"].value == 3


def test_health_checking_and_reflection(sqlite_url):
    with ingest_server(sqlite_url) as server, channel(server) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "exporter.ExporterService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="exporter.ExporterService"),
        ]
        answers = list(stub.ServerReflectionInfo(iter(requests), timeout=5))
        services = {s.name for s in answers[0].list_services_response.service}
        assert {"exporter.ExporterService", "grpc.health.v1.Health"} <= services
        assert answers[1].file_descriptor_response.file_descriptor_proto


def test_tls_serves_agents_that_trust_the_ca(sqlite_url, tmp_path):
    from lens_pipeline.sim.tls import make_certificate

    certificate = make_certificate()
    (tmp_path / "tls.crt").write_bytes(certificate.cert_pem + certificate.ca_pem)
    (tmp_path / "tls.key").write_bytes(certificate.key_pem)
    raw = agent.event("Running", container_id(1), gpu_container(1, "Running"), "n1")
    with ingest_server(
        sqlite_url,
        tls_cert=str(tmp_path / "tls.crt"),
        tls_key=str(tmp_path / "tls.key"),
        metrics_port=free_port(),
    ) as server:
        credentials = grpc.ssl_channel_credentials(root_certificates=certificate.ca_pem)
        with grpc.secure_channel(f"127.0.0.1:{server.grpc_port}", credentials) as secure:
            assert agent.stream_events(secure, [raw]).acked == 1
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as plain:
            assert agent.stream_events(plain, [raw], timeout=5).code in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
        # The probes and the scrape: /livez, /healthz and /metrics in plain HTTP on the metrics
        # port, and no events there; the HTTP port serves them only over TLS.
        plain_http = f"http://127.0.0.1:{server.metrics_port}"
        for path, expected in (("/livez", {"status": "alive"}), ("/healthz", {"status": "SERVING"})):
            with urllib.request.urlopen(plain_http + path, timeout=5) as response:
                assert json.loads(response.read()) == expected
        with urllib.request.urlopen(plain_http + "/metrics", timeout=5) as response:
            assert b"primus_lens_jobs_container_event_recv_total" in response.read()
        assert post_json_to(plain_http, "/v1/container-events", _http_event(2))[0] == 404
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # TLS only: plain HTTP is cut
            urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/healthz", timeout=5).read()


@pytest.mark.parametrize("method", [agent.K8S_METHOD, agent.DOCKER_METHOD])
def test_both_original_methods_are_served(sqlite_url, method):
    data = (
        gpu_container(1, "Running")
        if method == agent.K8S_METHOD
        else agent.docker_container("d1", name="x", status="", started_at="")
    )
    with ingest_server(sqlite_url) as server, channel(server) as ch:
        assert agent.stream_events(ch, [agent.event("snapshot", "d1", data)], method=method).acked == 1


def test_a_batch_is_answered_event_by_event(sqlite_url):
    good = [agent.event("Running", container_id(i), gpu_container(i, "Running"), "n1") for i in range(1, 5)]
    first = agent.batch([good[0], b"\xff\xff", good[1]])
    second = agent.batch([good[2], agent.event("Nope", container_id(9), {}), good[3]])
    docker_data = agent.docker_container("d1", name="x", status="", started_at="")
    docker = agent.batch([agent.event("snapshot", "d1", docker_data)], "docker")
    with ingest_server(sqlite_url) as server, channel(server) as ch:
        result = agent.stream_events(ch, [first, second, docker, b"\x08\x01"], method=agent.BATCH_METHOD)
    assert result.code is None and result.acked == 8  # 7 events + 1 unreadable batch
    assert sorted(result.errors) == [2, 5, 8]
    assert {(e.source, e.container_id) for e in logged(sqlite_url)} == {
        *(("k8s", container_id(i)) for i in range(1, 5)),
        ("docker", "d1"),
    }


def test_an_ipv6_host_serves_both_ports(sqlite_url):
    """`--host ::1` (or `::`): gRPC takes the address bracketed, as it must, and HTTP binds it too."""
    raw = agent.event("Running", container_id(1), gpu_container(1, "Running"), "n1")
    with ingest_server(sqlite_url, host="::1") as server:
        with grpc.insecure_channel(f"[::1]:{server.grpc_port}") as ch:
            assert agent.stream_events(ch, [raw]).acked == 1
        with urllib.request.urlopen(f"http://[::1]:{server.http_port}/livez", timeout=5) as response:
            assert json.loads(response.read()) == {"status": "alive"}
