"""The simulator over real HTTP: the official kubernetes and Prometheus clients read it like a real
cluster, and its ground truth follows every mutation."""

from __future__ import annotations

import json
import math
import os
import re
import stat
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from prometheus_api_client import PrometheusConnect

from lens_pipeline.sim import SimCluster, SimFleet, SimServer, promql, write_registry
from lens_pipeline.sim.fleet import GENERATION_EPOCH
from lens_pipeline.sim.kubeobjects import parse_time, rfc3339
from lens_pipeline_tests.sim.support import COLLECTIONS, continue_token, http

SEED = 11


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimFleet, SimServer, Path]]:
    """A read-only fleet shared by the tests that do not mutate it."""
    fleet = SimFleet.generate(clusters=2, nodes=12, seed=SEED, vendor="mixed")
    registry = tmp_path_factory.mktemp("sim") / "clusters.yaml"
    with SimServer(fleet) as server:
        write_registry(registry, server)
        yield fleet, server, registry


@pytest.fixture
def mutable(tmp_path: Path) -> Iterator[tuple[SimCluster, SimServer, Path]]:
    """A fresh one-cluster fleet for tests that change it."""
    fleet = SimFleet.generate(clusters=1, nodes=6, seed=SEED, vendor="amd")
    registry = tmp_path / "clusters.yaml"
    with SimServer(fleet) as server:
        write_registry(registry, server)
        yield fleet.clusters[0], server, registry


def _core(registry: Path, name: str) -> client.CoreV1Api:
    api = config.new_client_from_config(
        config_file=str(registry.parent / "kubeconfigs" / f"{name}.yaml"), context=name
    )
    return client.CoreV1Api(api)


_http = http  # the one request helper of the simulator tests


def _page_all(list_page: Any, **kwargs: Any) -> tuple[list[str], int]:
    """Names of every item over all pages, and the number of pages, through raw JSON as the pipeline reads."""
    names, pages, token = [], 0, None
    while True:
        response = list_page(limit=3, _continue=token, _preload_content=False, **kwargs)
        document = json.loads(response.data)
        pages += 1
        names += [
            f"{item['metadata'].get('namespace', '')}/{item['metadata']['name']}".lstrip("/")
            for item in document["items"]
        ]
        token = document["metadata"].get("continue")
        if not token:
            return names, pages


def _truth(server: SimServer, name: str) -> dict[str, Any]:
    status, truth = _http(f"{server.base_url(name)}/_truth")
    assert status == 200
    return truth


def _control(server: SimServer, cluster_name: str, /, **command: Any) -> tuple[int, Any]:
    return _http(f"{server.base_url(cluster_name)}/_control", body=command)


# -- the Kubernetes API ------------------------------------------------------------------------


def test_paging_with_the_official_client_returns_every_object_exactly_once(served) -> None:
    fleet, _, registry = served
    cluster = fleet.cluster("sim-amd-0")
    core = _core(registry, "sim-amd-0")
    cluster.request_log.reset()

    nodes, node_pages = _page_all(core.list_node)
    pods, pod_pages = _page_all(core.list_pod_for_all_namespaces)

    expected_nodes = sorted(n["metadata"]["name"] for n in cluster.truth_inputs()[0])
    expected_pods = sorted(
        f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in cluster.truth_inputs()[1]
    )
    assert nodes == expected_nodes  # key order, no duplicates, nothing missing
    assert pods == expected_pods
    assert node_pages == math.ceil(len(nodes) / 3)
    assert pod_pages == math.ceil(len(pods) / 3)
    assert cluster.request_count("/api/v1/nodes") == node_pages
    assert cluster.request_count("/api/v1/pods") == pod_pages


def test_typed_models_of_the_official_client_accept_the_objects(served) -> None:
    fleet, _, registry = served
    core = _core(registry, "sim-nvidia-1")
    first = core.list_node(limit=5)
    assert len(first.items) == 5
    assert first.metadata.remaining_item_count == len(fleet.cluster("sim-nvidia-1").truth_inputs()[0]) - 5
    rest = core.list_node(limit=100, _continue=continue_token(first.metadata))
    gpu_nodes = [n for n in first.items + rest.items if "nvidia.com/gpu" in (n.status.capacity or {})]
    assert len(gpu_nodes) == 12
    assert {n.status.capacity["nvidia.com/gpu"] for n in gpu_nodes} == {"8"}
    assert all(n.metadata.labels["nvidia.com/gpu.product"].startswith("NVIDIA-") for n in gpu_nodes)
    pods = core.list_pod_for_all_namespaces(limit=500)
    assert pods.items and any(p.metadata.owner_references for p in pods.items)
    # Only the `kubectl run`-style debug pods belong to nobody.
    assert all(
        p.metadata.name.startswith("gpu-debug-") for p in pods.items if not p.metadata.owner_references
    )
    assert client.VersionApi(core.api_client).get_code().git_version.startswith("v1.")


