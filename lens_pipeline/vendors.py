"""GPU vendor profiles: the one table that says how each vendor shows up in Kubernetes and Prometheus.

Adding a vendor is adding a row. Collectors never spell a resource, label or metric name themselves.

A profile here is the exporter as shipped. Real clusters differ (a metric prefix, `exported_*`
labels under `honor_labels: false`, the node named only by `instance`, labels renamed between
exporter releases): `learn` turns a profile into the one a cluster's Prometheus really speaks, from
the metric and label names it holds and the registry's overrides.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache, partial

# Labels that a scrape config commonly adds to name the node a target runs on: Prometheus'
# Kubernetes discovery relabelled (`node`, `kubernetes_node`, `nodename`) or the original's vmagent
# (`primus_lens_node_name`). `instance` (`<node IP>:<port>`) is the last resort, matched against the
# Node objects' addresses.
NODE_LABELS = ("node", "kubernetes_node", "nodename", "primus_lens_node_name")
INSTANCE = "instance"
# Under `honor_labels: false` Prometheus renames a scraped label that clashes with a target label.
EXPORTED_PREFIX = "exported_"


@dataclass(frozen=True)
class VendorProfile:
    name: str
    resource: str  # extended resource the device plugin advertises for a whole GPU
    product_label: str  # node label naming the GPU model
    driver_version_labels: tuple[str, ...]  # node labels carrying the driver version, first found wins
    # Exporter metrics (AMD device-metrics-exporter, NVIDIA dcgm-exporter).
    exporter: str
    util_metric: str  # per-GPU utilization, 0-100
    node_label: str  # exporter label holding the Kubernetes node name
    gpu_index_label: str
    serial_label: str  # exporter label identifying the card (serial number or UUID)
    model_label: str  # exporter label naming the model (its market name)
    # Exporter labels naming the pod (and its namespace) a GPU is allocated to.
    pod_label: str = "pod"
    namespace_label: str = "namespace"
    # Per-GPU figures of `gpu_device`: figure -> metric. Memory in MB; NVIDIA reports used and free
    # (and, since dcgm-exporter 4.3.1-4.4.0, reserved).
    device_metrics: dict[str, str] = field(default_factory=dict)
    # Older spellings of the driver version: node labels whose values joined with "." make it
    # (GPU feature discovery before k8s-device-plugin v0.15.0 labelled `cuda.driver.major/minor/rev`
    # only; `cuda.driver-version.full` came with v0.15.0).
    driver_version_parts: tuple[str, ...] = ()
    # Other spellings of labels in exporter releases and options: dcgm-exporter's `Hostname` is
    # `hostname` on its main branch (#655, commit d5e5f51, after 4.5.3-4.8.2 and in no release tag
    # yet): both are read. `--use-old-namespace` writes `uuid`, `pod_name`, `pod_namespace`.
    node_label_aliases: tuple[str, ...] = ()
    serial_label_aliases: tuple[str, ...] = ()
    pod_label_aliases: tuple[tuple[str, str], ...] = ()  # (pod, namespace) pairs
    # Labels naming the model otherwise, read only when neither `model_label` nor the node's
    # product label does (AMD's `card_model`, a board part number, is what its default labels have).
    model_label_fallbacks: tuple[str, ...] = ()
    # Figures some models report under another metric (AMD MI2xx: edge temperature, average power).
    figure_fallbacks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The metric prefix this cluster's exporter was configured with ('' as shipped).
    metric_prefix: str = ""
    # Every extended resource whose units are this vendor's GPUs, as the device plugin names them
    # (a regular expression matched in full): `resource`, and the slices, partitions and shares
    # some of its strategies advertise instead. Each unit counts as one GPU, as the scheduler
    # counts it, whatever its size. `units_described` says the same to a person.
    units_pattern: str = ""
    units_described: str = ""

    def counts_as_gpus(self, resource: str) -> bool:
        """Whether `resource`'s units are this vendor's GPUs."""
        return resource == self.resource or _full_match(self.units_pattern, resource)

    def measured(self, selector: str) -> str:
        """`selector`'s utilization series that hold a percentage: a GPU whose exporter reports NaN
        (it could not read the counter) or a value outside 0-100 (a broken counter) is left out of
        means, sums and counts rather than making them NaN, 0 or absurd. (NaN fails every
        comparison; chained comparisons filter in turn.)"""
        return f"{selector} >= 0 <= 100"

    @property
    def measured_util(self) -> str:
        return self.measured(self.util_metric)

    def node_utilization_query(self) -> str:
        """One grouped query for every node's mean GPU utilization (never one query per node)."""
        return f"avg by ({self.node_label}) ({self.measured_util})"

    def identity_query(self) -> str:
        """Every GPU with its identity labels and utilization, in one query."""
        labels = ", ".join(
            (
                self.node_label,
                self.gpu_index_label,
                self.serial_label,
                self.model_label,
                *self.model_label_fallbacks,
            )
        )
        return f"max by ({labels}) ({self.util_metric})"

    def series_per_node_query(self) -> str:
        """How many GPU series each node label value has (what `lens doctor` counts)."""
        return f"count by ({self.node_label}) ({self.util_metric})"

    def duplicate_query(self) -> str:
        """GPUs that more than one series reports (an exporter scraped twice, two exporters)."""
        return f"count by ({self.node_label}, {self.gpu_index_label}) ({self.util_metric}) > 1"

    def figure_query(self, figure: str) -> str:
        return f"max by ({self.node_label}, {self.gpu_index_label}) ({self.device_metrics[figure]})"

    def utilization_sum_queries(self) -> tuple[str, str]:
        """The sum and the count of every GPU's utilization: their ratio is the cluster's mean, and
        clusters with GPUs of both vendors add up."""
        return f"sum({self.measured_util})", f"count({self.measured_util})"

    def pod_key(self, labels: Mapping[str, str]) -> tuple[str, str]:
        """(namespace, pod) of a per-pod series of `pod_utilization_queries`."""
        return labels.get(self.namespace_label, ""), labels.get(self.pod_label, "")

    def pod_utilization_queries(self, idle_below: float) -> tuple[str, str, str]:
        """Per pod (the exporters label a GPU with the pod holding it): the sum of its GPUs'
        utilization, their count, and how many of them are under `idle_below` percent."""
        held = self.measured(f'{self.util_metric}{{{self.pod_label}!=""}}')
        by = f"by ({self.namespace_label}, {self.pod_label})"
        return f"sum {by} ({held})", f"count {by} ({held})", f"count {by} ({held} < {idle_below:g})"

    def capacity_query(self) -> str:
        """How many GPUs the exporters report (a GPU whose utilization reads NaN is still there)."""
        return f"count({self.util_metric})"

    def pod_memory_queries(self) -> dict[str, str]:
        """Per pod: the memory (MB) of the GPUs it holds, by figure (`vram_used`, and `vram_total`, or
        NVIDIA's `vram_free` and `vram_reserved`, which with the used make the total), and `gpus`,
        how many of its GPUs report memory. Only the figures this cluster's exporter has."""
        by = f"by ({self.namespace_label}, {self.pod_label})"
        held = f'{{{self.pod_label}!=""}}'
        memory = ("vram_used", "vram_total", "vram_free", "vram_reserved")
        queries = {
            f: f"sum {by} ({self.device_metrics[f]}{held})" for f in memory if f in self.device_metrics
        }
        if "vram_used" in self.device_metrics:
            queries["gpus"] = f"count {by} ({self.device_metrics['vram_used']}{held})"
        return queries

    def driver_version(self, labels: Mapping[str, str]) -> str:
        """The driver version a node's labels give, in today's spelling or the older one."""
        for key in self.driver_version_labels:
            if labels.get(key):
                return str(labels[key])
        parts = [labels.get(key) for key in self.driver_version_parts]
        if parts and all(parts):
            return ".".join(str(p) for p in parts)
        return ""

    def metrics(self) -> tuple[str, ...]:
        """Every metric the profile reads, utilization first."""
        return (self.util_metric, *self.device_metrics.values())

    @property
    def held(self) -> str:
        """The matcher of a GPU a pod holds (the exporters label it with the pod)."""
        return f'{self.pod_label}!=""'

    def memory_metrics(self) -> tuple[str, tuple[str, ...]] | None:
        """(used, the metrics whose sum is the total) of a GPU's memory, as `gpu_device.memory` adds
        them: the exporter's total, or used + free (+ reserved); None when the cluster lacks them."""
        figures = self.device_metrics
        if "vram_used" not in figures:
            return None
        if "vram_total" in figures:
            return figures["vram_used"], (figures["vram_total"],)
        if "vram_free" not in figures:
            return None
        parts = [figures["vram_used"], figures["vram_free"]]
        if "vram_reserved" in figures:
            parts.append(figures["vram_reserved"])
        return figures["vram_used"], tuple(parts)


