"""The workloads a simulated cluster runs, one function per kind: its objects (owner tree, labels,
SaFE's label link) and the pods its controller creates, named as that controller names them."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from lens_pipeline.sim import controllers
from lens_pipeline.sim.kubeobjects import ContainerPlan, Owner, applied_with_kubectl, new_uid, suffix
from lens_pipeline.sim.state import SAFE_WORKLOAD_LABEL
from lens_pipeline.sim.workloads import PHASES, Controllers, PodPlan, Spawned, Timeline

WORKLOAD_NAMESPACES = ("ml-train", "ml-infer", "research", "default")
SAFE_WORKSPACES = ("safe-prod", "safe-research")
TRAINING_NAMES = ("llama-pretrain", "mixtral-sft", "bert-finetune", "sd-train", "qwen-dpo", "gpt-neox")
SERVING_NAMES = ("vllm-serve", "triton-infer", "embedding-api", "reranker")
BATCH_NAMES = ("eval-harness", "data-prep", "tokenize", "ckpt-convert")
SERVICE_NAMES = ("redis", "vector-db", "metadata-store", "feature-cache")
USERS = ("alice", "bob", "chen", "dana", "emre")
RAY_IMAGE = "docker.io/rayproject/ray-ml:2.9.0-gpu"
# Shared memory for NCCL/RCCL and dataloader workers: every real training pod mounts one.
DSHM_VOLUME = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}


def spawn(ctl: Controllers, kind: str, now: float, outcome: str | None = None, **options: Any) -> Spawned:
    """A new workload of `kind` (one of SPAWNERS) with its owner tree and pods."""
    return SPAWNERS[kind](ctl, now, outcome, **options)


def _gpu_choice(rng: random.Random) -> int:
    return rng.choice((1, 2, 4, 8, 8, 8))


def spawn_pytorchjob(
    ctl: Controllers,
    now: float,
    outcome: str | None,
    namespace: str | None = None,
    safe: dict[str, str] | None = None,
    name: str | None = None,
    gpus: int | None = None,
    workers: int | None = None,
) -> Spawned:
    """A Kubeflow PyTorchJob: `<job>-master-0` and `<job>-worker-N`, gang-scheduled, one GPU count for all."""
    rng = ctl.rng
    outcome = outcome or rng.choices(PHASES, weights=(8, 55, 25, 12))[0]
    namespace = namespace or rng.choice(("ml-train", "research"))
    name = name or ctl.workload_name(TRAINING_NAMES)
    gpus = gpus if gpus is not None else (8 if rng.random() < 0.7 else rng.choice((1, 2, 4)))
    workers = workers if workers is not None else rng.choice((0, 1, 1, 3, 3, 7))
    labels = dict(safe or {})
    timeline = ctl.timeline(now, outcome)
    uid = new_uid(rng)
    containers = ctl.containers("pytorch", gpus)
    template = controllers.pod_template({}, containers, ctl.profile.workload_image, ctl.profile, "OnFailure")
    annotations = {"sim.lens/owner": rng.choice(USERS)}
    job = controllers.pytorchjob(
        name, namespace, uid, timeline.created, labels, workers, template, annotations
    )
    ctl.state.put("pytorchjobs", job if safe else applied_with_kubectl(job))  # SaFE's own are not applied
    owner = Owner("PyTorchJob", "kubeflow.org/v1", name, uid)
    base = {
        "training.kubeflow.org/job-name": name,
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        **(safe or {}),
    }
    init_gpus = ctl.init_gpus(gpus)
    plans = [
        PodPlan(
            f"{name}-master-0",
            {
                **base,
                "training.kubeflow.org/job-role": "master",
                "training.kubeflow.org/replica-index": "0",
                "training.kubeflow.org/replica-type": "master",
            },
            owner,
            containers,
            "OnFailure",
            init_gpus,
            volumes=(DSHM_VOLUME,),
        )
    ] + [
        PodPlan(
            f"{name}-worker-{i}",
            {
                **base,
                "training.kubeflow.org/replica-index": str(i),
                "training.kubeflow.org/replica-type": "worker",
            },
            owner,
            containers,
            "OnFailure",
            init_gpus,
            volumes=(DSHM_VOLUME,),
        )
        for i in range(workers)
    ]
    outcome, keys = ctl.create_pods(namespace, plans, outcome, timeline, ctl.profile.workload_image)
    ctl.refresh_tree(uid, timeline.changed)
    return Spawned(uid, outcome, keys)


def spawn_bound_job(ctl: Controllers, node: str, gpus: int, phase: str, namespace: str, now: float) -> str:
    """A Job whose one pod requests `gpus` GPUs on `node` in `phase` (the caller checked that it
    fits); returns the pod's key."""
    rng = ctl.rng
    name = f"sim-job-{suffix(rng, 6)}"
    uid = new_uid(rng)
    containers = (ContainerPlan("main", gpus),)
    template = controllers.pod_template({}, containers, ctl.profile.workload_image, ctl.profile, "Never")
    job = applied_with_kubectl(controllers.job(name, namespace, uid, now, None, {}, 1, template))
    ctl.state.put("jobs", job)
    plan = PodPlan(
        ctl.pod_name(namespace, f"{name}-"),
        dict(job["spec"]["template"]["metadata"]["labels"]),
        Owner("Job", "batch/v1", name, uid),
        containers,
        "Never",
        generate_name=f"{name}-",
    )
    key = ctl.put_pod(namespace, plan, phase, node, Timeline(now, now, now), ctl.profile.workload_image, None)
    ctl.refresh(uid, now)
    return key


