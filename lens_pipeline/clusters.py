"""The cluster registry: which clusters exist, how to reach their API server and Prometheus, which GPUs.

Loaded from a YAML file (`LENS_CLUSTERS_FILE`) or from a directory holding one kubeconfig per
cluster (the original's `multi-k8s-config` Secret, mounted). Every entry is checked on its own: a
bad entry becomes a `RegistryError` naming the cluster and the field, and the others still load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lens_pipeline.vendors import VENDOR_CHOICES

# A DNS-1123 label: also keeps `,` and `|` out of partition keys, which break Dagster backfills.
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_KUBECONFIG_SUFFIXES = (".yaml", ".yml", ".kubeconfig", ".conf")
_ENTRY_FIELDS = {
    "name",
    "vendor",
    "prometheus_url",
    "kubeconfig",
    "context",
    "in_cluster",
    "server",
    "token",
    "token_file",
    "ca_file",
    "insecure_skip_tls_verify",
    "request_timeout_seconds",
}


@dataclass(frozen=True)
class ClusterConfig:
    """One cluster. Exactly one way to reach the API server: kubeconfig, in-cluster, or server + token."""

    name: str
    vendor: str = "auto"
    prometheus_url: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False
    server: str | None = None
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    ca_file: str | None = None
    insecure_skip_tls_verify: bool = False
    request_timeout_seconds: float = 30.0


@dataclass(frozen=True)
class RegistryError:
    cluster: str | None
    field: str
    message: str

    def __str__(self) -> str:
        who = f"cluster {self.cluster!r}" if self.cluster else "registry"
        return f"{who}: field {self.field!r}: {self.message}"


class ClusterNotFound(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class Registry:
    clusters: dict[str, ClusterConfig]
    errors: list[RegistryError]
    source: str

    @property
    def names(self) -> list[str]:
        return sorted(self.clusters)

    def get(self, name: str) -> ClusterConfig:
        if name in self.clusters:
            return self.clusters[name]
        problems = [str(e) for e in self.errors if e.cluster == name]
        detail = "; ".join(problems) if problems else "it is not in the registry"
        raise ClusterNotFound(f"cluster {name!r} cannot be used ({self.source}): {detail}")


def validate_cluster_name(name: object) -> str | None:
    """Why `name` is not a valid cluster name, or None when it is."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if len(name) > 63 or not _DNS1123_LABEL.match(name):
        return (
            f"{name!r} is not a DNS-1123 label (lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters)"
        )
    return None


def load_registry(path: str | Path) -> Registry:
    """Load the registry from a YAML file or from a directory of kubeconfigs."""
    path = Path(path)
    if path.is_dir():
        entries, errors = _entries_from_kubeconfig_dir(path, defaults={})
        return _build(entries, errors, base=path, source=str(path))
    try:
        document = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        return Registry(
            {}, [RegistryError(None, "path", f"registry file {str(path)!r} does not exist")], str(path)
        )
    except (OSError, yaml.YAMLError) as exc:
        return Registry({}, [RegistryError(None, "path", f"cannot read {str(path)!r}: {exc}")], str(path))
    return parse_registry(document, base=path.parent, source=str(path))


def parse_registry(document: Any, base: Path, source: str = "<memory>") -> Registry:
    """Build a registry from an already-parsed YAML document; relative paths resolve against `base`."""
    if document is None:
        document = {}
    if not isinstance(document, dict):
        return Registry(
            {}, [RegistryError(None, "document", "expected a mapping with a 'clusters' list")], source
        )
    errors: list[RegistryError] = []
    entries: list[dict[str, Any]] = []
    defaults = document.get("defaults") or {}
    if not isinstance(defaults, dict):
        errors.append(RegistryError(None, "defaults", "expected a mapping"))
        defaults = {}
    raw_entries = document.get("clusters") or []
    if not isinstance(raw_entries, list):
        errors.append(RegistryError(None, "clusters", "expected a list of cluster entries"))
        raw_entries = []
    if document.get("kubeconfig_dir"):
        dir_entries, dir_errors = _entries_from_kubeconfig_dir(
            base / str(document["kubeconfig_dir"]), defaults
        )
        # An explicit entry for the same name refines the one found in the directory.
        explicit = {e.get("name") for e in raw_entries if isinstance(e, dict)}
        entries.extend(e for e in dir_entries if e["name"] not in explicit)
        errors.extend(dir_errors)
    for index, raw in enumerate(raw_entries):
        if not isinstance(raw, dict):
            errors.append(RegistryError(None, f"clusters[{index}]", "expected a mapping"))
            continue
        entries.append({**{k: v for k, v in defaults.items() if k != "prometheus_url"}, **raw})
        if "prometheus_url" not in raw and "prometheus_url" in defaults:
            entries[-1]["prometheus_url"] = defaults["prometheus_url"]
    return _build(entries, errors, base, source)


