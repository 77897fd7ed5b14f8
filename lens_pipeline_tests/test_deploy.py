"""deploy/: what can be checked without a Docker engine or a Kubernetes cluster.

The manifests parse and hang together (selectors, Services, ConfigMaps, Secrets, service accounts),
the production dagster.yaml loads into a real instance (PostgreSQL storage, K8sRunLauncher against
the simulator's Kubernetes API), and every container's command starts from this checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from lens_pipeline_tests.conftest import _server_database, skip_unless
from lens_pipeline_tests.ingest.support import free_port

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
BIN = Path(sys.executable).parent


def kustomization() -> dict:
    return yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())


def manifests() -> list[dict]:
    documents = []
    for resource in kustomization()["resources"]:
        documents += [d for d in yaml.safe_load_all((DEPLOY / resource).read_text()) if d]
    return documents


def by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in manifests() if d["kind"] == kind}


def example_secrets() -> dict[str, dict]:
    """The Secrets the operator creates (not applied by the kustomization): deploy/examples."""
    documents = yaml.safe_load_all((DEPLOY / "examples" / "secrets.yaml").read_text())
    return {d["metadata"]["name"]: d for d in documents if d and d["kind"] == "Secret"}


def containers(name: str) -> dict[str, dict]:
    spec = by_kind("Deployment")[name]["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


def test_kustomization_lists_every_manifest_and_each_parses():
    listed = {DEPLOY / r for r in kustomization()["resources"]}
    assert listed == set((DEPLOY / "kubernetes").glob("*.yaml"))
    for document in manifests():
        assert {"apiVersion", "kind", "metadata"} <= set(document), document
        assert document["kind"] == "Namespace" or document["metadata"]["namespace"] == "lens"
    generated = {g["name"]: g["files"] for g in kustomization()["configMapGenerator"]}
    assert generated == {"lens-dagster-instance": ["dagster.yaml", "workspace.yaml"]}
    for files in generated.values():
        for file in files:
            assert yaml.safe_load((DEPLOY / file).read_text())


def test_every_process_has_its_deployment_and_every_reference_exists():
    deployments = by_kind("Deployment")
    assert set(deployments) == {
        "lens-code-location",
        "lens-dagster-webserver",
        "lens-dagster-daemon",
        "lens-ingest",
        "lens-api",
    }
    config_maps = set(by_kind("ConfigMap")) | {g["name"] for g in kustomization()["configMapGenerator"]}
    secrets = set(example_secrets())
    accounts = set(by_kind("ServiceAccount"))
    image = kustomization()["images"][0]["name"]
    for name, deployment in deployments.items():
        template = deployment["spec"]["template"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= template["metadata"]["labels"].items(), name
        spec = template["spec"]
        assert spec.get("serviceAccountName", "default") in accounts | {"default"}, name
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets, (name, volume)
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, (name, volume)
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            assert container["image"] == image, (name, container["name"])
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in config_maps
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets
            mounted = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounted <= {v["name"] for v in spec.get("volumes", [])}, (name, container["name"])
    for name, service in by_kind("Service").items():
        (target,) = [
            d
            for d in deployments.values()
            if service["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        ports = {
            p["name"] for c in target["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
        }
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports, name
    # The workspace the webserver and daemon load points at the code location's Service.
    (location,) = yaml.safe_load((DEPLOY / "workspace.yaml").read_text())["load_from"]
    assert location["grpc_server"]["host"] in by_kind("Service")
    # Settings the processes read are given to them.
    data = by_kind("ConfigMap")["lens-config"]["data"]
    assert {"DAGSTER_HOME", "LENS_CLUSTERS_FILE", "LENS_CLUSTERS_PER_RUN"} <= set(data)
    assert {"DAGSTER_POSTGRES_URL", "LENS_DATABASE_URL", "LENS_SAFE_DATABASE_URL"} <= set(
        example_secrets()["lens-secrets"]["stringData"]
    )


def test_the_production_instance_loads_with_postgres_and_the_k8s_run_launcher(tmp_path, monkeypatch):
    from dagster import DagsterInstance, QueuedRunCoordinator
    from dagster_k8s import K8sRunLauncher

    from lens_pipeline.sim.fleet import SimFleet
    from lens_pipeline.sim.registry import write_registry
    from lens_pipeline.sim.server import SimServer

    databases = _server_database("postgresql", "dagster")
    url = next(databases)
    try:
        config = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
        with SimServer(SimFleet.generate(clusters=1, nodes=2, seed=1, vendor="amd")) as server:
            write_registry(tmp_path / "clusters.yaml", server)
            (kubeconfig,) = (tmp_path / "kubeconfigs").glob("*.yaml")
            # Outside a pod: the launcher reads a kubeconfig (the simulator's API) instead.
            launcher = config["run_launcher"]["config"]
            assert launcher["load_incluster_config"] is True
            launcher.update(load_incluster_config=False, kubeconfig_file=str(kubeconfig))
            home = tmp_path / "home"
            home.mkdir()
            (home / "dagster.yaml").write_text(yaml.safe_dump(config))
            monkeypatch.setenv("DAGSTER_POSTGRES_URL", url)
            with DagsterInstance.from_config(str(home)) as instance:
                assert isinstance(instance.run_launcher, K8sRunLauncher)
                assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
                assert type(instance.run_storage).__name__ == "PostgresRunStorage"
                assert instance.get_runs() == []
        local = yaml.safe_load((DEPLOY.parent / "dagster.yaml").read_text())
        keys = lambda c: {limit["key"] for limit in c["concurrency"]["runs"]["tag_concurrency_limits"]}  # noqa: E731
        assert keys(local) == keys(config)
    finally:
        databases.close()


def _start(command: list[str], env: dict, log: Path) -> subprocess.Popen:
    executable = BIN / command[0]
    return subprocess.Popen(
        [str(executable), *command[1:]],
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


def _with_port(command: list[str], flag: str, port: int) -> list[str]:
    index = command.index(flag)
    return [*command[: index + 1], str(port), *command[index + 2 :]]


def test_every_container_command_starts_from_this_checkout(tmp_path):
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path),
        "LENS_DATABASE_URL": f"sqlite:///{tmp_path / 'lens.db'}",
        "LENS_SAFE_DATABASE_URL": f"sqlite:///{tmp_path / 'safe.db'}",
        "LENS_CLUSTERS_FILE": str(tmp_path / "clusters.yaml"),
    }
    (tmp_path / "clusters.yaml").write_text(
        example_secrets()["lens-cluster-registry"]["stringData"]["clusters.yaml"]
    )
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(example_secrets()["lens-ingest-tokens"]["stringData"]["tokens.yaml"])

    migrate = containers("lens-code-location")["migrate"]["command"]
    done = subprocess.run([str(BIN / migrate[0]), *migrate[1:]], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

    processes: list[subprocess.Popen] = []
    try:
        api = containers("lens-api")["api"]["command"]
        port = free_port()
        processes.append(_start(_with_port(api, "--port", port), env, tmp_path / "api.log"))
        _wait(processes[-1], tmp_path / "api.log", _http_ok(f"http://127.0.0.1:{port}/healthz"))

        ingest = containers("lens-ingest")["ingest"]["command"]
        grpc_port, http_port = free_port(), free_port()
        ingest = _with_port(_with_port(ingest, "--grpc-port", grpc_port), "--http-port", http_port)
        ingest = _with_port(ingest, "--tokens-file", tokens)  # type: ignore[arg-type]
        processes.append(_start(ingest, env, tmp_path / "ingest.log"))
        _wait(processes[-1], tmp_path / "ingest.log", _http_ok(f"http://127.0.0.1:{http_port}/healthz"))

        location = containers("lens-code-location")["code-location"]
        grpc = _with_port(location["command"], "--port", free_port())
        grpc = _with_port(grpc, "--host", "127.0.0.1")  # type: ignore[arg-type]
        probe = _with_port(location["readinessProbe"]["exec"]["command"], "--port", int(grpc[-1]))
        processes.append(_start(grpc, env, tmp_path / "grpc.log"))
        _wait(
            processes[-1],
            tmp_path / "grpc.log",
            lambda: (
                subprocess.run([str(BIN / probe[0]), *probe[1:]], env=env, capture_output=True).returncode
                == 0
            ),
            timeout=120,
        )
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait(timeout=30)

    # The webserver and daemon need the cluster's code-location Service: their commands and flags exist.
    for deployment, name in (("lens-dagster-webserver", "webserver"), ("lens-dagster-daemon", "daemon")):
        command = containers(deployment)[name]["command"]
        words = (
            [w for w in command[1:] if not w.startswith("-")][:1] if command[0] == "dagster-daemon" else []
        )
        shown = subprocess.run(
            [str(BIN / command[0]), *words, "--help"], env=env, capture_output=True, text=True
        )
        assert shown.returncode == 0, shown.stderr
        for flag in (w for w in command if w.startswith("--")):
            assert flag in shown.stdout, (deployment, flag)


def _locked(path: Path) -> set[str]:
    """The package names a lock pins (each with its hashes)."""
    text = path.read_text()
    names = {line.split("==")[0].lower() for line in text.splitlines() if line and line[0].isalpha()}
    assert text.count("--hash=sha256:") >= len(names)
    return names


def test_the_image_installs_the_locked_set_before_the_source_in_two_stages():
    """What can be checked without a Docker engine: the Dockerfile installs the hash-checked lock
    of the deploy extra before it copies the source (dependencies stay a cached layer), in a build
    stage the final image copies the environment from; the lock pins every dependency pyproject
    names and nothing of the test tools; the build context leaves out what the image never needs."""
    import tomllib

    text = (DEPLOY / "Dockerfile").read_text()
    assert text.count("FROM ") == 2 and "COPY --from=build /opt/venv /opt/venv" in text
    lock_install = text.index("--require-hashes -r /tmp/deploy.lock")
    assert lock_install < text.index("COPY lens_pipeline") < text.index("--no-deps /src")
    root = DEPLOY.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["deploy"]]
    names = {re.split(r"[<>=\[;]", d)[0].strip().lower().replace("_", "-") for d in wanted}
    deploy_lock = _locked(root / "requirements" / "deploy.lock")
    assert names <= deploy_lock, names - deploy_lock
    assert not deploy_lock & {"pytest", "ruff", "selenium", "hypothesis", "mypy"}
    assert _locked(root / "requirements" / "ci.lock") >= deploy_lock | {"pytest", "ruff"}
    ignored = (root / ".dockerignore").read_text().split()
    assert {".git", ".venv", "lens_pipeline_tests"} <= set(ignored)
    for copied in re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.MULTILINE):
        for source in copied.split():
            assert (root / source).exists() and source.split("/")[0] not in ignored, source


def _rendered(directory: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    skip_unless(kubectl is not None, "Debian's kubectl is not installed (apt-get install kubernetes-client)")
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _images(documents: list[dict]) -> tuple[set[str], set[str]]:
    """Every container image, and every DAGSTER_CURRENT_IMAGE value, of the rendered workloads."""
    images, current = set(), set()
    for document in documents:
        spec = document.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            images.add(container["image"])
            current |= {e["value"] for e in container.get("env", []) if e["name"] == "DAGSTER_CURRENT_IMAGE"}
    return images, current


def test_every_run_job_gets_the_code_locations_image_as_rendered(tmp_path):
    """What `kubectl apply -k` applies, not the sources: the image each run's Job takes
    (DAGSTER_CURRENT_IMAGE) is the code location's, also when an overlay renames the image (the
    overlay repeats the base's `replacements`, as deploy/README.md says)."""
    images, current = _images(_rendered(DEPLOY))
    assert images == current == {"registry.example.com/lens-pipeline:latest"}
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DEPLOY, overlay)],
                "replacements": kustomization()["replacements"],  # as deploy/README.md says
                "images": [
                    {
                        "name": "registry.example.com/lens-pipeline",
                        "newName": "gpu.corp/lens",
                        "newTag": "2.1",
                    }
                ],
            }
        )
    )
    images, current = _images(_rendered(overlay))
    assert images == current == {"gpu.corp/lens:2.1"}