AMD = VendorProfile(
    name="amd",
    resource="amd.com/gpu",
    product_label="amd.com/gpu.product-name",
    driver_version_labels=("amd.com/gpu.driver-version",),
    exporter="device-metrics-exporter",
    util_metric="gpu_gfx_activity",
    node_label="hostname",
    gpu_index_label="gpu_id",
    serial_label="serial_number",
    # `card_series` (the market name, what amd-smi calls it) is an optional label; the exporter's
    # mandatory ones (gpuMandatoryLables) name the model only by `card_model`.
    model_label="card_series",
    model_label_fallbacks=("card_model",),
    device_metrics={
        "temperature": "gpu_junction_temperature",
        "power": "gpu_package_power",
        "vram_total": "gpu_total_vram",
        "vram_used": "gpu_used_vram",
    },
    figure_fallbacks={
        "temperature": ("gpu_edge_temperature",),
        "power": ("gpu_average_package_power", "gpu_power_usage"),
    },
    # ROCm's k8s-device-plugin with `-resource_naming_strategy mixed` advertises a partitioned GPU's
    # partitions as `amd.com/<compute partition>_<memory partition>`, lower case (`amd.com/cpx_nps4`,
    # `amd.com/spx_nps1`: cmd/k8s-device-plugin/main.go, getResourceList); `single` advertises them
    # as `amd.com/gpu`. device-metrics-exporter reports each partition as a GPU of its own.
    units_pattern=r"amd\.com/(?:spx|dpx|tpx|qpx|cpx)_nps[0-9]+",
    units_described="amd.com/gpu, amd.com/<spx|dpx|tpx|qpx|cpx>_nps<N>",
)

