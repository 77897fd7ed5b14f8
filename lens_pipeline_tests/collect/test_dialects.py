"""Exporter dialects learned from a Prometheus' metric and label names, with the registry's
overrides: prefixes, `exported_*` labels, the node named only by `instance`, renamed labels."""

from __future__ import annotations

import pytest

from lens_pipeline.collect.overview import (
    StorageVolume,
    juicefs_inode_capacity,
    juicefs_space_capacity,
    storage_figures,
)
from lens_pipeline.collect.statistics import window_bounds
from lens_pipeline.vendors import AMD, JUICEFS, NVIDIA, ExporterOverrides, learn_dialect, learn_profile

AMD_LABELS = {"hostname", "gpu_id", "serial_number", "card_model", "card_series", "pod", "namespace"}
AMD_METRICS = {
    "gpu_gfx_activity",
    "gpu_junction_temperature",
    "gpu_package_power",
    "gpu_total_vram",
    "gpu_used_vram",
}


def labels_of(table: dict[str, set[str]]):
    return lambda metric: table.get(metric, set())


def test_shipped_names_are_learned_as_they_are():
    dialect = learn_dialect("auto", AMD_METRICS, labels_of({"gpu_gfx_activity": AMD_LABELS}))
    (amd,) = dialect.profiles
    assert amd == AMD and not dialect.missing and "infiniband" in dialect.found


def test_a_metric_prefix_is_found_from_the_utilization_metric():
    names = {f"amd_{m}" for m in AMD_METRICS} | {"amd_gpu_used_vram", "up"}
    (amd,) = learn_dialect("amd", names, labels_of({"amd_gpu_gfx_activity": AMD_LABELS})).profiles
    assert amd.util_metric == "amd_gpu_gfx_activity" and amd.metric_prefix == "amd_"
    assert amd.device_metrics == {f: f"amd_{m}" for f, m in AMD.device_metrics.items()}
    assert amd.node_utilization_query() == "avg by (hostname) (amd_gpu_gfx_activity >= 0 <= 100)"


def test_honor_labels_false_moves_the_pod_to_exported_labels():
    labels = AMD_LABELS | {"exported_pod", "exported_namespace", "exported_container", "container"}
    (amd,) = learn_dialect("amd", AMD_METRICS, labels_of({"gpu_gfx_activity": labels})).profiles
    assert (amd.pod_label, amd.namespace_label) == ("exported_pod", "exported_namespace")
    assert amd.pod_key({"exported_pod": "p", "exported_namespace": "ns", "pod": "exporter-x"}) == ("ns", "p")


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"Hostname", "gpu", "UUID"}, "Hostname"),  # dcgm-exporter 3.x and 4.x releases
        ({"hostname", "gpu", "UUID"}, "hostname"),  # after the rename (#655)
        ({"gpu", "UUID", "kubernetes_node", "instance"}, "kubernetes_node"),  # --no-hostname, relabelled
        ({"gpu", "UUID", "instance"}, "instance"),  # nothing but the scrape address
    ],
)
def test_the_node_label_is_the_first_one_present(labels, expected):
    nvidia = learn_profile(NVIDIA, {"DCGM_FI_DEV_GPU_UTIL"}, labels)
    assert nvidia.node_label == expected


def counts(current: dict[str, float], asked: list[list[str]]):
    def series_counts(selectors):
        asked.append(list(selectors))
        return {s: current.get(s, 0.0) for s in selectors}

    return series_counts


def test_a_name_still_in_the_lookback_loses_to_the_one_with_series_now():
    """Minutes after an exporter upgrade or a scrape config change, Prometheus lists the old names
    too: an AMD prefix just set, dcgm-exporter's `Hostname` renamed `hostname`, a relabelled
    `node` removed from node_exporter's targets. The names with series now win, in two queries."""
    names = AMD_METRICS | {f"amd_{m}" for m in AMD_METRICS} | {"DCGM_FI_DEV_GPU_UTIL", "node_infiniband_info"}
    table = {
        "amd_gpu_gfx_activity": AMD_LABELS | {"instance"},
        "DCGM_FI_DEV_GPU_UTIL": {"Hostname", "hostname", "gpu", "UUID", "instance"},
        "node_infiniband_info": {"node", "instance", "device"},
    }
    current = {
        "amd_gpu_gfx_activity": 64,
        'amd_gpu_gfx_activity{hostname!=""}': 64,
        'amd_gpu_gfx_activity{instance!=""}': 64,
        'DCGM_FI_DEV_GPU_UTIL{hostname!=""}': 16,
        'DCGM_FI_DEV_GPU_UTIL{instance!=""}': 16,
        'node_infiniband_info{instance!=""}': 8,
    }
    asked: list[list[str]] = []
    dialect = learn_dialect("auto", names, labels_of(table), series_counts=counts(current, asked))
    amd, nvidia = dialect.profiles
    assert (amd.metric_prefix, amd.node_label) == ("amd_", "hostname")
    assert nvidia.node_label == "hostname" and dialect.nic.node_label == "instance"
    assert asked[0] == ["gpu_gfx_activity", "amd_gpu_gfx_activity"] and len(asked) == 2
    assert 'DCGM_FI_DEV_GPU_UTIL{Hostname!=""}' in asked[1] and 'node_infiniband_info{node!=""}' in asked[1]
    # The names alone choose the stale ones.
    stale = learn_dialect("auto", names, labels_of(table))
    assert stale.profiles[0].metric_prefix == "" and stale.profiles[1].node_label == "Hostname"
    assert stale.nic.node_label == "node"


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        ({"Hostname": 8, "hostname": 8, "instance": 8}, "Hostname"),  # a tie: the preferred
        ({"Hostname": 3, "hostname": 5, "instance": 8}, "hostname"),  # mid-rollout: the most series
        ({"Hostname": 0, "hostname": 0, "instance": 8}, "instance"),  # only the address is current
        ({}, "Hostname"),  # nothing current at all: what the names say
    ],
)
def test_the_node_label_with_most_current_series_wins_and_instance_only_when_alone(current, expected):
    labels = {"Hostname", "hostname", "gpu", "UUID", "instance"}
    series = {f'DCGM_FI_DEV_GPU_UTIL{{{label}!=""}}': n for label, n in current.items()}
    nvidia = learn_profile(NVIDIA, {"DCGM_FI_DEV_GPU_UTIL"}, labels, current=series)
    assert nvidia.node_label == expected


