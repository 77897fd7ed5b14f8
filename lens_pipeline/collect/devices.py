"""GPU devices from exporter metrics -> `gpu_device` rows, paired by GPU index (the original paired
by list position, §10.3), and the `node_device_changelog` rows of what was added, removed or replaced."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lens_pipeline.vendors import NicProfile, VendorProfile

Row = dict[str, Any]
Labels = Mapping[str, str]


def _gpu_key(labels: Labels, profile: VendorProfile) -> tuple[str, int] | None:
    node = labels.get(profile.node_label)
    index = labels.get(profile.gpu_index_label)
    if not node or index is None or not str(index).isdigit():
        return None
    return node, int(index)


def gpu_device_rows(
    profile: VendorProfile,
    identity: Iterable[tuple[Labels, float]],
    figures: Mapping[str, Iterable[tuple[Labels, float]]],
    fallback_models: Mapping[str, str],
) -> list[Row]:
    """One row per GPU seen by the exporter. `identity` are the samples of `identity_query` (which
    carry utilization), `figures` those of each `figure_query`; a node's product label names the
    model when the exporter does not."""
    by_figure: dict[str, dict[tuple[str, int], float]] = {}
    for figure, samples in figures.items():
        by_figure[figure] = {k: v for labels, v in samples if (k := _gpu_key(labels, profile)) is not None}
    rows: dict[tuple[str, int], Row] = {}
    for labels, utilization in identity:
        key = _gpu_key(labels, profile)
        if key is None:
            continue
        memory = by_figure.get("vram_total", {}).get(key)
        if memory is None and key in by_figure.get("vram_used", {}) and key in by_figure.get("vram_free", {}):
            memory = by_figure["vram_used"][key] + by_figure["vram_free"][key]
        rows[key] = {
            "node_name": key[0],
            "gpu_id": key[1],
            "gpu_model": labels.get(profile.model_label) or fallback_models.get(key[0], ""),
            "memory": round(memory) if memory is not None else None,
            "utilization": utilization,
            "temperature": by_figure.get("temperature", {}).get(key),
            "power": by_figure.get("power", {}).get(key),
            "serial": labels.get(profile.serial_label, ""),
        }
    return [rows[k] for k in sorted(rows)]


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


def rdma_device_rows(samples: Iterable[tuple[Labels, float]], nic: NicProfile) -> list[Row]:
    """One `rdma_device` row per (node, device) in node_exporter's `node_infiniband_info`."""
    rows: dict[tuple[str, str], Row] = {}
    for labels, _ in samples:
        node_name, device = labels.get(nic.node_label), labels.get(nic.device_label)
        if not node_name or not device:
            continue
        rows[(node_name, device)] = {
            "node_name": node_name,
            "ifname": device,
            "fw": labels.get(nic.firmware_label, ""),
            "node_type": labels.get(nic.type_label, ""),
        }
    return [rows[k] for k in sorted(rows)]
