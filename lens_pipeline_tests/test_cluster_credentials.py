"""Every way a registry reaches an API server, held against the simulator over TLS: the original's
`multi-k8s-config` Secret of `ClusterConfig` JSON (bearer token or client certificate, CA data,
insecure-skip-tls-verify), and kubeconfigs with client certificates, through the real `kubernetes`
client and, where installed, kubectl."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess

import pytest
import yaml

from lens_pipeline.clusters import load_registry
from lens_pipeline.kube.reader import KubeError, KubeReader
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.kubeapi import client_user
from lens_pipeline.sim.registry import kubeconfig
from lens_pipeline.sim.server import SimServer


@pytest.fixture(scope="module")
def tls_fleet():
    fleet = SimFleet.generate(clusters=1, nodes=3, seed=9, vendor="amd")
    with SimServer(fleet, tls=True) as server:
        yield fleet.clusters[0], server


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _gpu_nodes(cluster_config) -> int:
    with KubeReader(cluster_config, max_retries=0) as reader:
        return len(reader.list("/api/v1/nodes", lambda n: n))


def test_the_original_secret_format_loads_and_reads(tls_fleet, tmp_path):
    cluster, server = tls_fleet
    secret = tmp_path / "multi-k8s-config"
    secret.mkdir()
    certificate = server.certificate
    cert, key = certificate.client_pair(client_user(cluster.name))
    # One key per cluster, as the original's Secret: Go writes []byte fields as base64.
    entries = {
        "by-token": {
            "host": server.base_url(cluster.name),
            "bearerToken": cluster.token,
            "caData": _b64(certificate.ca_pem),
        },
        "by-cert": {
            "host": server.base_url(cluster.name),
            "caData": _b64(certificate.ca_pem),
            "certData": _b64(cert),
            "keyData": _b64(key),
            "tlsServerName": "localhost",
        },
        "insecure": {
            "host": server.base_url(cluster.name),
            "bearerToken": cluster.token,
            "insecureSkipTLSVerify": True,
        },
        "untrusted": {"host": server.base_url(cluster.name), "bearerToken": cluster.token},
        "bad-ca": {"host": server.base_url(cluster.name), "bearerToken": "x", "caData": "not base64!"},
        "odd-field": {"host": server.base_url(cluster.name), "bearerToken": "x", "proxyURL": "http://p"},
        "Bad_Key": {"host": server.base_url(cluster.name), "bearerToken": "x"},
    }
    for name, entry in entries.items():
        (secret / name).write_text(json.dumps(entry))
    (secret / "..data").mkdir()  # what a mounted Secret carries beside its keys
    registry = load_registry(secret)
    assert registry.names == ["by-cert", "by-token", "insecure", "untrusted"]
    problems = {(e.cluster, e.field) for e in registry.errors}
    assert problems == {("bad-ca", "caData"), ("odd-field", "proxyURL"), ("Bad_Key", "name")}, registry.errors
    assert all(cluster.token not in str(e) for e in registry.errors)

    nodes = len(cluster.node_names()) + 2  # and the CPU nodes
    for name in ("by-token", "by-cert", "insecure"):
        assert _gpu_nodes(registry.get(name)) == nodes, name
    with pytest.raises(KubeError, match="CERTIFICATE_VERIFY_FAILED"):
        _gpu_nodes(registry.get("untrusted"))


def test_a_kubeconfig_with_a_client_certificate_reads_with_both_clients(tls_fleet, tmp_path):
    cluster, server = tls_fleet
    cert, key = server.certificate.client_pair(client_user(cluster.name))
    document = kubeconfig(cluster, server.base_url(cluster.name), server.certificate.ca_pem)
    document["users"][0]["user"] = {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}
    path = tmp_path / "cert.yaml"
    path.write_text(yaml.safe_dump(document))
    stranger_cert, stranger_key = server.certificate.client_pair("someone-else")
    stranger = dict(
        document,
        users=[
            {
                "name": cluster.name,
                "user": {
                    "client-certificate-data": _b64(stranger_cert),
                    "client-key-data": _b64(stranger_key),
                },
            }
        ],
    )
    (tmp_path / "stranger.yaml").write_text(yaml.safe_dump(stranger))
    (tmp_path / "clusters.yaml").write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {"name": "cert", "kubeconfig": "cert.yaml"},
                    {"name": "stranger", "kubeconfig": "stranger.yaml"},
                ]
            }
        )
    )
    registry = load_registry(tmp_path / "clusters.yaml")
    assert _gpu_nodes(registry.get("cert")) == len(cluster.node_names()) + 2
    with pytest.raises(KubeError, match="401"):
        _gpu_nodes(registry.get("stranger"))
    if shutil.which("kubectl"):  # an independent client agrees
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(path), "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.split()) == len(cluster.node_names()) + 2