def spawn_mpijob(ctl: Controllers, now: float, outcome: str | None) -> Spawned:
    """A Kubeflow MPIJob: a CPU launcher `<job>-launcher` and 8-GPU workers `<job>-worker-N`."""
    rng = ctl.rng
    outcome = outcome or rng.choices(PHASES, weights=(8, 55, 25, 12))[0]
    namespace = rng.choice(("ml-train", "research"))
    name = ctl.workload_name(TRAINING_NAMES)
    workers = rng.choice((1, 2, 2, 4))
    timeline = ctl.timeline(now, outcome)
    uid = new_uid(rng)
    image = ctl.profile.workload_image
    worker_containers = ctl.containers("mpi-worker", 8)
    launcher_containers = (ContainerPlan("mpi-launcher"),)
    launcher_template = controllers.pod_template({}, launcher_containers, image, ctl.profile, "Never")
    worker_template = controllers.pod_template({}, worker_containers, image, ctl.profile, "Never")
    ctl.state.put(
        "mpijobs",
        applied_with_kubectl(
            controllers.mpijob(
                name, namespace, uid, timeline.created, {}, workers, launcher_template, worker_template, 8
            )
        ),
    )
    owner = Owner("MPIJob", "kubeflow.org/v1", name, uid)
    base = {
        "training.kubeflow.org/job-name": name,
        "training.kubeflow.org/operator-name": "mpijob-controller",
    }
    plans = [
        PodPlan(
            f"{name}-launcher",
            {
                **base,
                "training.kubeflow.org/job-role": "launcher",
                "training.kubeflow.org/replica-type": "launcher",
            },
            owner,
            launcher_containers,
            "Never",
        ),
    ] + [
        PodPlan(
            f"{name}-worker-{i}",
            {
                **base,
                "training.kubeflow.org/replica-index": str(i),
                "training.kubeflow.org/replica-type": "worker",
            },
            owner,
            worker_containers,
            "Never",
            volumes=(DSHM_VOLUME,),
        )
        for i in range(workers)
    ]
    outcome, keys = ctl.create_pods(namespace, plans, outcome, timeline, image)
    ctl.refresh_tree(uid, timeline.changed)
    return Spawned(uid, outcome, keys)