def test_continued_pages_come_from_the_snapshot_of_the_first_page(mutable) -> None:
    cluster, _, registry = mutable
    core = _core(registry, cluster.name)
    first = json.loads(core.list_node(limit=3, _preload_content=False).data)
    last_node = cluster.node_names()[-1]
    cluster.remove_node(last_node)

    rest = json.loads(core.list_node(_continue=first["metadata"]["continue"], _preload_content=False).data)
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert last_node in [n["metadata"]["name"] for n in rest["items"]]
    fresh = json.loads(core.list_node(_preload_content=False).data)
    assert last_node not in [n["metadata"]["name"] for n in fresh["items"]]
    assert int(fresh["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])


def test_expired_continue_token_answers_410(mutable) -> None:
    cluster, _, registry = mutable
    core = _core(registry, cluster.name)
    token = continue_token(core.list_node(limit=2).metadata)
    cluster.expire_continue_tokens()
    with pytest.raises(client.ApiException) as raised:
        core.list_node(limit=2, _continue=token)
    assert raised.value.status == 410
    status = json.loads(raised.value.body)
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Expired", 410)
    assert status["message"].startswith("The provided continue parameter is too old")
    assert core.list_node(limit=2).items  # a fresh list works


def test_continue_tokens_expire_after_their_ttl() -> None:
    now = [1_800_000_000.0]
    cluster = SimCluster("ttl", "nvidia", 4, SEED, continue_ttl=60, clock=lambda: now[0])
    with SimServer(SimFleet([cluster])) as server:
        url = f"{server.base_url('ttl')}/api/v1/nodes?limit=1"
        _, page = _http(url, cluster.token)
        now[0] += 30
        status, page = _http(f"{url}&continue={page['metadata']['continue']}", cluster.token)
        assert status == 200
        now[0] += 61
        status, body = _http(f"{url}&continue={page['metadata']['continue']}", cluster.token)
        assert (status, body["reason"]) == (410, "Expired")


def test_field_and_label_selectors_filter_like_the_api_server(served) -> None:
    fleet, _, registry = served
    cluster = fleet.cluster("sim-amd-0")
    core = _core(registry, "sim-amd-0")
    nodes, pods = cluster.truth_inputs()[:2]
    node = "sim-amd-0-gpu-00003"

    on_node, _ = _page_all(core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
    assert on_node == sorted(cluster.pods_on_node(node)) and on_node

    running_elsewhere = core.list_pod_for_all_namespaces(
        field_selector=f"status.phase=Running,spec.nodeName!={node}"
    ).items
    expected = [p for p in pods if p["status"]["phase"] == "Running" and p["spec"].get("nodeName") != node]
    assert len(running_elsewhere) == len(expected)

    mi325 = core.list_node(label_selector="amd.com/gpu.product-name=AMD_Instinct_MI325X_OAM").items
    expected_mi325 = [
        n for n in nodes if n["metadata"]["labels"].get("amd.com/gpu.product-name", "").endswith("MI325X_OAM")
    ]
    assert len(mi325) == len(expected_mi325)
    with_gpus = core.list_node(label_selector="amd.com/gpu.product-name").items
    without_gpus = core.list_node(label_selector="!amd.com/gpu.product-name").items
    assert (len(with_gpus), len(without_gpus)) == (12, 2)
    zones = core.list_node(
        label_selector="topology.kubernetes.io/zone in (zone-0, zone-1),kubernetes.io/os=linux"
    )
    assert 0 < len(zones.items) < len(nodes)

    namespaced = core.list_namespaced_pod("kube-amd-gpu", limit=5)
    assert {p.metadata.namespace for p in namespaced.items} == {"kube-amd-gpu"}
    assert namespaced.metadata.remaining_item_count == 12 - 5


def test_errors_are_kubernetes_status_objects(served) -> None:
    fleet, server, registry = served
    core = _core(registry, "sim-amd-0")
    with pytest.raises(client.ApiException) as raised:
        core.read_node("sim-amd-0-gpu-99999")
    status = json.loads(raised.value.body)
    assert (raised.value.status, status["kind"], status["reason"]) == (404, "Status", "NotFound")
    assert status["details"] == {"name": "sim-amd-0-gpu-99999", "kind": "nodes"}

    code, body = _http(f"{server.base_url('sim-amd-0')}/api/v1/nodes")
    assert (code, body["kind"], body["reason"]) == (401, "Status", "Unauthorized")
    token = fleet.cluster("sim-amd-0").token
    code, body = _http(f"{server.base_url('sim-amd-0')}/api/v1/nodes", fleet.cluster("sim-nvidia-1").token)
    assert code == 401  # one cluster's token does not open another
    code, body = _http(f"{server.base_url('sim-amd-0')}/api/v1/nodes?fieldSelector=spec.bogus%3D1", token)
    assert (code, body["reason"], body["message"]) == (
        400,
        "BadRequest",
        "field label not supported: spec.bogus",
    )
    code, body = _http(f"{server.base_url('sim-amd-0')}/apis/apps/v1/controllerrevisions", token)
    assert (code, body["reason"]) == (404, "NotFound")
    code, body = _http(
        f"{server.base_url('sim-amd-0')}/apis/kubeflow.org/v1/namespaces/x/pytorchjobs/nope", token
    )
    assert (code, body["message"], body["details"]) == (
        404,
        'pytorchjobs.kubeflow.org "nope" not found',
        {"name": "nope", "group": "kubeflow.org", "kind": "pytorchjobs"},
    )


# -- Prometheus and the exporters --------------------------------------------------------------


def test_prometheus_client_gets_node_utilization_equal_to_the_truth(served) -> None:
    _, server, _ = served
    truth = {n["name"]: n for n in _truth(server, "sim-amd-0")["nodes"]}
    prometheus = PrometheusConnect(url=server.prometheus_url("sim-amd-0"), disable_ssl=True)

    result = prometheus.custom_query("avg by (hostname) (gpu_gfx_activity)")

    ready = {name for name, row in truth.items() if row["status"] == "Ready"}
    assert {series["metric"]["hostname"] for series in result} == ready
    assert len(result) == len(ready)
    for series in result:
        assert float(series["value"][1]) == truth[series["metric"]["hostname"]]["gpu_utilization"]
    assert all(row["gpu_utilization"] is None for name, row in truth.items() if name not in ready)

    trailing = prometheus.custom_query("avg(gpu_gfx_activity) by (hostname)")
    assert [s["value"][1] for s in trailing] == [s["value"][1] for s in result]


def test_dcgm_series_carry_pod_labels_only_when_allocated(served) -> None:
    fleet, server, _ = served
    cluster = fleet.cluster("sim-nvidia-1")
    prometheus = PrometheusConnect(url=server.prometheus_url("sim-nvidia-1"), disable_ssl=True)
    series = prometheus.custom_query('DCGM_FI_DEV_GPU_UTIL{Hostname=~"sim-nvidia-1-gpu-0000[1-4]"}')
    assert series and {s["metric"]["__name__"] for s in series} == {"DCGM_FI_DEV_GPU_UTIL"}
    for s in series:
        metric = s["metric"]
        assert metric["UUID"].startswith("GPU-") and metric["device"] == f"nvidia{metric['gpu']}"
        assert metric["modelName"].startswith("NVIDIA ") and metric["DCGM_FI_DRIVER_VERSION"] == "550.54.15"
        assert ("pod" in metric) == ("namespace" in metric) == ("container" in metric)
        if "pod" in metric:
            assert f"{metric['namespace']}/{metric['pod']}" in cluster.pods_on_node(metric["Hostname"])
    allocated = prometheus.custom_query('count(DCGM_FI_DEV_GPU_UTIL{pod!=""})')
    assert int(allocated[0]["value"][1]) == sum(
        "pod" in labels for _, labels, _ in cluster.exporter_samples()
    )


def test_metrics_endpoint_is_prometheus_text_exposition(served) -> None:
    fleet, server, _ = served
    status, text = _http(f"{server.base_url('sim-amd-0')}/metrics")
    assert status == 200
    lines = text.splitlines()
    assert lines[:2] == [
        "# HELP gpu_gfx_activity Graphics engine activity in percent",
        "# TYPE gpu_gfx_activity gauge",
    ]
    samples = [line for line in lines if not line.startswith("#")]
    gpus = sum(len(v) for v in fleet.cluster("sim-amd-0").gpu_utilization_samples().values())
    assert len([line for line in samples if line.startswith("gpu_gfx_activity{hostname=")]) == gpus
    for family in ("gpu_junction_temperature", "gpu_package_power", "gpu_total_vram", "gpu_used_vram"):
        assert f"# TYPE {family} gauge" in lines
        assert len([line for line in samples if line.startswith(family + "{")]) == gpus
    # One target per node and exporter, as a real Prometheus scrapes them.
    node = fleet.cluster("sim-amd-0").node_names()[0]
    status, per_node = _http(f"{server.base_url('sim-amd-0')}/metrics/device-metrics-exporter/{node}")
    assert status == 200 and per_node.count("gpu_gfx_activity{") == 8 and node in per_node
    assert all(f'hostname="{node}"' in line for line in per_node.splitlines() if not line.startswith("#"))
    status, nics = _http(f"{server.base_url('sim-amd-0')}/metrics/node-exporter/{node}")
    assert status == 200 and "# TYPE node_infiniband_port_data_received_bytes_total counter" in nics
    status, juicefs = _http(f"{server.base_url('sim-amd-0')}/metrics/juicefs")
    assert status == 200 and 'juicefs_used_space{vol_name="primus-data"' in juicefs


def test_prometheus_errors_are_bad_data(served) -> None:
    _, server, _ = served
    url = f"{server.prometheus_url('sim-amd-0')}/api/v1/query?query=quantile(0.5%2C%20gpu_gfx_activity)"
    status, body = _http(url)
    assert status == 400
    assert (body["status"], body["errorType"]) == ("error", "bad_data")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            'm{node="a"}',
            [
                ({"__name__": "m", "node": "a", "gpu": "0"}, 1.0),
                ({"__name__": "m", "node": "a", "gpu": "1"}, 3.0),
            ],
        ),
        ('m{node!="a",gpu=~"0|1"}', [({"__name__": "m", "node": "b", "gpu": "0", "pod": "p"}, 10.0)]),
        (
            'm{pod=""}',
            [
                ({"__name__": "m", "node": "a", "gpu": "0"}, 1.0),
                ({"__name__": "m", "node": "a", "gpu": "1"}, 3.0),
            ],
        ),
        ("sum by (node) (m)", [({"node": "a"}, 4.0), ({"node": "b"}, 10.0)]),
        ("max(m) by (node)", [({"node": "a"}, 3.0), ({"node": "b"}, 10.0)]),
        ("min without (gpu) (m)", [({"node": "a"}, 1.0), ({"node": "b", "pod": "p"}, 10.0)]),
        ("count(m)", [({}, 3.0)]),
        ("avg by (pod) (m)", [({}, 2.0), ({"pod": "p"}, 10.0)]),
        ('sum(avg by (node) (m{gpu!~"9"}))', [({}, 12.0)]),
        ("topk(1, avg by (node) (m))", [({"node": "b"}, 10.0)]),
        (
            "bottomk(2, m)",
            [
                ({"__name__": "m", "node": "a", "gpu": "0"}, 1.0),
                ({"__name__": "m", "node": "a", "gpu": "1"}, 3.0),
            ],
        ),
    ],
)
def test_promql_evaluator(query: str, expected: list[tuple[dict[str, str], float]]) -> None:
    series = [
        ({"__name__": "m", "node": "a", "gpu": "0"}, 1.0),
        ({"__name__": "m", "node": "a", "gpu": "1"}, 3.0),
        ({"__name__": "m", "node": "b", "gpu": "0", "pod": "p"}, 10.0),
        ({"__name__": "other", "node": "a"}, 99.0),
    ]
    assert promql.evaluate(query, series) == sorted(expected, key=lambda item: sorted(item[0].items()))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("sum(rate(c_total[1m]))", [({}, 3.0)]),
        ('irate(c_total{node="a"}[10s])', [({"node": "a"}, 2.0)]),
        ("sum(rate(m[5m]))", [({}, 0.0)]),  # a gauge that does not move
        ("count by (node) (m < 5)", [({"node": "a"}, 2.0)]),
        (
            "m >= 3",
            [({"__name__": "m", "node": "a", "gpu": "1"}, 3.0), ({"__name__": "m", "node": "b"}, 10.0)],
        ),
        (
            "m != 3",
            [({"__name__": "m", "node": "a", "gpu": "0"}, 1.0), ({"__name__": "m", "node": "b"}, 10.0)],
        ),
        ("count(m >= 2 <= 5)", [({}, 1.0)]),  # chained: each comparison filters in turn
        (  # one count per selector in one query: what PromReader.series_counts asks
            'label_replace(count(m{gpu!=""}), "s", "0", "", "") or label_replace(count(m{pod!=""}), "s", "1", "", "")'
            ' or label_replace(count(c_total{pod!=""}), "s", "2", "", "")',
            [({"s": "0"}, 2.0)],  # no series: no sample (m{pod!=""}, c_total{pod!=""})
        ),
        (
            'label_replace(m{gpu="1"}, "host", "$1-x", "node", "(.*)")',
            [({"__name__": "m", "node": "a", "gpu": "1", "host": "a-x"}, 3.0)],
        ),
        ('label_replace(m{gpu="1"}, "gpu", "", "node", "a")', [({"__name__": "m", "node": "a"}, 3.0)]),
        (
            'm{node="b"} or c_total',
            [({"__name__": "m", "node": "b"}, 10.0), ({"__name__": "c_total", "node": "a"}, 7200.0)],
        ),
    ],
)
def test_promql_rates_and_comparisons(query: str, expected: list[tuple[dict[str, str], float]]) -> None:
    series = [
        ({"__name__": "m", "node": "a", "gpu": "0"}, 1.0),
        ({"__name__": "m", "node": "a", "gpu": "1"}, 3.0),
        ({"__name__": "m", "node": "b"}, 10.0),
        ({"__name__": "c_total", "node": "a"}, 7200.0),
        ({"__name__": "c_total", "node": "b"}, 3600.0),
    ]
    rates = [({"__name__": "c_total", "node": "a"}, 2.0), ({"__name__": "c_total", "node": "b"}, 1.0)]
    assert promql.evaluate(query, series, rates) == sorted(expected, key=lambda item: sorted(item[0].items()))


