"""The cluster registry: every bad entry is a named error, and never stops the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lens_pipeline.clusters import ClusterNotFound, load_registry, validate_cluster_name
from lens_pipeline.doctor import diagnose


def _kubeconfig(path: Path, contexts: tuple[str, ...] = ("ctx",), current: str | None = "ctx") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": c, "cluster": {"server": "http://127.0.0.1:1"}} for c in contexts],
                "users": [{"name": "u", "user": {"token": "s3cret-token"}}],
                "contexts": [{"name": c, "context": {"cluster": c, "user": "u"}} for c in contexts],
                "current-context": current,
            }
        )
    )
    return path


def _registry(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "clusters.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("prod-a", True),
        ("a", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("Prod", False),
        ("a,b", False),
        ("a|b", False),
        ("-a", False),
        ("a-", False),
        ("a_b", False),
        ("", False),
        (None, False),
        (7, False),
    ],
)
def test_cluster_names_are_dns1123_labels(name, valid):
    assert (validate_cluster_name(name) is None) is valid


def test_good_entries_load_and_bad_ones_are_named_errors(tmp_path):
    _kubeconfig(tmp_path / "a.yaml", contexts=("ctx", "other"))
    registry = load_registry(
        _registry(
            tmp_path,
            {
                "clusters": [
                    {
                        "name": "alpha",
                        "kubeconfig": "a.yaml",
                        "prometheus_url": "http://prom:9090/",
                        "vendor": "amd",
                    },
                    {"name": "beta", "kubeconfig": "a.yaml", "context": "other", "vendor": "nvidia"},
                    {"name": "gamma", "kubeconfig": "missing.yaml"},
                    {"name": "delta", "kubeconfig": "a.yaml", "context": "nope"},
                    {"name": "Bad,Name", "kubeconfig": "a.yaml"},
                    {"name": "eps", "kubeconfig": "a.yaml", "vendor": "intel"},
                    {"name": "zeta", "server": "https://10.0.0.1:6443"},
                    {"name": "eta", "in_cluster": True, "prometheus_url": "ftp://x"},
                    {"name": "alpha", "kubeconfig": "a.yaml"},
                    "not-a-mapping",
                ]
            },
        )
    )
    assert registry.names == ["alpha", "beta"]
    alpha = registry.get("alpha")
    assert alpha.prometheus_url == "http://prom:9090" and alpha.vendor == "amd" and alpha.context is None
    assert registry.get("beta").context == "other"
    problems = {(e.cluster, e.field) for e in registry.errors}
    assert {
        ("gamma", "kubeconfig"),
        ("delta", "context"),
        ("eps", "vendor"),
        ("zeta", "token"),
        ("eta", "prometheus_url"),
        ("alpha", "name"),
        (None, "clusters[9]"),
    } <= problems
    assert any(e.field == "name" and "Bad,Name" in e.message for e in registry.errors)
    with pytest.raises(ClusterNotFound, match="context 'nope' is not in"):
        registry.get("delta")
    with pytest.raises(ClusterNotFound, match="not in the registry"):
        registry.get("omega")


def test_errors_and_reprs_never_show_credentials(tmp_path):
    _kubeconfig(tmp_path / "a.yaml")
    registry = load_registry(
        _registry(
            tmp_path,
            {
                "clusters": [
                    {"name": "tok", "server": "https://k:6443", "token": "very-secret"},
                    {"name": "broken", "kubeconfig": "a.yaml", "context": "zzz"},
                ]
            },
        )
    )
    assert "very-secret" not in repr(registry.get("tok"))
    assert all("s3cret" not in str(e) for e in registry.errors)


def test_a_directory_of_kubeconfigs_is_a_registry(tmp_path):
    secret = tmp_path / "multi-k8s-config"
    secret.mkdir()
    _kubeconfig(secret / "east")
    _kubeconfig(secret / "west.yaml")
    (secret / "..data").mkdir()  # what a mounted Secret carries beside its keys
    (secret / "broken").write_text("{not: yaml: at all")
    registry = load_registry(secret)
    assert registry.names == ["east", "west"]
    assert [e.cluster for e in registry.errors] == ["broken"]


def test_a_registry_can_add_a_kubeconfig_directory_with_defaults(tmp_path):
    (tmp_path / "kc").mkdir()
    _kubeconfig(tmp_path / "kc" / "east")
    _kubeconfig(tmp_path / "kc" / "west")
    registry = load_registry(
        _registry(
            tmp_path,
            {
                "kubeconfig_dir": "kc",
                "defaults": {"vendor": "nvidia", "prometheus_url": "http://prom.{name}.svc:9090"},
                "clusters": [{"name": "west", "kubeconfig": "kc/west", "vendor": "amd"}],
            },
        )
    )
    assert registry.get("east").prometheus_url == "http://prom.east.svc:9090"
    assert registry.get("east").vendor == "nvidia"
    assert registry.get("west").vendor == "amd"


def test_an_entry_can_be_disabled_without_being_removed(tmp_path):
    """`enabled: false` keeps an entry out of everything (only its name is read), also one of a
    `kubeconfig_dir` that another system writes, by an entry of its name; `defaults` can pause
    every cluster but those that say `enabled: true`."""
    (tmp_path / "kc").mkdir()
    for name in ("east", "west", "north"):
        _kubeconfig(tmp_path / "kc" / name)
    registry = load_registry(
        _registry(
            tmp_path,
            {
                "kubeconfig_dir": "kc",
                "clusters": [
                    {"name": "west", "enabled": False},  # from the directory, not collected
                    {"name": "south", "enabled": False, "server": "half-written"},
                    {"name": "bad-flag", "enabled": "sometimes", "kubeconfig": "kc/east"},
                ],
            },
        )
    )
    assert registry.names == ["east", "north"]
    assert registry.disabled == {"west", "south"}
    assert registry.listed() == {"east", "north", "bad-flag"}  # an entry in error is still listed
    assert [(e.cluster, e.field) for e in registry.errors] == [("bad-flag", "enabled")]
    # lens doctor says so, and does not call a disabled cluster missing.
    (finding,) = diagnose(registry, only=["west"])
    assert (finding.cluster, finding.status) == ("west", "warn") and "enabled: false" in finding.detail

    paused = load_registry(
        _registry(
            tmp_path,
            {
                "defaults": {"enabled": False},
                "clusters": [
                    {"name": "east", "kubeconfig": "kc/east"},
                    {"name": "west", "kubeconfig": "kc/west", "enabled": True},
                ],
            },
        )
    )
    assert paused.names == ["west"] and paused.disabled == {"east"} and not paused.errors
    # The same over a directory: an entry of a directory's cluster refines it (its file stays its
    # way to the API server), and a disabled one's broken file is no error.
    (tmp_path / "kc" / "broken").write_text("{not: yaml: at all")
    allowed = load_registry(
        _registry(
            tmp_path,
            {
                "kubeconfig_dir": "kc",
                "defaults": {"enabled": False},
                "clusters": [{"name": "north", "enabled": True, "vendor": "amd"}],
            },
        )
    )
    assert allowed.names == ["north"] and not allowed.errors, allowed.errors
    assert allowed.get("north").kubeconfig == str(tmp_path / "kc" / "north")
    assert allowed.get("north").vendor == "amd"
    assert allowed.disabled == {"east", "west", "broken"}
    with pytest.raises(ClusterNotFound, match="disabled"):
        allowed.get("east")


def test_a_registry_partly_unreadable_says_nothing_about_which_clusters_left(tmp_path):
    """The registry sensor removes, and `/metrics` hides, only clusters a readable registry no
    longer lists: a `kubeconfig_dir` that is not there (a Secret not mounted), a `clusters` that is
    not a list, an entry without a name leave `listed()` None; an unknown top-level field does not."""
    for document in (
        {"kubeconfig_dir": "missing", "clusters": []},
        {"clusters": 5},
        {"clusters": [{"kubeconfig": "kc"}]},
        {"clusters": ["east"]},
    ):
        assert load_registry(_registry(tmp_path, document)).listed() is None, document
    _kubeconfig(tmp_path / "kc-east")
    typo = load_registry(
        _registry(tmp_path, {"cluster": [], "clusters": [{"name": "east", "kubeconfig": "kc-east"}]})
    )
    assert typo.listed() == {"east"}


@pytest.mark.parametrize("content", ["", "[1, 2]", "clusters: 5", "{{{"])
def test_unusable_files_are_errors_not_crashes(tmp_path, content):
    path = tmp_path / "clusters.yaml"
    path.write_text(content)
    registry = load_registry(path)
    assert registry.clusters == {}
    assert content == "" or registry.errors


def test_a_missing_registry_file_is_an_error(tmp_path):
    registry = load_registry(tmp_path / "nope.yaml")
    assert registry.clusters == {} and registry.errors[0].field == "path"


def test_the_readme_registry_example_loads_as_written(tmp_path):
    """The README's example, with the files it names in place (its kubeconfig, and the Secret
    directory holding one of the original's ClusterConfig JSON): every cluster loads with its
    overrides, and nothing is an error."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    example = readme.split("A registry file:\n\n```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "kubeconfigs").mkdir()
    _kubeconfig(tmp_path / "kubeconfigs" / "east.yaml", contexts=("east-admin",), current="east-admin")
    (tmp_path / "multi-k8s-config").mkdir()
    (tmp_path / "multi-k8s-config" / "prod-north").write_text(
        json.dumps({"host": "https://10.0.0.1:6443", "bearerToken": "t0ken", "insecureSkipTLSVerify": True})
    )
    (tmp_path / "east-prom-token").write_text("t0ken\n")
    (tmp_path / "east-ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "clusters.yaml").write_text(example)
    registry = load_registry(tmp_path / "clusters.yaml")
    assert registry.names == ["prod-east", "prod-north", "prod-west"]
    assert registry.errors == []
    assert registry.get("prod-north").prometheus_url == "http://prometheus.prod-north.example:9090"
    east, west = registry.get("prod-east"), registry.get("prod-west")
    overrides = east.exporter_overrides
    assert (overrides.metric_prefix, overrides.node_label, overrides.nic_node_label) == (
        "amd_",
        "kubernetes_node",
        "instance",
    )
    assert overrides.pod_label == "exported_pod"  # from the defaults, merged one level down
    assert east.juicefs_capacity_bytes == {"shared-data": 1099511627776}
    http = east.prometheus_http
    assert http.authorization is not None
    assert http.authorization.credentials_file == str(tmp_path / "east-prom-token")
    assert http.tls_config.ca_file == str(tmp_path / "east-ca.crt")
    assert http.http_headers["X-Scope-OrgID"].values == ["east"]
    assert west.prometheus_url == "http://prometheus.prod-west.example:9090" and west.vendor == "nvidia"


def test_override_fields_are_checked_by_name(tmp_path):
    _kubeconfig(tmp_path / "a.yaml")
    registry = load_registry(
        _registry(
            tmp_path,
            {
                "clusters": [
                    {"name": "a", "kubeconfig": "a.yaml", "exporters": {"node_label": "not a label"}},
                    {"name": "b", "kubeconfig": "a.yaml", "exporters": {"prefix": "amd_"}},
                    {"name": "c", "kubeconfig": "a.yaml", "juicefs_capacity_bytes": {"v": -1}},
                    {
                        "name": "d",
                        "kubeconfig": "a.yaml",
                        "exporters": {"metric_names": {"DCGM_FI_DEV_GPU_UTILIZATION": "gpu_util"}},
                    },
                    {
                        "name": "e",
                        "kubeconfig": "a.yaml",
                        "exporters": {"metric_names": {"DCGM_FI_DEV_GPU_UTIL": "not a name"}},
                    },
                    {
                        "name": "f",
                        "kubeconfig": "a.yaml",
                        "exporters": {"metric_names": {"DCGM_FI_DEV_GPU_UTIL": "nv_gpu_util"}},
                    },
                ]
            },
        )
    )
    assert registry.names == ["f"]
    assert registry.get("f").exporter_overrides.metric_names == {"DCGM_FI_DEV_GPU_UTIL": "nv_gpu_util"}
    errors = {(e.cluster, e.field): e.message for e in registry.errors}
    assert set(errors) == {
        ("a", "exporters.node_label"),
        ("b", "exporters.prefix"),
        ("c", "juicefs_capacity_bytes"),
        ("d", "exporters.metric_names"),
        ("e", "exporters.metric_names"),
    }
    assert "unknown metric 'DCGM_FI_DEV_GPU_UTILIZATION'" in errors[("d", "exporters.metric_names")]
    assert "DCGM_FI_DEV_GPU_UTIL" in errors[("d", "exporters.metric_names")]
