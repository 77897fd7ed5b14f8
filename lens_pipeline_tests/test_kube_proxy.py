"""An API server reached through a proxy, as kubectl reaches it: the kubeconfig's `proxy-url` (an
HTTP CONNECT proxy, or SOCKS5 as the Kubernetes docs set up with `ssh -D`), or the registry's
`proxy_url`. Held against Debian's tinyproxy and microsocks in front of the simulator over TLS,
through the real `kubernetes` client and kubectl."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from lens_pipeline.clusters import kubeconfig_proxy_url, load_registry, proxy_problem
from lens_pipeline.doctor import diagnose_cluster
from lens_pipeline.kube.reader import KubeError, KubeReader, api_client_for
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline_tests.ports import free_port


@pytest.fixture(scope="module")
def tls_fleet():
    fleet = SimFleet.generate(clusters=1, nodes=3, seed=12, vendor="amd")
    with SimServer(fleet, tls=True) as server:
        yield fleet.clusters[0], server


def _with_proxy_url(registry: Path, proxy: str | None) -> Path:
    """The registry's kubeconfig with `proxy-url` set on its cluster (or removed)."""
    document = yaml.safe_load(registry.read_text())
    path = registry.parent / document["clusters"][0]["kubeconfig"]
    kubeconfig = yaml.safe_load(path.read_text())
    cluster = kubeconfig["clusters"][0]["cluster"]
    cluster.pop("proxy-url", None)
    if proxy is not None:
        cluster["proxy-url"] = proxy
    path.write_text(yaml.safe_dump(kubeconfig))
    return path


def _nodes(registry: Path) -> int:
    loaded = load_registry(registry)
    assert not loaded.errors, loaded.errors
    with KubeReader(loaded.get(loaded.names[0]), max_retries=0) as reader:
        return len(reader.list("/api/v1/nodes", lambda n: n))