@pytest.mark.parametrize(
    "query",
    [
        "",
        "{}",
        'm{node="a"',
        "sum by (node)",
        "m[5m]",
        "quantile(0.5, m)",
        "topk(m)",
        'm{a=~"("}',
        "rate(m)",
        "m < n",
    ],
)
def test_promql_rejects_what_it_does_not_support(query: str) -> None:
    with pytest.raises(promql.PromQLError):
        promql.evaluate(query, [])


@pytest.mark.parametrize(
    ("value", "text"), [(42.0, "42"), (0.5, "0.5"), (1e-05, "0.00001"), (math.nan, "NaN")]
)
def test_sample_values_format_like_prometheus(value: float, text: str) -> None:
    assert promql.format_value(value) == text


# -- determinism, truth and mutations ----------------------------------------------------------


def test_same_seed_serves_byte_identical_lists() -> None:
    def lists(seed: int) -> list[bytes]:
        fleet = SimFleet.generate(clusters=2, nodes=5, seed=seed, vendor="mixed")
        with SimServer(fleet) as server:
            out = []
            for cluster in fleet:
                for path in ("/api/v1/nodes", "/api/v1/pods", "/metrics", "/_truth"):
                    request = urllib.request.Request(
                        server.base_url(cluster.name) + path,
                        headers={"Authorization": f"Bearer {cluster.token}"},
                    )
                    with urllib.request.urlopen(request, timeout=10) as response:
                        out.append(response.read())
            return out

    first, second = lists(SEED), lists(SEED)
    assert first == second
    assert lists(SEED + 1)[:2] != first[:2]