def test_one_candidate_each_asks_nothing_more():
    asked: list[list[str]] = []
    learn_dialect(
        "amd", AMD_METRICS, labels_of({"gpu_gfx_activity": AMD_LABELS}), series_counts=counts({}, asked)
    )
    assert asked == []


def test_dcgm_old_namespace_labels_and_missing_figures():
    names = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP"}
    labels = {"Hostname", "gpu", "uuid", "pod_name", "pod_namespace"}
    dialect = learn_dialect("nvidia", names, labels_of({"DCGM_FI_DEV_GPU_UTIL": labels}))
    (nvidia,) = dialect.profiles
    assert (nvidia.serial_label, nvidia.pod_label, nvidia.namespace_label) == (
        "uuid",
        "pod_name",
        "pod_namespace",
    )
    assert set(nvidia.device_metrics) == {"vram_used", "vram_free", "temperature"}
    # Power is missing (a custom counters CSV); the reserve is optional (exporters before 4.3.1).
    assert dialect.missing == ("dcgm-exporter: no series for power",)


def test_dcgm_old_namespace_under_honor_labels_false_reads_pod_name_not_the_exporters_pod():
    """The target's `pod` (the exporter's own pod) beside dcgm-exporter's `pod_name`: no target
    carries `pod_name`, so it names the workload, and nothing more needs asking."""
    labels = {"hostname", "gpu", "uuid", "pod_name", "pod_namespace", "pod", "namespace", "container"}
    asked: list[tuple[str, str]] = []

    def pod_is_targets(metric: str, pod_label: str) -> bool:
        asked.append((metric, pod_label))
        return True

    table = {"DCGM_FI_DEV_GPU_UTIL": labels}
    dialect = learn_dialect(
        "nvidia", {"DCGM_FI_DEV_GPU_UTIL"}, labels_of(table), pod_is_targets_of=pod_is_targets
    )
    assert (dialect.profiles[0].pod_label, dialect.profiles[0].namespace_label) == (
        "pod_name",
        "pod_namespace",
    )
    assert asked == []


def test_mi200_figures_fall_back_to_their_own_metrics():
    names = {"gpu_gfx_activity", "gpu_edge_temperature", "gpu_average_package_power", "gpu_total_vram"}
    amd = learn_profile(AMD, names, AMD_LABELS)
    assert amd.device_metrics["temperature"] == "gpu_edge_temperature"
    assert amd.device_metrics["power"] == "gpu_average_package_power"


def test_overrides_win_over_what_is_learned():
    overrides = ExporterOverrides(
        metric_names={"DCGM_FI_DEV_GPU_UTIL": "gpu_util_percent"},
        node_label="node_name",
        pod_label="workload_pod",
        namespace_label="workload_ns",
        nic_node_label="host",
    )
    names = {"gpu_util_percent", "DCGM_FI_DEV_FB_USED", "node_infiniband_info"}
    dialect = learn_dialect(
        "auto", names, labels_of({"node_infiniband_info": {"node", "device", "instance"}}), overrides
    )
    (nvidia,) = dialect.profiles
    assert (nvidia.util_metric, nvidia.node_label, nvidia.pod_label) == (
        "gpu_util_percent",
        "node_name",
        "workload_pod",
    )
    assert nvidia.device_metrics == {"vram_used": "DCGM_FI_DEV_FB_USED"}
    assert dialect.nic.node_label == "host"


