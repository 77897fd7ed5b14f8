"""The simulator's one table of GPU vendor facts: Kubernetes resource and node labels, device
identities and the exporter metric names and labels (AMD device-metrics-exporter, NVIDIA dcgm-exporter)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuProduct:
    """One GPU model as the node labels and the exporter name it."""

    node_label: str
    weight: float
    memory_mib: int  # the whole framebuffer
    # Model-identifying labels on every exporter series of this product.
    exporter_labels: tuple[tuple[str, str], ...]
    # Framebuffer the driver keeps (dcgm-exporter's DCGM_FI_DEV_FB_RESERVED; used + free + reserved
    # is the whole). 537 MiB on an H100 80GB; the A100 figure is this simulator's own.
    reserved_mib: int = 0


@dataclass(frozen=True)
class GpuDevice:
    """One GPU of a node: its index and the identities the exporter reports."""

    index: int
    uuid: str
    serial: str


@dataclass(frozen=True)
class SimVendor:
    """Everything the simulator does differently per GPU vendor."""

    name: str
    resource: str
    product_label: str
    driver_label: str
    driver_version: str
    products: tuple[GpuProduct, ...]
    # Node labels besides product and driver (device plugin / feature discovery), per product.
    extra_node_labels: Callable[[GpuProduct, int], dict[str, str]]
    taint_key: str
    util_metric: str
    util_help: str
    # dcgm-exporter reports whole percents; device-metrics-exporter reports fractions.
    util_decimals: int
    # The series label carrying the node name.
    node_label: str
    # Series labels naming one device, given (node name, device, product, driver version).
    device_labels: Callable[[str, GpuDevice, GpuProduct, str], dict[str, str]]
    # Labels the exporter adds when a device is allocated to a running container.
    workload_labels: tuple[str, str, str]
    # Node labels of the driver version's parts in older releases of the feature discovery.
    legacy_driver_labels: tuple[str, ...]
    exporter_job: str
    exporter_port: int
    exporter_namespace: str
    exporter_image: str
    workload_image: str
    # Whether an extended resource's units are this vendor's GPUs besides `resource`: MIG instances,
    # partitions and renamed shares, as the vendors' device plugins advertise them.
    other_units: Callable[[str], bool] = lambda resource: False

    def counts_as_gpus(self, resource: str) -> bool:
        return resource == self.resource or self.other_units(resource)

    def gpu_resources_in(self, quantities: object) -> list[str]:
        """The names in a capacity, requests or limits that are this vendor's GPUs."""
        return [r for r in quantities if self.counts_as_gpus(r)] if isinstance(quantities, dict) else []


# ROCm's device plugin, `-resource_naming_strategy mixed`: `amd.com/<compute>_<memory partition>`.
_AMD_COMPUTE_PARTITIONS = ("spx", "dpx", "tpx", "qpx", "cpx")


def _amd_partition(resource: str) -> bool:
    group, _, name = resource.partition("/")
    compute, _, memory = name.partition("_")
    return (
        group == "amd.com"
        and compute in _AMD_COMPUTE_PARTITIONS
        and memory[:3] == "nps"
        and memory[3:].isdigit()
    )


def _nvidia_slice_or_share(resource: str) -> bool:
    """MIG instances of the `mixed` strategy (`nvidia.com/mig-<G>g.<M>gb`, then any attributes or
    `.shared`) and time-slicing's renamed share (`nvidia.com/gpu.shared`)."""
    if resource == "nvidia.com/gpu.shared":
        return True
    profile = resource.removeprefix("nvidia.com/mig-")
    if profile == resource:
        return False
    slices, _, rest = profile.partition("g.")
    memory = rest[: len(rest) - len(rest.lstrip("0123456789"))]
    return slices.isdigit() and bool(memory) and rest[len(memory) : len(memory) + 2] == "gb"


AMD_NODE_LABEL = "hostname"
NVIDIA_NODE_LABEL = "Hostname"


def _amd_node_labels(product: GpuProduct, gpu_count: int) -> dict[str, str]:
    device_id = dict(product.exporter_labels)["card_model"].removeprefix("0x")
    return {"amd.com/gpu.device-id": device_id, "amd.com/gpu.family": "AI"}


