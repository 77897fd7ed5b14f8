"""GPU vendor profiles: the one table that says how each vendor shows up in Kubernetes and Prometheus.

Adding a vendor is adding a row. Collectors never spell a resource, label or metric name themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class VendorProfile:
    name: str
    resource: str  # extended resource the device plugin advertises
    product_label: str  # node label naming the GPU model
    driver_version_labels: tuple[str, ...]  # node labels carrying the driver version, first found wins
    # Exporter metrics (AMD device-metrics-exporter, NVIDIA dcgm-exporter).
    exporter: str
    util_metric: str  # per-GPU utilization, 0-100
    node_label: str  # exporter label holding the Kubernetes node name
    gpu_index_label: str
    serial_label: str  # exporter label identifying the card (serial number or UUID)
    model_label: str  # exporter label naming the model
    # Exporter labels naming the pod (and its namespace) a GPU is allocated to.
    pod_label: str = "pod"
    namespace_label: str = "namespace"
    # Per-GPU figures of `gpu_device`: figure -> metric. Memory in MB; NVIDIA reports used and free.
    device_metrics: dict[str, str] = field(default_factory=dict)

    def node_utilization_query(self) -> str:
        """One grouped query for every node's mean GPU utilization (never one query per node)."""
        return f"avg by ({self.node_label}) ({self.util_metric})"

    def identity_query(self) -> str:
        """Every GPU with its identity labels and utilization, in one query."""
        labels = ", ".join((self.node_label, self.gpu_index_label, self.serial_label, self.model_label))
        return f"max by ({labels}) ({self.util_metric})"

    def figure_query(self, figure: str) -> str:
        return f"max by ({self.node_label}, {self.gpu_index_label}) ({self.device_metrics[figure]})"

    def utilization_sum_queries(self) -> tuple[str, str]:
        """The sum and the count of every GPU's utilization: their ratio is the cluster's mean, and
        clusters with GPUs of both vendors add up."""
        return f"sum({self.util_metric})", f"count({self.util_metric})"

    def pod_key(self, labels: dict[str, str]) -> tuple[str, str]:
        """(namespace, pod) of a per-pod series of `pod_utilization_queries`."""
        return labels.get(self.namespace_label, ""), labels.get(self.pod_label, "")

    def pod_utilization_queries(self, idle_below: float) -> tuple[str, str, str]:
        """Per pod (the exporters label a GPU with the pod holding it): the sum of its GPUs'
        utilization, their count, and how many of them are under `idle_below` percent."""
        held = f'{self.util_metric}{{{self.pod_label}!=""}}'
        by = f"by ({self.namespace_label}, {self.pod_label})"
        return f"sum {by} ({held})", f"count {by} ({held})", f"count {by} ({held} < {idle_below:g})"


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
    model_label="card_series",
    device_metrics={
        "temperature": "gpu_junction_temperature",
        "power": "gpu_package_power",
        "vram_total": "gpu_total_vram",
    },
)

NVIDIA = VendorProfile(
    name="nvidia",
    resource="nvidia.com/gpu",
    product_label="nvidia.com/gpu.product",
    driver_version_labels=("nvidia.com/cuda.driver-version.full",),
    exporter="dcgm-exporter",
    util_metric="DCGM_FI_DEV_GPU_UTIL",
    node_label="Hostname",
    gpu_index_label="gpu",
    serial_label="UUID",
    model_label="modelName",
    device_metrics={
        "temperature": "DCGM_FI_DEV_GPU_TEMP",
        "power": "DCGM_FI_DEV_POWER_USAGE",
        "vram_used": "DCGM_FI_DEV_FB_USED",
        "vram_free": "DCGM_FI_DEV_FB_FREE",
    },
)

PROFILES: dict[str, VendorProfile] = {p.name: p for p in (AMD, NVIDIA)}
VENDOR_CHOICES = (*PROFILES, "auto")


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

    def traffic_queries(self, window: str) -> tuple[str, str]:
        """The fleet's RDMA bytes per second, received and transmitted: a rate of each port's counter
        summed (the original's `rate(sum(...))` took the rate of a sum, wrong across resets)."""
        return tuple(  # type: ignore[return-value]
            f"sum(rate({counter}[{window}]))" for counter in (self.received_counter, self.transmitted_counter)
        )


INFINIBAND = NicProfile()
