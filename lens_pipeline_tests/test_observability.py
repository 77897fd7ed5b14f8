"""The observability pack (deploy/components/monitoring) against a real Prometheus (Debian's).

Rendered by `kubectl kustomize`, its PrometheusRule's groups pass `promtool check rules`, its alerts
fire as meant (`promtool test rules`), and a real Prometheus scraping a running `lens api` (over a
Lens database with a collected cluster), `lens ingest` (fed by simulated node agents) and `lens
watch` (keeping the cluster's nodes) answers
every recording rule, the measured side of every alert, and every PromQL expression of the Grafana
dashboard with data. CI installs `prometheus` and `kubectl`; there this test must not skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from dagster import instance_for_test

from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.kube.cache import WARM
from lens_pipeline.sim.agent_feed import feed_forever
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.event_log import quarantine
from lens_pipeline_tests.conftest import skip_unless
from lens_pipeline_tests.defs.support import served_fleet
from lens_pipeline_tests.defs.test_derived_against_truth import run_cluster
from lens_pipeline_tests.ingest.support import container_id, gpu_container
from lens_pipeline_tests.ports import free_port
from lens_pipeline_tests.test_deploy import rendered_overlay

BIN = Path(sys.executable).parent
DEADLINE_SECONDS = 60
# The measured side of an alert: what its threshold compares (`<series> <op> <number>`).
COMPARISON = re.compile(r"^(?P<measured>.+?)\s*(==|!=|>=|<=|>|<)\s*[0-9.]+$", re.DOTALL)

# promtool's unit tests of the alert logic: a cluster that stops being collected, ingest lag, a
# collection the watch cache stops serving, and GPU nodes that turn faulty.
ALERT_TESTS = {
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                # Cluster a's timestamp stops at 0; b's follows the clock: only a is stale.
                {
                    "series": 'lens_cluster_last_collected_timestamp_seconds{cluster="a",asset="gpu_nodes"}',
                    "values": "0x30",
                },
                {
                    "series": 'lens_cluster_last_collected_timestamp_seconds{cluster="b",asset="gpu_nodes"}',
                    "values": "0+60x30",
                },
                # Cluster b starts no container: its container_events is never materialized again,
                # which is no stale collection (LensIngestLagging watches the events that wait).
                {
                    "series": 'lens_cluster_last_collected_timestamp_seconds{cluster="b",asset="container_events"}',
                    "values": "0x30",
                },
                # Agents that name no cluster: 40 events wait for "default", which no registry lists.
                {"series": 'lens_container_events_unregistered{cluster="default"}', "values": "0x5 40x25"},
                {"series": 'lens_container_events_lag_seconds{cluster="a"}', "values": "0+60x30"},
                {"series": 'lens_container_events_lag_seconds{cluster="b"}', "values": "0x30"},
                # lens watch stops serving cluster a's pods; b's stay served.
                {"series": 'lens_watch_cache_served{cluster="a",path="/api/v1/pods"}', "values": "0x30"},
                {"series": 'lens_watch_cache_served{cluster="b",path="/api/v1/pods"}', "values": "1x30"},
                # lens watch refuses no request for 10 minutes, then three a minute (a run a minute
                # of three clusters with a token it does not accept).
                {"series": "lens_watch_cache_unauthorized_total", "values": "0x10 3+3x20"},
                # Two of cluster a's GPU nodes turn faulty at 10m; b's stay healthy.
                {"series": 'lens_cluster_gpu_nodes{cluster="a",state="faulty"}', "values": "0x10 2x20"},
                {"series": 'lens_cluster_gpu_nodes{cluster="b",state="faulty"}', "values": "0x30"},
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "LensClusterCollectionStale", "exp_alerts": []},
                {
                    "eval_time": "15m",
                    "alertname": "LensClusterCollectionStale",
                    "exp_alerts": [
                        {"exp_labels": {"severity": "warning", "cluster": "a", "asset": "gpu_nodes"}}
                    ],
                },
                {"eval_time": "10m", "alertname": "LensIngestLagging", "exp_alerts": []},
                {
                    "eval_time": "20m",
                    "alertname": "LensIngestLagging",
                    "exp_alerts": [{"exp_labels": {"severity": "warning", "cluster": "a"}}],
                },
                {"eval_time": "5m", "alertname": "LensWatchCacheNotServing", "exp_alerts": []},
                {
                    "eval_time": "15m",
                    "alertname": "LensWatchCacheNotServing",
                    "exp_alerts": [
                        {"exp_labels": {"severity": "warning", "cluster": "a", "path": "/api/v1/pods"}}
                    ],
                },
                {"eval_time": "10m", "alertname": "LensWatchCacheRefusingRuns", "exp_alerts": []},
                {"eval_time": "14m", "alertname": "LensWatchCacheRefusingRuns", "exp_alerts": []},
                {
                    "eval_time": "20m",
                    "alertname": "LensWatchCacheRefusingRuns",
                    "exp_alerts": [{"exp_labels": {"severity": "warning"}}],
                },
                {"eval_time": "15m", "alertname": "LensIngestUnregisteredCluster", "exp_alerts": []},
                {
                    "eval_time": "25m",
                    "alertname": "LensIngestUnregisteredCluster",
                    "exp_alerts": [{"exp_labels": {"severity": "warning", "cluster": "default"}}],
                },
                {"eval_time": "20m", "alertname": "LensGpuNodesFaulty", "exp_alerts": []},
                {
                    "eval_time": "26m",
                    "alertname": "LensGpuNodesFaulty",
                    "exp_alerts": [{"exp_labels": {"severity": "warning", "cluster": "a"}}],
                },
            ],
        }
    ],
}


def _alert_tests(groups: list[dict]) -> dict:
    """ALERT_TESTS with each firing alert's annotations: its summary as templated for the test's
    series, its description as the rule says."""
    summaries = {
        "LensClusterCollectionStale": "gpu_nodes of cluster a not collected for 15m 0s",
        "LensIngestLagging": "container events of cluster a wait 20m 0s to be applied",
        "LensWatchCacheNotServing": "lens watch has not served /api/v1/pods of cluster a for 10 minutes",
        "LensWatchCacheRefusingRuns": "lens watch refused 30 requests for their bearer token in 10 minutes",
        "LensGpuNodesFaulty": "2 GPU nodes of cluster a are faulty",
        "LensIngestUnregisteredCluster": "40 container events wait for cluster default, which the registry does not list",
    }
    descriptions = {
        r["alert"]: r["annotations"].get("description") for g in groups for r in g["rules"] if "alert" in r
    }
    tests = json.loads(json.dumps(ALERT_TESTS))
    for case in tests["tests"][0]["alert_rule_test"]:
        for alert in case["exp_alerts"]:
            name = case["alertname"]
            alert["exp_annotations"] = {"summary": summaries[name], "description": descriptions[name]}
    return tests


def _pack(tmp_path: Path) -> tuple[list[dict], dict]:
    """The PrometheusRule's groups and the dashboard, as `kubectl kustomize` renders them."""
    documents = rendered_overlay(tmp_path / "overlay", components=["monitoring"])
    (rule,) = [d for d in documents if d["kind"] == "PrometheusRule"]
    (board,) = [
        d for d in documents if d["kind"] == "ConfigMap" and "lens-pipeline.json" in d.get("data", {})
    ]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    (monitor,) = [d for d in documents if d["kind"] == "ServiceMonitor"]
    services = [d for d in documents if d["kind"] == "Service"]
    selected = [
        s
        for s in services
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert {s["metadata"]["name"] for s in selected} == {"lens-api", "lens-ingest", "lens-watch"}
    for service in selected:  # the endpoint's port is one each Service has
        assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    return rule["spec"]["groups"], json.loads(board["data"]["lens-pipeline.json"])


def _promtool(*args: str, cwd: Path) -> None:
    promtool = shutil.which("promtool")
    done = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=60)  # type: ignore[list-item]
    assert done.returncode == 0, done.stdout + done.stderr