NVIDIA = VendorProfile(
    name="nvidia",
    resource="nvidia.com/gpu",
    product_label="nvidia.com/gpu.product",
    driver_version_labels=("nvidia.com/cuda.driver-version.full",),
    driver_version_parts=(
        "nvidia.com/cuda.driver.major",
        "nvidia.com/cuda.driver.minor",
        "nvidia.com/cuda.driver.rev",
    ),
    exporter="dcgm-exporter",
    util_metric="DCGM_FI_DEV_GPU_UTIL",
    node_label="Hostname",
    node_label_aliases=("hostname",),
    gpu_index_label="gpu",
    serial_label="UUID",
    serial_label_aliases=("uuid",),
    pod_label_aliases=(("pod_name", "pod_namespace"),),
    model_label="modelName",
    device_metrics={
        "temperature": "DCGM_FI_DEV_GPU_TEMP",
        "power": "DCGM_FI_DEV_POWER_USAGE",
        "vram_used": "DCGM_FI_DEV_FB_USED",
        "vram_free": "DCGM_FI_DEV_FB_FREE",
        "vram_reserved": "DCGM_FI_DEV_FB_RESERVED",
    },
    # NVIDIA's k8s-device-plugin (internal/rm/rm.go, api/config/v1): MIG's `mixed` strategy advertises
    # each MIG profile as `nvidia.com/mig-<profile>` with `+` written `.` (`mig-1g.10gb`,
    # `mig-1g.10gb.me`, `mig-1g.10gb-me`); time-slicing and MPS with `renameByDefault` add `.shared`
    # (`nvidia.com/gpu.shared`, `nvidia.com/mig-1g.10gb.shared`). `single` and unrenamed sharing
    # keep `nvidia.com/gpu`. The plugin refuses any other name (DisableResourceNamingInConfig).
    units_pattern=r"nvidia\.com/(?:gpu\.shared|mig-[0-9]+g\.[0-9]+gb[a-z0-9.+-]*)",
    units_described="nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-<profile>[.shared]",
)

