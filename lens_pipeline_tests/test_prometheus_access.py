"""A cluster's Prometheus behind what real ones sit behind: HTTPS from a private CA, a bearer token
or basic auth checked by a proxy, a client certificate, a tenant header. The registry's
`prometheus_http` (Prometheus' own `http_config` names) held against the simulator's Prometheus
over TLS, through `prometheus-api-client`, `lens doctor`'s probe and a real Dagster materialization."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import certifi
import pytest
from dagster import instance_for_test

from lens_pipeline.clusters import PrometheusHttp, load_registry
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.defs.resources import (
    ClusterRegistryResource,
    LensDatabase,
    PrometheusResource,
    SafeDatabase,
)
from lens_pipeline.doctor import FAIL, diagnose_cluster
from lens_pipeline.prom.reader import PromError
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.sim.tls import make_certificate
from lens_pipeline_tests.defs.support import edit_registry, materialize_cluster
from lens_pipeline_tests.ports import free_port

TOKEN, TENANT = "prom-token-1", "east"


@pytest.fixture(scope="module")
def tls_fleet():
    fleet = SimFleet.generate(clusters=1, nodes=3, seed=11, vendor="nvidia")
    with SimServer(fleet, tls=True) as server:
        yield fleet.clusters[0], server


@pytest.fixture
def registry(tls_fleet, tmp_path):
    """The simulator's registry (kubeconfigs with its CA) and a token file beside it; the cluster's
    Prometheus open again after the test."""
    cluster, server = tls_fleet
    path = write_registry(tmp_path / "clusters.yaml", server)
    (tmp_path / "prom-token").write_text(TOKEN + "\n")
    yield path
    cluster.require_prometheus_headers({})


def _with_http(path: Path, http: dict) -> None:
    edit_registry(path, lambda document: document["clusters"][0].update(prometheus_http=http))


def _reader(path: Path):
    registry = load_registry(path)
    assert not registry.errors, registry.errors
    (name,) = registry.names
    return PrometheusResource(timeout_seconds=10).reader(registry.get(name))


def _up(reader) -> int:
    try:
        return len(reader.vector("up"))
    finally:
        reader.close()


def test_a_token_file_a_private_ca_and_a_tenant_header(tls_fleet, registry):
    cluster, _server = tls_fleet
    cluster.require_prometheus_headers({"Authorization": [f"Bearer {TOKEN}"], "X-Scope-OrgID": [TENANT]})
    full = {
        "authorization": {"credentials_file": "prom-token"},  # relative to the registry
        "tls_config": {"ca_file": "sim-ca.crt"},
        "http_headers": {"X-Scope-OrgID": {"values": [TENANT]}},
    }
    _with_http(registry, full)
    assert _up(_reader(registry)) > 0

    # Whatever is left out is refused, with the cause in the error.
    without_tenant = {key: value for key, value in full.items() if key != "http_headers"}
    _with_http(registry, without_tenant)
    with pytest.raises(PromError, match="401"):
        _up(_reader(registry))
    _with_http(registry, {**full, "tls_config": {}})
    with pytest.raises(PromError, match="CERTIFICATE_VERIFY_FAILED"):
        _up(_reader(registry))
    _with_http(registry, {**full, "tls_config": {"insecure_skip_verify": True}})
    assert _up(_reader(registry)) > 0
    _with_http(registry, {**full, "authorization": {"credentials": "stale"}})
    with pytest.raises(PromError, match="401"):
        _up(_reader(registry))


def test_a_rotated_token_is_read_at_the_next_request(tls_fleet, registry):
    """As Prometheus reads its http_config's files: a reader that lives on (`lens api`'s) picks up a
    rotated projected token without being made anew; a file that cannot be read fails the query."""
    cluster, _server = tls_fleet
    cluster.require_prometheus_headers({"Authorization": [f"Bearer {TOKEN}"]})
    _with_http(
        registry,
        {"authorization": {"credentials_file": "prom-token"}, "tls_config": {"ca_file": "sim-ca.crt"}},
    )
    reader = _reader(registry)
    try:
        assert len(reader.vector("up")) > 0
        cluster.require_prometheus_headers({"Authorization": ["Bearer prom-token-2"]})
        with pytest.raises(PromError, match="401"):
            reader.vector("up")
        (registry.parent / "prom-token").write_text("prom-token-2\n")
        assert len(reader.vector("up")) > 0
        (registry.parent / "prom-token").unlink()
        with pytest.raises(PromError, match=r"credentials_file .* cannot be read"):
            reader.vector("up")
    finally:
        reader.close()


def test_basic_auth_and_a_client_certificate(tls_fleet, registry, tmp_path):
    cluster, server = tls_fleet
    cert, key = server.certificate.client_pair("lens-reader")
    (tmp_path / "client.crt").write_bytes(cert)
    (tmp_path / "client.key").write_bytes(key)
    (tmp_path / "password").write_text("s3cret\n")
    pair = base64.b64encode(b"lens:s3cret").decode()
    cluster.require_prometheus_headers({"Authorization": [f"Basic {pair}"]}, client_cn="lens-reader")
    tls = {"ca_file": "sim-ca.crt", "cert_file": "client.crt", "key_file": "client.key"}
    _with_http(registry, {"basic_auth": {"username": "lens", "password_file": "password"}, "tls_config": tls})
    assert _up(_reader(registry)) > 0
    _with_http(registry, {"basic_auth": {"username": "lens", "password": "s3cret"}, "tls_config": tls})
    assert _up(_reader(registry)) > 0
    _with_http(
        registry,
        {"basic_auth": {"username": "lens", "password": "s3cret"}, "tls_config": {"ca_file": "sim-ca.crt"}},
    )
    with pytest.raises(PromError, match="401"):  # no client certificate
        _up(_reader(registry))
    # A user without a password: an empty one, as Prometheus sends it.
    cluster.require_prometheus_headers({"Authorization": [f"Basic {base64.b64encode(b'lens:').decode()}"]})
    _with_http(registry, {"basic_auth": {"username": "lens"}, "tls_config": {"ca_file": "sim-ca.crt"}})
    assert _up(_reader(registry)) > 0


def test_bad_prometheus_http_entries_are_named_and_secrets_never_shown(tmp_path, tls_fleet):
    _cluster, server = tls_fleet
    path = write_registry(tmp_path / "clusters.yaml", server)
    (tmp_path / "token").write_text("t")
    good = {
        "authorization": {"credentials": "inline-secret"},
        "http_headers": {"X-Scope-OrgID": {"values": ["a"]}},
    }
    entries = {
        "good": good,
        "username-only": {"basic_auth": {"username": "u"}},  # an empty password, as Prometheus
        # A file that is not there yet: the cluster loads (its Kubernetes collection goes on) and
        # its queries fail, naming the file.
        "gone": {"authorization": {"credentials_file": "no-such-token"}},
        "both": {
            "authorization": {"credentials": "x"},
            "basic_auth": {"username": "u", "password": "hunter2"},
        },
        "two-secrets": {"authorization": {"credentials": "x", "credentials_file": "token"}},
        "no-secret": {"authorization": {"type": "Bearer"}},
        "basic-type": {"authorization": {"type": "basic", "credentials": "hunter2"}},
        "newline": {"authorization": {"credentials": "hunter2\nX-Injected: 1"}},
        "half-pair": {"tls_config": {"cert_file": "token"}},
        "auth-header": {"http_headers": {"authorization": {"values": ["Bearer hunter2"]}}},
        "host-header": {"http_headers": {"Host": {"values": ["prom.example"]}}},
        "bad-name": {"http_headers": {"X Tenant": {"values": ["a"]}}},
        "server-name": {"tls_config": {"server_name": "prom.example"}},
    }

    def entries_for(document: dict) -> None:
        template = document["clusters"][0]
        document["clusters"] = [
            {**template, "name": name, "prometheus_http": http} for name, http in entries.items()
        ]

    edit_registry(path, entries_for)
    registry = load_registry(path)
    assert registry.names == ["gone", "good", "username-only"]
    found = {(e.cluster, e.field) for e in registry.errors}
    assert found == {
        ("both", "prometheus_http"),
        ("two-secrets", "prometheus_http.authorization"),
        ("no-secret", "prometheus_http.authorization"),
        ("basic-type", "prometheus_http.authorization"),
        ("newline", "prometheus_http.authorization"),
        ("half-pair", "prometheus_http.tls_config"),
        ("auth-header", "prometheus_http"),
        ("host-header", "prometheus_http"),
        ("bad-name", "prometheus_http"),
        ("server-name", "prometheus_http.tls_config.server_name"),
    }, registry.errors
    assert "inline-secret" not in repr(registry.get("good"))
    assert all("inline-secret" not in str(e) and "hunter2" not in str(e) for e in registry.errors)
    with pytest.raises(PromError, match=r"credentials_file .*no-such-token.* cannot be read"):
        _up(PrometheusResource(timeout_seconds=10).reader(registry.get("gone")))


def test_defaults_merge_section_by_section_and_null_opens(tls_fleet, tmp_path):
    """`defaults.prometheus_http` under each entry: `tls_config` and `http_headers` key by key, an
    entry's `basic_auth` replacing the defaults' `authorization`, `prometheus_http: null` open."""
    _cluster, server = tls_fleet
    path = write_registry(tmp_path / "clusters.yaml", server)

    def with_defaults(document: dict) -> None:
        template = document["clusters"][0]
        document["defaults"] = {
            "prometheus_http": {
                "authorization": {"credentials_file": "token"},
                "tls_config": {"ca_file": "sim-ca.crt"},
                "http_headers": {"X-Scope-OrgID": {"values": ["fleet"]}},
            }
        }
        document["clusters"] = [
            {**template, "name": "inherits"},
            {
                **template,
                "name": "own",
                "prometheus_http": {
                    "basic_auth": {"username": "lens", "password_file": "password"},
                    "tls_config": {"cert_file": "client.crt", "key_file": "client.key"},
                    "http_headers": {"X-Extra": {"values": ["1"]}},
                },
            },
            {**template, "name": "open", "prometheus_http": None},
        ]

    edit_registry(path, with_defaults)
    registry = load_registry(path)
    assert not registry.errors, registry.errors
    inherits, own, open_ = (registry.get(n).prometheus_http for n in ("inherits", "own", "open"))
    assert inherits.authorization is not None and inherits.tls_config.ca_file == str(tmp_path / "sim-ca.crt")
    assert own.authorization is None and own.basic_auth is not None
    assert own.basic_auth.password_file == str(tmp_path / "password")
    assert (own.tls_config.ca_file, own.tls_config.cert_file) == (
        str(tmp_path / "sim-ca.crt"),
        str(tmp_path / "client.crt"),
    )
    assert set(own.http_headers) == {"X-Scope-OrgID", "X-Extra"}
    assert open_ == PrometheusHttp()


def test_a_secret_mounted_by_the_kubelet_is_followed_through_its_rotation(tls_fleet, registry):
    """A Secret volume's key is a link through `..data` to a dated folder, which the kubelet swaps
    and deletes at each update: the registry keeps the key's own path, and the next request reads
    the new token (a path resolved to the dated folder would be gone)."""
    cluster, _server = tls_fleet
    volume = registry.parent / "secret"
    (volume / "..2026_01").mkdir(parents=True)
    (volume / "..2026_01" / "token").write_text(TOKEN + "\n")
    (volume / "..data").symlink_to("..2026_01")
    (volume / "token").symlink_to("..data/token")
    cluster.require_prometheus_headers({"Authorization": [f"Bearer {TOKEN}"]})
    _with_http(
        registry,
        {"authorization": {"credentials_file": "secret/token"}, "tls_config": {"ca_file": "sim-ca.crt"}},
    )
    reader = _reader(registry)
    try:
        assert len(reader.vector("up")) > 0
        # The kubelet's update: a new dated folder, `..data` swapped to it, the old one deleted.
        (volume / "..2026_02").mkdir()
        (volume / "..2026_02" / "token").write_text("prom-token-2\n")
        (volume / "..data_tmp").symlink_to("..2026_02")
        (volume / "..data_tmp").replace(volume / "..data")
        shutil.rmtree(volume / "..2026_01")
        cluster.require_prometheus_headers({"Authorization": ["Bearer prom-token-2"]})
        assert len(reader.vector("up")) > 0
    finally:
        reader.close()


def test_what_goes_wrong_at_query_time_is_named_without_the_secret(tls_fleet, registry, monkeypatch):
    """A token file of two lines, a CA file that is not there: the query fails with the file named
    and the secret never shown. `insecure_skip_verify` checks no certificate even with a CA file
    that would fail; `$REQUESTS_CA_BUNDLE` does not replace the registry's CA file."""
    cluster, _server = tls_fleet
    cluster.require_prometheus_headers({"Authorization": [f"Bearer {TOKEN}"]})
    token = registry.parent / "prom-token"
    token.write_text(f"{TOKEN}\nsecond-line-secret\n")
    _with_http(
        registry,
        {"authorization": {"credentials_file": "prom-token"}, "tls_config": {"ca_file": "sim-ca.crt"}},
    )
    with pytest.raises(PromError, match="control character") as refused:
        _up(_reader(registry))
    assert "second-line-secret" not in str(refused.value) and TOKEN not in str(refused.value)
    token.write_text(TOKEN + "\n")

    (registry.parent / "other-ca.crt").write_bytes(make_certificate(("127.0.0.1",)).ca_pem)
    _with_http(
        registry,
        {"authorization": {"credentials_file": "prom-token"}, "tls_config": {"ca_file": "other-ca.crt"}},
    )
    with pytest.raises(PromError, match="CERTIFICATE_VERIFY_FAILED"):
        _up(_reader(registry))
    _with_http(
        registry,
        {
            "authorization": {"credentials_file": "prom-token"},
            "tls_config": {"ca_file": "other-ca.crt", "insecure_skip_verify": True},
        },
    )
    assert _up(_reader(registry)) > 0
    _with_http(
        registry,
        {"authorization": {"credentials_file": "prom-token"}, "tls_config": {"ca_file": "no-such-ca.crt"}},
    )
    with pytest.raises(PromError, match=r"no-such-ca\.crt"):
        _up(_reader(registry))

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", certifi.where())  # the public CAs, not the simulator's
    _with_http(
        registry,
        {"authorization": {"credentials_file": "prom-token"}, "tls_config": {"ca_file": "sim-ca.crt"}},
    )
    assert _up(_reader(registry)) > 0