def test_infiniband_without_a_node_label_is_matched_by_instance():
    names = AMD_METRICS | {"node_infiniband_info"}
    table = {
        "gpu_gfx_activity": AMD_LABELS,
        "node_infiniband_info": {"device", "board_id", "instance", "job"},
    }
    assert learn_dialect("amd", names, labels_of(table)).nic.node_label == "instance"
    table["node_infiniband_info"] |= {"primus_lens_node_name"}
    assert learn_dialect("amd", names, labels_of(table)).nic.node_label == "primus_lens_node_name"


def test_no_exporter_at_all_is_missing_data_and_every_vendor_is_still_asked():
    dialect = learn_dialect("auto", {"up", "node_cpu_seconds_total"}, labels_of({}))
    assert [p.name for p in dialect.profiles] == ["amd", "nvidia"]
    assert dialect.missing and "no GPU exporter series" in dialect.missing[0]


PIB = float(1 << 50)


@pytest.mark.parametrize(
    ("total", "used", "capacity"),
    [
        (PIB, 0.0, None),  # no quota: the made-up 1 PiB
        (PIB, 0.8 * PIB, None),
        (2 * PIB, 0.9 * PIB, None),  # doubled once the used space passed 80 %
        (4 * PIB, 2.5 * PIB, None),
        (2 * PIB, 0.5 * PIB, 2 * PIB),  # not what JuiceFS would make up for that usage: a quota
        (10e12, 4e12, 10e12),  # a 10 TB quota
    ],
)
def test_juicefs_space_without_quota_is_no_capacity(total, used, capacity):
    assert juicefs_space_capacity(total, used) == capacity


def test_juicefs_inodes_without_quota_are_no_capacity():
    free = float(10 << 20)
    assert juicefs_inode_capacity(1000 + free, 1000) is None
    assert juicefs_inode_capacity(50_000_000 + 2 * free, 50_000_000) is None  # 50 M > 4 x 10 Mi: doubled
    assert juicefs_inode_capacity(1e9, 3e8) == 1e9


def test_one_volume_without_capacity_makes_the_total_unknown_not_smaller():
    figures = storage_figures(
        [StorageVolume(total_space=1e12, used_space=5e11), StorageVolume(total_space=None, used_space=1e11)]
    )
    assert figures["storage_total_space"] is None and figures["storage_usage_percentage"] is None
    assert figures["storage_used_space"] == 6e11


def test_a_pod_label_that_is_the_scrape_targets_means_exported_pod_even_with_no_gpu_held():
    """honor_labels: false while no GPU is held: no `exported_pod` yet, and `pod` names the exporter's
    own pod. Whether the series' `pod` is their targets' (as `up` has it) tells."""
    labels = {"Hostname", "gpu", "UUID", "pod", "namespace", "container", "instance", "job"}
    asked: list[tuple[str, str]] = []

    def targets(answer: bool):
        def pod_is_targets(metric: str, pod_label: str) -> bool:
            asked.append((metric, pod_label))
            return answer

        return pod_is_targets

    table = {"DCGM_FI_DEV_GPU_UTIL": labels}
    (nvidia,) = learn_dialect(
        "nvidia", {"DCGM_FI_DEV_GPU_UTIL"}, labels_of(table), pod_is_targets_of=targets(True)
    ).profiles
    assert (nvidia.pod_label, nvidia.namespace_label) == ("exported_pod", "exported_namespace")
    assert asked == [("DCGM_FI_DEV_GPU_UTIL", "pod")]
    # A `pod` the targets do not have (honor_labels: true and a GPU held, or targets without a pod
    # label): the exporter's `pod` is the workload's, even though `up` has a `pod` label too.
    (nvidia,) = learn_dialect(
        "nvidia", {"DCGM_FI_DEV_GPU_UTIL"}, labels_of(table), pod_is_targets_of=targets(False)
    ).profiles
    assert nvidia.pod_label == "pod"
    # With `exported_pod` seen, nothing more is asked.
    asked.clear()
    table["DCGM_FI_DEV_GPU_UTIL"] = labels | {"exported_pod", "exported_namespace"}
    learn_dialect("nvidia", {"DCGM_FI_DEV_GPU_UTIL"}, labels_of(table), pod_is_targets_of=targets(True))
    assert asked == []


@pytest.mark.parametrize(
    ("cursor", "now", "expected"),
    [
        (None, 1000.0, (420.0, 990.0)),  # first run: from 600 s back, on multiples of 30 s
        (960.0, 1000.0, (990.0, 990.0)),  # continues after the last point read
        (990.0, 1000.0, (1020.0, 990.0)),  # nothing new yet: last < first
        (10.0, 5000.0, (4410.0, 4980.0)),  # after a long pause: 600 s back only
    ],
)
def test_statistics_windows_continue_on_multiples_of_the_resolution(cursor, now, expected):
    assert window_bounds(cursor, now, first_window_seconds=600, resolution=30) == expected


def test_juicefs_queries_are_one_per_figure_grouped_by_volume():
    queries = JUICEFS.figure_queries("2m")
    assert queries["total_space"] == "avg by (vol_name) (juicefs_total_space)"
    assert queries["read_bandwidth"] == "sum by (vol_name) (rate(juicefs_fuse_read_size_bytes_sum[2m]))"