PROFILES: dict[str, VendorProfile] = {p.name: p for p in (AMD, NVIDIA)}


def exporter_metric_names() -> frozenset[str]:
    """Every GPU exporter metric a profile reads, by its shipped name (what the registry's
    `metric_names` may rename)."""
    return frozenset(
        name
        for p in PROFILES.values()
        for name in (
            p.util_metric,
            *p.device_metrics.values(),
            *(m for ms in p.figure_fallbacks.values() for m in ms),
        )
    )


# Figures an exporter release may lack without anything being wrong: dcgm-exporter exports the
# reserved framebuffer since 4.3.1-4.4.0 (before, memory is used + free, short of the reserve).
OPTIONAL_FIGURES = frozenset({"vram_reserved"})
VENDOR_CHOICES = (*PROFILES, "auto")


@lru_cache(maxsize=4096)
def _full_match(pattern: str, text: str) -> bool:
    # Memoized: the same few resource names (cpu, memory, the GPU's) come by on every container.
    return bool(pattern) and re.fullmatch(pattern, text) is not None


class GpuResources:
    """Which extended resources hold GPUs, and whose, for a cluster's registry vendor: what nodes'
    capacity and pods' requests are read for."""

    __slots__ = ("known", "profiles")

    def __init__(self, profiles: Sequence[VendorProfile]) -> None:
        self.profiles = tuple(profiles)
        # resource -> `vendor_of` it, for the names met so far (read directly on the hot path).
        self.known: dict[str, str | None] = {}

    def vendor_of(self, resource: str) -> str | None:
        """The name of the vendor whose GPUs `resource` counts, or None for any other resource."""
        try:
            return self.known[resource]
        except KeyError:
            found = next((p.name for p in self.profiles if p.counts_as_gpus(resource)), None)
            if len(self.known) < 4096:  # names come from objects: keep the memo bounded
                self.known[resource] = found
            return found

    def units(self, quantities: Mapping[str, object], vendor: str) -> list[tuple[str, object]]:
        """The (resource, quantity) pairs of `quantities` (a capacity, requests or limits) that are
        `vendor`'s GPUs."""
        return [(r, q) for r, q in quantities.items() if self.vendor_of(r) == vendor]

    def __str__(self) -> str:
        return ", ".join(p.units_described or p.resource for p in self.profiles)


@cache
def gpu_resources(vendor: str) -> GpuResources:
    """The extended resources a pod or node of a cluster of `vendor` holds GPUs as (`amd.com/gpu`,
    its partitions, ...)."""
    return GpuResources(profiles_for(vendor))


def profiles_for(vendor: str) -> tuple[VendorProfile, ...]:
    """The profiles a cluster's registry entry asks for; `auto` tries every vendor per node."""
    if vendor == "auto":
        return tuple(PROFILES.values())
    try:
        return (PROFILES[vendor],)
    except KeyError:
        raise ValueError(
            f"unknown GPU vendor {vendor!r}; expected one of {', '.join(VENDOR_CHOICES)}"
        ) from None