def _amd_device_labels(node: str, device: GpuDevice, product: GpuProduct, driver: str) -> dict[str, str]:
    return {
        AMD_NODE_LABEL: node,
        "gpu_id": str(device.index),
        "serial_number": device.serial,
        **dict(product.exporter_labels),
        "gpu_uuid": device.uuid,
    }


def _nvidia_node_labels(product: GpuProduct, gpu_count: int) -> dict[str, str]:
    return {
        "nvidia.com/gpu.count": str(gpu_count),
        "nvidia.com/gpu.memory": str(product.memory_mib),
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.machine": "DGX-H100" if "H100" in product.node_label else "DGX-A100",
    }


def _nvidia_device_labels(node: str, device: GpuDevice, product: GpuProduct, driver: str) -> dict[str, str]:
    return {
        "gpu": str(device.index),
        "UUID": f"GPU-{device.uuid}",
        "device": f"nvidia{device.index}",
        **dict(product.exporter_labels),
        NVIDIA_NODE_LABEL: node,
        "DCGM_FI_DRIVER_VERSION": driver,
    }


AMD = SimVendor(
    name="amd",
    resource="amd.com/gpu",
    product_label="amd.com/gpu.product-name",
    driver_label="amd.com/gpu.driver-version",
    driver_version="6.10.5",
    products=(
        GpuProduct(
            "AMD_Instinct_MI300X_OAM",
            0.75,
            196592,
            (("card_model", "0x74a1"), ("card_series", "AMD Instinct MI300X OAM")),
        ),
        GpuProduct(
            "AMD_Instinct_MI325X_OAM",
            0.25,
            262128,
            (("card_model", "0x74a5"), ("card_series", "AMD Instinct MI325X OAM")),
        ),
    ),
    extra_node_labels=_amd_node_labels,
    taint_key="amd.com/gpu",
    util_metric="gpu_gfx_activity",
    util_help="Graphics engine activity in percent",
    util_decimals=1,
    node_label=AMD_NODE_LABEL,
    device_labels=_amd_device_labels,
    workload_labels=("pod", "namespace", "container"),
    legacy_driver_labels=(),
    exporter_job="device-metrics-exporter",
    exporter_port=5000,
    exporter_namespace="kube-amd-gpu",
    exporter_image="docker.io/rocm/device-metrics-exporter:v1.2.0",
    workload_image="docker.io/rocm/pytorch:rocm6.2_ubuntu22.04_py3.10_pytorch_release_2.3.0",
    other_units=_amd_partition,
)

NVIDIA = SimVendor(
    name="nvidia",
    resource="nvidia.com/gpu",
    product_label="nvidia.com/gpu.product",
    driver_label="nvidia.com/cuda.driver-version.full",
    driver_version="550.54.15",
    products=(
        GpuProduct("NVIDIA-H100-80GB-HBM3", 0.75, 81559, (("modelName", "NVIDIA H100 80GB HBM3"),), 537),
        GpuProduct("NVIDIA-A100-SXM4-80GB", 0.25, 81920, (("modelName", "NVIDIA A100-SXM4-80GB"),), 530),
    ),
    extra_node_labels=_nvidia_node_labels,
    taint_key="nvidia.com/gpu",
    util_metric="DCGM_FI_DEV_GPU_UTIL",
    util_help="GPU utilization (in %).",
    util_decimals=0,
    node_label=NVIDIA_NODE_LABEL,
    device_labels=_nvidia_device_labels,
    workload_labels=("pod", "namespace", "container"),
    legacy_driver_labels=(
        "nvidia.com/cuda.driver.major",
        "nvidia.com/cuda.driver.minor",
        "nvidia.com/cuda.driver.rev",
    ),
    exporter_job="dcgm-exporter",
    exporter_port=9400,
    exporter_namespace="gpu-operator",
    exporter_image="nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-ubuntu22.04",
    workload_image="nvcr.io/nvidia/pytorch:24.05-py3",
    other_units=_nvidia_slice_or_share,
)

VENDORS: dict[str, SimVendor] = {vendor.name: vendor for vendor in (AMD, NVIDIA)}