def spawn_rayjob(ctl: Controllers, now: float, outcome: str | None) -> Spawned:
    """A KubeRay RayJob: its RayCluster's head and GPU workers, and the submitter Job KubeRay runs."""
    rng = ctl.rng
    outcome = outcome or rng.choices(PHASES, weights=(8, 55, 25, 12))[0]
    namespace = rng.choice(("ml-train", "research"))
    name = ctl.workload_name(("ray-tune", "ray-train", "ray-data"))
    workers = rng.choice((1, 2, 4))
    gpus = _gpu_choice(rng)
    timeline = ctl.timeline(now, outcome)
    head_containers, worker_containers, spec = _ray_cluster_spec(ctl, gpus, workers)
    uid = new_uid(rng)
    state = ctl.state
    state.put(
        "rayjobs", applied_with_kubectl(controllers.rayjob(name, namespace, uid, timeline.created, {}, spec))
    )
    rayjob_owner = Owner("RayJob", "ray.io/v1", name, uid)
    cluster_name = f"{name}-raycluster-{suffix(rng)}"
    cluster_uid = new_uid(rng)
    cluster_labels = {"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": name}
    state.put(
        "rayclusters",
        controllers.raycluster(
            cluster_name, namespace, cluster_uid, timeline.created, rayjob_owner, cluster_labels, spec
        ),
    )
    plans = _ray_pods(ctl, namespace, cluster_name, cluster_uid, head_containers, worker_containers, workers)
    # With `shutdownAfterJobFinishes: false` (KubeRay's default) the cluster outlives its job: a
    # finished RayJob's head and workers still run, holding their GPUs idle.
    finished = outcome in controllers.TERMINAL_PHASES
    started, keys = ctl.create_pods(namespace, plans, "Running" if finished else outcome, timeline, RAY_IMAGE)
    if not finished or started != "Running":
        outcome = started  # without room, the job has not run
    else:
        for key in keys:
            ctl.state.idle_devices(key)
    # KubeRay's submitter: a Job named after the RayJob that runs `ray job submit`.
    submitter_uid = new_uid(rng)
    submitter = controllers.job(
        name,
        namespace,
        submitter_uid,
        timeline.created,
        rayjob_owner,
        {"ray.io/originated-from-crd": "RayJob"},
        1,
        controllers.pod_template({}, (ContainerPlan("ray-job-submitter"),), RAY_IMAGE, ctl.profile, "Never"),
    )
    state.put("jobs", submitter)
    submit_plan = PodPlan(
        ctl.pod_name(namespace, f"{name}-"),
        dict(submitter["spec"]["template"]["metadata"]["labels"]),
        Owner("Job", "batch/v1", name, submitter_uid),
        (ContainerPlan("ray-job-submitter"),),
        "Never",
        generate_name=f"{name}-",
    )
    _, submit_keys = ctl.create_pods(namespace, [submit_plan], outcome, timeline, RAY_IMAGE)
    ctl.refresh_tree(uid, timeline.changed)
    return Spawned(uid, outcome, keys + submit_keys)


