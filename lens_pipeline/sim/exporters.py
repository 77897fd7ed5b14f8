"""What the simulated exporters expose, one scrape target per node and exporter, as a real Prometheus
would scrape them: the GPU exporter (AMD device-metrics-exporter or NVIDIA dcgm-exporter),
node_exporter (its infiniband, cpu and meminfo collectors), and the JuiceFS clients (one target per
cluster).

The figures are derived from the cluster's state by this module only; `/api/v1/query` and
`/metrics` both read them from here, so the simulator's own answers and a real Prometheus
scraping the same targets see the same series.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lens_pipeline.sim.dialects import (
    AMD_DEFAULT_EXTRA_LABELS,
    AMD_OPTIONAL_LABELS,
    DCGM_OLD_NAMESPACE,
    ExporterDialect,
    juicefs_made_up_inodes,
    juicefs_made_up_space,
)
from lens_pipeline.sim.generate import JUICEFS_VOLUMES
from lens_pipeline.sim.history import GpuSample
from lens_pipeline.sim.vendors import AMD, VENDORS, SimVendor

if TYPE_CHECKING:
    from lens_pipeline.sim.fleet import SimCluster
    from lens_pipeline.sim.nics import SimNic

NODE_EXPORTER_JOB = "node-exporter"
NODE_EXPORTER_PORT = 9100
JUICEFS_JOB = "juicefs"
JUICEFS_PORT = 9567
# Seconds the JuiceFS counters have been counting when the cluster starts (any fixed epoch works).
_COUNTER_EPOCH = 1_700_000_000.0

Sample = tuple[str, dict[str, str], float]


@dataclass(frozen=True)
class Family:
    name: str
    type: str
    help: str


@dataclass(frozen=True)
class Target:
    """One scrape target: `path` is below the cluster's base URL; `node` is '' for cluster-wide ones."""

    job: str
    node: str
    instance: str

    @property
    def path(self) -> str:
        return f"/metrics/{self.job}/{self.node}" if self.node else f"/metrics/{self.job}"


# Per-GPU figures besides utilization: (family, value from (vendor, utilization, index, memory MiB, busy)).
def _temperature(util: float, index: int) -> float:
    return round(32.0 + 0.45 * util + (index % 4) * 1.5, 1)


def _power(vendor: SimVendor, util: float) -> float:
    idle, per_percent = (140.0, 6.0) if vendor.name == AMD.name else (70.0, 6.2)
    return round(idle + per_percent * util, 1)


def _vram_used(total: int, util: float, busy: bool) -> int:
    return round(total * (0.12 + util / 125.0)) if busy else 284


