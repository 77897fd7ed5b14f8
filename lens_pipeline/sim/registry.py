"""Writes the cluster registry the pipeline reads, and one kubeconfig per simulated cluster."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import yaml

from lens_pipeline.sim import exporters
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
                # Over TLS its Prometheus is trusted by the same CA as its API server.
                **(
                    {"prometheus_http": {"tls_config": {"ca_file": "sim-ca.crt"}}}
                    if server.certificate is not None
                    else {}
                ),
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


def prometheus_config(cluster: SimCluster, server: SimServer, scrape_interval: str = "5s") -> dict[str, Any]:
    """A `prometheus.yml` for one cluster: a scrape job per exporter, a target per node (its path
    carried in `__metrics_path__`), with the `node` and `instance` labels the simulator's own query
    API gives the same series. One Prometheus per cluster, as each original cluster had its own."""
    base = urlsplit(server.base_url(cluster.name))
    jobs: dict[str, list[dict[str, Any]]] = {}
    for target in exporters.scrape(cluster):
        labels = {
            "__metrics_path__": f"{base.path}{target.path}",
            "instance": target.instance,
            **exporters.target_labels(cluster, target),
        }
        jobs.setdefault(target.job, []).append({"targets": [base.netloc], "labels": labels})
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": job,
                "scheme": base.scheme,
                # Prometheus' default, said aloud: a target label wins a clash (`exported_*`).
                "honor_labels": False,
                "static_configs": configs,
                **({"tls_config": {"insecure_skip_verify": True}} if base.scheme == "https" else {}),
            }
            for job, configs in sorted(jobs.items())
        ],
    }


def write_prometheus_configs(
    directory: str | os.PathLike[str], server: SimServer, scrape_interval: str = "5s"
) -> list[Path]:
    """`prometheus-<cluster>.yml` for every cluster of the fleet, in `directory`."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for cluster in server.fleet:
        path = folder / f"prometheus-{cluster.name}.yml"
        path.write_text(yaml.safe_dump(prometheus_config(cluster, server, scrape_interval), sort_keys=False))
        written.append(path)
    return written