def test_the_kubeconfigs_http_proxy_carries_every_request(tls_fleet, http_proxy, tmp_path, monkeypatch):
    """Through tinyproxy with its user and password, as kubectl goes; an environment proxy (here a
    SOCKS one that is not there) does not take the place of the kubeconfig's."""
    cluster, server = tls_fleet
    proxy, log = http_proxy
    registry = write_registry(tmp_path / "clusters.yaml", server)
    nodes = len(cluster.node_names()) + 2
    kubeconfig = _with_proxy_url(registry, proxy)
    monkeypatch.setenv("HTTPS_PROXY", f"socks5://127.0.0.1:{free_port()}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert _nodes(registry) == nodes
    assert f"CONNECT 127.0.0.1:{server.port}" in log.read_text()
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.delenv("NO_PROXY")
    if shutil.which("kubectl"):  # kubectl takes the same way
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and len(done.stdout.split()) == nodes, done.stderr

    # The wrong password: the proxy's refusal, and the password never in the error.
    _with_proxy_url(registry, proxy.replace("pr0xy", "wr0ng"))
    with pytest.raises(KubeError, match=r"Tunnel connection failed: 40[17]") as refused:
        _nodes(registry)
    assert "wr0ng" not in str(refused.value) and "pr0xy" not in str(refused.value)
    # A proxy that is not there fails the read, with the proxy named: the client took the way.
    _with_proxy_url(registry, f"http://127.0.0.1:{free_port()}")
    with pytest.raises(KubeError, match=r"(?i)proxy"):
        _nodes(registry)


def test_socks5_from_the_kubeconfig_or_the_registry(tls_fleet, socks_proxy, tmp_path):
    cluster, server = tls_fleet
    port, _log = socks_proxy
    registry = write_registry(tmp_path / "clusters.yaml", server)
    nodes = len(cluster.node_names()) + 2
    _with_proxy_url(registry, f"SOCKS5://lens:s0cks@127.0.0.1:{port}")  # a scheme in any case, as kubectl
    assert _nodes(registry) == nodes
    config = load_registry(registry).get(cluster.name)
    # The proxy resolves the API server's name, as Go's socks5 dialer lets it (a name known only
    # behind the bastion); urllib3 calls that socks5h.
    manager = api_client_for(config).rest_client.pool_manager
    assert manager.connection_pool_kw["_socks_options"]["rdns"] is True
    _with_proxy_url(registry, f"socks5h://lens:wr0ng@127.0.0.1:{port}")  # the proxy refuses
    with pytest.raises(KubeError, match=r"(?i)socks|auth") as refused:
        _nodes(registry)
    assert "wr0ng" not in str(refused.value)

    # The registry's proxy_url wins over the kubeconfig's (here a wrong one), and is never shown.
    document = yaml.safe_load(registry.read_text())
    document["clusters"][0]["proxy_url"] = f"socks5://lens:s0cks@127.0.0.1:{port}"
    registry.write_text(yaml.safe_dump(document))
    assert _nodes(registry) == nodes
    config = load_registry(registry).get(cluster.name)
    assert "s0cks" not in repr(config)
    # `lens doctor` says which way it took, without the password.
    access = {f.check: f.detail for f in diagnose_cluster(config)}
    assert access["kubernetes access"] == f"through the proxy socks5://<user>@127.0.0.1:{port}"


def test_the_proxy_of_the_context_in_use_and_bad_proxies_named_without_their_password(tmp_path):
    document = {
        "current-context": "b",
        "contexts": [
            {"name": "a", "context": {"cluster": "one", "user": "u"}},
            {"name": "b", "context": {"cluster": "two", "user": "u"}},
        ],
        "clusters": [
            {"name": "one", "cluster": {"server": "https://one:6443", "proxy-url": "http://p1:3128"}},
            {"name": "two", "cluster": {"server": "https://two:6443", "proxy-url": "socks5://p2:1080"}},
        ],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }
    assert kubeconfig_proxy_url(document, "a") == "http://p1:3128"
    assert kubeconfig_proxy_url(document, None) == "socks5://p2:1080"
    assert kubeconfig_proxy_url({**document, "clusters": []}, "a") is None
    assert proxy_problem("HTTPS://proxy.example:3128") is None
    for bad, why in (
        ("socks4://u:hunter2@p:1080", "scheme"),
        ("http://u:hunter2@p:99999", "port"),
        ("socks5://u:hunter2@p", "port"),
        # urllib3 reads a backslash as a slash and would quote "u:hunt" back as a host
        ("http://u:hunt\\er2@p:3128", "backslash"),
        (" socks5://u:hunter2@p:1080", "space"),
        ("socks5://u:hunter2@p:1080\n", "control character"),
        ("http://", "host"),
    ):
        problem = proxy_problem(bad)
        assert problem is not None and why in problem and "hunter2" not in problem, (bad, problem)

    # In a registry: the entry is refused, the field named, the password never shown.
    kubeconfig = tmp_path / "k.yaml"
    broken = {
        **document,
        "clusters": [
            {**c, "cluster": {**c["cluster"], "proxy-url": "socks4://u:hunter2@p:1"}}
            for c in document["clusters"]
        ],
    }
    kubeconfig.write_text(yaml.safe_dump(broken))
    (tmp_path / "clusters.yaml").write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {"name": "from-kubeconfig", "kubeconfig": "k.yaml"},
                    {
                        "name": "own",
                        "server": "https://s:6443",
                        "token": "t",
                        "proxy_url": "http://u:hunter2@p:99999",
                    },
                ]
            }
        )
    )
    registry = load_registry(tmp_path / "clusters.yaml")
    assert {(e.cluster, e.field) for e in registry.errors} == {
        ("from-kubeconfig", "kubeconfig"),
        ("own", "proxy_url"),
    }
    assert all("hunter2" not in str(e) for e in registry.errors), registry.errors