def spawn_rayservice(ctl: Controllers, now: float, outcome: str | None) -> Spawned:
    """A KubeRay RayService: a Ray Serve application on the RayCluster KubeRay makes for it
    (`<service>-<5 random>`, owned by the service), its head and GPU workers (pods of a RayService's
    cluster carry `ray.io/serve`: a worker `true` from the start, the head once it serves)."""
    rng = ctl.rng
    outcome = outcome or ("Running" if rng.random() < 0.92 else "Pending")
    namespace = rng.choice(("ml-infer", "default"))
    name = ctl.workload_name(("ray-serve-llm", "ray-serve-embed", "ray-serve-rerank"))
    workers = rng.choice((1, 1, 2, 4))
    gpus = rng.choice((1, 2, 4, 8))
    timeline = ctl.timeline(now, outcome, max_age=60 * 86400)
    head_containers, worker_containers, spec = _ray_cluster_spec(ctl, gpus, workers)
    serve_config = (
        "applications:\n"
        f"  - name: {controllers.SERVE_APPLICATION}\n"
        "    import_path: serve_app:app\n"
        "    route_prefix: /\n"
        "    deployments:\n"
        f"      - name: {controllers.SERVE_DEPLOYMENT}\n"
        f"        num_replicas: {workers}\n"
        "        ray_actor_options:\n"
        f"          num_gpus: {gpus}\n"
    )
    uid = new_uid(rng)
    state = ctl.state
    service = applied_with_kubectl(
        controllers.rayservice(name, namespace, uid, timeline.created, {}, spec, serve_config)
    )
    state.put("rayservices", service)
    cluster_name = f"{name}-{suffix(rng)}"  # KubeRay's GenerateRayClusterName
    cluster = controllers.raycluster(
        cluster_name,
        namespace,
        new_uid(rng),
        timeline.created,
        Owner("RayService", "ray.io/v1", name, uid),
        # KubeRay copies the service's labels and annotations (kubectl's last-applied-configuration
        # too) to the cluster it makes, and adds its own.
        {
            **service["metadata"].get("labels", {}),
            "ray.io/originated-from-crd": "RayService",
            "ray.io/originated-from-cr-name": name,
        },
        spec,
    )
    cluster["metadata"]["annotations"] = {
        **service["metadata"]["annotations"],
        **controllers.rayservice_cluster_annotations(spec),
    }
    state.put("rayclusters", cluster)
    cluster_uid = cluster["metadata"]["uid"]
    plans = _ray_pods(
        ctl,
        namespace,
        cluster_name,
        cluster_uid,
        head_containers,
        worker_containers,
        workers,
        head_labels={"ray.io/serve": "true" if outcome == "Running" else "false"},
        worker_labels={"ray.io/serve": "true"},
    )
    outcome, keys = ctl.create_pods(namespace, plans, outcome, timeline, RAY_IMAGE)
    ctl.refresh_tree(uid, timeline.changed)
    return Spawned(uid, outcome, keys)


def _ray_cluster_spec(
    ctl: Controllers, gpus: int, workers: int
) -> tuple[tuple[ContainerPlan, ...], tuple[ContainerPlan, ...], dict[str, Any]]:
    """The containers of a RayCluster's head and GPU workers, and its spec."""
    head_containers = (ContainerPlan("ray-head"),)
    worker_containers = ctl.containers("ray-worker", gpus)
    head = controllers.pod_template({}, head_containers, RAY_IMAGE, ctl.profile, "Always")
    worker = controllers.pod_template({}, worker_containers, RAY_IMAGE, ctl.profile, "Always")
    return head_containers, worker_containers, controllers.ray_cluster_spec(head, worker, workers)


def _ray_node(cluster_name: str, node_type: str, group: str) -> dict[str, str]:
    """A Ray pod's node labels, as KubeRay's `labelPod` sets them (`ray.io/identifier` is
    `<cluster>-<type>`, cut to its last 63 characters)."""
    return {
        "ray.io/node-type": node_type,
        "ray.io/group": group,
        "ray.io/identifier": f"{cluster_name}-{node_type}"[-63:],
    }


def _ray_pods(
    ctl: Controllers,
    namespace: str,
    cluster_name: str,
    cluster_uid: str,
    head_containers: tuple[ContainerPlan, ...],
    worker_containers: tuple[ContainerPlan, ...],
    workers: int,
    head_labels: dict[str, str] | None = None,
    worker_labels: dict[str, str] | None = None,
) -> list[PodPlan]:
    """The pods KubeRay's RayCluster controller makes: `<cluster>-head-<5>` and
    `<cluster>-gpu-group-worker-<5>`, labelled with their cluster, node type and group."""
    owner = Owner("RayCluster", "ray.io/v1", cluster_name, cluster_uid)
    ray_labels = {
        "ray.io/cluster": cluster_name,
        "ray.io/is-ray-node": "yes",
        "app.kubernetes.io/created-by": "kuberay-operator",
        "app.kubernetes.io/name": "kuberay",
    }
    return [
        PodPlan(
            ctl.pod_name(namespace, f"{cluster_name}-head-"),
            {**ray_labels, **_ray_node(cluster_name, "head", "headgroup"), **(head_labels or {})},
            owner,
            head_containers,
            "Always",
            generate_name=f"{cluster_name}-head-",
        ),
    ] + [
        PodPlan(
            ctl.pod_name(namespace, f"{cluster_name}-gpu-group-worker-"),
            {**ray_labels, **_ray_node(cluster_name, "worker", "gpu-group"), **(worker_labels or {})},
            owner,
            worker_containers,
            "Always",
            generate_name=f"{cluster_name}-gpu-group-worker-",
            volumes=(DSHM_VOLUME,),
        )
        for _ in range(workers)
    ]


