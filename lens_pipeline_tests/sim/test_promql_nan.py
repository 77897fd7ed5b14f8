"""A GPU whose exporter reports NaN (it could not read the counter) or an impossible percentage
(1e6, -3: a broken counter) is left out of the means and sums the pipeline asks for, on both
vendors, as Prometheus itself evaluates them (promtool's unit test runner is the real PromQL engine;
it ships in Debian's `prometheus` package).

Without the `>= 0 <= 100` filter one NaN series turns a node's, a pod's and the cluster's mean into
NaN, which the readers then drop (a cluster at 50 % reads as unknown), and one 1e6 turns it into a
figure no column can hold.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from lens_pipeline.vendors import AMD, NVIDIA, VendorProfile
from lens_pipeline_tests.conftest import skip_unless

IDLE_BELOW = 5.0


def _series(profile: VendorProfile, gpu: int, values: str) -> dict:
    labels = {
        profile.node_label: "node-1",
        profile.gpu_index_label: str(gpu),
        profile.pod_label: "trainer-0",
        profile.namespace_label: "team-a",
    }
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{profile.util_metric}{{{text}}}", "values": values}


def _expect(query: str, value: float, labels: str = "{}") -> dict:
    return {"expr": query, "eval_time": "2m", "exp_samples": [{"labels": labels, "value": value}]}


@pytest.mark.parametrize("profile", [AMD, NVIDIA], ids=lambda p: p.name)
def test_nan_and_impossible_gpus_leave_the_means_of_the_others_alone(profile: VendorProfile, tmp_path):
    promtool = shutil.which("promtool")
    skip_unless(promtool is not None, "Debian's prometheus (promtool) is not installed")
    total, count = profile.utilization_sum_queries()
    pod_sum, pod_count, pod_idle = profile.pod_utilization_queries(IDLE_BELOW)
    pod = f'{{{profile.namespace_label}="team-a", {profile.pod_label}="trainer-0"}}'
    tests = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    _series(profile, 0, "50x5"),
                    _series(profile, 1, "2x5"),
                    _series(profile, 2, "NaN NaN NaN NaN NaN NaN"),
                    _series(profile, 3, "1e6x5"),
                    _series(profile, 4, "-3x5"),
                ],
                "promql_expr_test": [
                    _expect(f"({total}) / ({count})", 26),
                    _expect(count, 2),
                    _expect(profile.node_utilization_query(), 26, f'{{{profile.node_label}="node-1"}}'),
                    _expect(pod_sum, 52, pod),
                    _expect(pod_count, 2, pod),
                    _expect(pod_idle, 1, pod),
                ],
            }
        ],
    }
    path = tmp_path / "nan.yml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
