"""deploy/ as `kubectl kustomize` renders it (not the sources), and every container's command
started from this checkout: what can be checked without a Docker engine or a Kubernetes cluster.

The Helm values of the Dagster side are checked in test_helm_values.py, the observability pack
against a real Prometheus in test_observability.py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from lens_pipeline_tests.conftest import skip_unless
from lens_pipeline_tests.ports import free_port

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
BIN = Path(sys.executable).parent
COMPONENTS = sorted(p.name for p in (DEPLOY / "components").iterdir() if p.is_dir())
# Components that replace one another: lens ingest ends TLS itself (ingest-tls) or behind an
# ingress controller (ingress).
ALTERNATIVES = {"ingest-tls": "ingress"}
TOGETHER = [c for c in COMPONENTS if c not in ALTERNATIVES]
# What an API server keeps in a namespace (the kinds deploy/ renders).
NAMESPACED = {
    "ConfigMap",
    "Deployment",
    "Ingress",
    "Job",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "PrometheusRule",
    "Role",
    "RoleBinding",
    "Secret",
    "Service",
    "ServiceAccount",
    "ServiceMonitor",
}


def rendered(directory: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    skip_unless(kubectl is not None, "Debian's kubectl is not installed (apt-get install kubernetes-client)")
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)  # type: ignore[list-item]
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def rendered_overlay(
    overlay: Path, *, components: list[str] = (), namespace: str | None = None, base: Path = DEPLOY
) -> list[dict]:
    """An overlay of `base` the way an operator writes one: the chosen components, maybe another
    namespace, rendered."""
    overlay.mkdir(parents=True, exist_ok=True)
    kustomization: dict = {"resources": [os.path.relpath(base, overlay)]}
    if components:
        kustomization["components"] = [
            os.path.relpath(DEPLOY / "components" / c, overlay) for c in components
        ]
    if namespace:
        kustomization["namespace"] = namespace
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return rendered(overlay)


def _named(documents: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in documents if d["kind"] == kind}


def _pod_specs(documents: list[dict]) -> dict[str, dict]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in documents
        if d["kind"] in ("Deployment", "Job")
    }


def _containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def _labels_match(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


def test_every_reference_resolves_in_the_rendered_output(tmp_path):
    """Base, every component and the migration Job rendered together: each ConfigMap, Secret,
    service account and volume a pod names exists; each Service, PDB, NetworkPolicy and the
    ServiceMonitor selects pods or Services that exist, on ports they have; each Ingress backend is
    a Service port."""
    documents = rendered_overlay(tmp_path / "all", components=TOGETHER)
    documents += rendered(DEPLOY / "migrate")
    config_maps, secrets = _named(documents, "ConfigMap"), _named(documents, "Secret")
    accounts, services = _named(documents, "ServiceAccount"), _named(documents, "Service")
    templates = {
        d["metadata"]["name"]: d["spec"]["template"] for d in documents if d["kind"] in ("Deployment", "Job")
    }
    assert set(templates) == {"lens-api", "lens-ingest", "lens-watch", "lens-db-upgrade"}
    for name, template in templates.items():
        spec = template["spec"]
        assert spec.get("serviceAccountName", "default") in {*accounts, "default"}, name
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for volume in volumes.values():
            assert "secret" not in volume or volume["secret"]["secretName"] in secrets, (name, volume)
            assert "configMap" not in volume or volume["configMap"]["name"] in config_maps, (name, volume)
        for container in _containers(spec):
            for source in container.get("envFrom", []):
                assert source.get("configMapRef", {"name": next(iter(config_maps))})["name"] in config_maps
                assert source.get("secretRef", {"name": next(iter(secrets))})["name"] in secrets
            assert {m["name"] for m in container.get("volumeMounts", [])} <= set(volumes), (
                name,
                container["name"],
            )
    deployments = _named(documents, "Deployment")
    for deployment in deployments.values():
        assert _labels_match(
            deployment["spec"]["selector"]["matchLabels"],
            deployment["spec"]["template"]["metadata"]["labels"],
        )
    for name, service in services.items():
        (target,) = [
            d
            for d in deployments.values()
            if _labels_match(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
        ]
        ports = {
            p["name"] for c in target["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
        }
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports, name
        assert service["metadata"]["labels"]["app.kubernetes.io/part-of"] == "lens-pipeline"
    for kind in ("PodDisruptionBudget",):
        for name, budget in _named(documents, kind).items():
            assert any(
                _labels_match(
                    budget["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"]
                )
                for d in deployments.values()
            ), name
    for name, policy in _named(documents, "NetworkPolicy").items():
        selected = [
            d
            for d in deployments.values()
            if _labels_match(
                policy["spec"]["podSelector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"]
            )
        ]
        if name == "lens-code-location":
            # the chart's pod: its `deployment` label, ours from deploy/helm/values.yaml
            helm = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
            (location,) = helm["dagster-user-deployments"]["deployments"]
            labels = {**location["labels"], "deployment": location["name"]}
            assert _labels_match(policy["spec"]["podSelector"]["matchLabels"], labels)
            assert policy["spec"]["ingress"][0]["ports"] == [{"port": location["port"]}]
            continue
        (target,) = selected
        ports = {
            p["name"] for c in target["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
        }
        opened = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
        # Every port the pods serve; besides, `https`, the one components/ingest-tls names.
        assert ports <= opened <= ports | {"https"}, name
    for ingress in _named(documents, "Ingress").values():
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                assert backend["port"]["name"] in {
                    p["name"] for p in services[backend["name"]]["spec"]["ports"]
                }


def test_one_image_everywhere_and_each_run_takes_the_code_locations():
    """lens api, lens ingest and the migration Job use the image of the code location in
    deploy/helm/values.yaml; the chart hands that same image to each run (DAGSTER_CURRENT_IMAGE is
    the entry's image: test_helm_values.py builds the run Job with it)."""
    helm = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
    (location,) = helm["dagster-user-deployments"]["deployments"]
    image = f"{location['image']['repository']}:{location['image']['tag']}"
    for documents in (rendered(DEPLOY), rendered(DEPLOY / "migrate")):
        images = {c["image"] for spec in _pod_specs(documents).values() for c in _containers(spec)}
        assert images == {image}


def test_a_namespace_overlay_moves_everything(tmp_path):
    """`namespace: gpu-obs` over the base with every component, and over the migration Job: every
    namespaced object lands there, and nothing names the base's namespace any more."""
    for name, base, components in (
        ("app", DEPLOY, TOGETHER),
        ("tls", DEPLOY, [*sorted(ALTERNATIVES), "monitoring", "network-policy"]),
        ("migrate", DEPLOY / "migrate", []),
    ):
        documents = rendered_overlay(tmp_path / name, components=components, namespace="gpu-obs", base=base)
        for document in documents:
            assert document["kind"] in NAMESPACED, document["kind"]
            assert document["metadata"]["namespace"] == "gpu-obs", (
                document["kind"],
                document["metadata"]["name"],
            )
        text = yaml.safe_dump_all(documents)
        assert "namespace: dagster" not in text and ".dagster.svc" not in text.replace(
            "postgresql.dagster.svc", ""
        )


def test_the_rendered_pods_meet_the_restricted_profile_and_probe_every_process():
    """On `kubectl kustomize`'s output: every pod runs as non-root with seccomp RuntimeDefault, every
    container without privilege escalation or capabilities on a read-only root filesystem with a
    writable /tmp, every long-running container has liveness and readiness probes, the migration
    Job's pod goes a day after it finishes."""
    documents = rendered(DEPLOY) + rendered(DEPLOY / "migrate")
    for name, spec in _pod_specs(documents).items():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in _containers(spec):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, (name, container["name"])
            assert context["capabilities"] == {"drop": ["ALL"]} and context["readOnlyRootFilesystem"]
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    for name, deployment in _named(documents, "Deployment").items():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            assert {"livenessProbe", "readinessProbe"} <= set(container), (name, container["name"])
            # A liveness probe that reads the database would restart every pod at each outage.
            path = container["livenessProbe"].get("httpGet", {}).get("path")
            if container["name"] in ("api", "ingest"):
                assert path == "/livez", (name, container["name"], path)
    (job,) = _named(documents, "Job").values()
    assert job["spec"]["ttlSecondsAfterFinished"] <= 86400


def test_secrets_are_rendered_only_when_asked_for(tmp_path):
    """`kubectl apply -k deploy/` applies no Secret (it would overwrite the operator's); the
    example-secrets component renders the three the pods name, for a trial."""
    assert not [d for d in rendered(DEPLOY) if d["kind"] == "Secret"]
    assert not [d for d in rendered(DEPLOY / "migrate") if d["kind"] == "Secret"]
    others = [c for c in TOGETHER if c != "example-secrets"]
    assert not [d for d in rendered_overlay(tmp_path / "no", components=others) if d["kind"] == "Secret"]
    asked = rendered_overlay(tmp_path / "yes", components=["example-secrets"])
    assert set(_named(asked, "Secret")) == {"lens-secrets", "lens-cluster-registry", "lens-ingest-tokens"}


def _start(command: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / command[0]), *command[1:]],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait(process: subprocess.Popen, log: Path, ready, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.3)