def _panel_expressions(board: dict) -> list[str]:
    """Every PromQL expression of the dashboard, its variables given values (all clusters)."""
    panels = [p for p in board["panels"] if p["type"] != "row"]
    expressions = [t["expr"] for p in panels for t in p["targets"]]
    assert len(expressions) >= len(panels) > 10
    return [e.replace("$cluster", ".*").replace("$__rate_interval", "10s") for e in expressions]


def _query(base: str, expression: str) -> list[Any]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    with urllib.request.urlopen(url, timeout=5) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", (expression, answer)
    return answer["data"]["result"]


def _all_kept(metrics_port: int) -> bool:
    """Whether lens watch has listed all it keeps from its start, and serves every collection."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        lines = response.read().decode().splitlines()
    served = [line for line in lines if line.startswith("lens_watch_cache_served{")]
    return (
        "lens_watch_cache_warm_queued 0" in lines and bool(served) and all(s.endswith(" 1") for s in served)
    )


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _start(command: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _wait_http(process: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while _safe_status(url) != 200:
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.3)


def _safe_status(url: str) -> int:
    try:
        return _get(url)
    except OSError:
        return 0


def test_the_rules_and_every_dashboard_panel_return_data_from_a_real_prometheus(tmp_path):
    prometheus = shutil.which("prometheus")
    skip_unless(
        prometheus is not None and shutil.which("promtool") is not None,
        "Debian's prometheus is not installed",
    )
    groups, board = _pack(tmp_path)
    # Evaluated every second here (30 s in the cluster), so the recorded series exist at once.
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{**g, "interval": "1s"} for g in groups]}))
    _promtool("check", "rules", "rules.yml", cwd=tmp_path)
    # Groups evaluated at the same instant run in no set order unless told: the alerts read the
    # recorded series of this instant, not of the one before (`14m` for `15m` otherwise, now and then).
    order = [g["name"] for g in groups]
    (tmp_path / "alerts_test.yml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yml"], "group_eval_order": order, **_alert_tests(groups)})
    )
    _promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)

    lens_url = f"sqlite:///{tmp_path / 'lens.db'}"
    env = {
        **os.environ,
        "LENS_DATABASE_URL": lens_url,
        "LENS_SAFE_DATABASE_URL": f"sqlite:///{tmp_path / 'safe.db'}",
    }
    processes: list[subprocess.Popen] = []
    stopped = threading.Event()
    with served_fleet(tmp_path, clusters=1, nodes=4, seed=11, vendor="amd") as (fleet, _server, registry):
        (cluster,) = [c.name for c in fleet]
        with instance_for_test() as instance:
            instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [cluster])
            run_cluster(cluster, registry, lens_url, env["LENS_SAFE_DATABASE_URL"], instance)
        with get_engine(lens_url).begin() as conn:  # one event set aside, as processing does
            quarantine(
                conn, "processing", [({"cluster_name": cluster, "payload": b"\x00"}, "does not decode")]
            )
        # lens api knows the registry: what it does not list (the agents' "default") is said apart.
        env["LENS_CLUSTERS_FILE"] = str(registry)
        try:
            api_port, grpc_port, http_port, prom_port = free_port(), free_port(), free_port(), free_port()
            processes.append(
                _start([str(BIN / "lens"), "api", "--port", str(api_port)], env, tmp_path / "api.log")
            )
            _wait_http(processes[-1], f"http://127.0.0.1:{api_port}/healthz", tmp_path / "api.log")
            ingest = [
                str(BIN / "lens"),
                "ingest",
                "--grpc-port",
                str(grpc_port),
                "--http-port",
                str(http_port),
            ]
            processes.append(_start(ingest, env, tmp_path / "ingest.log"))
            _wait_http(processes[-1], f"http://127.0.0.1:{http_port}/healthz", tmp_path / "ingest.log")
            watch_port, watch_metrics = free_port(), free_port()
            watch = [str(BIN / "lens"), "watch", "--registry", str(registry), "--port", str(watch_port)]
            processes.append(
                _start([*watch, "--metrics-port", str(watch_metrics)], env, tmp_path / "watch.log")
            )
            _wait_http(processes[-1], f"http://127.0.0.1:{watch_metrics}/healthz", tmp_path / "watch.log")
            # It keeps every cluster's nodes, pods and owner kinds from the start, before a run asks.
            nodes_url = f"http://127.0.0.1:{watch_port}/clusters/{cluster}/api/v1/nodes"
            deadline = time.monotonic() + 30
            while _get(nodes_url) != 200 or not _all_kept(watch_metrics):
                assert time.monotonic() < deadline, (tmp_path / "watch.log").read_text()[-2000:]
                time.sleep(0.2)
            feeder = threading.Thread(
                target=feed_forever, args=(fleet, f"127.0.0.1:{grpc_port}", 0.5, stopped), daemon=True
            )
            feeder.start()
            # Traffic the API and ingest panels show: answers and a 404, and one refused event.
            for path in (
                f"/v1/clusters/overview?cluster={cluster}",
                f"/v1/nodes?cluster={cluster}",
                "/v1/nodes?cluster=gone",
            ):
                _get(f"http://127.0.0.1:{api_port}{path}")
            refused = urllib.request.Request(
                f"http://127.0.0.1:{http_port}/v1/container-events", data=b"{not json"
            )
            assert _get_request(refused) == 400
            # An agent that names no cluster: its event goes to lens ingest's default cluster,
            # "default", which the registry does not list (the unregistered-cluster alert's data).
            unnamed = {
                "type": "Running",
                "source": "k8s",
                "node": "node-h",
                "container_id": container_id(1),
                "data": gpu_container(1, "Running"),
            }
            stray = urllib.request.Request(
                f"http://127.0.0.1:{http_port}/v1/container-events",
                data=json.dumps(unnamed).encode(),
                headers={"Content-Type": "application/json"},
            )
            assert _get_request(stray) == 200
            # lens api writes a JSON line per request to its standard output (once the answer is
            # sent: the last line may come a moment after its answer).
            deadline = time.monotonic() + 10
            while True:
                text = (tmp_path / "api.log").read_text()
                lines = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
                if {(x["path"], x["status"]) for x in lines} >= {("/v1/nodes", 200), ("/v1/nodes", 404)}:
                    break
                assert time.monotonic() < deadline, lines
                time.sleep(0.1)

            config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(tmp_path / "rules.yml")],
                "scrape_configs": [
                    {"job_name": "lens-api", "static_configs": [{"targets": [f"127.0.0.1:{api_port}"]}]},
                    {"job_name": "lens-ingest", "static_configs": [{"targets": [f"127.0.0.1:{http_port}"]}]},
                    {
                        "job_name": "lens-watch",
                        "static_configs": [{"targets": [f"127.0.0.1:{watch_metrics}"]}],
                    },
                ],
            }
            (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
            processes.append(
                _start(
                    [
                        prometheus,  # type: ignore[list-item]
                        f"--config.file={tmp_path / 'prometheus.yml'}",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}",
                        "--log.level=warn",
                    ],
                    env,
                    tmp_path / "prometheus.log",
                )
            )
            base = f"http://127.0.0.1:{prom_port}"
            _wait_http(processes[-1], f"{base}/-/ready", tmp_path / "prometheus.log")

            rules = [r for g in groups for r in g["rules"]]
            measured = {r.get("record") or r["alert"]: r["expr"] for r in rules if "record" in r}
            for rule in (r for r in rules if "alert" in r):
                match = COMPARISON.match(rule["expr"].strip())
                assert match, rule["alert"]
                measured[rule["alert"]] = match["measured"]
            expressions = {**measured, **{f"panel: {e}": e for e in _panel_expressions(board)}}
            empty = dict(expressions)
            deadline = time.monotonic() + DEADLINE_SECONDS
            while empty and time.monotonic() < deadline:
                empty = {name: e for name, e in empty.items() if not _query(base, e)}
                time.sleep(1)
            assert not empty, (
                f"no data from {sorted(empty)}\n" + (tmp_path / "ingest.log").read_text()[-2000:]
            )

            # Prometheus evaluates every rule itself without error.
            with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=5) as response:
                loaded = [r for g in json.loads(response.read())["data"]["groups"] for r in g["rules"]]
            assert len(loaded) == len(rules)
            assert all(r["health"] == "ok" for r in loaded), [r for r in loaded if r["health"] != "ok"]
            # The figures are the database's: the allocation ratio is the overview's, lag is growing.
            (ratio,) = _query(base, f'lens_gpu_allocation_ratio{{cluster="{cluster}"}}')
            assert 0 <= float(ratio["value"][1]) <= 1
            (lag,) = _query(base, f'lens:container_events_lag_seconds:max{{cluster="{cluster}"}}')
            assert float(lag["value"][1]) > 0  # no container_events run applies them here
            # lens watch keeps the nodes, the pods and the owner kinds the cluster serves (those it
            # does not serve are let go, not reported unserved), all served.
            served = {
                s["metric"]["path"]: s["value"][1]
                for s in _query(base, f'lens:watch_cache_served:min{{cluster="{cluster}"}}')
            }
            assert set(served.values()) == {"1"} and set(served) <= set(WARM), served
            assert {"/api/v1/nodes", "/api/v1/pods", "/apis/apps/v1/replicasets"} <= set(served)
            assert "/apis/jobset.x-k8s.io/v1alpha2/jobsets" not in served
            # The objects are served on their own port only.
            assert _get(f"http://127.0.0.1:{watch_metrics}/clusters/{cluster}/api/v1/nodes") == 404
        finally:
            stopped.set()
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)
            for process in processes:
                process.wait(timeout=30)


def _get_request(request: urllib.request.Request) -> int:
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
