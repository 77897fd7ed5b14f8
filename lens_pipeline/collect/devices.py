"""GPU devices from exporter metrics -> `gpu_device` rows, paired by GPU index (the original paired
by list position, §10.3), and the `node_device_changelog` rows of what was added, removed or replaced."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lens_pipeline.collect.nodes import NodeIndex
from lens_pipeline.vendors import NicProfile, VendorProfile

Row = dict[str, Any]
Labels = Mapping[str, str]


@dataclass
class GpuSeries:
    """`gpu_device` rows from one vendor's exporter series, and what could not be used: series that
    name no node of the cluster, GPUs without an identity (no serial or UUID), GPUs whose
    utilization is NaN or infinite (kept, utilization unknown)."""

    rows: list[Row] = field(default_factory=list)
    unmatched_nodes: set[str] = field(default_factory=set)
    without_index: list[str] = field(default_factory=list)  # no GPU index label, or not a number
    without_identity: list[str] = field(default_factory=list)
    nonfinite: list[str] = field(default_factory=list)


def _gpu_index(labels: Labels, profile: VendorProfile) -> int | None:
    index = labels.get(profile.gpu_index_label)
    return int(index) if index is not None and str(index).isdigit() else None


def _gpu_key(labels: Labels, profile: VendorProfile, nodes: NodeIndex) -> tuple[str, int] | None:
    node = nodes.resolve(labels.get(profile.node_label))
    index = _gpu_index(labels, profile)
    return (node, index) if node and index is not None else None


def _memory(figures: Mapping[str, Mapping[tuple[str, int], float]], key: tuple[str, int]) -> float | None:
    """A GPU's memory in MB: the exporter's total, or used + free (+ reserved, which dcgm-exporter
    reports since 4.3.1-4.4.0 and which is part of the framebuffer)."""
    total = figures.get("vram_total", {}).get(key)
    if total is not None:
        return total
    used, free = figures.get("vram_used", {}).get(key), figures.get("vram_free", {}).get(key)
    if used is None or free is None:
        return None
    return used + free + figures.get("vram_reserved", {}).get(key, 0.0)


def gpu_device_rows(
    profile: VendorProfile,
    identity: Iterable[tuple[Labels, float]],
    figures: Mapping[str, Iterable[tuple[Labels, float]]],
    fallback_models: Mapping[str, str],
    nodes: NodeIndex,
) -> GpuSeries:
    """One row per GPU seen by the exporter on a node of the cluster. `identity` are the samples of
    `identity_query` (which carry utilization, NaN included), `figures` those of each
    `figure_query`; a node's product label names the model when the exporter does not."""
    by_figure: dict[str, dict[tuple[str, int], float]] = {}
    for figure, samples in figures.items():
        by_figure[figure] = {
            k: v for labels, v in samples if (k := _gpu_key(labels, profile, nodes)) is not None
        }
    found = GpuSeries()
    rows: dict[tuple[str, int], Row] = {}
    for labels, utilization in identity:
        key = _gpu_key(labels, profile, nodes)
        if key is None:
            node = labels.get(profile.node_label) or f"(no {profile.node_label} label)"
            if nodes.resolve(labels.get(profile.node_label)) is None:
                found.unmatched_nodes.add(node)
            else:
                found.without_index.append(f"{node}/{labels.get(profile.gpu_index_label, '(none)')}")
            continue
        where = f"{key[0]}/{key[1]}"
        serial = labels.get(profile.serial_label, "")
        if not serial:
            found.without_identity.append(where)
        if not math.isfinite(utilization):
            found.nonfinite.append(where)
        memory = _memory(by_figure, key)
        rows[key] = {
            "node_name": key[0],
            "gpu_id": key[1],
            "gpu_model": labels.get(profile.model_label) or fallback_models.get(key[0], ""),
            "memory": round(memory) if memory is not None and math.isfinite(memory) else None,
            "utilization": utilization if math.isfinite(utilization) else None,
            "temperature": _finite(by_figure.get("temperature", {}).get(key)),
            "power": _finite(by_figure.get("power", {}).get(key)),
            "serial": serial,
        }
    found.rows = [rows[k] for k in sorted(rows)]
    return found


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def nodes_without_gpu_series(gpu_nodes: Iterable[str], rows: Iterable[Row]) -> list[str]:
    """GPU nodes (Ready, with GPUs) that no exporter series names: their GPUs are invisible."""
    seen = {row["node_name"] for row in rows}
    return sorted(set(gpu_nodes) - seen)


def device_changes(
    before: Mapping[tuple[str, int], tuple[str, str]],
    after: Mapping[tuple[str, int], tuple[str, str]],
    device_type: str = "gpu",
) -> list[Row]:
    """CREATE / DELETE changelog rows between two states {(node, index): (model, serial)}.

    A card whose serial changed under the same index was replaced: its old self is deleted and the
    new one created."""
    changes: list[Row] = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new or (old and new and old[1] == new[1]):
            continue
        if old is not None:
            changes.append(
                {
                    "node_name": key[0],
                    "device_type": device_type,
                    "device_name": old[0],
                    "device_uuid": old[1],
                    "op": "DELETE",
                }
            )
        if new is not None:
            changes.append(
                {
                    "node_name": key[0],
                    "device_type": device_type,
                    "device_name": new[0],
                    "device_uuid": new[1],
                    "op": "CREATE",
                }
            )
    return changes


def rdma_device_rows(
    samples: Iterable[tuple[Labels, float]], nic: NicProfile, nodes: NodeIndex
) -> tuple[list[Row], set[str]]:
    """One `rdma_device` row per (node, device) in node_exporter's `node_infiniband_info`, and the
    label values of the series that name no node of the cluster."""
    rows: dict[tuple[str, str], Row] = {}
    unmatched: set[str] = set()
    for labels, _ in samples:
        node_name, device = nodes.resolve(labels.get(nic.node_label)), labels.get(nic.device_label)
        if not node_name:
            unmatched.add(labels.get(nic.node_label) or f"(no {nic.node_label} label)")
            continue
        if not device:
            continue
        rows[(node_name, device)] = {
            "node_name": node_name,
            "ifname": device,
            "fw": labels.get(nic.firmware_label, ""),
            "node_type": labels.get(nic.type_label, ""),
        }
    return [rows[k] for k in sorted(rows)], unmatched