def _http_ok(url: str):
    def ready() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    return ready


def _with(command: list[str], flag: str, value: object) -> list[str]:
    index = command.index(flag)
    return [*command[: index + 1], str(value), *command[index + 2 :]]


def test_every_container_command_starts_from_this_checkout(tmp_path):
    """The rendered commands of the migration Job, lens api, lens ingest and lens watch, and the code location
    the chart starts (`dagster api grpc -h 0.0.0.0 -p <port>` and our dagsterApiGrpcArgs) with the
    probe the chart gives it, each run here on free ports with the example Secrets' contents."""
    documents = rendered_overlay(tmp_path / "trial", components=["example-secrets"])
    secrets = {name: s["stringData"] for name, s in _named(documents, "Secret").items()}
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path),
        "LENS_DATABASE_URL": f"sqlite:///{tmp_path / 'lens.db'}",
        "LENS_SAFE_DATABASE_URL": f"sqlite:///{tmp_path / 'safe.db'}",
        "LENS_CLUSTERS_FILE": str(tmp_path / "clusters.yaml"),
    }
    (tmp_path / "clusters.yaml").write_text(secrets["lens-cluster-registry"]["clusters.yaml"])
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(secrets["lens-ingest-tokens"]["tokens.yaml"])
    containers = {
        c["name"]: c
        for spec in _pod_specs(documents + rendered(DEPLOY / "migrate")).values()
        for c in spec["containers"]
    }
    migrate = containers["migrate"]["command"]
    done = subprocess.run([str(BIN / migrate[0]), *migrate[1:]], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

    helm = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
    (location,) = helm["dagster-user-deployments"]["deployments"]
    processes: list[subprocess.Popen] = []
    try:
        port = free_port()
        processes.append(
            _start(_with(containers["api"]["command"], "--port", port), env, tmp_path / "api.log")
        )
        _wait(processes[-1], tmp_path / "api.log", _http_ok(f"http://127.0.0.1:{port}/healthz"))
        assert _http_ok(f"http://127.0.0.1:{port}/livez")()

        grpc_port, http_port = free_port(), free_port()
        ingest = _with(
            _with(containers["ingest"]["command"], "--grpc-port", grpc_port), "--http-port", http_port
        )
        processes.append(_start(_with(ingest, "--tokens-file", tokens), env, tmp_path / "ingest.log"))
        _wait(processes[-1], tmp_path / "ingest.log", _http_ok(f"http://127.0.0.1:{http_port}/healthz"))
        assert _http_ok(f"http://127.0.0.1:{http_port}/livez")()

        cache_port, metrics_port = free_port(), free_port()
        watch = _with(
            _with(containers["watch"]["command"], "--port", cache_port), "--metrics-port", metrics_port
        )
        processes.append(_start(watch, env, tmp_path / "watch.log"))
        _wait(processes[-1], tmp_path / "watch.log", _http_ok(f"http://127.0.0.1:{metrics_port}/metrics"))
        assert _http_ok(f"http://127.0.0.1:{cache_port}/healthz")()

        grpc = free_port()  # as the chart's deployment-user template starts it, on loopback here
        server = [
            "dagster",
            "api",
            "grpc",
            "-h",
            "127.0.0.1",
            "-p",
            str(grpc),
            *location["dagsterApiGrpcArgs"],
        ]
        probe = [str(BIN / "dagster"), "api", "grpc-health-check", "-p", str(grpc)]  # the chart's probe
        processes.append(_start(server, env, tmp_path / "grpc.log"))
        _wait(
            processes[-1],
            tmp_path / "grpc.log",
            lambda: subprocess.run(probe, env=env, capture_output=True).returncode == 0,
            timeout=120,
        )
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait(timeout=30)


def test_the_ingest_tls_component_serves_tls_and_keeps_probes_and_scrape_on_a_plain_port(tmp_path):
    """With components/ingest-tls, lens ingest ends TLS on its gRPC and HTTP ports (the agents'),
    while /metrics, /livez and /healthz move to a plain port named `http` that the kubelet probes
    (its gRPC probe speaks no TLS) and the ServiceMonitor scrapes; the rendered command starts
    here, with a certificate of our own, and answers so."""
    from lens_pipeline.sim.tls import make_certificate

    # In any order among the others (listed first here).
    documents = rendered_overlay(tmp_path / "tls", components=["ingest-tls", "network-policy", "monitoring"])
    spec = _pod_specs(documents)["lens-ingest"]
    (container,) = spec["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "grpc": 50051,
        "https": 8989,
        "http": 8990,
    }
    command = container["command"]
    assert {"--tls-cert=/etc/lens-ingest-tls/tls.crt", "--tls-key=/etc/lens-ingest-tls/tls.key"} <= set(
        command
    )
    assert "--metrics-port=8990" in command
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "lens-ingest-tls"
    assert {"name": "tls", "mountPath": "/etc/lens-ingest-tls", "readOnly": True} in container["volumeMounts"]
    services = _named(documents, "Service")
    # What the monitored clusters reach: TLS only. The plain port is on a Service of its own.
    assert {p["name"]: (p["port"], p["targetPort"]) for p in services["lens-ingest"]["spec"]["ports"]} == {
        "grpc": (50051, "grpc"),
        "https": (8989, "https"),
    }
    metrics = services["lens-ingest-metrics"]
    assert metrics["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert [(p["name"], p["port"], p["targetPort"]) for p in metrics["spec"]["ports"]] == [
        ("http", 8990, "http")
    ]
    # The ServiceMonitor scrapes the port named `http` of every lens Service: here, the plain one.
    (monitor,) = _named(documents, "ServiceMonitor").values()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["http"]
    scraped = {
        name: [p["port"] for p in service["spec"]["ports"] if p["name"] == "http"]
        for name, service in services.items()
        if _labels_match(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    }
    assert scraped["lens-ingest"] == [] and scraped["lens-ingest-metrics"] == [8990]
    policy = _named(documents, "NetworkPolicy")["lens-ingest"]
    assert {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]} == {
        "grpc",
        "https",
        "http",
    }

    certificate = make_certificate()
    (tmp_path / "tls.crt").write_bytes(certificate.cert_pem + certificate.ca_pem)
    (tmp_path / "tls.key").write_bytes(certificate.key_pem)
    (tmp_path / "tokens.yaml").write_text("tokens: {}\n")
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    local = {
        "--tls-cert=/etc/lens-ingest-tls/tls.crt": f"--tls-cert={tmp_path / 'tls.crt'}",
        "--tls-key=/etc/lens-ingest-tls/tls.key": f"--tls-key={tmp_path / 'tls.key'}",
        "--metrics-port=8990": f"--metrics-port={metrics_port}",
    }
    command = [local.get(arg, arg) for arg in command]
    command = _with(
        _with(_with(command, "--grpc-port", grpc_port), "--http-port", http_port),
        "--tokens-file",
        tmp_path / "tokens.yaml",
    )
    env = {**os.environ, "LENS_DATABASE_URL": f"sqlite:///{tmp_path / 'lens.db'}"}
    process = _start(command, env, tmp_path / "ingest.log")
    try:
        _wait(process, tmp_path / "ingest.log", _http_ok(f"http://127.0.0.1:{metrics_port}/healthz"))
        assert _http_ok(f"http://127.0.0.1:{metrics_port}/livez")()
        assert _http_ok(f"http://127.0.0.1:{metrics_port}/metrics")()
        # The agents' HTTP port answers over TLS only, with the Secret's certificate.
        trusting = ssl.create_default_context(cadata=certificate.ca_pem.decode())
        trusting.check_hostname = False
        with urllib.request.urlopen(
            f"https://127.0.0.1:{http_port}/healthz", context=trusting, timeout=5
        ) as answer:
            assert answer.status == 200
        assert not _http_ok(f"http://127.0.0.1:{http_port}/healthz")()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def _locked(path: Path) -> set[str]:
    """The package names a lock pins (each with its hashes)."""
    text = path.read_text()
    names = {line.split("==")[0].lower() for line in text.splitlines() if line and line[0].isalpha()}
    assert text.count("--hash=sha256:") >= len(names)
    return names


def test_the_image_installs_the_locked_set_before_the_source_in_two_stages():
    """What can be checked without a Docker engine: the Dockerfile installs a pinned pip, then the
    hash-checked lock of the deploy extra before it copies the source (dependencies stay a cached
    layer), in a build stage the final image copies the environment from; the lock pins every
    dependency pyproject names and nothing of the test or simulator tools; the production image
    leaves the simulator out; the build context leaves out what the image never needs."""
    import tomllib

    text = (DEPLOY / "Dockerfile").read_text()
    assert text.count("FROM ") == 2 and "COPY --from=build /opt/venv /opt/venv" in text
    assert re.search(r"pip install [^\n]*'pip==[0-9.]+'", text), "pip is pinned"
    lock_install = text.index("--require-hashes -r /tmp/deploy.lock")
    assert lock_install < text.index("COPY lens_pipeline") < text.index("--no-deps /src")
    assert "rm -rf /opt/venv/lib/python3.11/site-packages/lens_pipeline/sim" in text
    root = DEPLOY.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["deploy"]]
    names = {re.split(r"[<>=\[;]", d)[0].strip().lower().replace("_", "-") for d in wanted}
    deploy_lock = _locked(root / "requirements" / "deploy.lock")
    assert names <= deploy_lock, names - deploy_lock
    assert not deploy_lock & {
        "pytest",
        "pytest-xdist",
        "ruff",
        "selenium",
        "hypothesis",
        "mypy",
        "grpcio-tools",
    }
    sim = {re.split(r"[<>=\[;]", d)[0].strip().lower() for d in project["optional-dependencies"]["protogen"]}
    assert _locked(root / "requirements" / "ci.lock") >= deploy_lock | sim | {"pytest", "ruff"}
    ignored = (root / ".dockerignore").read_text().split()
    assert {".git", ".venv", "lens_pipeline_tests"} <= set(ignored)
    for copied in re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.MULTILINE):
        for source in copied.split():
            assert (root / source).exists() and source.split("/")[0] not in ignored, source


def test_retries_of_each_layer_come_from_the_one_table_and_do_not_stack():
    """The step's RetryPolicy is built from lens_pipeline.retry; every lens job's runs are retried
    only when their worker died (a failed step was already retried by its policy, or is asked for
    again by the schedule or the events sensor), as often as retry.py says: run tags, so the
    instance's other code locations keep their own retry settings."""
    from dagster import Backoff, Jitter

    from lens_pipeline import retry
    from lens_pipeline.defs import run_tags
    from lens_pipeline.defs.collectors.common import COLLECTOR_RETRY

    assert (COLLECTOR_RETRY.max_retries, COLLECTOR_RETRY.delay) == (retry.OP_RETRIES, retry.OP_RETRY_DELAY)
    assert (COLLECTOR_RETRY.backoff, COLLECTOR_RETRY.jitter) == (Backoff.EXPONENTIAL, Jitter.PLUS_MINUS)
    for tags in (run_tags.COLLECTION_RUN_TAGS, run_tags.CONTAINER_EVENTS_RUN_TAGS):
        assert tags[run_tags.MAX_RETRIES_TAG] == str(retry.RUN_RETRIES)
        assert tags[run_tags.RETRY_ON_FAILURE_TAG] == "false"
