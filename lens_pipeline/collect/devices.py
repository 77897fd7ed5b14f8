"""GPU devices from exporter metrics -> `gpu_device` rows, paired by GPU index (the original paired
by list position, §10.3), and the `node_device_changelog` rows of what was added, removed or replaced."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lens_pipeline.collect.nodes import NodeIndex
from lens_pipeline.vendors import NicProfile, VendorProfile

Row = dict[str, Any]
Labels = Mapping[str, str]


# What a working GPU can report, in the units stored (percent, degrees Celsius, watts, MB). A value
# outside is a broken counter (1e6 %, 65535 °C, negative watts): unknown, never stored as a figure,
# and never overflowing a column (SaFE's DECIMAL(5,2) utilization, `gpu_device.memory`'s INTEGER).
PLAUSIBLE = {
    "utilization": (0.0, 100.0),
    "temperature": (-50.0, 150.0),
    "power": (0.0, 10_000.0),
    "memory": (0.0, 10_000_000.0),
}


def plausible(figure: str, value: float | None) -> bool:
    """Whether `value` (finite) is one a working GPU can report for `figure`."""
    low, high = PLAUSIBLE[figure]
    return value is not None and math.isfinite(value) and low <= value <= high


@dataclass
class GpuSeries:
    """`gpu_device` rows from one vendor's exporter series, and what could not be used: series that
    name no node of the cluster, GPUs without an identity (no serial or UUID), GPUs whose
    utilization is NaN or infinite (kept, utilization unknown), figures no working GPU reports
    (kept, that figure unknown), and GPUs that more than one series reports (left out: which
    series tells the truth is unknown, so their stored rows are kept as they are)."""

    rows: list[Row] = field(default_factory=list)
    unmatched_nodes: set[str] = field(default_factory=set)
    without_index: list[str] = field(default_factory=list)  # no GPU index label, or not a number
    without_identity: list[str] = field(default_factory=list)
    nonfinite: list[str] = field(default_factory=list)
    out_of_range: list[str] = field(default_factory=list)  # "node/gpu figure=value"
    duplicated: set[tuple[str, int]] = field(default_factory=set)

    @property
    def nodes(self) -> set[str]:
        """The nodes that some series of this vendor names (with a GPU index)."""
        return {row["node_name"] for row in self.rows} | {node for node, _ in self.duplicated}


# A GPU index is a small whole number; a label past it is no index (and would not fit its column).
MAX_GPU_INDEX_DIGITS = 6


def _gpu_index(labels: Labels, profile: VendorProfile) -> int | None:
    """The series' GPU index; None when the label is absent or no plain decimal number ("²" and
    other scripts' digits pass `str.isdigit` but not `int`)."""
    index = labels.get(profile.gpu_index_label)
    text = str(index) if index is not None else ""
    if text.isascii() and text.isdigit() and len(text) <= MAX_GPU_INDEX_DIGITS:
        return int(text)
    return None


def _gpu_key(labels: Labels, profile: VendorProfile, nodes: NodeIndex) -> tuple[str, int] | None:
    node = nodes.resolve(labels.get(profile.node_label))
    index = _gpu_index(labels, profile)
    return (node, index) if node and index is not None else None


MEMORY_FIGURES = ("vram_total", "vram_used", "vram_free", "vram_reserved")


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


def _duplicated_keys(
    profile: VendorProfile,
    identity: list[tuple[Labels, float]],
    duplicates: Iterable[Labels],
    nodes: NodeIndex,
) -> set[tuple[str, int]]:
    """GPUs reported by more than one series: what `duplicate_query` counts (same node label and
    index), and GPUs whose identity series differ (another serial, or two node label values naming
    one node)."""
    keys = [key for labels, _ in identity if (key := _gpu_key(labels, profile, nodes)) is not None]
    twice = {key for key, n in Counter(keys).items() if n > 1}
    return twice | {key for labels in duplicates if (key := _gpu_key(labels, profile, nodes)) is not None}


def gpu_device_rows(
    profile: VendorProfile,
    identity: Iterable[tuple[Labels, float]],
    figures: Mapping[str, Iterable[tuple[Labels, float]]],
    fallback_models: Mapping[str, str],
    nodes: NodeIndex,
    duplicates: Iterable[Labels] = (),
) -> GpuSeries:
    """One row per GPU seen by the exporter on a node of the cluster. `identity` are the samples of
    `identity_query` (which carry utilization, NaN included), `figures` those of each
    `figure_query`, `duplicates` the label sets of `duplicate_query`; `fallback_models` (node ->
    product label) name the model when the exporter's market-name label does not."""
    identity = list(identity)
    by_figure: dict[str, dict[tuple[str, int], float]] = {}
    for figure, samples in figures.items():
        by_figure[figure] = {
            k: v for labels, v in samples if (k := _gpu_key(labels, profile, nodes)) is not None
        }
    found = GpuSeries(duplicated=_duplicated_keys(profile, identity, duplicates, nodes))
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
        if key in found.duplicated:
            continue
        where = f"{key[0]}/{key[1]}"
        serial = labels.get(profile.serial_label, "")
        if not serial:
            found.without_identity.append(where)
        if not math.isfinite(utilization):
            found.nonfinite.append(where)
        measured = {
            "utilization": utilization,
            "temperature": by_figure.get("temperature", {}).get(key),
            "power": by_figure.get("power", {}).get(key),
        }
        memory_parts = [by_figure[f][key] for f in MEMORY_FIGURES if key in by_figure.get(f, {})]
        memory = _memory(by_figure, key)
        if memory is not None and not all(plausible("memory", v) for v in (*memory_parts, memory)):
            found.out_of_range.append(f"{where} memory={memory_parts}")
            memory = None
        for figure, value in measured.items():
            if value is not None and math.isfinite(value) and not plausible(figure, value):
                found.out_of_range.append(f"{where} {figure}={value:g}")
        rows[key] = {
            "node_name": key[0],
            "gpu_id": key[1],
            "gpu_model": _model(labels, profile, fallback_models.get(key[0], "")),
            "memory": round(memory) if memory is not None else None,
            **{figure: value if plausible(figure, value) else None for figure, value in measured.items()},
            "serial": serial,
        }
    found.rows = [rows[k] for k in sorted(rows)]
    return found


def _model(labels: Labels, profile: VendorProfile, node_product: str) -> str:
    """The GPU's market name from the exporter; else the node's product label (the same name as the
    vendor's labeller writes it); else another label naming the model (AMD's board part number)."""
    fallbacks = (labels.get(label, "") for label in profile.model_label_fallbacks)
    return labels.get(profile.model_label) or node_product or next((m for m in fallbacks if m), "")


def nodes_without_gpu_series(gpu_nodes: Iterable[str], seen: Iterable[str]) -> list[str]:
    """GPU nodes (Ready, with GPUs) that no exporter series names: their GPUs are invisible."""
    return sorted(set(gpu_nodes) - set(seen))


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