@dataclass(frozen=True)
class NicProfile:
    """InfiniBand/RDMA NICs as node_exporter's infiniband collector shows them."""

    info_metric: str = "node_infiniband_info"
    node_label: str = "node"  # added by the scrape config (node_exporter itself names no node)
    device_label: str = "device"
    firmware_label: str = "firmware_version"
    type_label: str = "hca_type"
    board_label: str = "board_id"
    received_counter: str = "node_infiniband_port_data_received_bytes_total"
    transmitted_counter: str = "node_infiniband_port_data_transmitted_bytes_total"

    def info_query(self) -> str:
        labels = ", ".join(
            (self.node_label, self.device_label, self.firmware_label, self.type_label, self.board_label)
        )
        return f"max by ({labels}) ({self.info_metric})"

    def nodes_query(self) -> str:
        """The node label values of the InfiniBand series, one sample each."""
        return f"count by ({self.node_label}) ({self.info_metric})"

    def traffic_queries(self, window: str) -> tuple[str, str]:
        """The fleet's RDMA bytes per second, received and transmitted: a rate of each port's counter
        summed (the original's `rate(sum(...))` took the rate of a sum, wrong across resets)."""
        return tuple(  # type: ignore[return-value]
            f"sum(rate({counter}[{window}]))" for counter in (self.received_counter, self.transmitted_counter)
        )


INFINIBAND = NicProfile()


@dataclass(frozen=True)
class HostProfile:
    """A node's CPU and memory as node_exporter shows them (the same scrape as its InfiniBand
    series, so named by the same node label, `Dialect.nic.node_label`)."""

    cpu_counter: str = "node_cpu_seconds_total"
    mode_label: str = "mode"
    idle_mode: str = "idle"
    memory_available: str = "node_memory_MemAvailable_bytes"
    memory_total: str = "node_memory_MemTotal_bytes"

    def idle_query(self, matcher: str) -> str:
        """The mean idle fraction of the node's CPUs (0-1): busy percent is 100 x (1 - it)."""
        return f'avg(irate({self.cpu_counter}{{{self.mode_label}="{self.idle_mode}", {matcher}}}[5m]))'

    def memory_queries(self, matcher: str) -> tuple[str, str]:
        """The node's available and total memory (bytes): used percent is 100 x (1 - a / t)."""
        return f"sum({self.memory_available}{{{matcher}}})", f"sum({self.memory_total}{{{matcher}}})"


NODE_HOST = HostProfile()


@dataclass(frozen=True)
class StorageProfile:
    """JuiceFS volumes as their clients' metrics show them: space and inodes from every mount
    (averaged: the same figure many times over) and FUSE traffic per mount (a rate of each, summed),
    by `vol_name`."""

    kind: str = "juicefs"
    volume_label: str = "vol_name"
    gauges: tuple[tuple[str, str], ...] = (
        ("total_space", "juicefs_total_space"),
        ("used_space", "juicefs_used_space"),
        ("total_inodes", "juicefs_total_inodes"),
        ("used_inodes", "juicefs_used_inodes"),
    )
    counters: tuple[tuple[str, str], ...] = (
        ("read_bandwidth", "juicefs_fuse_read_size_bytes_sum"),
        ("write_bandwidth", "juicefs_fuse_written_size_bytes_sum"),
    )

    def figure_queries(self, window: str) -> dict[str, str]:
        """Figure -> one query grouped by volume, whatever the number of volumes and mounts."""
        by = f"by ({self.volume_label})"
        return {
            **{figure: f"avg {by} ({metric})" for figure, metric in self.gauges},
            **{figure: f"sum {by} (rate({metric}[{window}]))" for figure, metric in self.counters},
        }


JUICEFS = StorageProfile()


# -- learning a cluster's dialect --------------------------------------------------------------


@dataclass(frozen=True)
class ExporterOverrides:
    """What the registry says of a cluster's exporters, for what cannot be guessed. Empty fields
    leave the choice to what is learned from Prometheus."""

    metric_prefix: str | None = None
    metric_names: Mapping[str, str] = field(default_factory=dict)  # shipped name -> the cluster's name
    node_label: str | None = None
    pod_label: str | None = None
    namespace_label: str | None = None
    nic_node_label: str | None = None


@dataclass(frozen=True)
class Dialect:
    """What a cluster's Prometheus really has: the profiles to query it with, and what was found,
    for run metadata and `lens doctor`."""

    profiles: tuple[VendorProfile, ...]  # vendors with exporter series (all asked for when none has)
    nic: NicProfile
    found: dict[str, str]  # vendor or "infiniband" -> how its series look, in words
    missing: tuple[str, ...]  # what the cluster's Prometheus lacks, in words

    def describe(self) -> dict[str, str]:
        return {**self.found, **({"missing": "; ".join(self.missing)} if self.missing else {})}


