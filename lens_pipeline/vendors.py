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
    extra: dict[str, str] = field(default_factory=dict)

    def node_utilization_query(self) -> str:
        """One grouped query for every node's mean GPU utilization (never one query per node)."""
        return f"avg by ({self.node_label}) ({self.util_metric})"


AMD = VendorProfile(
    name="amd",
    resource="amd.com/gpu",
    product_label="amd.com/gpu.product-name",
    driver_version_labels=("amd.com/gpu.driver-version",),
    exporter="device-metrics-exporter",
    util_metric="gpu_gfx_activity",
    node_label="hostname",
    gpu_index_label="gpu_id",
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