def spawn_job(
    ctl: Controllers,
    now: float,
    outcome: str | None,
    owner: Owner | None = None,
    namespace: str | None = None,
    name: str | None = None,
    gpus: int | None = None,
    created: float | None = None,
) -> Spawned:
    """A Job of 1-4 parallel pods `<job>-<5>`; under a CronJob (`owner`), one pod at the scheduled time."""
    rng = ctl.rng
    outcome = outcome or rng.choices(PHASES, weights=(8, 55, 25, 12))[0]
    namespace = namespace or rng.choice(WORKLOAD_NAMESPACES)
    name = name or ctl.workload_name(BATCH_NAMES)
    gpus = gpus if gpus is not None else (_gpu_choice(rng) if rng.random() < 0.6 else 0)
    parallelism = 1 if owner else rng.choice((1, 1, 2, 4))
    timeline = ctl.timeline(now, outcome)
    if created is not None:
        timeline = Timeline(created, min(created + 5, now), min(created + 5 + rng.uniform(60, 3600), now))
    uid = new_uid(rng)
    containers = ctl.containers("main", gpus)
    template = controllers.pod_template({}, containers, ctl.profile.workload_image, ctl.profile, "Never")
    job = controllers.job(name, namespace, uid, timeline.created, owner, {}, parallelism, template)
    ctl.state.put("jobs", job if owner else applied_with_kubectl(job))  # a CronJob's are its controller's
    labels = dict(job["spec"]["template"]["metadata"]["labels"])
    job_owner = Owner("Job", "batch/v1", name, uid)
    init_gpus = ctl.init_gpus(gpus)
    plans = [
        PodPlan(
            ctl.pod_name(namespace, f"{name}-"),
            labels,
            job_owner,
            containers,
            "Never",
            init_gpus,
            f"{name}-",
        )
        for _ in range(parallelism)
    ]
    outcome, keys = ctl.create_pods(namespace, plans, outcome, timeline, ctl.profile.workload_image)
    ctl.refresh_tree(uid, timeline.changed)
    return Spawned(uid, outcome, keys)