# Current series per selector (`metric` or `metric{label!=""}`), as `series_counts` answers them:
# what tells a name in use now from one Prometheus still lists for its lookback window (an exporter
# upgraded minutes ago, a prefix just set, a relabelling just removed). Absent: not asked.
Current = Mapping[str, float]


def label_selector(metric: str, label: str) -> str:
    """The series of `metric` that carry `label` (what `Current` counts for a label candidate)."""
    return f'{metric}{{{label}!=""}}'


def _candidates(preferred: Iterable[str | None], present: Iterable[str]) -> list[str]:
    """The names of `preferred` that are `present`, in order of preference, each once."""
    present = set(present)
    return [c for c in dict.fromkeys(preferred) if c and c in present]


def _choose(candidates: list[str], selector: Callable[[str], str], current: Current) -> str | None:
    """The candidate with the most current series (`current[selector(candidate)]`), the earlier on a
    tie; `instance` only when no other has any (it is on every series, and says the least). When
    nothing was asked, or no candidate has current series, the first: what the names alone say."""
    counted = [c for c in candidates if selector(c) in current]
    named = [c for c in counted if c != INSTANCE and current[selector(c)] > 0]
    if named:
        return max(named, key=lambda c: (current[selector(c)], -candidates.index(c)))
    if INSTANCE in counted and current[selector(INSTANCE)] > 0:
        return INSTANCE
    return candidates[0] if candidates else None


def _prefixes_of(metric: str, names: Iterable[str]) -> list[str]:
    """The prefixes under which `metric` is in `names` ('' when as shipped), shortest first."""
    return sorted((n[: -len(metric)] for n in names if n.endswith(metric)), key=lambda p: (len(p), p))


def _prefix(profile: VendorProfile, names: set[str], overrides: ExporterOverrides, current: Current) -> str:
    if overrides.metric_prefix is not None:
        return overrides.metric_prefix
    if profile.util_metric in overrides.metric_names:
        return ""
    found = _prefixes_of(profile.util_metric, names)
    return _choose(found, _under_prefix(profile.util_metric), current) or ""


def _under_prefix(metric: str) -> Callable[[str], str]:
    """prefix -> the metric's name under it (the selector counting a prefix candidate's series)."""
    return lambda prefix: f"{prefix}{metric}"


def _metric_name(metric: str, prefix: str, overrides: ExporterOverrides) -> str:
    return overrides.metric_names.get(metric) or f"{prefix}{metric}"


def util_metric_name(
    profile: VendorProfile,
    metric_names: Iterable[str],
    overrides: ExporterOverrides,
    current: Current | None = None,
) -> str:
    """The name of the vendor's utilization metric in this cluster's Prometheus (its shipped name
    when no prefixed or renamed one is found)."""
    names = set(metric_names)
    return _metric_name(profile.util_metric, _prefix(profile, names, overrides, current or {}), overrides)


def label_choices(profile: VendorProfile, label_names: Iterable[str]) -> dict[str, list[str]]:
    """The labels present that could name, on the profile's series, the node and the card's
    identity: in order of preference, for `learn_profile` to choose from."""
    return {
        "node": _candidates(
            (profile.node_label, *profile.node_label_aliases, *NODE_LABELS, INSTANCE), label_names
        ),
        "serial": _candidates((profile.serial_label, *profile.serial_label_aliases), label_names),
    }


