"""deploy/helm/values.yaml against the official dagster chart, without Helm or a cluster.

The keys are the chart's (its values schema, vendored in deploy/helm/schema/), the values validate
against that schema, the Kubernetes objects in them against the Kubernetes client's models, the
daemon settings load into a real Dagster instance as the chart's instance template writes them,
and each lens job's run Job is built by dagster-k8s itself from the code location's container
context (what `includeConfigInLaunchedRuns` hands the runs) and the job's tags.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes
import pytest
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from lens_pipeline.defs import run_tags
from lens_pipeline.defs.cluster_assets import COLLECTION_TAG
from lens_pipeline.defs.containers.sensors import CONTAINER_EVENTS_TAG
from lens_pipeline.defs.partitions import BATCH_TAG, CLUSTER_TAG

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
HELM = DEPLOY / "helm"
K8S_SCHEMA = "https://kubernetesjsonschema.dev/"

# What the chart's instance template (helm/dagster/templates/configmap-instance.yaml) reads from
# dagsterDaemon.runMonitoring and .runRetries, and the dagster.yaml keys it writes them to: the
# chart's schema leaves both objects free-form, so a key outside these is silently ignored.
RUN_MONITORING_KEYS = {
    "enabled": "enabled",
    "startTimeoutSeconds": "start_timeout_seconds",
    "cancelTimeoutSeconds": "cancel_timeout_seconds",
    "maxResumeRunAttempts": "max_resume_run_attempts",
    "pollIntervalSeconds": "poll_interval_seconds",
    "freeSlotsAfterRunEndSeconds": "free_slots_after_run_end_seconds",
}
RUN_RETRIES_KEYS = {"enabled": "enabled", "maxRetries": "max_retries"}


def values() -> dict[str, Any]:
    return yaml.safe_load((HELM / "values.yaml").read_text())


def schema(name: str) -> dict[str, Any]:
    return json.loads((HELM / "schema" / f"{name}.values.schema.json").read_text())


def lens_deployment() -> dict[str, Any]:
    (deployment,) = values()["dagster-user-deployments"]["deployments"]
    return deployment


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def validator(root: dict[str, Any], pointer: str) -> jsonschema.Draft7Validator:
    """A draft-7 validator of the definition at `pointer` of `root`, offline: the chart's
    `$ref`s to kubernetesjsonschema.dev resolve to empty schemas (the Kubernetes objects are checked
    against the Kubernetes client's models instead, below)."""
    stubs: dict[str, dict[str, Any]] = {}
    for ref in _refs(root):
        if ref.startswith(K8S_SCHEMA):
            url, _, fragment = ref.partition("#")
            node = stubs.setdefault(url, {})
            for part in fragment.strip("/").split("/"):
                node = node.setdefault(part, {})
    registry = Registry().with_resources(
        (url, Resource.from_contents(document, default_specification=DRAFT7))
        for url, document in stubs.items()
    )
    registry = registry.with_resource("urn:chart", Resource.from_contents(root, default_specification=DRAFT7))
    return jsonschema.Draft7Validator({"$ref": f"urn:chart#{pointer}"}, registry=registry)


def unknown_keys(value: Any, node: dict[str, Any], root: dict[str, Any], path: str = "") -> list[str]:
    """Keys of `value` that the schema `node` does not declare, wherever the schema declares
    properties (the chart's schemas mostly allow extra keys, which Helm then silently ignores)."""
    while "$ref" in node and node["$ref"].startswith("#/"):
        declared = node.get("properties")
        node = root["definitions"][node["$ref"].split("/")[-1]] | (
            {"properties": declared} if declared else {}
        )
    if node.get("$ref", "").startswith(K8S_SCHEMA):
        return []  # a Kubernetes object: its own properties, checked against the client's models
    for option in node.get("anyOf", []):
        if option.get("type") == "array" and isinstance(value, list) and "items" in node:
            return [k for item in value for k in unknown_keys(item, node["items"], root, path + "[]")]
        if "$ref" in option and isinstance(value, dict):
            return unknown_keys(value, option, root, path)
    if isinstance(value, list) and "items" in node:
        return [k for item in value for k in unknown_keys(item, node["items"], root, path + "[]")]
    if not isinstance(value, dict) or not node.get("properties"):
        return []
    found = [f"{path}.{key}" for key in value if key not in node["properties"]]
    for key, item in value.items():
        if key in node["properties"]:
            found += unknown_keys(item, node["properties"][key], root, f"{path}.{key}")
    return found


def test_every_key_of_ours_is_one_the_chart_declares():
    main, subchart = schema("dagster"), schema("dagster-user-deployments")
    assert unknown_keys(values(), main, main) == []
    assert unknown_keys({"deployments": [lens_deployment()]}, subchart, subchart) == []
    # The walker finds what Helm would ignore: a misspelt key at any depth.
    wrong = values()
    wrong["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]["tagConcurrencyLimit"] = []
    wrong["dagster-user-deployments"]["deployments"][0]["includeConfigInLaunchedRun"] = {"enabled": True}
    assert set(unknown_keys(wrong, main, main)) == {
        ".dagsterDaemon.runCoordinator.config.queuedRunCoordinator.tagConcurrencyLimit",
        ".dagster-user-deployments.deployments[].includeConfigInLaunchedRun",
    }


def test_the_values_validate_against_the_charts_schema():
    """Each section we set, against the chart's definition of it: the code locations section and
    retention whole; under dagsterDaemon (whose other required keys the chart's defaults give)
    each key we set against its property. The standalone subchart takes the same entry."""
    main, subchart = schema("dagster"), schema("dagster-user-deployments")
    ours = values()
    # The chart's default for the one required key of these sections we leave to it.
    ours["dagster-user-deployments"] = {"imagePullSecrets": [], **ours["dagster-user-deployments"]}
    sections = {
        "/definitions/UserDeployments": ours["dagster-user-deployments"],
        "/definitions/Retention": ours["retention"],
        **{f"/definitions/Daemon/properties/{key}": v for key, v in ours["dagsterDaemon"].items()},
    }
    for pointer, section in sections.items():
        errors = [e.message for e in validator(main, pointer).iter_errors(section)]
        assert errors == [], (pointer, errors)
    standalone = validator(subchart, "/properties/deployments")
    assert list(standalone.iter_errors([lens_deployment()])) == []
    # Not vacuous: what the chart refuses is refused here.
    retention = copy.deepcopy(ours["retention"])
    del retention["sensor"]["purgeAfterDays"]["started"]  # the per-type map needs all four
    assert list(validator(main, "/definitions/Retention").iter_errors(retention))
    limits = copy.deepcopy(ours["dagsterDaemon"]["runCoordinator"])
    limits["config"]["queuedRunCoordinator"]["tagConcurrencyLimits"][0]["perValue"] = True
    assert list(validator(main, "/definitions/Daemon/properties/runCoordinator").iter_errors(limits))
    assert list(standalone.iter_errors([{**lens_deployment(), "port": "3030"}]))


def _model_errors(value: Any, model: str, path: str) -> list[str]:
    """Keys of a Kubernetes object (camelCase, as in a manifest) that its model in the Kubernetes
    client does not have, at any depth."""
    cls = getattr(kubernetes.client, model)
    by_json = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    errors = []
    for key, item in value.items():
        if key not in by_json:
            errors.append(f"{path}.{key}")
            continue
        kind = cls.openapi_types[by_json[key]]
        if kind.startswith("list[V1") and isinstance(item, list):
            errors += [e for x in item for e in _model_errors(x, kind[5:-1], f"{path}.{key}[]")]
        elif kind.startswith("V1") and isinstance(item, dict):
            errors += _model_errors(item, kind, f"{path}.{key}")
    return errors


def test_the_kubernetes_objects_in_the_values_are_kubernetes_objects():
    deployment = lens_deployment()
    models = {
        "podSecurityContext": "V1PodSecurityContext",
        "securityContext": "V1SecurityContext",
        "resources": "V1ResourceRequirements",
        "livenessProbe": "V1Probe",
        "readinessProbe": "V1Probe",
        "startupProbe": "V1Probe",
    }
    errors = []
    for key, model in models.items():
        item = {k: v for k, v in deployment[key].items() if k != "enabled"}  # the chart's own switch
        errors += _model_errors(item, model, key)
    for key, model in (("volumes", "V1Volume"), ("volumeMounts", "V1VolumeMount")):
        errors += [e for item in deployment[key] for e in _model_errors(item, model, key)]
    errors += [
        e for item in deployment["envConfigMaps"] for e in _model_errors(item, "V1ConfigMapEnvSource", "")
    ]
    errors += [e for item in deployment["envSecrets"] for e in _model_errors(item, "V1SecretEnvSource", "")]
    assert errors == []
    assert _model_errors({"runAsNonRoot": True, "runAsUsr": 1}, "V1PodSecurityContext", "x") == ["x.runAsUsr"]


def test_the_daemon_settings_load_into_a_real_instance_as_the_chart_writes_them(tmp_path):
    """The chart's instance template turns dagsterDaemon's run queue, run monitoring and run
    retries, and retention, into dagster.yaml; written the same way, they load into a real
    DagsterInstance. The queue's limits key on lens/* tags and on our code location's name only,
    and every tag our runs carry for the queue is limited, here and in the demo's instance."""
    from dagster import DagsterInstance

    daemon, retention = values()["dagsterDaemon"], values()["retention"]
    assert set(daemon["runMonitoring"]) <= set(RUN_MONITORING_KEYS)
    assert set(daemon["runRetries"]) <= set(RUN_RETRIES_KEYS)
    queued = daemon["runCoordinator"]["config"]["queuedRunCoordinator"]
    limits = [
        {
            "key": limit["key"],
            "limit": limit["limit"],
            **({"value": limit["value"]} if "value" in limit else {}),
        }
        for limit in queued["tagConcurrencyLimits"]
    ]
    instance_config = {
        "run_coordinator": {
            "module": "dagster.core.run_coordinator",
            "class": "QueuedRunCoordinator",
            "config": {"tag_concurrency_limits": limits},
        },
        "run_monitoring": {RUN_MONITORING_KEYS[k]: v for k, v in daemon["runMonitoring"].items()},
        "run_retries": {RUN_RETRIES_KEYS[k]: v for k, v in daemon["runRetries"].items()},
        "retention": {
            kind: {"purge_after_days": retention[kind]["purgeAfterDays"]} for kind in ("schedule", "sensor")
        },
    }
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(instance_config))
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.run_monitoring_enabled and instance.run_retries_enabled
        assert instance.run_retries_max_retries == 0  # others' runs are not retried: ours say so per run
        assert instance.run_coordinator.get_run_queue_config().tag_concurrency_limits == limits
    keys = {limit["key"] for limit in limits}
    # Our share of the slots counts every run of our code location (the UI's too) by the name
    # Dagster gives it: the chart's deployment name, not another team's.
    (share,) = [limit for limit in limits if not limit["key"].startswith("lens/")]
    assert share["key"] == run_tags.DAGSTER_CODE_LOCATION_TAG
    assert share["value"] == lens_deployment()["name"]
    assert keys == {
        run_tags.DAGSTER_CODE_LOCATION_TAG,
        CLUSTER_TAG,
        BATCH_TAG,
        COLLECTION_TAG,
        CONTAINER_EVENTS_TAG,
        run_tags.HISTORY_TAG,
    }
    demo = yaml.safe_load((DEPLOY.parent / "dagster.yaml").read_text())["concurrency"]["runs"]
    assert {limit["key"] for limit in demo["tag_concurrency_limits"]} == keys - {
        run_tags.DAGSTER_CODE_LOCATION_TAG
    }


def _chart_container_context(deployment: dict[str, Any], namespace: str) -> dict[str, Any]:
    """What the user-deployments chart hands each run of this code location with
    includeConfigInLaunchedRuns (its `dagsterUserDeployments.k8sContainerContext` helper)."""
    return {
        "k8s": {
            "image_pull_policy": deployment["image"]["pullPolicy"],
            "env_config_maps": [f"dagster-{deployment['name']}-user-env"]
            + [c["name"] for c in deployment["envConfigMaps"]],
            "env_secrets": [s["name"] for s in deployment["envSecrets"]],
            "volume_mounts": deployment["volumeMounts"],
            "volumes": deployment["volumes"],
            "labels": deployment["labels"],
            "resources": deployment["resources"],
            "namespace": namespace,
            "service_account_name": "dagster-dagster-user-deployments-user-deployments",
            "run_k8s_config": {"pod_spec_config": {"automount_service_account_token": True}},
        }
    }


def _job_tags() -> dict[str, dict[str, str]]:
    from dagster import AutomationConditionSensorDefinition

    from lens_pipeline.definitions import defs

    repository = defs.get_repository_def()
    tags = {job.name: dict(job.tags) for job in repository.get_all_jobs() if not job.name.startswith("__")}
    for sensor in repository.sensor_defs:
        if isinstance(sensor, AutomationConditionSensorDefinition):
            tags[sensor.name] = dict(sensor.run_tags)
    return tags


@pytest.mark.parametrize("job", sorted(_job_tags()))
def test_each_lens_runs_kubernetes_job_as_dagster_k8s_builds_it(job, tmp_path):
    """The run Job of each lens job (and of the automation sensor's runs), built by dagster-k8s
    from the launcher the chart configures, the code location's container context and the job's
    tags: the code location's image, env, registry and /tmp; the restricted profile; deleted 10
    minutes after it finishes."""
    from dagster_k8s import K8sRunLauncher, construct_dagster_k8s_job
    from dagster_k8s.container_context import K8sContainerContext
    from dagster_k8s.job import UserDefinedDagsterK8sConfig, get_user_defined_k8s_config

    tags = _job_tags()[job]
    assert tags[run_tags.CODE_LOCATION_TAG] == run_tags.CODE_LOCATION
    assert int(tags[run_tags.MAX_RUNTIME_TAG]) > 0

    kubeconfig = tmp_path / "kubeconfig"  # parsed, never contacted
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    launcher = K8sRunLauncher(  # as the chart's instance template configures it
        service_account_name="dagster",
        instance_config_map="dagster-instance",
        postgres_password_secret="dagster-postgresql-secret",
        dagster_home="/opt/dagster/dagster_home",
        job_image=None,
        load_incluster_config=False,
        kubeconfig_file=str(kubeconfig),
        job_namespace="dagster",
    )
    deployment = lens_deployment()
    image = f"{deployment['image']['repository']}:{deployment['image']['tag']}"
    context = K8sContainerContext(
        namespace=launcher.job_namespace,
        service_account_name=launcher.service_account_name,
        run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(launcher.run_k8s_config or {}),
    )
    context = context.merge(
        K8sContainerContext.create_from_config(_chart_container_context(deployment, "dagster")).merge(
            K8sContainerContext(run_k8s_config=get_user_defined_k8s_config(tags))
        )
    )
    built = construct_dagster_k8s_job(
        job_config=context.get_k8s_job_config(job_image=image, run_launcher=launcher),
        args=["dagster", "api", "execute_run", "{}"],
        job_name="dagster-run-0123",
        user_defined_k8s_config=context.run_k8s_config,
        component="run_worker",
    )
    body = kubernetes.client.ApiClient().sanitize_for_serialization(built)
    assert body["spec"]["ttlSecondsAfterFinished"] == run_tags.RUN_JOB_TTL_SECONDS
    pod = body["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["image"] == image
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {v["name"] for v in pod["volumes"]} >= {"registry", "tmp"}
    sources = [s.get("configMapRef", s.get("secretRef"))["name"] for s in container["envFrom"]]
    assert {"lens-config", "lens-secrets"} <= set(sources)
    resources = json.loads(tags[run_tags.K8S_CONFIG_TAG])["container_config"].get("resources")
    assert container["resources"] == (resources or deployment["resources"])
