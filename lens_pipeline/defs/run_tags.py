"""The run tags every lens job carries: what the lens code location asks of the Dagster instance it
runs in, per run, so that nothing of ours applies to other code locations' runs.

A shared Dagster (the official Helm chart with many code locations) has one instance config; the
run monitoring limit, the run retries and the Kubernetes settings of our runs are therefore tags on
our jobs (Dagster's `dagster/max_runtime` and `dagster/max_retries`, dagster-k8s's
`dagster-k8s/config`), and the run queue's limits key on `lens/*` tags and on our code location's
name only (deploy/helm/).
"""

import json
from collections.abc import Mapping
from typing import Any

from lens_pipeline.retry import RUN_RETRIES

# Every run of our jobs and sensors carries it: run retention deletes only our runs (with Dagster's
# code location tag below, which also bounds our share of the instance's run slots).
CODE_LOCATION_TAG = "lens/code-location"
CODE_LOCATION = "lens_pipeline"
# Dagster (1.12 and later) tags every run created through a workspace, whoever launched it (a
# schedule, a sensor, the UI, a backfill), with the name of its code location: the one mark of ours
# that runs started by hand in the UI carry too. The name is the workspace's (the chart: the
# user deployment's `name`), not ours to choose.
DAGSTER_CODE_LOCATION_TAG = "dagster/code_location"
# Dagster's documented run tags (the public API names no constant for them).
MAX_RUNTIME_TAG = "dagster/max_runtime"
MAX_RETRIES_TAG = "dagster/max_retries"
RETRY_ON_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"
K8S_CONFIG_TAG = "dagster-k8s/config"
# A finished run's Kubernetes Job goes after 10 minutes (dagster-k8s keeps it a day by default:
# about 4,300 Jobs a day at three runs a minute); its logs and events are in Dagster's storage.
RUN_JOB_TTL_SECONDS = 600
# The image's user (deploy/Dockerfile).
RUN_AS_USER = 10001

# The restricted Pod Security profile, as dagster-k8s takes it (snake_case keys of the Kubernetes
# client's models). The chart's includeConfigInLaunchedRuns carries the code location's env,
# volumes and resources to each run, but not its security contexts: they come from here.
POD_SECURITY_CONTEXT = {
    "run_as_non_root": True,
    "run_as_user": RUN_AS_USER,
    "run_as_group": RUN_AS_USER,
    "fs_group": RUN_AS_USER,
    "seccomp_profile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT = {
    "allow_privilege_escalation": False,
    "read_only_root_filesystem": True,  # /tmp is the code location's emptyDir, carried to the run
    "capabilities": {"drop": ["ALL"]},
}


def run_tags(
    *,
    max_runtime_seconds: int,
    max_retries: int = 0,
    resources: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Tags for a lens job: run monitoring stops a run past `max_runtime_seconds` (when the
    instance's run monitoring is on), the run is retried `max_retries` times when its worker died
    (when the instance's run retries are on; a run whose step failed is not: the step's own retries,
    the schedule's next minute and the events sensor cover that), and its Kubernetes Job (K8sRunLauncher) runs restricted, with `resources`
    (else the code location's), and is deleted RUN_JOB_TTL_SECONDS after it finishes."""
    container: dict[str, Any] = {"security_context": CONTAINER_SECURITY_CONTEXT}
    if resources is not None:
        container["resources"] = dict(resources)
    k8s = {
        "container_config": container,
        "pod_spec_config": {"security_context": POD_SECURITY_CONTEXT},
        "job_spec_config": {"ttl_seconds_after_finished": RUN_JOB_TTL_SECONDS},
    }
    return {
        CODE_LOCATION_TAG: CODE_LOCATION,
        MAX_RUNTIME_TAG: str(max_runtime_seconds),
        MAX_RETRIES_TAG: str(max_retries),
        RETRY_ON_FAILURE_TAG: "false",
        K8S_CONFIG_TAG: json.dumps(k8s, sort_keys=True),
    }


# A collection run over a batch of 10 clusters of 100 nodes: ~16 CPU-seconds with its start, about
# 0.8 core while it works, 370-540 MiB (docs/SCALING.md); a run longer than 15 minutes is stuck. The automation sensor's runs (views of
# a cluster after a manual run) are runs of the same assets.
# A run whose worker died is run again; a failed batch is not (its healthy clusters are written, and
# the schedule's next tick runs the failing cluster alone, with the op's retries: defs/batches.py).
COLLECTION_RUN_TAGS = run_tags(
    max_runtime_seconds=900,
    max_retries=RUN_RETRIES,
    resources={"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
)
# A container_events run applies a batch of clusters' new events; the sensor asks again for what a
# failed run left (a failing cluster alone, once a minute).
CONTAINER_EVENTS_RUN_TAGS = run_tags(max_runtime_seconds=900, max_retries=RUN_RETRIES)
# Retention deletes in bounded batches; a catch-up after a long stop may take a while.
RETENTION_RUN_TAGS = run_tags(max_runtime_seconds=3600)
# An hourly history run recomputes a batch of (cluster, hour) partitions from Prometheus range
# queries; one at a time (`lens/history` in the run queue), so a week's backfill of a new cluster
# never crowds out the collection runs. A run whose worker died is run again; the automation asks
# again for a (cluster, hour) that failed.
HISTORY_TAG = "lens/history"
HISTORY_RUN_TAGS = {
    **run_tags(
        max_runtime_seconds=900,
        max_retries=RUN_RETRIES,
        resources={"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
    ),
    HISTORY_TAG: "hourly",
}
