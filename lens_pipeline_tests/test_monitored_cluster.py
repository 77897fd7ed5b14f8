"""deploy/monitored-cluster/ grants what the collectors read, and only reads: a LIST and a WATCH of every path
`lens doctor` checks (the collectors' own LISTs), of every owner kind a GPU pod can have (the
simulator's kinds, which mirror the real CRDs) and of those lens watch keeps from its start, and a
GET of the one JuiceFS Secret, nothing more."""

from __future__ import annotations

from lens_pipeline.doctor import LISTED
from lens_pipeline.kube.cache import WARM
from lens_pipeline.sim.kinds import KINDS
from lens_pipeline.sim.serviceproxy import NAMESPACE, PROXY_PATH
from lens_pipeline_tests.test_deploy import DEPLOY, rendered

READ = {"get", "list", "watch"}


def _granted(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_cluster_role_lets_the_collectors_list_what_they_read_and_nothing_else():
    documents = rendered(DEPLOY / "monitored-cluster")
    (role,) = [d for d in documents if d["kind"] == "ClusterRole"]
    granted = _granted(role["rules"])
    assert {verb for *_, verb in granted} <= READ and not any("*" in g for g in granted)
    for kind, path in LISTED.items():
        group = "" if path.startswith("/api/v1/") else path.split("/")[2]
        assert {(group, kind, "list"), (group, kind, "watch")} <= granted, path
    owners = [k for k in KINDS if k.plural not in {"namespaces", "secrets"}]
    missing = [
        f"{k.plural}.{k.group}"
        for k in owners
        if not {(k.group, k.plural, "list"), (k.group, k.plural, "watch")} <= granted
    ]
    assert missing == []
    # What lens watch keeps of every cluster from its start (a kind it may not list would be let go).
    for path in WARM:
        parts = path.strip("/").split("/")  # api/v1/<plural> or apis/<group>/<version>/<plural>
        group = "" if parts[0] == "api" else parts[1]
        assert {(group, parts[-1], "list"), (group, parts[-1], "watch")} <= granted, path
    assert not [g for g in granted if g[1] == "secrets"], "Secrets only through the namespaced Role"
    (binding,) = [d for d in documents if d["kind"] == "ClusterRoleBinding"]
    (account,) = [d for d in documents if d["kind"] == "ServiceAccount"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]


def test_the_juicefs_secret_is_one_named_secret_to_get():
    documents = rendered(DEPLOY / "monitored-cluster")
    (role,) = [d for d in documents if d["kind"] == "Role"]
    (rule,) = role["rules"]
    assert _granted([rule]) == {("", "secrets", "get")} and len(rule["resourceNames"]) == 1
    (binding,) = [d for d in documents if d["kind"] == "RoleBinding"]
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }


def test_the_prometheus_proxy_overlay_adds_one_get_through_one_service():
    """deploy/monitored-cluster-prometheus-proxy/: the same grants, and `get` on services/proxy of the
    one Service in front of Prometheus (the verb and resource kube-apiserver authorizes a GET
    through its service proxy with), bound to the same service account."""
    base = rendered(DEPLOY / "monitored-cluster")
    documents = rendered(DEPLOY / "monitored-cluster-prometheus-proxy")
    added = [d for d in documents if d not in base]
    assert sorted(d["kind"] for d in added) == ["Role", "RoleBinding"]
    (role,) = [d for d in added if d["kind"] == "Role"]
    (rule,) = role["rules"]
    assert _granted([rule]) == {("", "services/proxy", "get")}
    # RBAC matches the URL's segment as written, port included: the one the registry's URL names.
    segment = PROXY_PATH.split("/services/")[1].removesuffix("/proxy")
    assert rule["resourceNames"] == [segment] and role["metadata"]["namespace"] == NAMESPACE
    (binding,) = [d for d in added if d["kind"] == "RoleBinding"]
    (account,) = [d for d in base if d["kind"] == "ServiceAccount"]
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