def learn_profile(
    profile: VendorProfile,
    metric_names: Iterable[str],
    label_names: Iterable[str],
    overrides: ExporterOverrides = ExporterOverrides(),
    pod_is_targets: bool = False,
    current: Current | None = None,
) -> VendorProfile:
    """`profile` as the cluster's Prometheus speaks it: the metric names it has (an override, or the
    shipped name under the prefix found for the utilization metric), the label naming the node and
    the labels naming the pod holding a GPU. With metric names known, figures whose metric is
    absent are dropped; with none (Prometheus not asked), the shipped names are kept. Where more
    than one name is present, `current` (series counts, see `Current`) picks the one in use now.

    `pod_is_targets` says the series' `pod` values are all their scrape targets' own (the
    exporter pods', as `up` has them): then the pod holding a GPU can only be `exported_pod`
    (honor_labels: false), even while no GPU is held and no `exported_pod` exists yet to learn
    from. Under honor_labels: true a held GPU's `pod` is the workload's, which `up` never has."""
    names, labels, current = set(metric_names), set(label_names), current or {}
    prefix = _prefix(profile, names, overrides, current)
    util = _metric_name(profile.util_metric, prefix, overrides)
    figures = {}
    for figure, metric in profile.device_metrics.items():
        candidates = [
            _metric_name(m, prefix, overrides) for m in (metric, *profile.figure_fallbacks.get(figure, ()))
        ]
        chosen = next((m for m in candidates if m in names), None) if names else candidates[0]
        if chosen is not None:
            figures[figure] = chosen
    choices = label_choices(profile, labels)
    node_label = overrides.node_label or _choose(choices["node"], partial(label_selector, util), current)
    serial_label = _choose(choices["serial"], partial(label_selector, util), current)
    # The pod holding a GPU: renamed `exported_*` when the scrape config's own `pod` label won
    # (honor_labels: false); else an exporter's other spelling (dcgm-exporter's `pod_name`, which
    # no target carries: beside it, `pod` is the exporter pod's); else the shipped one.
    pod_pairs = _pod_label_pairs(profile)
    pod_label, namespace_label = next((pair for pair in pod_pairs if pair[0] in labels), pod_pairs[-1])
    if pod_label == profile.pod_label and pod_is_targets:
        pod_label, namespace_label = pod_pairs[0]
    return replace(
        profile,
        util_metric=util,
        device_metrics=figures,
        node_label=node_label or profile.node_label,
        serial_label=serial_label or profile.serial_label,
        pod_label=overrides.pod_label or pod_label,
        namespace_label=overrides.namespace_label or namespace_label,
        metric_prefix=prefix,
    )


def _pod_label_pairs(profile: VendorProfile) -> list[tuple[str, str]]:
    """(pod, namespace) label pairs in order of preference: every spelling renamed `exported_*`,
    then the exporter's other spellings, then the shipped one."""
    pairs = [(profile.pod_label, profile.namespace_label), *profile.pod_label_aliases]
    return [(f"{EXPORTED_PREFIX}{p}", f"{EXPORTED_PREFIX}{n}") for p, n in pairs] + pairs[1:] + pairs[:1]


def nic_label_choices(label_names: Iterable[str]) -> list[str]:
    """The labels present that could name the node on node_exporter's InfiniBand series."""
    return _candidates((*NODE_LABELS, INSTANCE), label_names)


def _nic(
    label_names: Iterable[str], overrides: ExporterOverrides, current: Current | None = None
) -> NicProfile:
    """node_exporter's InfiniBand series name no node: the label the scrape config added, else `instance`."""
    chosen = _choose(
        nic_label_choices(label_names), partial(label_selector, INFINIBAND.info_metric), current or {}
    )
    return replace(INFINIBAND, node_label=overrides.nic_node_label or chosen or INFINIBAND.node_label)


def describe_profile(profile: VendorProfile) -> str:
    """How a learned profile reads a cluster's series, in one line."""
    prefix = f" (prefix {profile.metric_prefix!r})" if profile.metric_prefix else ""
    return (
        f"{profile.exporter}: {profile.util_metric}{prefix}; node by {profile.node_label!r}; "
        f"pod by {profile.namespace_label!r}/{profile.pod_label!r}; "
        f"figures: {', '.join(sorted(profile.device_metrics)) or 'none'}"
    )


def _ambiguous(choices: Iterable[list[str]], selector: Callable[[str], str]) -> list[str]:
    """The selectors to count for the choices that have more than one candidate."""
    return [selector(c) for candidates in choices if len(candidates) > 1 for c in candidates]