def test_the_epoch_moves_every_generated_time_and_nothing_else() -> None:
    """A cluster generated as of an instant a day later (the demo's own `epoch`) is the same
    cluster with every time in it a day later: nothing made counts from the default epoch or
    from the clock. So are the names a CronJob gives its Jobs (`<cronjob>-<scheduled minute>`);
    container ids differ (the runtime names a container by its start)."""
    day = 86400.0
    clock = lambda: GENERATION_EPOCH + 3 * day  # noqa: E731
    options = {"pods_per_node": 4.0, "clock": clock}
    before = SimCluster("sim-amd-0", "amd", 24, SEED, **options)
    after = SimCluster("sim-amd-0", "amd", 24, SEED, epoch=GENERATION_EPOCH + day, **options)
    timestamp = re.compile(rb'"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"')
    container_id = re.compile(rb'"containerd://[0-9a-f]{64}"')
    scheduled_minute = re.compile(rb"-(\d{8})(?=[-\"/]|$)")

    def a_day_later(match: re.Match[bytes]) -> bytes:
        return b'"' + rfc3339(parse_time(match[1].decode()) + day).encode() + b'"'

    def moved(raw: bytes) -> bytes:
        raw = scheduled_minute.sub(lambda m: b"-%d" % (int(m[1]) + 1440), raw)
        return container_id.sub(b"", timestamp.sub(a_day_later, raw))

    times = 0
    for path, _ in COLLECTIONS:
        resource = path.rsplit("/", 1)[1]
        made = before.simulated_objects(resource)
        assert made, f"no {resource} generated"
        expected = [(moved(o.key.encode()), moved(o.raw)) for o in made]
        assert expected == [
            (o.key.encode(), container_id.sub(b"", o.raw)) for o in after.simulated_objects(resource)
        ]
        times += sum(len(timestamp.findall(o.raw)) for o in made)
    assert times > 1000
    newest = max(
        parse_time(t.decode()) for o in after.simulated_objects("pods") for t in timestamp.findall(o.raw)
    )
    # The generated world stands still after its epoch (the last pods end up to 80 s after it).
    assert newest <= GENERATION_EPOCH + day + 80


