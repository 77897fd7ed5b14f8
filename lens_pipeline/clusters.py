"""The cluster registry: which clusters exist, how to reach their API server and Prometheus, which GPUs.

Loaded from a YAML file (`LENS_CLUSTERS_FILE`) or from a directory with one file per cluster, as
the original's `multi-k8s-config` Secret is mounted: each file a kubeconfig, or the original's
`ClusterConfig` JSON (`host`, `bearerToken`, `caData`...). Every entry is checked on its own, as a
typed model: a bad entry becomes a `RegistryError` naming the cluster and the field, and the others
still load.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lens_pipeline.vendors import ExporterOverrides, exporter_metric_names

# A DNS-1123 label: also keeps `,` and `|` out of partition keys, which break Dagster backfills.
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_KUBECONFIG_SUFFIXES = (".yaml", ".yml", ".kubeconfig", ".conf", ".json")
# A Prometheus label name.
_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
_METRIC_PREFIX = r"^([a-zA-Z_:][a-zA-Z0-9_:]*)?$"
_METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"


class ExporterSettings(BaseModel):
    """What auto-detection cannot guess about a cluster's exporters (registry key `exporters`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric_prefix: str | None = Field(
        default=None, pattern=_METRIC_PREFIX, description="prefix of every GPU exporter metric, e.g. amd_"
    )
    metric_names: dict[str, str] = Field(
        default_factory=dict, description="a metric's shipped name -> its name in this cluster's Prometheus"
    )
    node_label: str | None = Field(default=None, pattern=_LABEL_NAME, description="GPU series: node label")
    pod_label: str | None = Field(default=None, pattern=_LABEL_NAME, description="GPU series: pod label")
    namespace_label: str | None = Field(default=None, pattern=_LABEL_NAME)
    nic_node_label: str | None = Field(default=None, pattern=_LABEL_NAME, description="InfiniBand series")

    @field_validator("metric_names")
    @classmethod
    def _known_metrics(cls, names: dict[str, str]) -> dict[str, str]:
        """A misspelt key would rename nothing, silently: only the metrics the profiles read."""
        known = exporter_metric_names()
        unknown = sorted(set(names) - known)
        if unknown:
            raise ValueError(
                f"unknown metric {', '.join(map(repr, unknown))}; the shipped names that can be renamed "
                f"are {', '.join(sorted(known))}"
            )
        bad = sorted(v for v in names.values() if not re.fullmatch(_METRIC_NAME, v))
        if bad:
            raise ValueError(f"not a Prometheus metric name: {', '.join(map(repr, bad))}")
        return names

    def overrides(self) -> ExporterOverrides:
        return ExporterOverrides(
            metric_prefix=self.metric_prefix,
            metric_names=dict(self.metric_names),
            node_label=self.node_label,
            pod_label=self.pod_label,
            namespace_label=self.namespace_label,
            nic_node_label=self.nic_node_label,
        )


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Text that goes into an HTTP header: no control character (a newline would split the header, and
# the HTTP library's refusal would quote the value, a secret).
_HEADER_TEXT = re.compile(r"^[^\x00-\x1f\x7f]*$")
# An HTTP header name (RFC 9110 token).
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Headers the client sets itself, which Prometheus' http_headers refuses as well.
RESERVED_HEADERS = frozenset(
    {
        "authorization",
        "host",
        "content-encoding",
        "content-length",
        "content-type",
        "user-agent",
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "www-authenticate",
        "accept-encoding",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def header_text(value: str | None, what: str) -> str | None:
    """`value` when it can go into a header; the error names `what`, never the value."""
    if value is not None and not _HEADER_TEXT.match(value):
        raise ValueError(f"{what} holds a control character (a newline?)")
    return value


class PromAuthorization(_Strict):
    """An `Authorization: <type> <credentials>` header (Prometheus' `authorization`)."""

    type: str = Field(default="Bearer", pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")
    credentials: str | None = Field(default=None, repr=False)
    # Read again at every request, as Prometheus does: a rotated token is used at once.
    credentials_file: str | None = None

    @model_validator(mode="after")
    def _one_secret(self) -> PromAuthorization:
        if self.type.lower() == "basic":
            raise ValueError("for type Basic, use basic_auth (username and password)")
        if bool(self.credentials) == bool(self.credentials_file):
            raise ValueError("give exactly one of credentials or credentials_file")
        header_text(self.credentials, "credentials")
        return self


class PromBasicAuth(_Strict):
    """HTTP basic authentication (Prometheus' `basic_auth`; no password: an empty one)."""

    username: str
    password: str | None = Field(default=None, repr=False)
    password_file: str | None = None  # read again at every request

    @model_validator(mode="after")
    def _one_secret(self) -> PromBasicAuth:
        if self.password and self.password_file:
            raise ValueError("give at most one of password or password_file")
        header_text(self.username, "username")
        header_text(self.password, "password")
        return self


class PromTLS(_Strict):
    """How the Prometheus server is trusted and the client shows itself (Prometheus' `tls_config`;
    `insecure_skip_verify` checks no certificate, whatever `ca_file` says)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False

    @model_validator(mode="after")
    def _pair(self) -> PromTLS:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError(
                "a client certificate (cert_file) needs its key (key_file), and a key its certificate"
            )
        return self


class PromHeader(_Strict):
    values: list[str] = Field(min_length=1, repr=False)

    @model_validator(mode="after")
    def _text(self) -> PromHeader:
        for value in self.values:
            header_text(value, "a value")
        return self


class PrometheusHttp(_Strict):
    """How to reach `prometheus_url` when it is not open HTTP (registry key `prometheus_http`): the
    names and meaning of Prometheus' own HTTP client settings (`http_config`), a subset of them.
    Behind an authenticating proxy (OpenShift's thanos-querier, vmauth, oauth2-proxy), over HTTPS
    from a private CA, or a multi-tenant store that wants its tenant header (Mimir's X-Scope-OrgID)."""

    authorization: PromAuthorization | None = None
    basic_auth: PromBasicAuth | None = None
    tls_config: PromTLS = Field(default_factory=PromTLS)
    http_headers: dict[str, PromHeader] = Field(default_factory=dict)
    # Every request to this Prometheus through this proxy (http, https, socks5, socks5h; a user and
    # password in the URL are the proxy's); the environment's HTTPS_PROXY then plays no part.
    proxy_url: str | None = Field(default=None, repr=False)

    @field_validator("proxy_url")
    @classmethod
    def _proxy(cls, url: str | None) -> str | None:
        return valid_proxy(url)

    @model_validator(mode="after")
    def _one_authorization(self) -> PrometheusHttp:
        if self.authorization is not None and self.basic_auth is not None:
            raise ValueError("authorization and basic_auth are mutually exclusive")
        for name in self.http_headers:
            if not _HEADER_NAME.match(name):
                raise ValueError(f"http_headers: {name!r} is not a header name")
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(
                    f"http_headers: {name} is set by the client itself"
                    + (" (use authorization or basic_auth)" if name.lower() == "authorization" else "")
                )
        return self


class ClusterConfig(BaseModel):
    """One cluster. Exactly one way to reach the API server: kubeconfig, in-cluster, or server (with a
    token or a client certificate)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    vendor: Literal["amd", "nvidia", "auto"] = "auto"
    # `enabled: false` keeps an entry out of every run, sensor and lens watch (a paused cluster,
    # or one of a `kubeconfig_dir` another system writes); such entries never become a ClusterConfig.
    enabled: Literal[True] = True
    prometheus_url: str | None = None
    prometheus_http: PrometheusHttp = Field(default_factory=PrometheusHttp)
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False
    server: str | None = None
    token: str | None = Field(default=None, repr=False)
    token_file: str | None = None
    ca_file: str | None = None
    # PEM, inline (the original's caData / certData / keyData, base64-decoded): never shown.
    ca_data: str | None = Field(default=None, repr=False)
    cert_data: str | None = Field(default=None, repr=False)
    key_data: str | None = Field(default=None, repr=False)
    cert_file: str | None = None
    key_file: str | None = None
    tls_server_name: str | None = None
    insecure_skip_tls_verify: bool = False
    # The proxy to the API server (kubectl's `proxy-url`): http, https, socks5 or socks5h; by
    # default the kubeconfig's own. Never shown: it may hold the proxy's user and password.
    proxy_url: str | None = Field(default=None, repr=False)
    request_timeout_seconds: float = Field(default=30.0, gt=0)
    exporters: ExporterSettings = Field(default_factory=ExporterSettings)
    # JuiceFS volume -> its capacity in bytes, for volumes without a quota (they report a made-up 1 PiB).
    juicefs_capacity_bytes: dict[str, float] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _dns1123(cls, name: str) -> str:
        if (why := validate_cluster_name(name)) is not None:
            raise ValueError(why)
        return name

    @field_validator("prometheus_http", mode="before")
    @classmethod
    def _open(cls, value: Any) -> Any:
        return {} if value is None else value  # `prometheus_http: null`: open, whatever the defaults say

    @field_validator("proxy_url")
    @classmethod
    def _proxy(cls, url: str | None) -> str | None:
        return valid_proxy(url)

    @field_validator("prometheus_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return url.rstrip("/") if url else url

    @field_validator("juicefs_capacity_bytes")
    @classmethod
    def _positive(cls, capacities: dict[str, float]) -> dict[str, float]:
        bad = sorted(volume for volume, size in capacities.items() if not size > 0)
        if bad:
            raise ValueError(f"capacities must be positive numbers of bytes (not for {', '.join(bad)})")
        return capacities

    @property
    def exporter_overrides(self) -> ExporterOverrides:
        return self.exporters.overrides()


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


UNKNOWN_FIELD = "unknown field"


@dataclass
class Registry:
    clusters: dict[str, ClusterConfig]
    errors: list[RegistryError]
    source: str
    # Entries with `enabled: false`: kept in the file, collected nowhere (as if not listed).
    disabled: set[str] = field(default_factory=set)

    @property
    def names(self) -> list[str]:
        return sorted(self.clusters)

    def listed(self) -> set[str] | None:
        """Every cluster the registry lists, those whose entry is in error too (not those it
        disables); None when the registry itself could not be read (it then says nothing about
        which clusters left)."""
        # Any error that names no cluster but is not a mere unknown top-level field: some entry, or
        # all of them, could not be read.
        if any(e.cluster is None and e.message != UNKNOWN_FIELD for e in self.errors):
            return None
        return set(self.clusters) | {e.cluster for e in self.errors if e.cluster}

    def get(self, name: str) -> ClusterConfig:
        if name in self.clusters:
            return self.clusters[name]
        problems = [str(e) for e in self.errors if e.cluster == name]
        detail = (
            "it is disabled there (enabled: false)"
            if name in self.disabled
            else "; ".join(problems)
            if problems
            else "it is not in the registry"
        )
        raise ClusterNotFound(f"cluster {name!r} cannot be used ({self.source}): {detail}")


def validate_cluster_name(name: object) -> str | None:
    """Why `name` is not a valid cluster name, or None when it is."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if len(name) > 63 or not _DNS1123_LABEL.fullmatch(name):
        return (
            f"{name!r} is not a DNS-1123 label (lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters)"
        )
    return None


def load_registry(path: str | Path) -> Registry:
    """Load the registry from a YAML file or from a directory of per-cluster files."""
    path = Path(path)
    if path.is_dir():
        entries, errors = _entries_from_directory(path)
        return _build(entries, errors, base=path, source=str(path))
    try:
        document = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        return Registry(
            {}, [RegistryError(None, "path", f"registry file {str(path)!r} does not exist")], str(path)
        )
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        return Registry({}, [RegistryError(None, "path", f"cannot read {str(path)!r}: {exc}")], str(path))
    return parse_registry(document, base=path.parent, source=str(path))


def _with_defaults(defaults: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """`entry` over `defaults`; mappings (exporters, capacities) merged one level down, and
    `prometheus_http` two (its `tls_config` and `http_headers` key by key; an entry's
    `authorization` or `basic_auth` replaces the other one of the defaults)."""
    merged = {**defaults, **entry}
    for key, value in defaults.items():
        if isinstance(value, dict) and isinstance(entry.get(key), dict):
            merged[key] = {**value, **entry[key]}
    default_http, own_http = defaults.get("prometheus_http"), entry.get("prometheus_http")
    if isinstance(default_http, dict) and isinstance(own_http, dict):
        http = merged["prometheus_http"]
        for section in ("tls_config", "http_headers"):
            if isinstance(default_http.get(section), dict) and isinstance(own_http.get(section), dict):
                http[section] = {**default_http[section], **own_http[section]}
        for one, other in (("authorization", "basic_auth"), ("basic_auth", "authorization")):
            if own_http.get(one) is not None and other not in own_http:
                http.pop(other, None)
    return merged


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
    for unknown in sorted(set(document) - {"clusters", "defaults", "kubeconfig_dir"}):
        errors.append(RegistryError(None, unknown, UNKNOWN_FIELD))
    found: dict[str, dict[str, Any]] = {}
    if document.get("kubeconfig_dir"):
        dir_entries, dir_errors = _entries_from_directory(base / str(document["kubeconfig_dir"]))
        found = {e["name"]: e for e in dir_entries}
        explicit = {e.get("name") for e in raw_entries if isinstance(e, dict)}
        entries.extend(_with_defaults(defaults, e) for e in dir_entries if e["name"] not in explicit)
        errors.extend(dir_errors)
    for index, raw in enumerate(raw_entries):
        if not isinstance(raw, dict):
            errors.append(RegistryError(None, f"clusters[{index}]", "expected a mapping"))
            continue
        entries.append(_with_defaults(defaults, _refined(found.get(str(raw.get("name"))), raw)))
    return _build(entries, errors, base, source)


# The ways to reach an API server (exactly one per entry), and every field that says how: an explicit
# entry that gives one of the ways brings its own fields, and none of the directory's.
CONNECTION_METHODS = ("kubeconfig", "in_cluster", "server")
CONNECTION_FIELDS = (
    *CONNECTION_METHODS,
    "context",
    "token",
    "token_file",
    "ca_file",
    "ca_data",
    "cert_data",
    "key_data",
    "cert_file",
    "key_file",
    "tls_server_name",
    "insecure_skip_tls_verify",
)


def _refined(found: dict[str, Any] | None, explicit: dict[str, Any]) -> dict[str, Any]:
    """An explicit entry over the directory's entry of the same name (its vendor, Prometheus,
    `enabled`...); one that names its own way to the API server keeps none of the directory's."""
    if found is None:
        return explicit
    if any(explicit.get(key) for key in CONNECTION_METHODS):
        found = {k: v for k, v in found.items() if k not in CONNECTION_FIELDS}
    return {**found, **explicit}


def _entries_from_directory(directory: Path) -> tuple[list[dict[str, Any]], list[RegistryError]]:
    """One entry per file (before `defaults`): the file's name (less a known suffix) is the cluster's."""
    if not directory.is_dir():
        return [], [RegistryError(None, "kubeconfig_dir", f"{str(directory)!r} is not a directory")]
    entries, errors = [], []
    for file in sorted(directory.iterdir()):
        # Mounted Secrets carry `..data` symlinks and dot-files beside the keys.
        if file.name.startswith(".") or not file.is_file():
            continue
        suffix = next((s for s in _KUBECONFIG_SUFFIXES if file.name.endswith(s)), "")
        name = file.name.removesuffix(suffix) if suffix else file.name
        try:
            original = _original_cluster_config(file)
        except ValueError as exc:
            errors.append(RegistryError(name, str(exc.args[0]), str(exc.args[1])))
            continue
        entry = original if original is not None else {"kubeconfig": str(file)}
        entries.append({"name": name, **entry})
    return entries, errors


# The original's ClusterConfig JSON (one per key of `multi-k8s-config`) -> our entry's fields. Its
# byte fields are base64, as Go's encoding/json writes []byte.
_ORIGINAL_FIELDS = {
    "kubeconfig": "kubeconfig",
    "host": "server",
    "bearerToken": "token",
    "caData": "ca_data",
    "certData": "cert_data",
    "keyData": "key_data",
    "insecureSkipTLSVerify": "insecure_skip_tls_verify",
    "tlsServerName": "tls_server_name",
}
_ORIGINAL_BYTES = frozenset({"caData", "certData", "keyData"})


def _original_cluster_config(file: Path) -> dict[str, Any] | None:
    """The entry of a file holding the original's `ClusterConfig` JSON, None for any other file (a
    kubeconfig), or ValueError(field, message) for a ClusterConfig that cannot be used."""
    text = file.read_text(errors="replace")
    if not text.lstrip().startswith("{"):
        return None
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return None  # a kubeconfig in JSON-ish YAML flow style: the kubeconfig check says more
    if not isinstance(document, dict) or "clusters" in document or "contexts" in document:
        return None  # a kubeconfig written as JSON
    entry: dict[str, Any] = {}
    for key, value in document.items():
        if key not in _ORIGINAL_FIELDS:
            raise ValueError(key, f"unknown field of the original ClusterConfig in {file.name!r}")
        if value in (None, "", False):
            continue
        if key in _ORIGINAL_BYTES:
            value = _pem(key, value)
        entry[_ORIGINAL_FIELDS[key]] = value
    if entry.get("kubeconfig") and entry.get("server"):
        entry.pop("kubeconfig")  # the original used host and credentials when given, the file else
    return entry


def _pem(field_name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(field_name, "expected base64 text")
    if value.lstrip().startswith("-----BEGIN"):
        return value
    try:
        decoded = base64.b64decode(value, validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        raise ValueError(field_name, "is neither base64 nor PEM") from None
    if "-----BEGIN" not in decoded:
        raise ValueError(field_name, "does not hold a PEM block")
    return decoded


def _build(entries: list[dict[str, Any]], errors: list[RegistryError], base: Path, source: str) -> Registry:
    clusters: dict[str, ClusterConfig] = {}
    disabled: set[str] = set()
    for raw in entries:
        enabled = raw.get("enabled", True)
        if not isinstance(enabled, bool):
            name = raw.get("name") if isinstance(raw.get("name"), str) else None
            errors.append(RegistryError(name, "enabled", "must be true or false"))
            continue
        if not enabled:  # only its name is read: the rest may be whatever it was
            name = raw.get("name")
            if (why := validate_cluster_name(name)) is not None:
                errors.append(RegistryError(name if isinstance(name, str) else None, "name", why))
            elif name in clusters or name in disabled:
                errors.append(RegistryError(name, "name", "listed twice; the first entry is kept"))
            else:
                disabled.add(str(name))
            continue
        cluster, problems = _parse_entry(raw, base)
        if problems:
            errors.extend(problems)
        elif cluster is not None and (cluster.name in clusters or cluster.name in disabled):
            errors.append(RegistryError(cluster.name, "name", "listed twice; the first entry is kept"))
        elif cluster is not None:
            clusters[cluster.name] = cluster
    # A disabled cluster is not read: what is wrong with it elsewhere (its file in a directory another
    # system writes) is no error of this registry.
    errors = [e for e in errors if e.cluster is None or e.cluster not in disabled]
    return Registry(clusters, errors, source, disabled)


_PATH_FIELDS = ("kubeconfig", "token_file", "ca_file", "cert_file", "key_file")


def _parse_entry(raw: dict[str, Any], base: Path) -> tuple[ClusterConfig | None, list[RegistryError]]:
    name = raw.get("name")
    label = name if isinstance(name, str) else None
    if (why := validate_cluster_name(name)) is not None:
        return None, [RegistryError(label, "name", why)]
    assert isinstance(name, str)
    raw = dict(raw)
    if isinstance(raw.get("prometheus_url"), str):
        raw["prometheus_url"] = raw["prometheus_url"].replace("{name}", name)
    for path_field in _PATH_FIELDS:
        if raw.get(path_field) and isinstance(raw[path_field], str | Path):
            raw[path_field] = _absolute(base, str(raw[path_field]))
    if isinstance(raw.get("prometheus_http"), dict):
        raw["prometheus_http"] = _resolved(raw["prometheus_http"], base)
    try:
        cluster = ClusterConfig.model_validate(raw)
    except ValidationError as exc:
        return None, [
            RegistryError(label, ".".join(map(str, e["loc"])) or "entry", _message(e)) for e in exc.errors()
        ]
    problems = [RegistryError(label, f, m) for f, m in _connection_problems(cluster)]
    return (None, problems) if problems else (cluster, [])


def _absolute(base: Path, path: str) -> str:
    """`path` against `base`, its symbolic links kept: a key of a mounted Secret is a link through
    `..data` to a dated folder the kubelet replaces at each update, so a path resolved to the folder
    would name a file that is gone after the next rotation."""
    return os.path.abspath(base / path)


def _resolved(section: dict[str, Any], base: Path) -> dict[str, Any]:
    """`prometheus_http` with its file paths made absolute against `base` (one level down)."""
    out = dict(section)
    for key, value in section.items():
        if isinstance(value, dict):
            out[key] = {
                name: _absolute(base, item) if name.endswith("_file") and isinstance(item, str) else item
                for name, item in value.items()
            }
    return out


def _message(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown field"
    # The input is never echoed: it may be a token.
    return str(error["msg"]).removeprefix("Value error, ")


def _connection_problems(cluster: ClusterConfig) -> list[tuple[str, str]]:
    """(field, message) of everything that keeps the entry from reaching its API server."""
    problems = []
    ways = [w for w in ("kubeconfig", "in_cluster", "server") if getattr(cluster, w)]
    if len(ways) != 1:
        problems.append(
            (
                "kubeconfig",
                "give exactly one of kubeconfig (+ context), in_cluster: true, or server (+ token)",
            )
        )
    if cluster.kubeconfig:
        why = _check_kubeconfig(cluster.kubeconfig, cluster.context)
        if why is not None:
            problems.append(("context" if why.startswith("context") else "kubeconfig", why))
    for path_field in _PATH_FIELDS[1:]:
        path = getattr(cluster, path_field)
        if path and not Path(path).is_file():
            problems.append((path_field, f"{path!r} does not exist"))
    has_certificate = bool(
        (cluster.cert_data or cluster.cert_file) and (cluster.key_data or cluster.key_file)
    )
    if cluster.server and not (cluster.token or cluster.token_file or has_certificate):
        problems.append(("token", "a server entry needs token, token_file or a client certificate and key"))
    if bool(cluster.cert_data or cluster.cert_file) != bool(cluster.key_data or cluster.key_file):
        problems.append(("cert_data", "a client certificate needs its key, and a key its certificate"))
    return problems


PROXY_SCHEMES = ("http", "https", "socks5", "socks5h")


def proxy_problem(url: str) -> str | None:
    """Why `url` is no proxy to an API server, or None. kubectl's `proxy-url` schemes (http, https,
    socks5) and socks5h; the text never repeats the URL, which may hold a password."""
    if any(c.isspace() or c == "\\" or not c.isprintable() for c in url):
        # Parsers disagree on these (urllib3 reads a backslash as a slash, and would then quote the
        # user and password back as a host): refused at load, as Go's url.Parse refuses them.
        return "proxy URL: holds a space, a control character or a backslash"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "proxy URL: not a URL with a valid host and port"
    if parts.scheme.lower() not in PROXY_SCHEMES:
        return f"proxy URL: scheme {parts.scheme!r:.20} is not one of {', '.join(PROXY_SCHEMES)}"
    if not parts.hostname:
        return "proxy URL: no host"
    if port is None and parts.scheme.lower().startswith("socks"):
        return "proxy URL: a SOCKS proxy needs its port"
    return None


def valid_proxy(url: str | None) -> str | None:
    """`url` when it is a proxy a client can go through (or None); ValueError saying why not."""
    if url is not None and (why := proxy_problem(url)) is not None:
        raise ValueError(why)
    return url


def kubeconfig_proxy_url(document: Any, context: str | None) -> str | None:
    """The `proxy-url` of a parsed kubeconfig's cluster for `context` (else its current context):
    the proxy kubectl takes to that API server, which the Python client's loader does not read."""
    if not isinstance(document, dict):
        return None
    wanted = context or document.get("current-context")
    cluster_name = next(
        (
            (c.get("context") or {}).get("cluster")
            for c in document.get("contexts") or ()
            if isinstance(c, dict) and c.get("name") == wanted and isinstance(c.get("context"), dict)
        ),
        None,
    )
    entry = next(
        (
            c.get("cluster")
            for c in document.get("clusters") or ()
            if isinstance(c, dict) and c.get("name") == cluster_name
        ),
        None,
    )
    proxy = entry.get("proxy-url") if isinstance(entry, dict) else None
    return str(proxy) if proxy else None


def shown_url(url: str) -> str:
    """A URL as it may be shown: its user and password (a proxy's, a Prometheus') replaced, its
    query left out."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is no number: said so, not shown
        port = ":<bad port>"
    user = "<user>@" if parts.username or parts.password else ""
    return urlunsplit((parts.scheme.lower(), f"{user}{host}{port}", parts.path, "", ""))


def describe_prometheus_http(http: PrometheusHttp) -> str:
    """What `prometheus_http` sends and trusts, in words, naming files and header names only."""
    said = []
    if http.authorization is not None:
        source = "inline" if http.authorization.credentials else f"from {http.authorization.credentials_file}"
        said.append(f"Authorization {http.authorization.type} ({source})")
    if http.basic_auth is not None:
        password = (
            f"password from {http.basic_auth.password_file}"
            if http.basic_auth.password_file
            else ("inline password" if http.basic_auth.password else "empty password")
        )
        said.append(f"basic auth as {http.basic_auth.username!r} ({password})")
    tls = http.tls_config
    if tls.insecure_skip_verify:
        said.append("server certificate NOT verified")
    elif tls.ca_file:
        said.append(f"CA {tls.ca_file}")
    if tls.cert_file:
        said.append(f"client certificate {tls.cert_file}")
    if http.http_headers:
        said.append(f"headers {', '.join(sorted(http.http_headers))}")
    if http.proxy_url:
        said.append(f"through the proxy {shown_url(http.proxy_url)}")
    return "; ".join(said) or "no credentials, the system's CAs"


def api_server_proxy(cluster: ClusterConfig) -> str | None:
    """The proxy to the cluster's API server: the entry's `proxy_url`, else its kubeconfig's
    `proxy-url`; ValueError naming only the file when the kubeconfig cannot be read."""
    if cluster.proxy_url:
        return cluster.proxy_url
    return read_kubeconfig_proxy_url(cluster.kubeconfig, cluster.context) if cluster.kubeconfig else None


def read_kubeconfig_proxy_url(path: str, context: str | None) -> str | None:
    """`kubeconfig_proxy_url` of the file at `path`; ValueError naming only the file when it cannot
    be read (its text holds credentials)."""
    try:
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"kubeconfig {path!r} is not readable YAML ({type(exc).__name__})") from None
    return kubeconfig_proxy_url(document, context)


def _check_kubeconfig(path: str, context: str | None) -> str | None:
    """Why this kubeconfig cannot be used, or None. Never echoes its content (it holds credentials)."""
    try:
        document = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        return f"file {path!r} does not exist"
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        return f"file {path!r} is not readable YAML ({type(exc).__name__})"
    if not isinstance(document, dict) or not isinstance(document.get("contexts"), list):
        return f"file {path!r} is not a kubeconfig (no contexts list)"
    names = [c.get("name") for c in document["contexts"] if isinstance(c, dict)]
    wanted = context or document.get("current-context")
    if not wanted:
        return f"file {path!r} has no current-context; name one with 'context'"
    if wanted not in names:
        return f"context {wanted!r} is not in {path!r} (it has: {', '.join(map(str, names)) or 'none'})"
    proxy = kubeconfig_proxy_url(document, context)
    if proxy is not None and (why := proxy_problem(proxy)) is not None:
        return f"file {path!r}: the proxy-url of context {wanted!r}: {why}"
    return None
