"""The API server's service proxy in front of the cluster's Prometheus, as kube-apiserver serves it
(`/api/v1/namespaces/<namespace>/services/[<scheme>:]<name>[:<port>]/proxy/<path>`): the way
kubectl proxy, Lens Desktop and Rancher reach a Prometheus that has no address outside the cluster.

What it does, as kube-apiserver does it: the caller is authenticated and authorized as for any API
call (the `get` verb on `services/proxy`); the Authorization header is then removed (the
authentication filter deletes it once it has done its work) and every other header goes on; the
Service's port is picked by name, or by number and then its name, so a Service whose port is named
(kube-prometheus' `prometheus-k8s` names it `web`) is not reached by its name alone: that answers
503 "no endpoints available". By a port number the Service is looked up (404 `services`), by a name
its Endpoints (404 `endpoints`). Only the `web` port is simulated (kube-prometheus' Service also has
`reloader-web`, 8080). Prometheus' own answers, errors and 401s of what stands in front of it come
back as they are; a Prometheus that cannot be reached is a 503 of the API server."""

from __future__ import annotations

import re
import time

from lens_pipeline.sim.fleet import SimCluster
from lens_pipeline.sim.kubeapi import refused, status_response
from lens_pipeline.sim.promapi import handle_prometheus
from lens_pipeline.sim.wire import SimRequest, SimResponse

# The Service every simulated cluster runs its Prometheus behind (kube-prometheus' names).
NAMESPACE, SERVICE, PORT_NAME, PORT = "monitoring", "prometheus-k8s", "web", 9090
PROXY_PATH = f"/api/v1/namespaces/{NAMESPACE}/services/{SERVICE}:{PORT_NAME}/proxy"

_ROUTE = re.compile(
    r"^/api/v1/namespaces/(?P<namespace>[^/]+)/services/(?P<service>[^/]+)/proxy(?P<rest>/.*)?$"
)
_SCHEMES = ("", "http", "https")


def service_proxy_route(path: str) -> re.Match[str] | None:
    return _ROUTE.match(path)


def _scheme_name_port(segment: str) -> tuple[str, str, str] | None:
    """`[scheme:]name[:port]` as the API server splits it: two parts are a name and a port."""
    parts = segment.split(":")
    if len(parts) == 1:
        scheme, name, port = "", parts[0], ""
    elif len(parts) == 2:
        scheme, (name, port) = "", parts
    elif len(parts) == 3:
        scheme, name, port = parts
    else:
        return None
    return (scheme, name, port) if name and scheme in _SCHEMES else None


def handle_service_proxy(cluster: SimCluster, req: SimRequest, route: re.Match[str]) -> SimResponse:
    denied = refused(cluster, req)
    if denied is not None:
        return denied
    namespace, segment = route["namespace"], route["service"]
    # RBAC names the object by the path's segment as it is ("prometheus-k8s:web"): a Role's
    # resourceNames must hold that text.
    if cluster.forbidden(req.path):
        return status_response(
            403,
            f'services "{segment}" is forbidden: User "system:serviceaccount:lens:lens-collector" cannot get '
            f'resource "services/proxy" in API group "" in the namespace "{namespace}"',
            details={"name": segment, "kind": "services"},
        )
    split = _scheme_name_port(segment)
    if split is None:
        return status_response(400, f'invalid service request "{segment}"')
    scheme, name, port = split
    ours = (namespace, name) == (NAMESPACE, SERVICE)
    if port.isdigit():  # a port number: the Service says which of its ports it is
        if not ours:
            return status_response(
                404, f'services "{name}" not found', details={"name": name, "kind": "services"}
            )
        if int(port) != PORT:
            return status_response(503, f'no service port {int(port)} found for service "{name}"')
        port = PORT_NAME
    if not ours:  # by name: the Service's endpoints are looked up
        return status_response(
            404, f'endpoints "{name}" not found', details={"name": name, "kind": "endpoints"}
        )
    if port != PORT_NAME:
        return status_response(503, f'no endpoints available for service "{segment}"')
    faults = cluster.faults("prometheus")
    if faults.connection is not None:
        return status_response(503, "error trying to reach service: EOF")
    if scheme == "https":  # the Service's port speaks plain HTTP
        return status_response(
            503, "error trying to reach service: tls: first record does not look like a TLS handshake"
        )
    if faults.delay:
        time.sleep(faults.delay)
    headers = {key: value for key, value in req.headers.items() if key != "authorization"}
    # The API server connects to the Service with its own identity, not the caller's certificate.
    if not cluster.prometheus_allows(headers, None):
        return SimResponse(401, b"Unauthorized\n", "text/plain; charset=utf-8")
    behind = SimRequest(
        method=req.method, path=route["rest"] or "/", query=req.query, headers=headers, body=req.body
    )
    return handle_prometheus(cluster, behind, behind.path)