def test_truth_rows_have_the_node_table_shape(served) -> None:
    fleet, server, _ = served
    for cluster in fleet:
        truth = _truth(server, cluster.name)
        assert (truth["cluster"], truth["vendor"]) == (cluster.name, cluster.vendor)
        assert [n["name"] for n in truth["nodes"]] == cluster.node_names()
        for row in truth["nodes"]:
            assert set(row) == {
                "name", "address", "gpu_name", "gpu_count", "gpu_allocation", "gpu_utilization", "status",
                "k8s_status", "cpu", "cpu_count", "memory", "k8s_version", "kubelet_version",
                "containerd_version", "os", "driver_version", "taints", "labels", "annotations",
            }  # fmt: skip
            assert 0 <= row["gpu_allocation"] <= row["gpu_count"] == 8
            assert row["status"] == row["k8s_status"] in ("Ready", "NotReady", "Unknown")
            assert row["taints"] == {} or row["taints"]["taints"]


def test_truth_follows_mutations_over_control(mutable) -> None:
    cluster, server, registry = mutable
    name = cluster.name
    core = _core(registry, name)
    ready = [n["name"] for n in _truth(server, name)["nodes"] if n["status"] == "Ready"]
    node, other = ready[0], ready[1]

    assert _control(server, name, action="set_node_ready", name=node, ready=False)[0] == 200
    row = next(n for n in _truth(server, name)["nodes"] if n["name"] == node)
    assert (row["status"], row["k8s_status"], row["gpu_utilization"]) == ("NotReady", "NotReady", None)
    assert [t["key"] for t in row["taints"]["taints"]][-1] == "node.kubernetes.io/not-ready"
    assert [c.status for c in core.read_node(node).status.conditions if c.type == "Ready"] == ["False"]
    hosts = PrometheusConnect(url=server.prometheus_url(name)).custom_query(
        "count by (hostname) (gpu_gfx_activity)"
    )
    assert node not in {s["metric"]["hostname"] for s in hosts}

    before = next(n for n in _truth(server, name)["nodes"] if n["name"] == other)["gpu_allocation"]
    free = 8 - before
    if free:
        status, body = _control(
            server, name, action="add_gpu_pod", node=other, gpus=free, namespace="ml-train"
        )
        assert status == 200
        assert core.read_namespaced_pod(body["result"], "ml-train").spec.node_name == other
    after = next(n for n in _truth(server, name)["nodes"] if n["name"] == other)["gpu_allocation"]
    assert after == 8
    status, body = _control(server, name, action="add_gpu_pod", node=other, gpus=1)
    assert status == 400 and "free" in body["error"]  # the scheduler never over-allocates

    pod = cluster.pods_on_node(other)[0]
    namespace, pod_name = pod.split("/")
    assert _control(server, name, action="remove_node", name=other)[0] == 200
    assert other not in [n["name"] for n in _truth(server, name)["nodes"]]
    with pytest.raises(client.ApiException) as raised:
        core.read_namespaced_pod(pod_name, namespace)
    assert raised.value.status == 404
    assert _control(server, name, action="remove_node", name=other)[0] == 404


