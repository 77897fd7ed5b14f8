"""How `lens ingest` is configured, and who may send: per-cluster bearer tokens.

The tokens file maps cluster name to token (YAML `{tokens: {prod-east: "...", ...}}`, or a
token file per cluster: `{tokens: {prod-east: {token_file: /run/secrets/east}}}`), or to a list of
them, all accepted, for a rotation (`{tokens: {prod-east: [new, old]}}`). With tokens
configured, every stream and request must carry `authorization: Bearer <token>`; the token says
which cluster its events belong to. Without, the sidecar serves one cluster (`default_cluster`)
as the original did, or whatever cluster an event names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lens_pipeline.bearer import bearer_token, matching
from lens_pipeline.clusters import validate_cluster_name
from lens_pipeline.ingest.events import DEFAULT_MAX_EVENT_BYTES

LENS_INGEST_TOKENS_FILE = "LENS_INGEST_TOKENS_FILE"


class Unauthenticated(Exception):
    pass


@dataclass(frozen=True)
class Tokens:
    by_cluster: dict[str, str | list[str]] = field(default_factory=dict)

    @property
    def required(self) -> bool:
        return bool(self.by_cluster)

    def cluster_of(self, authorization: str | None) -> str | None:
        """The cluster a bearer token belongs to; None when tokens are not configured."""
        if not self.required:
            return None
        if not authorization:
            raise Unauthenticated("a bearer token is required (authorization: Bearer <token>)")
        token = bearer_token(authorization)
        if token is None:
            raise Unauthenticated("the authorization must be a bearer token")
        pairs = (
            (cluster, expected)
            for cluster, accepted in self.by_cluster.items()
            for expected in ([accepted] if isinstance(accepted, str) else accepted)
        )
        match = matching(token, pairs)
        if match is None:
            raise Unauthenticated("the bearer token is not valid for any cluster")
        return match

    @classmethod
    def load(cls, path: str | None) -> Tokens:
        if not path:
            return cls()
        base = Path(path).parent
        document = yaml.safe_load(Path(path).read_text()) or {}
        entries = document.get("tokens") if isinstance(document, dict) else None
        if not isinstance(entries, dict):
            raise ValueError(f"{path}: expected a mapping `tokens: {{cluster: token}}`")
        tokens: dict[str, str | list[str]] = {}
        for cluster, entry in entries.items():
            problem = validate_cluster_name(cluster)
            if problem:
                raise ValueError(f"{path}: cluster name {problem}")
            if isinstance(entry, list) and entry:
                tokens[cluster] = [_read_token(base, f"{path}: cluster {cluster}", item) for item in entry]
            else:
                tokens[cluster] = _read_token(base, f"{path}: cluster {cluster}", entry)
        return cls(tokens)


def _read_token(base: Path, where: str, entry: object) -> str:
    """One token of the tokens file: the token itself, or `{token_file: PATH}` (relative to the file)."""
    if isinstance(entry, dict) and "token_file" in entry:
        token = (base / entry["token_file"]).read_text().strip()
    elif isinstance(entry, str):
        token = entry.strip()
    else:
        raise ValueError(f"{where}: expected a token, {{token_file: PATH}}, or a list of them")
    if not token:
        raise ValueError(f"{where}: empty token")
    return token


@dataclass(frozen=True)
class IngestConfig:
    database_url: str
    host: str = "0.0.0.0"
    grpc_port: int = 50051  # the original's `jobs.grpc_port` (README example; its manifests use 8991)
    http_port: int = 8989  # the later original's telemetry-processor port
    # /metrics, /livez and /healthz alone, plain HTTP, on a port of their own (0: none): for the
    # probes and the scrape when the HTTP port serves TLS, or is to be reached by the agents only.
    metrics_port: int = 0
    default_cluster: str = "default"
    tokens: Tokens = field(default_factory=Tokens)
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None  # also require client certificates signed by this CA
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    linger_seconds: float = 0.002
    max_pending_rows: int = 50_000
    shutdown_grace_seconds: float = 10.0

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert and self.tls_key)

    @property
    def transport_limit(self) -> int:
        # Messages up to this size reach the server and get a per-event error when over
        # `max_event_bytes`; only larger ones are cut off by gRPC itself (RESOURCE_EXHAUSTED).
        return max(4 * self.max_event_bytes, 16 << 20)
