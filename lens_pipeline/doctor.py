"""`lens doctor`: before the first run, what each cluster of the registry would give and what would
be missing, in a table a person can act on.

For each cluster it asks the Kubernetes API (can the credentials list what the collectors list,
how many GPU nodes are there) and Prometheus (which exporters, in which dialect, how many series
per GPU node, what names no node, which storage has no capacity), with the same code the
collectors use. Nothing is written anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from lens_pipeline.clusters import (
    ClusterConfig,
    Registry,
    api_server_proxy,
    describe_prometheus_http,
    shown_url,
)
from lens_pipeline.collect.nodes import NodeIndex, has_gpus, node_profile, project_node, ready_status
from lens_pipeline.collect.overview import juicefs_space_capacity
from lens_pipeline.collect.problems import MalformedObject, object_name
from lens_pipeline.kube.reader import KubeError, KubeReader
from lens_pipeline.prom.dialect import read_dialect
from lens_pipeline.prom.reader import PromError, PromReader
from lens_pipeline.vendors import JUICEFS, Dialect, profiles_for

OK, WARN, FAIL = "ok", "warn", "FAIL"
# What the collectors list; each must be allowed (a read-only ClusterRole gives them all).
LISTED = {
    "nodes": "/api/v1/nodes",
    "pods": "/api/v1/pods",
    "replicasets": "/apis/apps/v1/replicasets",
    "jobs": "/apis/batch/v1/jobs",
    "storageclasses": "/apis/storage.k8s.io/v1/storageclasses",
}
MAX_NAMED = 5


@dataclass(frozen=True)
class Finding:
    cluster: str
    check: str
    status: str
    detail: str


def _named(names: Iterable[str]) -> str:
    names = sorted(names)
    more = f" (+{len(names) - MAX_NAMED} more)" if len(names) > MAX_NAMED else ""
    return ", ".join(names[:MAX_NAMED]) + more


def diagnose(registry: Registry, only: Iterable[str] = (), timeout_seconds: float = 10.0) -> list[Finding]:
    """Every finding for the registry's clusters (or those named in `only`), registry errors first."""
    wanted = set(only)
    findings = [
        Finding(e.cluster or "(registry)", "registry", FAIL, f"field {e.field!r}: {e.message}")
        for e in registry.errors
        if not wanted or e.cluster in wanted
    ]
    for name in registry.names:
        if not wanted or name in wanted:
            findings += diagnose_cluster(registry.get(name), timeout_seconds)
    for name in sorted(registry.disabled):
        if not wanted or name in wanted:
            findings.append(Finding(name, "registry", WARN, "enabled: false: not collected, not checked"))
    for name in sorted(
        wanted - set(registry.names) - registry.disabled - {e.cluster for e in registry.errors}
    ):
        findings.append(Finding(name, "registry", FAIL, "not in the registry"))
    return findings


def diagnose_cluster(cluster: ClusterConfig, timeout_seconds: float = 10.0) -> list[Finding]:
    cluster = cluster.model_copy(update={"request_timeout_seconds": timeout_seconds})
    findings: list[Finding] = []
    nodes: list[dict] = []
    findings += _access(cluster)
    with KubeReader(cluster, max_retries=0) as reader:
        nodes = _kubernetes(cluster, reader, findings)
    if not cluster.prometheus_url:
        findings.append(
            Finding(cluster.name, "prometheus", FAIL, "no prometheus_url: no devices, no utilization")
        )
        return findings
    prom = PromReader(
        cluster.name,
        cluster.prometheus_url,
        timeout_seconds=timeout_seconds,
        retries=0,
        http=cluster.prometheus_http,
    )
    try:
        _prometheus(cluster, prom, nodes, findings)
    except PromError as exc:
        findings.append(
            Finding(cluster.name, "prometheus", FAIL, str(exc) + _service_proxy_hint(cluster, exc))
        )
    finally:
        prom.close()
    return findings


