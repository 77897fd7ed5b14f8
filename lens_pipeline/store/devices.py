"""Writing `gpu_device`, `rdma_device` and `node_device_changelog` for one cluster."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from lens_pipeline.collect.devices import device_changes
from lens_pipeline.store.schema import gpu_device, node, node_device_changelog, rdma_device
from lens_pipeline.store.upsert import bulk_upsert, sync_snapshot

Row = dict[str, Any]
Key = tuple[str, Any]  # (node, GPU index or NIC name)
Device = tuple[str, str]  # (model or NIC name, serial or NIC name), as the changelog names it


def node_ids(conn: Connection, cluster_name: str) -> dict[str, int]:
    query = select(node.c.name, node.c.id).where(node.c.cluster_name == cluster_name)
    return {name: id_ for name, id_ in conn.execute(query)}


def write_devices(
    conn: Connection,
    cluster_name: str,
    *,
    gpus: Sequence[Row],
    nics: Sequence[Row] | None,
    now: datetime,
    keep_gpus_of: Iterable[str] = (),
    keep_gpus: Iterable[tuple[str, int]] = (),
    keep_nics_of: Iterable[str] = (),
) -> dict[str, Any]:
    """GPUs that vanished are deleted (as the original did) and NICs soft-deleted, both with a
    changelog row. What was not seen for want of series is left as stored, with no changelog row:
    the GPUs of `keep_gpus_of` (nodes not Ready, or whose exporter is silent: their series are
    missing, not their GPUs), the GPUs `keep_gpus` (reported by conflicting series) and the NICs of
    `keep_nics_of`. `nics` None: the NIC metrics were not available this run. A GPU seen without a
    serial keeps the stored one.

    Returns the sync results, the changelog rows, and the stored devices kept unseen
    (`kept_gpus`, `kept_nics`: (node, gpu index or NIC name) keys)."""
    scope = {"cluster_name": cluster_name}
    ids = node_ids(conn, cluster_name)
    stored_gpus = {
        (r.node_name, r.gpu_id): (r.gpu_model or "", r.serial or "")
        for r in conn.execute(
            select(
                gpu_device.c.node_name, gpu_device.c.gpu_id, gpu_device.c.gpu_model, gpu_device.c.serial
            ).where(gpu_device.c.cluster_name == cluster_name)
        )
    }
    gpus = _with_known_serials(gpus, stored_gpus)
    seen_gpus = {(r["node_name"], r["gpu_id"]): (r["gpu_model"] or "", r["serial"] or "") for r in gpus}
    kept_gpus = _kept(stored_gpus, seen_gpus, set(keep_gpus_of), set(keep_gpus))
    kept_nics: dict[Key, Device] = {}
    changes = device_changes(stored_gpus, {**seen_gpus, **kept_gpus}, "gpu")
    gpu_result = sync_snapshot(
        conn,
        gpu_device,
        scope,
        [{**scope, **r, "node_id": ids.get(r["node_name"])} for r in gpus],
        now=now,
        on_vanish="delete",
        protect=[(cluster_name, *k) for k in kept_gpus],
    )
    nic_result = None
    if nics is not None:
        stored_nics = {
            (r.node_name, r.ifname): (r.ifname, r.ifname)
            for r in conn.execute(
                select(rdma_device.c.node_name, rdma_device.c.ifname).where(
                    rdma_device.c.cluster_name == cluster_name, rdma_device.c.deleted_at.is_(None)
                )
            )
        }
        seen_nics = {(r["node_name"], r["ifname"]): (r["ifname"], r["ifname"]) for r in nics}
        kept_nics = _kept(stored_nics, seen_nics, set(keep_nics_of), set())
        changes += device_changes(stored_nics, {**seen_nics, **kept_nics}, "rdma")
        nic_result = sync_snapshot(
            conn,
            rdma_device,
            scope,
            [{**scope, **r, "node_id": ids.get(r["node_name"]), "deleted_at": None} for r in nics],
            now=now,
            on_vanish={"deleted_at": now},
            may_vanish=rdma_device.c.deleted_at.is_(None),
            protect=[(cluster_name, *k) for k in kept_nics],
        )
    bulk_upsert(
        conn,
        node_device_changelog,
        [{**scope, **c, "node_id": ids.get(c["node_name"]), "created_at": now} for c in changes],
        update_columns=[],
        new=True,  # stamped with this run's time: no stored row has their key
    )
    return {
        "gpu_device": gpu_result,
        "rdma_device": nic_result,
        "changes": changes,
        "kept_gpus": sorted(kept_gpus),
        "kept_nics": sorted(kept_nics),
    }


def _kept(
    stored: Mapping[Key, Device], seen: Mapping[Key, Device], nodes: set[str], keys: set[Key]
) -> dict[Key, Device]:
    """The stored devices not seen this run that stay as they are: on one of `nodes`, or in `keys`."""
    return {k: v for k, v in stored.items() if k not in seen and (k[0] in nodes or k in keys)}


def _with_known_serials(gpus: Sequence[Row], stored: Mapping[Key, Device]) -> list[Row]:
    """A GPU whose series lost its serial (a label dropped, a VM guest) is no replaced card: it keeps
    the serial stored for it."""
    out = []
    for row in gpus:
        known = stored.get((row["node_name"], row["gpu_id"]), ("", ""))[1]
        out.append({**row, "serial": known} if not row["serial"] and known else row)
    return out