def test_the_rendered_workloads_meet_the_restricted_profile_and_probe_every_process():
    """On `kubectl kustomize`'s output: every pod runs as non-root with seccomp RuntimeDefault, every
    container without privilege escalation or capabilities on a read-only root filesystem, every
    long-running container has liveness and readiness probes, no Secret is applied (they are the
    operator's), and run Jobs are kept 10 minutes, as the restricted runs' pods."""
    documents = _rendered(DEPLOY)
    assert not [d for d in documents if d["kind"] == "Secret"]
    deployments = [d for d in documents if d["kind"] == "Deployment"]
    assert len(deployments) == 5
    for deployment in deployments:
        name, spec = deployment["metadata"]["name"], deployment["spec"]["template"]["spec"]
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, (name, container["name"])
            assert context["capabilities"] == {"drop": ["ALL"]} and context["readOnlyRootFilesystem"]
        for container in spec["containers"]:
            assert "livenessProbe" in container, (name, container["name"])
            if container["name"] != "daemon":  # the daemon serves nothing to be ready for
                assert "readinessProbe" in container, (name, container["name"])
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    launcher = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())["run_launcher"]["config"][
        "run_k8s_config"
    ]
    assert launcher["job_spec_config"]["ttl_seconds_after_finished"] == 600
    assert launcher["pod_spec_config"]["security_context"]["runAsNonRoot"] is True


def test_retries_of_each_layer_come_from_the_one_table_and_do_not_stack():
    """The step's RetryPolicy is built from lens_pipeline.retry; the production instance retries a
    run only when its worker died (a failed step was already retried by its policy), as often as
    retry.py says."""
    from dagster import Backoff, Jitter

    from lens_pipeline import retry
    from lens_pipeline.defs.collectors.common import COLLECTOR_RETRY

    assert (COLLECTOR_RETRY.max_retries, COLLECTOR_RETRY.delay) == (retry.OP_RETRIES, retry.OP_RETRY_DELAY)
    assert (COLLECTOR_RETRY.backoff, COLLECTOR_RETRY.jitter) == (Backoff.EXPONENTIAL, Jitter.PLUS_MINUS)
    run_retries = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())["run_retries"]
    assert run_retries == {
        "enabled": True,
        "max_retries": retry.RUN_RETRIES,
        "retry_on_asset_or_op_failure": False,
    }