def _service_proxy_hint(cluster: ClusterConfig, exc: PromError) -> str:
    """What to change when the API server's service proxy could not pick the Service's port."""
    found = re.search(r"/services/([^/]+)/proxy(?:/|$)", cluster.prometheus_url or "")
    if found is None or "no endpoints available for service" not in str(exc):
        return ""
    segment = found[1]
    port = segment.rpartition(":")[2] if ":" in segment else ""  # `[scheme:]name[:port]`
    if port:  # the Service has no port of that name, or no ready endpoint
        return f" (is {port!r} the name of one of the Service's ports, and is Prometheus up?)"
    return (
        f" (the API server wants the Service's port named when it has a name: "
        f"services/{segment.rstrip(':')}:<port name or number>/proxy)"
    )


def _access(cluster: ClusterConfig) -> list[Finding]:
    """How the API server and Prometheus are reached, as the registry and the kubeconfig say (a
    proxy, credentials, CAs), so that a failure below reads against what was tried; no secret."""
    try:
        proxy = api_server_proxy(cluster)
    except ValueError as exc:
        return [Finding(cluster.name, "kubernetes access", FAIL, str(exc))]
    found = [
        Finding(
            cluster.name,
            "kubernetes access",
            OK,
            f"through the proxy {shown_url(proxy)}"
            if proxy
            else "no proxy-url (direct, or $HTTPS_PROXY when set)",
        )
    ]
    if cluster.prometheus_url:
        how = describe_prometheus_http(cluster.prometheus_http)
        found.append(
            Finding(cluster.name, "prometheus access", OK, f"{shown_url(cluster.prometheus_url)}: {how}")
        )
    return found


def _kubernetes(cluster: ClusterConfig, reader: KubeReader, findings: list[Finding]) -> list[dict]:
    name = cluster.name
    try:
        version = reader.get("/version") or {}
    except KubeError as exc:
        findings.append(Finding(name, "kubernetes", FAIL, str(exc)))
        return []
    findings.append(Finding(name, "kubernetes", OK, f"API server {version.get('gitVersion', '?')} answers"))
    denied = {kind: why for kind, path in LISTED.items() if (why := reader.can_list(path)) is not None}
    if denied:
        detail = "; ".join(f"{kind}: {why}" for kind, why in denied.items())
        findings.append(Finding(name, "kubernetes list", FAIL, f"cannot list {detail}"))
    else:
        findings.append(Finding(name, "kubernetes list", OK, f"can list {', '.join(LISTED)}"))
    if "nodes" in denied:
        return []
    try:
        nodes = reader.list(LISTED["nodes"], project_node)
    except KubeError as exc:
        findings.append(Finding(name, "gpu nodes", FAIL, str(exc)))
        return []
    profiles = profiles_for(cluster.vendor)
    gpu_nodes = [n for n in nodes if isinstance(n, dict) and node_profile(n, profiles) is not None]
    vendors = sorted({p.name for n in gpu_nodes if (p := node_profile(n, profiles)) is not None})
    status = OK if gpu_nodes else FAIL
    detail = f"{len(gpu_nodes)} GPU nodes ({', '.join(vendors) or 'no vendor'}) of {len(nodes)} nodes"
    findings.append(
        Finding(name, "gpu nodes", status, detail if gpu_nodes else f"{detail}: nothing to watch")
    )
    return nodes


def _ready_gpu_nodes(cluster: ClusterConfig, nodes: list[dict]) -> set[str]:
    profiles = profiles_for(cluster.vendor)
    ready = set()
    for node in nodes:
        try:
            if ready_status(node) == "Ready" and has_gpus(node, profiles):
                ready.add(object_name(node))
        except MalformedObject:
            continue
    return ready


