"""Helpers the simulator tests share: clients from the written kubeconfigs, plain HTTP calls, raw
paged LISTs, and an owner-chain walk written independently of the simulator's own."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client, config

from lens_pipeline.kube.reader import raw_get
from lens_pipeline.sim import SimServer

# Every served collection: (resource path below the base URL, kind of its items).
COLLECTIONS = (
    ("/api/v1/namespaces", "Namespace"),
    ("/api/v1/nodes", "Node"),
    ("/api/v1/pods", "Pod"),
    ("/api/v1/secrets", "Secret"),
    ("/apis/apps/v1/daemonsets", "DaemonSet"),
    ("/apis/apps/v1/deployments", "Deployment"),
    ("/apis/apps/v1/replicasets", "ReplicaSet"),
    ("/apis/apps/v1/statefulsets", "StatefulSet"),
    ("/apis/batch/v1/cronjobs", "CronJob"),
    ("/apis/batch/v1/jobs", "Job"),
    ("/apis/storage.k8s.io/v1/storageclasses", "StorageClass"),
    ("/apis/kubeflow.org/v1/mpijobs", "MPIJob"),
    ("/apis/kubeflow.org/v1/pytorchjobs", "PyTorchJob"),
    ("/apis/ray.io/v1/rayclusters", "RayCluster"),
    ("/apis/ray.io/v1/rayjobs", "RayJob"),
    ("/apis/ray.io/v1/rayservices", "RayService"),
    ("/apis/amd.com/v1/workloads", "Workload"),
)


def api_client(registry: Path, name: str) -> client.ApiClient:
    return config.new_client_from_config(
        config_file=str(registry.parent / "kubeconfigs" / f"{name}.yaml"), context=name
    )


def http(
    url: str,
    token: str | None = None,
    body: dict[str, Any] | None = None,
    accept: str | None = None,
    server: SimServer | None = None,
) -> tuple[int, Any]:
    """One request; `server` lends its CA when it serves HTTPS."""
    context = None
    if server is not None and server.certificate is not None:
        context = ssl.create_default_context(cadata=server.certificate.ca_pem.decode("ascii"))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if accept:
        headers["Accept"] = accept
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(
        url, data=data, headers=headers, method="POST" if body is not None else "GET"
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            raw, status = response.read(), response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def control(server: SimServer, cluster: str, /, **command: Any) -> tuple[int, Any]:
    return http(f"{server.base_url(cluster)}/_control", body=command, server=server)


def truth(server: SimServer, cluster: str) -> dict[str, Any]:
    status, body = http(f"{server.base_url(cluster)}/_truth", server=server)
    assert status == 200
    return body


def list_raw(api: client.ApiClient, path: str, limit: int = 500) -> tuple[list[dict[str, Any]], int]:
    """Every item of a collection through the official client's raw path, and the pages it took."""
    items: list[dict[str, Any]] = []
    token, pages = None, 0
    while True:
        query: list[tuple[str, Any]] = [("limit", limit)] + ([("continue", token)] if token else [])
        status, body = raw_get(api, path, query, (10.0, 60.0))
        page = json.loads(body)
        assert status == 200, page
        pages += 1
        items += page["items"]
        token = page["metadata"].get("continue")
        if not token:
            return items, pages


def key_of(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}".lstrip("/")


def owner_walk(objects: dict[str, list[dict[str, Any]]]) -> dict[str, list[str] | None]:
    """For every pod uid: the uids of its owners up to the top of the chain (controller reference,
    looked up by apiVersion/kind/namespace/name and checked by uid), or None when a link is broken."""
    index: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for items in objects.values():
        for obj in items:
            metadata = obj.get("metadata") or {}
            if "name" in metadata:
                index[
                    (
                        obj.get("apiVersion", ""),
                        obj.get("kind", ""),
                        metadata.get("namespace", ""),
                        metadata["name"],
                    )
                ] = obj
    cluster_scoped = {"Node", "Namespace", "StorageClass", "Workload"}
    chains: dict[str, list[str] | None] = {}
    for pod in objects["/api/v1/pods"]:
        metadata = pod.get("metadata") or {}
        if "uid" not in metadata:
            continue
        chain: list[str] | None = []
        current, seen = pod, {metadata["uid"]}
        while chain is not None:
            references = (current.get("metadata") or {}).get("ownerReferences") or []
            reference = next(
                (r for r in references if r.get("controller")), references[0] if references else None
            )
            if reference is None:
                break
            namespace = (
                "" if reference["kind"] in cluster_scoped else current["metadata"].get("namespace", "")
            )
            owner = index.get((reference["apiVersion"], reference["kind"], namespace, reference["name"]))
            if owner is None or owner["metadata"]["uid"] != reference["uid"] or reference["uid"] in seen:
                chain = None
                break
            seen.add(reference["uid"])
            chain.append(reference["uid"])
            current = owner
        chains[metadata["uid"]] = chain
    return chains


def continue_token(metadata: Any) -> str | None:
    """A list's continue token from the official client's model (`var_continue` since kubernetes 37,
    `_continue` before)."""
    return getattr(metadata, "var_continue", None) or getattr(metadata, "_continue", None)