def test_doctor_and_a_materialization_read_through_it(tls_fleet, registry, tmp_path):
    """`lens doctor`'s probe and `gpu_nodes` read the cluster's utilization through the proxy's
    checks; without the credentials, the doctor says why and the asset's check fails loudly."""
    cluster, _server = tls_fleet
    cluster.require_prometheus_headers({"Authorization": [f"Bearer {TOKEN}"]})
    _with_http(
        registry,
        {"authorization": {"credentials_file": "prom-token"}, "tls_config": {"ca_file": "sim-ca.crt"}},
    )
    config = load_registry(registry).get(cluster.name)
    findings = diagnose_cluster(config)
    failures = [f for f in findings if f.status == FAIL]
    assert not failures, failures
    access = {f.check: f.detail for f in findings}
    assert access["prometheus access"] == (
        f"{config.prometheus_url}: Authorization Bearer (from {registry.parent / 'prom-token'}); "
        f"CA {registry.parent / 'sim-ca.crt'}"
    )
    assert access["kubernetes access"] == "no proxy-url (direct, or $HTTPS_PROXY when set)"

    with instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [cluster.name])
        resources = {
            "registry": ClusterRegistryResource(clusters_file=str(registry)),
            "lens_db": LensDatabase(url=f"sqlite:///{tmp_path / 'lens.db'}"),
            "safe_db": SafeDatabase(url=f"sqlite:///{tmp_path / 'safe.db'}"),
        }
        result = materialize_cluster(
            ["gpu_nodes"], instance=instance, partition_key=cluster.name, resources=resources
        )
        assert result.success
        checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
        assert checks["every_gpu_node_has_utilization"] and checks["utilization_fresh"], checks

        _with_http(registry, {"tls_config": {"ca_file": "sim-ca.crt"}})  # the token left out
        config = load_registry(registry).get(cluster.name)
        failures = [f for f in diagnose_cluster(config) if f.status == FAIL]
        assert any("401" in f.detail for f in failures), failures
        result = materialize_cluster(
            ["gpu_nodes"], instance=instance, partition_key=cluster.name, resources=resources
        )
        checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
        assert checks["utilization_fresh"] is False, checks