def _prometheus(cluster: ClusterConfig, prom: PromReader, nodes: list[dict], findings: list[Finding]) -> None:
    name = cluster.name
    dialect = read_dialect(prom, cluster.vendor, cluster.exporter_overrides)
    for vendor, how in dialect.found.items():
        findings.append(Finding(name, f"exporter {vendor}", OK, how))
    for missing in dialect.missing:
        findings.append(Finding(name, "exporter", FAIL, missing))
    index, ready = NodeIndex(nodes), _ready_gpu_nodes(cluster, nodes)
    if set(dialect.found) - {"infiniband"}:  # a GPU exporter was found: are all nodes in its series?
        _gpu_series(name, prom, dialect, index, ready, findings)
    _infiniband(name, prom, dialect, index, findings)
    _storage(cluster, prom, findings)


def _gpu_series(
    name: str, prom: PromReader, dialect: Dialect, index: NodeIndex, ready: set[str], findings: list[Finding]
) -> None:
    per_node: dict[str, float] = {}
    strangers: set[str] = set()
    for profile in dialect.profiles:
        for sample in prom.vector(profile.series_per_node_query()):
            value = sample.labels.get(profile.node_label, "")
            node = index.resolve(value)
            if node is None:
                strangers.add(value or f"(no {profile.node_label})")
            else:
                per_node[node] = per_node.get(node, 0) + sample.value
    silent = ready - set(per_node)
    if silent:
        findings.append(
            Finding(
                name,
                "gpu series",
                FAIL,
                f"{len(silent)} of {len(ready)} Ready GPU nodes have no GPU series: {_named(silent)}",
            )
        )
    elif ready:
        gpus = sum(per_node.get(n, 0) for n in ready)
        findings.append(
            Finding(
                name,
                "gpu series",
                OK,
                f"every Ready GPU node has series ({gpus:g} GPUs, {gpus / len(ready):.1f} per node)",
            )
        )
    if strangers:
        findings.append(
            Finding(
                name,
                "gpu series",
                FAIL,
                f"{len(strangers)} node label values name no node: {_named(strangers)}",
            )
        )


def _infiniband(
    name: str, prom: PromReader, dialect: Dialect, index: NodeIndex, findings: list[Finding]
) -> None:
    if "node by" not in dialect.found.get("infiniband", ""):
        findings.append(Finding(name, "infiniband", OK, dialect.found.get("infiniband", "no series")))
        return
    label = dialect.nic.node_label
    values = [s.labels.get(label, "") for s in prom.vector(dialect.nic.nodes_query())]
    strangers = {v or f"(no {label})" for v in values if index.resolve(v) is None}
    if strangers:
        findings.append(
            Finding(name, "infiniband", FAIL, f"series by {label!r} name no node: {_named(strangers)}")
        )
    else:
        findings.append(
            Finding(name, "infiniband", OK, f"{len(values)} nodes with NICs, matched by {label!r}")
        )


def _storage(cluster: ClusterConfig, prom: PromReader, findings: list[Finding]) -> None:
    queries, volume = JUICEFS.figure_queries("1m"), JUICEFS.volume_label
    totals = {s.labels.get(volume, ""): s.value for s in prom.vector(queries["total_space"])}
    if not totals:
        return
    used = {s.labels.get(volume, ""): s.value for s in prom.vector(queries["used_space"])}
    uncapped = {
        v
        for v, total in totals.items()
        if v not in cluster.juicefs_capacity_bytes and juicefs_space_capacity(total, used.get(v, 0.0)) is None
    }
    if uncapped:
        findings.append(
            Finding(
                cluster.name,
                "storage",
                FAIL,
                f"JuiceFS volumes without quota, capacity unknown: {_named(uncapped)} (set juicefs_capacity_bytes)",
            )
        )
    else:
        findings.append(
            Finding(cluster.name, "storage", OK, f"{len(totals)} JuiceFS volumes with a capacity")
        )


def render(findings: list[Finding]) -> str:
    """The findings as an aligned text table."""
    rows = [
        ("CLUSTER", "CHECK", "STATUS", "DETAIL"),
        *((f.cluster, f.check, f.status, f.detail) for f in findings),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3] for row in rows
    )