def test_pod_phase_changes_move_allocation(mutable) -> None:
    cluster, _, _ = mutable
    node = cluster.node_names()[-1]
    allocation = {row["name"]: row["gpu_allocation"] for row in cluster.truth()["nodes"]}
    free = 8 - allocation[node]
    if free == 0:
        cluster.remove_pod(*cluster.pods_on_node(node)[-1].split("/"))
        free = 8 - {r["name"]: r["gpu_allocation"] for r in cluster.truth()["nodes"]}[node]
    pod = cluster.add_gpu_pod(node, 1, phase="Pending")
    rv = cluster.pod("default", pod)["metadata"]["resourceVersion"]
    cluster.set_pod_phase("default", pod, "Running")
    assert cluster.pod("default", pod)["metadata"]["resourceVersion"] > rv
    assert any(labels.get("pod") == pod for _, labels, _ in cluster.exporter_samples())
    running = {r["name"]: r["gpu_allocation"] for r in cluster.truth()["nodes"]}[node]
    cluster.set_pod_phase("default", pod, "Succeeded")
    done = {r["name"]: r["gpu_allocation"] for r in cluster.truth()["nodes"]}[node]
    assert running - done == 1
    assert not any(labels.get("pod") == pod for _, labels, _ in cluster.exporter_samples())