def test_the_simulators_tls_registry_reaches_its_prometheus(tls_fleet, tmp_path, monkeypatch):
    """`lens sim --tls` writes a registry whose Prometheus is trusted by the simulator's CA, as its
    API server is (before, only the kubeconfigs carried the CA and every query failed verification)."""
    _cluster, server = tls_fleet
    for variable in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(variable, raising=False)
    registry = load_registry(write_registry(tmp_path / "clusters.yaml", server))
    assert _up(PrometheusResource(timeout_seconds=10).reader(registry.get(registry.names[0]))) > 0


def _through_api_server(registry: Path, cluster, server, service: str, http: dict) -> None:
    """The entry's Prometheus is the API server's service proxy to it (the kube token in a file)."""
    (registry.parent / "kube-token").write_text(cluster.token + "\n")
    url = f"{server.base_url(cluster.name)}/api/v1/namespaces/monitoring/services/{service}/proxy"
    edit_registry(
        registry,
        lambda document: document["clusters"][0].update(
            prometheus_url=url,
            prometheus_http={
                "authorization": {"credentials_file": "kube-token"},
                "tls_config": {"ca_file": "sim-ca.crt"},
                **http,
            },
        ),
    )


def test_a_prometheus_reached_through_the_api_servers_service_proxy(tls_fleet, registry):
    """A Prometheus with no address outside its cluster, reached as kubectl proxy reaches it: the
    API server's service proxy, with a token the API server accepts (and `get` on services/proxy).
    The API server keeps the Authorization header for itself; other headers reach Prometheus; a
    Service port is named or numbered, as the API server wants it; its errors say what is wrong."""
    cluster, server = tls_fleet
    _through_api_server(registry, cluster, server, "prometheus-k8s:web", {})
    assert _up(_reader(registry)) > 0
    _through_api_server(registry, cluster, server, "prometheus-k8s:9090", {})
    assert _up(_reader(registry)) > 0

    cluster.require_prometheus_headers({"X-Scope-OrgID": [TENANT]})
    tenant = {"http_headers": {"X-Scope-OrgID": {"values": [TENANT]}}}
    _through_api_server(registry, cluster, server, "prometheus-k8s:web", tenant)
    assert _up(_reader(registry)) > 0
    # A Prometheus that wants a bearer token of its own is not reached this way: the API server
    # removed it. What answered 401 is Prometheus' proxy, not the API server.
    cluster.require_prometheus_headers({"Authorization": [f"Bearer {cluster.token}"]})
    with pytest.raises(PromError, match="401"):
        _up(_reader(registry))
    cluster.require_prometheus_headers({})

    for service, error in (
        ("prometheus-k8s", r"503 .*no endpoints available for service \W+prometheus-k8s"),
        ("prometheus-k8s:webx", r"503 .*no endpoints available for service \W+prometheus-k8s:webx"),
        ("prometheus-k8s:9999", "503 .*no service port 9999 found"),
        ("prometheus:9090", r"404 .*services \W+prometheus\W+ not found"),
        ("prometheus:web", r"404 .*endpoints \W+prometheus\W+ not found"),
        ("https:prometheus-k8s:web", "error trying to reach service"),
    ):
        _through_api_server(registry, cluster, server, service, {})
        with pytest.raises(PromError, match=error):
            _up(_reader(registry))
    # lens doctor says what to write instead of a bare Service name.
    _through_api_server(registry, cluster, server, "prometheus-k8s", {})
    failures = [
        f.detail for f in diagnose_cluster(load_registry(registry).get(cluster.name)) if f.status == FAIL
    ]
    assert any("services/prometheus-k8s:<port name or number>/proxy" in f for f in failures), failures
    _through_api_server(registry, cluster, server, "prometheus-k8s:webx", {})
    failures = [
        f.detail for f in diagnose_cluster(load_registry(registry).get(cluster.name)) if f.status == FAIL
    ]
    assert any("is 'webx' the name of one of the Service's ports" in f for f in failures), failures
    _through_api_server(registry, cluster, server, "prometheus-k8s:web", {})
    assert not [f for f in diagnose_cluster(load_registry(registry).get(cluster.name)) if f.status == FAIL]
    (registry.parent / "kube-token").write_text("not-the-token\n")
    with pytest.raises(PromError, match="401"):
        _up(_reader(registry))
    (registry.parent / "kube-token").write_text(cluster.token + "\n")
    cluster.forbid("/api/v1/namespaces/monitoring/services")
    try:
        with pytest.raises(
            PromError,
            match=r"403 .*services \W+prometheus-k8s:web\W+ is forbidden: .*cannot get resource \W+services/proxy\W",
        ):
            _up(_reader(registry))
    finally:
        cluster.clear_faults()


