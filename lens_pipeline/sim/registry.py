"""Writes the cluster registry the pipeline reads, and one kubeconfig per simulated cluster."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from lens_pipeline.sim.fleet import SimCluster

if TYPE_CHECKING:
    from lens_pipeline.sim.server import SimServer


class _IndentedDumper(yaml.SafeDumper):
    """Indents list items under their key (`clusters:\\n  - name:`), as people write YAML by hand."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)


def kubeconfig(cluster: SimCluster, server_url: str, ca_pem: bytes | None = None) -> dict[str, Any]:
    """A kubeconfig for one cluster; with `ca_pem` (the simulator serves HTTPS) it trusts that CA."""
    server: dict[str, Any] = {"server": server_url}
    if ca_pem is not None:
        server["certificate-authority-data"] = base64.b64encode(ca_pem).decode("ascii")
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster.name, "cluster": server}],
        "users": [{"name": cluster.name, "user": {"token": cluster.token}}],
        "contexts": [{"name": cluster.name, "context": {"cluster": cluster.name, "user": cluster.name}}],
        "current-context": cluster.name,
        "preferences": {},
    }


def _write_private(path: Path, text: str) -> None:
    # Kubeconfigs carry bearer tokens: never world-readable, even for a fake cluster.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def write_registry(path: str | os.PathLike[str], server: SimServer) -> Path:
    """Write the registry at `path` and `<dir of path>/kubeconfigs/<name>.yaml` (and, over TLS, the CA
    as `<dir of path>/sim-ca.crt`); returns the registry path."""
    registry_path = Path(path)
    kubeconfig_dir = registry_path.parent / "kubeconfigs"
    kubeconfig_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for cluster in server.fleet:
        kubeconfig_path = kubeconfig_dir / f"{cluster.name}.yaml"
        _write_private(
            kubeconfig_path,
            yaml.dump(
                kubeconfig(
                    cluster,
                    server.base_url(cluster.name),
                    server.certificate.ca_pem if server.certificate is not None else None,
                ),
                Dumper=_IndentedDumper,
                sort_keys=False,
            ),
        )
        entries.append(
            {
                "name": cluster.name,
                "kubeconfig": f"kubeconfigs/{cluster.name}.yaml",
                "context": cluster.name,
                "prometheus_url": server.prometheus_url(cluster.name),
                "vendor": cluster.vendor,
            }
        )
    if server.certificate is not None:
        # For clients that take a CA file rather than a kubeconfig (Prometheus over HTTPS, curl).
        (registry_path.parent / "sim-ca.crt").write_bytes(server.certificate.ca_pem)
    registry_path.write_text(
        "# Written by `lens sim`; kubeconfig paths are relative to this file.\n"
        + yaml.dump({"clusters": entries}, Dumper=_IndentedDumper, sort_keys=False),
        encoding="utf-8",
    )
    return registry_path