def spawn_cronjob(ctl: Controllers, now: float, outcome: str | None) -> Spawned:
    """A CronJob every 6 hours with 1-3 runs kept (the latest possibly still running)."""
    rng = ctl.rng
    namespace = rng.choice(WORKLOAD_NAMESPACES)
    name = ctl.workload_name(("nightly-eval", "ckpt-cleanup", "metrics-rollup"))
    gpus = rng.choice((1, 2)) if rng.random() < 0.4 else 0
    period = 6 * 3600
    created = now - rng.uniform(3, 30) * 86400
    uid = new_uid(rng)
    containers = ctl.containers("main", gpus)
    template = controllers.pod_template({}, containers, ctl.profile.workload_image, ctl.profile, "Never")
    cronjob = controllers.cronjob(name, namespace, uid, created, {}, "0 */6 * * *", template)
    ctl.state.put("cronjobs", applied_with_kubectl(cronjob))
    owner = Owner("CronJob", "batch/v1", name, uid)
    last = int(now // period) * period
    runs = rng.randint(1, 3)
    keys: list[str] = []
    for run in range(runs):
        scheduled = last - (runs - 1 - run) * period
        latest = run == runs - 1
        run_outcome = (
            outcome if latest and outcome else ("Running" if latest and rng.random() < 0.4 else "Succeeded")
        )
        if not latest and rng.random() < 0.1:
            run_outcome = "Failed"
        spawned = spawn_job(
            ctl, now, run_outcome, owner, namespace, f"{name}-{int(scheduled // 60)}", gpus, scheduled
        )
        keys += spawned.pods
    ctl.refresh_tree(uid, now)
    return Spawned(uid, "Running", keys)


def spawn_deployment(
    ctl: Controllers,
    now: float,
    outcome: str | None,
    namespace: str | None = None,
    safe: dict[str, str] | None = None,
    name: str | None = None,
    gpus: int | None = None,
    replicas: int | None = None,
) -> Spawned:
    """A Deployment, its current ReplicaSet (and sometimes an older one scaled to 0), and its replicas."""
    rng = ctl.rng
    serving = gpus is not None or rng.random() < 0.5
    gpus = gpus if gpus is not None else (rng.choice((1, 1, 2, 4, 8)) if serving else 0)
    namespace = namespace or rng.choice(("ml-infer", "default") if serving else WORKLOAD_NAMESPACES)
    name = name or ctl.workload_name(SERVING_NAMES if serving else SERVICE_NAMES)
    replicas = replicas if replicas is not None else rng.choice((1, 1, 2, 2, 3, 4))
    outcome = outcome or ("Running" if rng.random() < 0.92 else "Pending")
    timeline = ctl.timeline(now, outcome, max_age=60 * 86400)
    app = {"app": name, **(safe or {})}
    containers = ctl.containers("server", gpus)
    uid = new_uid(rng)
    state = ctl.state
    template = controllers.pod_template(app, containers, ctl.profile.workload_image, ctl.profile, "Always")
    deployment = controllers.deployment(name, namespace, uid, timeline.created, dict(app), replicas, template)
    state.put("deployments", deployment if safe else applied_with_kubectl(deployment))
    owner = Owner("Deployment", "apps/v1", name, uid)
    revision = 1
    if rng.random() < 0.3:
        # An earlier rollout's ReplicaSet, scaled to zero and kept for `kubectl rollout undo`.
        old_hash = suffix(rng, 10)
        old_template = controllers.pod_template(
            {**app, "pod-template-hash": old_hash},
            containers,
            ctl.profile.workload_image,
            ctl.profile,
            "Always",
        )
        state.put(
            "replicasets",
            controllers.replicaset(
                f"{name}-{old_hash}",
                namespace,
                new_uid(rng),
                timeline.created,
                owner,
                {**app, "pod-template-hash": old_hash},
                0,
                old_template,
                1,
            ),
        )
        revision = 2
    template_hash = suffix(rng, 10)
    rs_labels = {**app, "pod-template-hash": template_hash}
    rs_name = f"{name}-{template_hash}"
    rs_uid = new_uid(rng)
    rs_template = controllers.pod_template(
        rs_labels, containers, ctl.profile.workload_image, ctl.profile, "Always"
    )
    state.put(
        "replicasets",
        controllers.replicaset(
            rs_name,
            namespace,
            rs_uid,
            timeline.created,
            owner,
            rs_labels,
            replicas,
            rs_template,
            revision,
        ),
    )
    rs_owner = Owner("ReplicaSet", "apps/v1", rs_name, rs_uid)
    keys: list[str] = []
    # Replicas are scheduled one by one, not as a gang.
    for _ in range(replicas):
        plan = PodPlan(
            ctl.pod_name(namespace, f"{rs_name}-"),
            rs_labels,
            rs_owner,
            containers,
            "Always",
            generate_name=f"{rs_name}-",
        )
        _, made = ctl.create_pods(namespace, [plan], outcome, timeline, ctl.profile.workload_image, 0.02)
        keys += made
    ctl.refresh_tree(uid, timeline.changed)
    return Spawned(uid, outcome, keys)


def spawn_statefulset(ctl: Controllers, now: float, outcome: str | None) -> Spawned:
    """A StatefulSet of 1-3 ordinal pods, mostly CPU services."""
    rng = ctl.rng
    namespace = rng.choice(WORKLOAD_NAMESPACES)
    name = ctl.workload_name(SERVICE_NAMES)
    gpus = rng.choice((1, 2)) if rng.random() < 0.2 else 0
    replicas = rng.choice((1, 3, 3))
    outcome = outcome or ("Running" if rng.random() < 0.95 else "Pending")
    timeline = ctl.timeline(now, outcome, max_age=90 * 86400)
    labels = {"app.kubernetes.io/name": name}
    containers = ctl.containers(name.rsplit("-", 1)[0], gpus)
    uid = new_uid(rng)
    template = controllers.pod_template(labels, containers, ctl.profile.workload_image, ctl.profile, "Always")
    sts = controllers.statefulset(name, namespace, uid, timeline.created, dict(labels), replicas, template)
    ctl.state.put("statefulsets", applied_with_kubectl(sts))
    keys: list[str] = []
    for index in range(replicas):
        plan = ctl.statefulset_pod(sts, index)
        _, made = ctl.create_pods(namespace, [plan], outcome, timeline, ctl.profile.workload_image)
        keys += made
    ctl.refresh_tree(uid, timeline.changed)
    return Spawned(uid, outcome, keys)


def spawn_bare_pod(ctl: Controllers, now: float, outcome: str | None) -> Spawned:
    """A pod nobody owns (`kubectl run`): it belongs to no workload."""
    rng = ctl.rng
    namespace = rng.choice(("default", "research"))
    outcome = outcome or rng.choices(PHASES, weights=(5, 70, 20, 5))[0]
    timeline = ctl.timeline(now, outcome, max_age=2 * 86400)
    plan = PodPlan(
        ctl.pod_name(namespace, "gpu-debug-"),
        {"run": "gpu-debug"},
        None,
        (ContainerPlan("debug", 1),),
        "Never",
    )
    outcome, keys = ctl.create_pods(namespace, [plan], outcome, timeline, ctl.profile.workload_image)
    uid = ctl.state.pod(keys[0]).uid  # type: ignore[union-attr]
    return Spawned(uid, outcome, keys)


def spawn_safe_workload(ctl: Controllers, now: float, outcome: str | None, cluster_id: str) -> Spawned:
    """A SaFE Workload and what SaFE dispatches for it: a PyTorchJob (training) or a Deployment
    (inference) in the workspace namespace, linked by label, with no ownerReference to it."""
    rng = ctl.rng
    training = rng.random() < 0.8
    name = f"{rng.choice(TRAINING_NAMES if training else SERVING_NAMES)}-{suffix(rng)}"
    workspace = rng.choice(SAFE_WORKSPACES)
    gpus = 8 if training else rng.choice((1, 2, 4))
    replica = rng.choice((1, 2, 4)) if training else rng.choice((1, 2))
    labels = {
        "primus-safe.cluster.id": cluster_id,
        SAFE_WORKLOAD_LABEL: name,
        "primus-safe.workspace.id": workspace,
        "primus-safe.workload.dispatch.count": "1",
    }
    kind = ("kubeflow.org", "v1", "PyTorchJob") if training else ("apps", "v1", "Deployment")
    uid = new_uid(rng)
    created = now if ctl.fresh else now - rng.uniform(60, 7 * 86400)
    annotations = {"primus-safe.user.name": rng.choice(USERS)}
    workload = controllers.safe_workload(
        name,
        uid,
        created,
        labels,
        annotations,
        workspace,
        gpus,
        replica,
        kind,
        ctl.profile.workload_image,
        ctl.profile.resource,
    )
    ctl.state.put("workloads", workload)
    if training:
        child = spawn_pytorchjob(ctl, now, outcome, workspace, dict(labels), name, gpus, replica - 1)
    else:
        child = spawn_deployment(ctl, now, outcome, workspace, dict(labels), name, gpus, replica)
    ctl.refresh(uid, now)
    return Spawned(uid, child.outcome, child.pods)


def spawn_daemonset(
    ctl: Controllers, name: str, namespace: str, nodes: Sequence[str], image: str, now: float
) -> Spawned:
    """One pod per node in `nodes`, created when the node joined; CPU only."""
    rng, state = ctl.rng, ctl.state
    labels = {"app.kubernetes.io/name": name}
    containers = (ContainerPlan(name),)
    uid = new_uid(rng)
    created = now - rng.uniform(30, 200) * 86400
    template = controllers.pod_template(labels, containers, image, ctl.profile, "Always")
    state.put(
        "daemonsets", controllers.daemonset(name, namespace, uid, created, dict(labels), template, None)
    )
    owner = Owner("DaemonSet", "apps/v1", name, uid)
    pod_labels = {
        **labels,
        "controller-revision-hash": f"{suffix(rng, 10)}",
        "pod-template-generation": "1",
    }
    keys: list[str] = []
    for node in nodes:
        timeline = ctl.timeline(now, "Running", max_age=30 * 86400)
        plan = PodPlan(
            ctl.pod_name(namespace, f"{name}-"),
            pod_labels,
            owner,
            containers,
            "Always",
            generate_name=f"{name}-",
            node=node,
        )
        _, made = ctl.create_pods(namespace, [plan], "Running", timeline, image)
        keys += made
    ctl.refresh(uid, now)
    return Spawned(uid, "Running", keys)


def fire_cronjob(ctl: Controllers, uid: str, now: float) -> Spawned | None:
    """The CronJob controller's next run: a new Job, and history pruned to the limits."""
    state = ctl.state
    record = state.by_uid[uid]
    cronjob = state.read("cronjobs", record.key)
    namespace, name = record.key.split("/", 1)
    jobs = [state.read("jobs", r.key) for r in state.child_records(uid) if r.resource == "jobs"]
    if any(not _finished(j) for j in jobs):
        return None  # concurrencyPolicy Forbid
    containers = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    gpus = int(containers[0]["resources"]["limits"].get(ctl.profile.resource, 0))
    job_name = f"{name}-{int(now // 60)}"
    if f"{namespace}/{job_name}" in state.stores["jobs"]:
        return None
    owner = Owner("CronJob", "batch/v1", name, uid)
    spawned = spawn_job(ctl, now, "Running", owner, namespace, job_name, gpus, now)
    jobs = sorted(
        (state.read("jobs", r.key) for r in state.child_records(uid) if r.resource == "jobs"),
        key=lambda j: j["metadata"]["creationTimestamp"],
    )
    for outcome, limit in (("Complete", 3), ("Failed", 1)):
        done = [j for j in jobs if _finished(j) == outcome]
        for old in done[: max(0, len(done) - limit)]:
            ctl.delete_tree(old["metadata"]["uid"], now)
    ctl.refresh(uid, now)
    return spawned


def _finished(job: dict[str, Any]) -> str:
    for condition in job.get("status", {}).get("conditions", []):
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"])
    return ""


SPAWNERS: dict[str, Callable[..., Spawned]] = {
    "pytorchjob": spawn_pytorchjob,
    "mpijob": spawn_mpijob,
    "rayjob": spawn_rayjob,
    "rayservice": spawn_rayservice,
    "job": spawn_job,
    "cronjob": spawn_cronjob,
    "deployment": spawn_deployment,
    "statefulset": spawn_statefulset,
    "pod": spawn_bare_pod,
}
# How often each appears among workloads (by count, not pods); SaFE Workloads come on top.
SPAWN_WEIGHTS = {
    "pytorchjob": 22,
    "mpijob": 6,
    "rayjob": 5,
    "rayservice": 3,
    "job": 14,
    "cronjob": 5,
    "deployment": 14,
    "statefulset": 5,
    "pod": 2,
}