def learn_dialect(
    vendor: str,
    metric_names: Iterable[str],
    labels_of: Callable[[str], Iterable[str]],
    overrides: ExporterOverrides = ExporterOverrides(),
    pod_is_targets_of: Callable[[str, str], bool] = lambda metric, pod_label: False,
    series_counts: Callable[[Sequence[str]], Current] = lambda selectors: {},
) -> Dialect:
    """The dialect of a cluster's Prometheus from its metric names and, for each exporter found, the
    label names of its series (`labels_of(metric)`, one cheap request each) and, when its `pod`
    label could be the scrape target's, whether it is (`pod_is_targets_of(metric, pod_label)`).

    The names cover a lookback window, so a name renamed minutes ago is still among them: where
    more than one candidate is present (two prefixes, `Hostname` and `hostname`, `node` and
    `instance`), `series_counts(selectors)` (one instant query for all of them) says which has
    series now. At most two such queries a run: the prefixes, then the labels."""
    names = set(metric_names)
    wanted = profiles_for(vendor)
    guessed = [
        p for p in wanted if overrides.metric_prefix is None and p.util_metric not in overrides.metric_names
    ]
    utils = [
        selector
        for p in guessed
        for selector in _ambiguous([_prefixes_of(p.util_metric, names)], _under_prefix(p.util_metric))
    ]
    current = dict(series_counts(utils)) if utils else {}
    found_utils = [(p, util_metric_name(p, names, overrides, current)) for p in wanted]
    found_utils = [(p, util) for p, util in found_utils if util in names]
    labels = {util: set(labels_of(util)) for _, util in found_utils}
    nic_labels = set(labels_of(INFINIBAND.info_metric)) if INFINIBAND.info_metric in names else set()
    to_count = [
        s
        for p, util in found_utils
        for role, candidates in label_choices(p, labels[util]).items()
        if not (role == "node" and overrides.node_label)
        for s in _ambiguous([candidates], partial(label_selector, util))
    ]
    if not overrides.nic_node_label:
        to_count += _ambiguous(
            [nic_label_choices(nic_labels)], partial(label_selector, INFINIBAND.info_metric)
        )
    if to_count:
        current.update(series_counts(to_count))
    learned_list = []
    for profile, util in found_utils:
        # A `pod` beside no other spelling could be the scrape target's (honor_labels: false).
        others = {pod for pod, _ in _pod_label_pairs(profile)} - {profile.pod_label}
        ambiguous = profile.pod_label in labels[util] and not others & labels[util]
        from_targets = ambiguous and not overrides.pod_label and pod_is_targets_of(util, profile.pod_label)
        learned_list.append(learn_profile(profile, names, labels[util], overrides, from_targets, current))
    learned = tuple(learned_list)
    found = {p.name: describe_profile(p) for p in learned}
    missing = []
    if not learned:
        expected = " or ".join(p.util_metric for p in wanted)
        missing.append(f"no GPU exporter series ({expected}, under any prefix)")
    for p in learned:
        absent = sorted(set(PROFILES[p.name].device_metrics) - set(p.device_metrics) - OPTIONAL_FIGURES)
        if absent:
            missing.append(f"{p.exporter}: no series for {', '.join(absent)}")
    nic = _nic(nic_labels, overrides, current)
    if INFINIBAND.info_metric in names:
        found["infiniband"] = f"{nic.info_metric}: node by {nic.node_label!r}"
    else:
        found["infiniband"] = f"no {nic.info_metric} series (no InfiniBand NIC, or the collector is off)"
    profiles = learned or tuple(learn_profile(p, (), (), overrides) for p in wanted)
    return Dialect(profiles=profiles, nic=nic, found=found, missing=tuple(missing))


def shipped_dialect(vendor: str, overrides: ExporterOverrides = ExporterOverrides()) -> Dialect:
    """The dialect when Prometheus could not be asked: the shipped names, with the registry's overrides."""
    profiles = tuple(learn_profile(p, (), (), overrides) for p in profiles_for(vendor))
    return Dialect(profiles=profiles, nic=_nic((), overrides), found={}, missing=())