def test_raw_nodes_are_served_verbatim_and_kept_out_of_the_truth(mutable) -> None:
    cluster, server, registry = mutable
    raw = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "broken-1"},
           "status": {"capacity": {"amd.com/gpu": "lots"}}}  # fmt: skip
    cluster.inject_raw_node(raw)
    cluster.inject_raw_node({"kind": "Node"})
    items = json.loads(_core(registry, cluster.name).list_node(_preload_content=False).data)["items"]
    assert raw in items and {"kind": "Node"} in items
    assert "broken-1" not in [n["name"] for n in cluster.truth()["nodes"]]
    status, body = _http(
        f"{server.base_url(cluster.name)}/api/v1/nodes?labelSelector=kubernetes.io/os", cluster.token
    )
    assert status == 200 and raw not in body["items"]


def test_faults_answer_every_call_until_cleared(mutable) -> None:
    cluster, server, registry = mutable
    core = _core(registry, cluster.name)
    prometheus = PrometheusConnect(url=server.prometheus_url(cluster.name), retry=None)
    assert _control(server, cluster.name, action="set_fault", target="kube", status=503)[0] == 200
    cluster.set_fault("prometheus", 500)
    with pytest.raises(client.ApiException) as raised:
        core.list_node(limit=1)
    assert raised.value.status == 503
    status, body = _http(f"{server.prometheus_url(cluster.name)}/api/v1/query?query=gpu_gfx_activity")
    assert (status, body["status"]) == (500, "error")
    cluster.set_fault("kube", None)
    _control(server, cluster.name, action="set_fault", target="prometheus", status=None)
    assert core.list_node(limit=1).items
    assert prometheus.custom_query("count(gpu_gfx_activity)")


def test_request_log_counts_calls_per_path(mutable) -> None:
    cluster, server, registry = mutable
    core = _core(registry, cluster.name)
    core.list_node()
    core.list_node(limit=2)
    core.list_namespaced_pod("default")
    status, log = _http(f"{server.base_url(cluster.name)}/_requests")
    assert status == 200
    assert log["counts"]["GET /api/v1/nodes"] == 2
    assert log["counts"]["GET /api/v1/namespaces/default/pods"] == 1
    assert "GET /api/v1/nodes?limit=2 200" in log["recent"]
    assert cluster.request_count("/api/v1/namespaces/") == 1
    assert _http(f"{server.base_url(cluster.name)}/_requests/reset", body={})[0] == 200
    assert cluster.request_count() == 0


def test_registry_and_kubeconfigs(served) -> None:
    fleet, server, registry = served
    document = yaml.safe_load(registry.read_text())
    assert document == {
        "clusters": [
            {
                "name": cluster.name,
                "kubeconfig": f"kubeconfigs/{cluster.name}.yaml",
                "context": cluster.name,
                "prometheus_url": f"{server.url}/clusters/{cluster.name}/prometheus",
                "vendor": cluster.vendor,
            }
            for cluster in fleet
        ]
    }
    assert "\n  - name: sim-amd-0\n" in registry.read_text()
    kubeconfig = registry.parent / "kubeconfigs" / "sim-amd-0.yaml"
    assert stat.S_IMODE(os.stat(kubeconfig).st_mode) == 0o600
    loaded = yaml.safe_load(kubeconfig.read_text())
    assert loaded["current-context"] == "sim-amd-0"
    assert loaded["clusters"][0]["cluster"]["server"] == server.base_url("sim-amd-0")
    assert loaded["users"][0]["user"]["token"] == fleet.cluster("sim-amd-0").token


def test_a_fleet_can_mix_cluster_sizes() -> None:
    from lens_pipeline.sim.cli import build_parser

    args = build_parser().parse_args(["--clusters", "3", "--nodes", "2,5"])
    fleet = SimFleet.generate(3, args.nodes, 1, "mixed")
    assert [len(c.node_names()) for c in fleet] == [2, 5, 2]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--nodes", "two"])