def test_a_prometheus_reached_through_a_proxy(tls_fleet, registry, http_proxy, socks_proxy, monkeypatch):
    """`prometheus_http.proxy_url` (Prometheus' own http_config key): every query through tinyproxy
    with its user and password, or through microsocks (names resolved by the proxy, socks5h); the
    environment's proxy does not take its place; a wrong password fails without being shown."""
    cluster, server = tls_fleet
    proxy, log = http_proxy
    port, _socks_log = socks_proxy
    ca = {"tls_config": {"ca_file": "sim-ca.crt"}}
    _with_http(registry, {**ca, "proxy_url": proxy})
    findings = {f.check: f for f in diagnose_cluster(load_registry(registry).get(cluster.name))}
    assert not [f for f in findings.values() if f.status == FAIL], findings
    assert findings["prometheus access"].detail.endswith(
        f"through the proxy http://<user>@127.0.0.1:{proxy.rsplit(':', 1)[1]}"
    )
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    connects = log.read_text().count(f"CONNECT 127.0.0.1:{server.port}")
    assert _up(_reader(registry)) > 0
    assert log.read_text().count(f"CONNECT 127.0.0.1:{server.port}") > connects

    _with_http(registry, {**ca, "proxy_url": f"socks5://lens:s0cks@127.0.0.1:{port}"})
    reader = _reader(registry)
    assert reader.client._session.proxies["https"] == f"socks5h://lens:s0cks@127.0.0.1:{port}"
    assert _up(reader) > 0
    _with_http(registry, {**ca, "proxy_url": f"socks5://lens:hunter2@127.0.0.1:{port}"})
    with pytest.raises(PromError) as refused:
        _up(_reader(registry))
    # The error says which proxy was in the way, never its password.
    assert f"(through the proxy socks5://<user>@127.0.0.1:{port})" in str(refused.value)
    assert "hunter2" not in str(refused.value)
    # The environment's CA bundle still stands in for the system's CAs (here: the simulator's).
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(registry.parent / "sim-ca.crt"))
    _with_http(registry, {"proxy_url": proxy})
    assert _up(_reader(registry)) > 0
    # Without a proxy of its own, the environment's applies, as before (here: nobody listens).
    _with_http(registry, ca)
    with pytest.raises(PromError, match=r"(?i)proxy"):
        _up(_reader(registry))


def test_a_proxy_url_that_cannot_work_refuses_the_entry_without_its_password(tls_fleet, tmp_path):
    _cluster, server = tls_fleet
    path = write_registry(tmp_path / "clusters.yaml", server)
    _with_http(path, {"proxy_url": "socks4://u:hunter2@proxy:1080"})
    loaded = load_registry(path)
    (error,) = loaded.errors
    assert "prometheus_http" in str(error) and "scheme" in str(error) and "hunter2" not in str(error)