def _entries_from_kubeconfig_dir(
    directory: Path, defaults: dict[str, Any]
) -> tuple[list[dict], list[RegistryError]]:
    if not directory.is_dir():
        return [], [RegistryError(None, "kubeconfig_dir", f"{str(directory)!r} is not a directory")]
    entries = []
    for file in sorted(directory.iterdir()):
        # Mounted Secrets carry `..data` symlinks and dot-files beside the keys.
        if file.name.startswith(".") or not file.is_file():
            continue
        suffix = next((s for s in _KUBECONFIG_SUFFIXES if s and file.name.endswith(s)), "")
        name = file.name.removesuffix(suffix) if suffix else file.name
        entry = {**defaults, "name": name, "kubeconfig": str(file)}
        entries.append(entry)
    return entries, []


def _build(entries: list[dict[str, Any]], errors: list[RegistryError], base: Path, source: str) -> Registry:
    clusters: dict[str, ClusterConfig] = {}
    for raw in entries:
        cluster, problems = _parse_entry(raw, base)
        if problems:
            errors.extend(problems)
        elif cluster is not None and cluster.name in clusters:
            errors.append(RegistryError(cluster.name, "name", "listed twice; the first entry is kept"))
        elif cluster is not None:
            clusters[cluster.name] = cluster
    return Registry(clusters, errors, source)


def _parse_entry(raw: dict[str, Any], base: Path) -> tuple[ClusterConfig | None, list[RegistryError]]:
    name = raw.get("name")
    label = name if isinstance(name, str) else None
    problems: list[RegistryError] = []

    def bad(field_name: str, message: str) -> None:
        problems.append(RegistryError(label, field_name, message))

    if (why := validate_cluster_name(name)) is not None:
        bad("name", why)
        return None, problems
    prometheus_url = raw.get("prometheus_url")
    if isinstance(prometheus_url, str):
        prometheus_url = prometheus_url.replace("{name}", name)
    for unknown in sorted(set(raw) - _ENTRY_FIELDS):
        bad(unknown, "unknown field")
    vendor = raw.get("vendor", "auto")
    if vendor not in VENDOR_CHOICES:
        bad("vendor", f"{vendor!r} is not one of {', '.join(VENDOR_CHOICES)}")
    if prometheus_url is not None and not (
        isinstance(prometheus_url, str) and prometheus_url.startswith(("http://", "https://"))
    ):
        bad("prometheus_url", "must be an http:// or https:// URL")
    ways = [w for w in ("kubeconfig", "in_cluster", "server") if raw.get(w)]
    if len(ways) != 1:
        bad("kubeconfig", "give exactly one of kubeconfig (+ context), in_cluster: true, or server (+ token)")
    kubeconfig = context = None
    if raw.get("kubeconfig"):
        kubeconfig = str((base / str(raw["kubeconfig"])).resolve())
        context = raw.get("context")
        why = _check_kubeconfig(kubeconfig, context)
        if why is not None:
            bad("context" if why.startswith("context") else "kubeconfig", why)
    for path_field in ("token_file", "ca_file"):
        if raw.get(path_field) and not (base / str(raw[path_field])).is_file():
            bad(path_field, f"{raw[path_field]!r} does not exist")
    if raw.get("server") and not (raw.get("token") or raw.get("token_file")):
        bad("token", "a server entry needs token or token_file")
    timeout = raw.get("request_timeout_seconds", 30.0)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        bad("request_timeout_seconds", "must be a positive number")
    if problems:
        return None, problems
    return ClusterConfig(
        name=name,
        vendor=vendor,
        prometheus_url=prometheus_url.rstrip("/") if prometheus_url else None,
        kubeconfig=kubeconfig,
        context=context,
        in_cluster=bool(raw.get("in_cluster")),
        server=raw.get("server"),
        token=raw.get("token"),
        token_file=str(base / raw["token_file"]) if raw.get("token_file") else None,
        ca_file=str(base / raw["ca_file"]) if raw.get("ca_file") else None,
        insecure_skip_tls_verify=bool(raw.get("insecure_skip_tls_verify")),
        request_timeout_seconds=float(timeout),
    ), []


def _check_kubeconfig(path: str, context: str | None) -> str | None:
    """Why this kubeconfig cannot be used, or None. Never echoes its content (it holds credentials)."""
    try:
        document = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        return f"file {path!r} does not exist"
    except (OSError, yaml.YAMLError) as exc:
        return f"file {path!r} is not readable YAML ({type(exc).__name__})"
    if not isinstance(document, dict) or not isinstance(document.get("contexts"), list):
        return f"file {path!r} is not a kubeconfig (no contexts list)"
    names = [c.get("name") for c in document["contexts"] if isinstance(c, dict)]
    wanted = context or document.get("current-context")
    if not wanted:
        return f"file {path!r} has no current-context; name one with 'context'"
    if wanted not in names:
        return f"context {wanted!r} is not in {path!r} (it has: {', '.join(map(str, names)) or 'none'})"
    return None