def test_before_recording_began_a_gpu_was_held_from_its_pods_binding_on() -> None:
    """A cluster generated as of its epoch and recording from a day later: asked for an earlier
    moment, its exporters show each GPU held by a pod already bound then, and free (reading 0)
    before, as the pods' lives have it."""
    day = 86400.0
    now = [GENERATION_EPOCH + day]
    cluster = SimCluster("sim-amd-0", "amd", 12, SEED, pods_per_node=4, history=True, clock=lambda: now[0])
    pod_label, namespace_label, _ = cluster.profile.workload_labels
    bound = {}
    for entry in cluster.simulated_objects("pods"):
        pod = entry.obj
        for condition in pod["status"].get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition["status"] == "True":
                key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
                bound[key] = parse_time(condition["lastTransitionTime"])

    def holders(at: float) -> dict[tuple[str, str], list[float]]:
        held: dict[tuple[str, str], list[float]] = {}
        for _, labels, value in cluster.exporter_samples(at):
            if labels.get(pod_label):
                held.setdefault((labels[namespace_label], labels[pod_label]), []).append(value)
        return held

    def free_sum(at: float) -> float:
        return sum(value for _, labels, value in cluster.exporter_samples(at) if not labels.get(pod_label))

    held_now = holders(now[0])
    assert len(held_now) > 10 and sum(map(len, held_now.values())) > 40
    first_bound = min(bound[pod] for pod in held_now)
    counts = set()
    for at in sorted({*(bound[pod] for pod in held_now), first_bound - day, GENERATION_EPOCH}):
        for moment in (at - 1, at):
            then = holders(moment)
            assert then == {pod: gpus for pod, gpus in held_now.items() if bound[pod] <= moment}, moment
            counts.add(len(then))
    assert min(counts) == 0 and max(counts) == len(held_now)
    assert free_sum(first_bound - 1) == free_sum(now[0])  # a GPU not yet held read 0


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        ("2026-01-01", datetime(2026, 1, 1, tzinfo=UTC).timestamp()),
        ("2026-01-01T02:00:00+02:00", datetime(2026, 1, 1, tzinfo=UTC).timestamp()),
        ("3000-01-01", None),  # not past
        ("last week", None),
    ],
)
def test_lens_sim_generates_as_of_the_epoch_it_is_given(text: str, epoch: float | None) -> None:
    from lens_pipeline.sim.cli import build_parser

    assert build_parser().parse_args([]).epoch == GENERATION_EPOCH
    if epoch is None:
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--epoch", text])
    else:
        assert build_parser().parse_args(["--epoch", text]).epoch == epoch


def test_lens_sim_advertises_gpus_under_the_resource_it_is_given() -> None:
    from lens_pipeline.sim.cli import build_parser

    args = build_parser().parse_args(
        ["--gpu-resource", "nvidia=nvidia.com/mig-3g.40gb", "--gpu-resource", "amd=amd.com/cpx_nps4"]
    )
    assert dict(args.gpu_resource) == {"nvidia": "nvidia.com/mig-3g.40gb", "amd": "amd.com/cpx_nps4"}
    for bad in ("nvidia=amd.com/cpx_nps4", "amd=amd.com/xgmi", "intel=gpu.intel.com/i915", "nvidia"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--gpu-resource", bad])
    with pytest.raises(ValueError, match="not a nvidia GPU resource"):
        SimCluster("sim-x", "nvidia", 1, seed=1, gpu_resource="example.com/gpu")

    cluster = SimCluster("sim-shared", "nvidia", 4, seed=3, gpu_resource="nvidia.com/gpu.shared")
    # Still the vendor's rule: its whole GPUs and MIG instances are GPUs of the truth too.
    assert all(map(cluster.profile.counts_as_gpus, ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb")))
    assert not cluster.profile.counts_as_gpus("amd.com/gpu")
    snapshot = cluster.truth_snapshot().objects
    capacities = [e.obj["status"]["capacity"] for e in snapshot["nodes"]]
    assert any("nvidia.com/gpu.shared" in c for c in capacities)
    assert not any("nvidia.com/gpu" in c for c in capacities)
    limits = [c["resources"].get("limits", {}) for e in snapshot["pods"] for c in e.obj["spec"]["containers"]]
    assert any("nvidia.com/gpu.shared" in lim for lim in limits)
    assert not any("nvidia.com/gpu" in lim for lim in limits)
    # Every unit is a device the exporter reports, held by the pods the truth says hold it.
    truth = cluster.truth()
    assert sum(n["gpu_count"] for n in truth["nodes"]) == len(cluster.exporter_samples()) > 0
    assert sum(n["gpu_allocation"] for n in truth["nodes"]) > 0