AMD_FAMILIES = {
    "gpu_junction_temperature": Family(
        "gpu_junction_temperature", "gauge", "Current junction temperature in Celsius"
    ),
    "gpu_package_power": Family("gpu_package_power", "gauge", "Current socket power in Watts"),
    "gpu_total_vram": Family("gpu_total_vram", "gauge", "Total VRAM available (in MB)"),
    "gpu_used_vram": Family("gpu_used_vram", "gauge", "Total VRAM memory used (in MB)"),
}
NVIDIA_FAMILIES = {
    "DCGM_FI_DEV_GPU_TEMP": Family("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": Family("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_FB_USED": Family("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_FREE": Family("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": Family(
        "DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."
    ),
}
NIC_FAMILIES = {
    "node_infiniband_info": Family(
        "node_infiniband_info",
        "gauge",
        "Non-numeric data from /sys/class/infiniband/<device>, value is always 1.",
    ),
    "node_infiniband_rate_bytes_per_second": Family(
        "node_infiniband_rate_bytes_per_second", "gauge", "Maximum signal transfer rate"
    ),
    "node_infiniband_port_data_received_bytes_total": Family(
        "node_infiniband_port_data_received_bytes_total",
        "counter",
        "Number of data octets received on all links",
    ),
    "node_infiniband_port_data_transmitted_bytes_total": Family(
        "node_infiniband_port_data_transmitted_bytes_total",
        "counter",
        "Number of data octets transmitted on all links",
    ),
}
HOST_FAMILIES = {
    "node_cpu_seconds_total": Family(
        "node_cpu_seconds_total", "counter", "Seconds the CPUs spent in each mode."
    ),
    "node_memory_MemAvailable_bytes": Family(
        "node_memory_MemAvailable_bytes", "gauge", "Memory information field MemAvailable_bytes."
    ),
    "node_memory_MemTotal_bytes": Family(
        "node_memory_MemTotal_bytes", "gauge", "Memory information field MemTotal_bytes."
    ),
}
# node_exporter's CPU series of a simulated node: a few CPUs are enough for a mean.
HOST_CPUS = 2
HOST_MEMORY_BYTES = float(2 << 40)  # 2 TiB, a GPU server's
JUICEFS_FAMILIES = {
    "juicefs_used_space": Family("juicefs_used_space", "gauge", "Total used space in bytes."),
    "juicefs_total_space": Family("juicefs_total_space", "gauge", "Total space in bytes."),
    "juicefs_used_inodes": Family("juicefs_used_inodes", "gauge", "Total used number of inodes."),
    "juicefs_total_inodes": Family("juicefs_total_inodes", "gauge", "Total number of inodes."),
    **{
        f"{name}{suffix}": Family(name, "histogram", what)
        for name, what in (
            ("juicefs_fuse_read_size_bytes", "size of read distributions."),
            ("juicefs_fuse_written_size_bytes", "size of write distributions."),
        )
        for suffix in ("_bucket", "_sum", "_count")
    },
}


def _stable_fraction(*parts: object) -> float:
    """A number in [0, 1) fixed by its inputs: figures that must not change between scrapes."""
    return (zlib.crc32("/".join(map(str, parts)).encode()) % 10_000) / 10_000


# Counters grow with time, not with the cluster's state: their cached value is a rate per second,
# turned into a count at each scrape (the rest is cached until the state moves).
COUNTERS = frozenset(
    {
        "node_infiniband_port_data_received_bytes_total",
        "node_infiniband_port_data_transmitted_bytes_total",
        "node_cpu_seconds_total",
        *(
            f"{h}{suffix}"
            for h in ("juicefs_fuse_read_size_bytes", "juicefs_fuse_written_size_bytes")
            for suffix in ("_bucket", "_sum", "_count")
        ),
    }
)
COUNTING_JOBS = frozenset({NODE_EXPORTER_JOB, JUICEFS_JOB})
# What a counter counts in: bytes are whole, CPU seconds in hundredths (the kernel's USER_HZ).
_COUNTER_UNIT = {"node_cpu_seconds_total": 0.01}


def _count(metric: str, rate: float, seconds: float) -> float:
    unit = _COUNTER_UNIT.get(metric, 1.0)
    return round(int(rate * seconds / unit) * unit, 2)


def scrape(
    cluster: SimCluster, metrics: Collection[str] | None = None, at: float | None = None
) -> dict[Target, list[Sample]]:
    """Every target of the cluster and the samples it answers with now (or, for a cluster keeping
    history, at the past time `at`); with `metrics`, the targets of counting jobs answer only those
    (the samples of the others are shared, not copied)."""
    history = cluster.history
    # The counters' time is taken first, as the scrape arrives: Prometheus stamps the samples with
    # the time it sent the scrape, and rebuilding the targets after a change takes a while.
    seconds = (cluster.now() if at is None else at) - _COUNTER_EPOCH
    if at is None or history is None:
        cached = cluster.memo("exporter_targets", lambda: _build(cluster))
    else:
        cached = history.memo(("targets", history.state_key(at)), lambda: _build(cluster, at))
    return {
        target: [
            (m, labels, _count(m, v, seconds) if m in COUNTERS else v)
            for m, labels, v in samples
            if metrics is None or m in metrics
        ]
        if target.job in COUNTING_JOBS
        else samples
        for target, samples in cached.items()
    }


def counter_rates(cluster: SimCluster) -> dict[Target, list[Sample]]:
    """Every counter of the cluster with its steady per-second rate: what `rate()` over it answers."""
    cached = cluster.memo("exporter_targets", lambda: _build(cluster))
    return {
        target: [sample for sample in samples if sample[0] in COUNTERS]
        for target, samples in cached.items()
        if target.job in COUNTING_JOBS
    }


def _build(cluster: SimCluster, at: float | None = None) -> dict[Target, list[Sample]]:
    vendor = cluster.profile
    targets: dict[Target, list[Sample]] = {}
    utilization = {
        (labels[vendor.node_label], labels[_index_label(vendor)]): (labels, value)
        for _, labels, value in cluster.exporter_samples(at)
    }
    gpus_by_node: dict[str, list[tuple[dict[str, str], float]]] = {}
    for (node, _index), (labels, value) in utilization.items():
        gpus_by_node.setdefault(node, []).append((labels, value))
    nics = cluster.nics()
    for node in cluster.node_names():
        if not cluster.exporter_up(node, at):
            continue  # the node's exporters run on it: down with it
        address = cluster.node_address(node)
        if cluster.exporter_running(node, vendor.exporter_job):  # a crash-looping one is no target
            gpu_target = Target(vendor.exporter_job, node, f"{address}:{vendor.exporter_port}")
            product = cluster.gpu_product(node)
            targets[gpu_target] = _gpu_samples(
                vendor, product.memory_mib, product.reserved_mib, gpus_by_node.get(node, [])
            )
        if cluster.exporter_running(node, NODE_EXPORTER_JOB):
            nic_target = Target(NODE_EXPORTER_JOB, node, f"{address}:{NODE_EXPORTER_PORT}")
            targets[nic_target] = _nic_samples(nics.get(node, [])) + _host_samples(cluster.name, node)
    targets[Target(JUICEFS_JOB, "", f"juicefs-csi-node:{JUICEFS_PORT}")] = _juicefs_samples(cluster)
    targets.update(cluster.injected_series())
    return targets


def _gpu_metric_names(vendor: SimVendor) -> frozenset[str]:
    return frozenset({vendor.util_metric, *(AMD_FAMILIES if vendor.name == AMD.name else NVIDIA_FAMILIES)})


def exposed(
    cluster: SimCluster, target: Target, samples: list[Sample], dialect: ExporterDialect | None = None
) -> list[Sample]:
    """A target's samples as its exporter writes them in the cluster's dialect (or `dialect`): AMD's
    metric prefix, its mandatory labels (empty where there is nothing to say, as on a GPU nobody
    holds) and, with its default label set, no optional ones; dcgm-exporter's `hostname`, its
    `--use-old-namespace` labels; the metrics the exporter does not export left out."""
    vendor, dialect = cluster.profile, dialect or cluster.dialect
    if target.job != vendor.exporter_job or samples[:1] == [("up", {}, 1.0)]:
        return samples
    amd = vendor.name == AMD.name
    prefix = dialect.metric_prefix if amd else ""
    renamed = {
        **({vendor.node_label: "hostname"} if dialect.lowercase_hostname and not amd else {}),
        **(DCGM_OLD_NAMESPACE if dialect.dcgm_old_namespace and not amd else {}),
    }
    # Labels the exporter always writes, with the value they have where nothing more is known.
    always = dict.fromkeys(vendor.workload_labels, "") if amd else {}
    dropped: tuple[str, ...] = ()
    if amd and dialect.amd_default_labels:
        always, dropped = {**always, **AMD_DEFAULT_EXTRA_LABELS}, AMD_OPTIONAL_LABELS
    missing = set(dialect.missing_metrics)
    if not (prefix or renamed or always or missing):
        return samples
    out = []
    for metric, labels, value in samples:
        if metric in missing:
            continue
        written = {renamed.get(k, k): v for k, v in labels.items() if k not in dropped}
        out.append(
            (f"{prefix}{metric}", {**written, **{k: v for k, v in always.items() if k not in written}}, value)
        )
    return out


def target_labels(
    cluster: SimCluster, target: Target, dialect: ExporterDialect | None = None
) -> dict[str, str]:
    """The labels a scrape config gives the target besides `job` and `instance`: the node it runs on
    under the dialect's label (none: `instance` only), and under `honor_labels: false` the GPU
    exporter pod's own pod, namespace and container, as a ServiceMonitor does."""
    dialect = dialect or cluster.dialect
    labels = {dialect.node_target_label: target.node} if target.node and dialect.node_target_label else {}
    if dialect.relabelled and target.job == cluster.profile.exporter_job:
        labels.update(cluster.exporter_pod(target.node))
    return labels


def _index_label(vendor: SimVendor) -> str:
    return "gpu_id" if vendor.name == AMD.name else "gpu"


def _gpu_samples(
    vendor: SimVendor, memory_mib: int, reserved_mib: int, gpus: list[tuple[dict[str, str], float]]
) -> list[Sample]:
    samples: list[Sample] = []
    for labels, util in sorted(gpus, key=lambda g: int(g[0][_index_label(vendor)])):
        index = int(labels[_index_label(vendor)])
        busy = bool(labels.get("pod"))
        total = memory_mib
        basis = util if 0.0 <= util <= 100.0 else 0.0  # a broken utilization breaks no other figure
        used = _vram_used(total, basis, busy)
        reserved = reserved_mib
        samples.append((vendor.util_metric, labels, util))
        if vendor.name == AMD.name:
            figures = {
                "gpu_junction_temperature": _temperature(basis, index),
                "gpu_package_power": _power(vendor, basis),
                "gpu_total_vram": float(total),
                "gpu_used_vram": float(used),
            }
        else:
            figures = {
                "DCGM_FI_DEV_GPU_TEMP": float(round(_temperature(basis, index))),
                "DCGM_FI_DEV_POWER_USAGE": _power(vendor, basis),
                "DCGM_FI_DEV_FB_USED": float(used),
                "DCGM_FI_DEV_FB_FREE": float(total - used - reserved),
                "DCGM_FI_DEV_FB_RESERVED": float(reserved),
            }
        samples += [(name, labels, value) for name, value in figures.items()]
    return samples


def pod_gpus(cluster: SimCluster, at: float) -> tuple[dict[tuple[str, str], list[GpuSample]], int]:
    """What the GPU exporters showed at `at`: each pod's GPUs (utilization, memory used and in
    total, MiB) by (namespace, pod), and how many GPUs they reported in all."""
    vendor = cluster.profile
    pod_label, namespace_label, _ = vendor.workload_labels
    used, total = (
        ("gpu_used_vram", "gpu_total_vram") if vendor.name == AMD.name else ("DCGM_FI_DEV_FB_USED", "")
    )
    # The framebuffer's parts the exporter has (before dcgm-exporter 4.3.1, no reserve).
    parts = (
        ()
        if vendor.name == AMD.name
        else ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
    )
    parts = tuple(p for p in parts if p not in cluster.dialect.missing_metrics)
    pods: dict[tuple[str, str], list[GpuSample]] = {}
    reported = 0
    injected = cluster.injected_series()
    for target, samples in scrape(cluster, at=at).items():
        if target.job != vendor.exporter_job or target in injected:
            continue
        gpus: dict[str, dict[str, float]] = {}
        holder: dict[str, tuple[str, str]] = {}
        for metric, labels, value in samples:
            index = labels[_index_label(vendor)]
            gpus.setdefault(index, {})[metric] = value
            if labels.get(pod_label):
                holder[index] = (labels[namespace_label], labels[pod_label])
        reported += len(gpus)
        for index, figures in gpus.items():
            if index in holder:
                memory = figures[total] if total else sum(figures[p] for p in parts)
                pods.setdefault(holder[index], []).append(
                    GpuSample(figures[vendor.util_metric], figures[used], memory)
                )
    return pods, reported


def host_load(cluster: str, node: str) -> tuple[float, float]:
    """(busy share of the node's CPUs, share of its memory in use), steady: what node_exporter's
    counters and gauges say, and so the truth of a node's CPU and memory utilization."""
    return 0.05 + 0.85 * _stable_fraction(cluster, node, "cpu"), 0.1 + 0.7 * _stable_fraction(
        cluster, node, "mem"
    )


def _host_samples(cluster: str, node: str) -> list[Sample]:
    """node_exporter's CPU counters (their rates: seconds per second in each mode) and meminfo."""
    busy, used = host_load(cluster, node)
    samples: list[Sample] = []
    for cpu in range(HOST_CPUS):
        for mode, rate in (("idle", 1.0 - busy), ("user", 0.8 * busy), ("system", 0.2 * busy)):
            samples.append(("node_cpu_seconds_total", {"cpu": str(cpu), "mode": mode}, rate))
    samples.append(("node_memory_MemTotal_bytes", {}, HOST_MEMORY_BYTES))
    samples.append(("node_memory_MemAvailable_bytes", {}, HOST_MEMORY_BYTES * (1.0 - used)))
    return samples


def nic_traffic(nic: SimNic) -> tuple[float, float]:
    """(received, transmitted) bytes per second of a NIC: steady, so a counter's rate is known."""
    share = 0.05 + 0.4 * _stable_fraction(nic.node_guid)
    return nic.rate_bytes_per_second * share, nic.rate_bytes_per_second * share * 0.9


def _nic_samples(nics: list[SimNic]) -> list[Sample]:
    samples: list[Sample] = []
    for nic in nics:
        info = {
            "board_id": nic.board_id,
            "device": nic.device,
            "firmware_version": nic.firmware_version,
            "hca_type": nic.hca_type,
        }
        port = {"device": nic.device, "port": str(nic.port)}
        received, transmitted = nic_traffic(nic)
        samples += [
            ("node_infiniband_info", info, 1.0),
            ("node_infiniband_rate_bytes_per_second", port, float(nic.rate_bytes_per_second)),
            ("node_infiniband_port_data_received_bytes_total", port, received),
            ("node_infiniband_port_data_transmitted_bytes_total", port, transmitted),
        ]
    return samples


def juicefs_volumes(cluster: SimCluster) -> dict[str, dict[str, float | None]]:
    """Each JuiceFS volume's figures: space and inodes (the capacity is None for a volume without
    quota), and read/write bytes per second."""
    volumes = {}
    for _namespace, _secret, volume, _storage_class in JUICEFS_VOLUMES:
        fraction = 0.2 + 0.6 * _stable_fraction(cluster.name, volume)
        quota_space, quota_inodes = float(200 << 40), 1e9  # 200 TiB, a billion inodes
        limited = cluster.dialect.juicefs_quota
        volumes[volume] = {
            "used_space": float(int(quota_space * fraction)),
            "total_space": quota_space if limited else None,
            "used_inodes": float(int(quota_inodes * fraction / 3)),
            "total_inodes": quota_inodes if limited else None,
            "read_bytes_per_second": 2.0e8 * fraction,
            "written_bytes_per_second": 5.0e7 * fraction,
        }
    return volumes


def _reported_total(total: float | None, used: float, made_up: Callable[[float], float]) -> float:
    """What JuiceFS reports as a total: the quota, or its made-up figure when there is none."""
    return total if total is not None else made_up(used)


def _juicefs_samples(cluster: SimCluster) -> list[Sample]:
    samples: list[Sample] = []
    for volume, figures in juicefs_volumes(cluster).items():
        labels = {"vol_name": volume, "mp": f"/var/lib/juicefs/volume/{volume}"}
        used_space, used_inodes = figures["used_space"] or 0.0, figures["used_inodes"] or 0.0
        samples += [
            ("juicefs_used_space", labels, used_space),
            (
                "juicefs_total_space",
                labels,
                _reported_total(figures["total_space"], used_space, juicefs_made_up_space),
            ),
            ("juicefs_used_inodes", labels, used_inodes),
            (
                "juicefs_total_inodes",
                labels,
                _reported_total(figures["total_inodes"], used_inodes, juicefs_made_up_inodes),
            ),
        ]
        for histogram, rate in (
            ("juicefs_fuse_read_size_bytes", figures["read_bytes_per_second"]),
            ("juicefs_fuse_written_size_bytes", figures["written_bytes_per_second"]),
        ):
            samples += [  # rates per second; `scrape` makes them counts (one FUSE request per 128 KiB)
                (f"{histogram}_bucket", {**labels, "le": "+Inf"}, rate / 131_072),
                (f"{histogram}_sum", labels, rate),
                (f"{histogram}_count", labels, rate / 131_072),
            ]
    return samples


def families(vendor: SimVendor, prefix: str = "") -> dict[str, Family]:
    """Every family a target of this vendor's clusters can expose, by sample name (GPU exporter
    families under the metric prefix of AMD's exporter, if any)."""
    gpu = {vendor.util_metric: Family(vendor.util_metric, "gauge", vendor.util_help)}
    gpu.update(AMD_FAMILIES if vendor.name == AMD.name else NVIDIA_FAMILIES)
    if vendor.name == AMD.name and prefix:
        gpu = {f"{prefix}{k}": Family(f"{prefix}{f.name}", f.type, f.help) for k, f in gpu.items()}
    return {**gpu, **NIC_FAMILIES, **HOST_FAMILIES, **JUICEFS_FAMILIES}


def device_truth(cluster: SimCluster) -> tuple[list[dict], list[dict]]:
    """The `gpu_device` and `rdma_device` rows of the Ready nodes (a silent exporter proves nothing
    about the devices of a node that is not Ready, so those are left out)."""
    vendor = cluster.profile
    index_label = _index_label(vendor)
    model_label = "card_series" if vendor.name == AMD.name else "modelName"
    serial_label = "serial_number" if vendor.name == AMD.name else "UUID"
    gpus, nics = [], []
    injected = cluster.injected_series()
    for target, samples in scrape(cluster).items():
        if target in injected:
            continue  # not the cluster's devices
        if target.job == vendor.exporter_job:
            figures: dict[int, dict] = {}
            for metric, labels, value in samples:
                row = figures.setdefault(
                    int(labels[index_label]),
                    {
                        "node_name": target.node,
                        "gpu_id": int(labels[index_label]),
                        "gpu_model": labels[model_label],
                        "serial": labels[serial_label],
                        "memory": 0,
                    },
                )
                if metric == vendor.util_metric:
                    row["utilization"] = value
                elif metric in ("gpu_junction_temperature", "DCGM_FI_DEV_GPU_TEMP"):
                    row["temperature"] = value
                elif metric in ("gpu_package_power", "DCGM_FI_DEV_POWER_USAGE"):
                    row["power"] = value
                elif metric in (
                    "gpu_total_vram",
                    "DCGM_FI_DEV_FB_USED",
                    "DCGM_FI_DEV_FB_FREE",
                    "DCGM_FI_DEV_FB_RESERVED",
                ):
                    row["memory"] += int(value)
            gpus += figures.values()
        elif target.job == NODE_EXPORTER_JOB:
            nics += [
                {
                    "node_name": target.node,
                    "ifname": labels["device"],
                    "fw": labels["firmware_version"],
                    "node_type": labels["hca_type"],
                }
                for metric, labels, _ in samples
                if metric == "node_infiniband_info"
            ]
    key = lambda row: (row["node_name"], row.get("gpu_id", row.get("ifname")))  # noqa: E731
    return sorted(gpus, key=key), sorted(nics, key=key)


# Taint effects that keep pods off a node: such a node is faulty for the overview, unless the taint is
# the GPU resource's own (the vendor's dedication taint), which GPU pods tolerate.
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def _gpu_taint_key(key: object) -> bool:
    """A taint keyed by one of the vendors' GPU resources (whole GPUs, MIG instances, partitions)."""
    return isinstance(key, str) and any(vendor.counts_as_gpus(key) for vendor in VENDORS.values())


def overview_truth(cluster: SimCluster, nodes: list[dict]) -> dict[str, float]:
    """The `cluster_overview_cache` row by spec §3's formulas with the original's bugs fixed:
    NotReady/Unknown GPU nodes count as faulty instead of vanishing, every other node lands in exactly
    one idle bucket, a tainted node is faulty only for taints that keep GPU pods off it, and storage and
    RDMA figures add up every volume and NIC (rates are bytes per second)."""
    faulty = [
        n
        for n in nodes
        if n["status"] != "Ready"
        or n["gpu_count"] == 0
        or any(
            t.get("effect") in BLOCKING_EFFECTS
            and not (t.get("effect") == "NoSchedule" and _gpu_taint_key(t.get("key")))
            for t in (n["taints"] or {}).get("taints", [])
        )
    ]
    healthy = [n for n in nodes if n not in faulty]
    capacity = sum(n["gpu_count"] for n in healthy)
    allocated = sum(n["gpu_allocation"] for n in healthy)
    samples = [v for values in cluster.gpu_utilization_samples().values() for v in values]
    volumes = juicefs_volumes(cluster).values()
    used, used_inodes = sum(v["used_space"] for v in volumes), sum(v["used_inodes"] for v in volumes)
    # A volume without quota has no capacity: the cluster's total is unknown, not a smaller sum.
    space = None if any(v["total_space"] is None for v in volumes) else sum(v["total_space"] for v in volumes)
    inodes = (
        None if any(v["total_inodes"] is None for v in volumes) else sum(v["total_inodes"] for v in volumes)
    )
    traffic = [
        nic_traffic(nic)
        for node, nics in cluster.nics().items()
        if cluster.node_status(node) == "Ready" and cluster.exporter_running(node, NODE_EXPORTER_JOB)
        for nic in nics
    ]
    return {
        "total_nodes": len(nodes),
        "healthy_nodes": len(healthy),
        "faulty_nodes": len(faulty),
        "fully_idle_nodes": sum(n["gpu_allocation"] == 0 for n in healthy),
        "partially_idle_nodes": sum(0 < n["gpu_allocation"] < n["gpu_count"] for n in healthy),
        "busy_nodes": sum(n["gpu_allocation"] >= n["gpu_count"] > 0 for n in healthy),
        "allocation_rate": 100.0 * allocated / capacity if capacity else 0.0,
        "utilization": sum(samples) / len(samples) if samples else None,
        "storage_total_space": space,
        "storage_used_space": used,
        "storage_usage_percentage": None if space is None else 100.0 * used / space if space else 0.0,
        "storage_total_inodes": inodes,
        "storage_used_inodes": used_inodes,
        "storage_inodes_usage_percentage": None
        if inodes is None
        else 100.0 * used_inodes / inodes
        if inodes
        else 0.0,
        "storage_read_bandwidth": sum(v["read_bytes_per_second"] for v in volumes),
        "storage_write_bandwidth": sum(v["written_bytes_per_second"] for v in volumes),
        # No InfiniBand counter scraped: nothing to add up, so unknown (not 0).
        "rdma_total_rx": sum(rx for rx, _ in traffic) if traffic else None,
        "rdma_total_tx": sum(tx for _, tx in traffic) if traffic else None,
    }
