"""GPU and NIC rows from exporter samples, and the device changelog."""

from __future__ import annotations

import math
from dataclasses import replace

from lens_pipeline.collect.devices import (
    device_changes,
    gpu_device_rows,
    nodes_without_gpu_series,
    rdma_device_rows,
)
from lens_pipeline.collect.nodes import NodeIndex
from lens_pipeline.vendors import AMD, INFINIBAND, NVIDIA


def _node(name: str, ip: str, hostname: str | None = None) -> dict:
    addresses = [{"type": "InternalIP", "address": ip}]
    if hostname:
        addresses.append({"type": "Hostname", "address": hostname})
    return {"metadata": {"name": name}, "status": {"addresses": addresses}}


NODES = NodeIndex([_node("n1", "10.0.0.1", "n1.lan"), _node("n2", "10.0.0.2")])


def test_amd_gpus_pair_figures_by_index_not_position():
    identity = [
        (
            {
                "hostname": "n1",
                "gpu_id": "1",
                "serial_number": "S1",
                "card_series": "AMD Instinct MI300X OAM",
            },
            40.0,
        ),
        (
            {
                "hostname": "n1",
                "gpu_id": "0",
                "serial_number": "S0",
                "card_series": "AMD Instinct MI300X OAM",
            },
            10.0,
        ),
        ({"hostname": "n2", "gpu_id": "x"}, 5.0),  # not a GPU index: ignored
    ]
    figures = {  # deliberately in another order than identity
        "temperature": [({"hostname": "n1", "gpu_id": "0"}, 50.0), ({"hostname": "n1", "gpu_id": "1"}, 70.0)],
        "power": [({"hostname": "n1", "gpu_id": "1"}, 700.0)],
        "vram_total": [
            ({"hostname": "n1", "gpu_id": "0"}, 196592.0),
            ({"hostname": "n1", "gpu_id": "1"}, 196592.0),
        ],
    }
    found = gpu_device_rows(AMD, identity, figures, {}, NODES)
    rows = found.rows
    assert [(r["gpu_id"], r["serial"], r["utilization"], r["temperature"], r["power"]) for r in rows] == [
        (0, "S0", 10.0, 50.0, None),
        (1, "S1", 40.0, 70.0, 700.0),
    ]
    assert rows[0]["memory"] == 196592 and rows[0]["gpu_model"] == "AMD Instinct MI300X OAM"


def test_nvidia_memory_is_used_plus_free_plus_reserved_and_model_falls_back_to_the_node_label():
    identity = [({"Hostname": "n1", "gpu": "0", "UUID": "GPU-1"}, 99.0)]
    figures = {
        "vram_used": [({"Hostname": "n1", "gpu": "0"}, 1000.0)],
        "vram_free": [({"Hostname": "n1", "gpu": "0"}, 80022.0)],
        "vram_reserved": [({"Hostname": "n1", "gpu": "0"}, 537.0)],
    }
    (row,) = gpu_device_rows(NVIDIA, identity, figures, {"n1": "NVIDIA-H100-80GB-HBM3"}, NODES).rows
    assert row["memory"] == 81559 and row["gpu_model"] == "NVIDIA-H100-80GB-HBM3" and row["serial"] == "GPU-1"
    del figures["vram_reserved"]  # dcgm-exporter before 4.3.1-4.4.0 has no reserve series
    (row,) = gpu_device_rows(NVIDIA, identity, figures, {}, NODES).rows
    assert row["memory"] == 81022


def test_series_are_matched_to_nodes_by_name_address_or_instance_and_strangers_are_reported():
    by_instance = replace(NVIDIA, node_label="instance")
    identity = [
        ({"instance": "10.0.0.1:9400", "gpu": "0", "UUID": "GPU-a"}, 10.0),
        ({"instance": "n1.lan:9400", "gpu": "1", "UUID": ""}, math.nan),  # no identity, no value
        ({"instance": "10.9.9.9:9400", "gpu": "0", "UUID": "GPU-x"}, 1.0),  # no such node
        ({"gpu": "0", "UUID": "GPU-y"}, 1.0),  # no node label at all
    ]
    found = gpu_device_rows(by_instance, identity, {}, {}, NODES)
    assert [(r["node_name"], r["gpu_id"], r["utilization"]) for r in found.rows] == [
        ("n1", 0, 10.0),
        ("n1", 1, None),
    ]
    assert found.unmatched_nodes == {"10.9.9.9:9400", "(no instance label)"}
    assert found.without_identity == ["n1/1"] and found.nonfinite == ["n1/1"]
    assert nodes_without_gpu_series({"n1", "n2"}, found.nodes) == ["n2"]


def test_a_gpu_reported_by_conflicting_series_is_left_out_and_its_node_is_not_silent():
    """Two series for n1/0 with different serials (a second exporter, a stale target): neither is
    believed. n1/1 is reported twice with the same identity (what `duplicate_query` finds) and is
    left out too; n1/2 is fine. Two node label values naming one node (name and address) collide."""
    identity = [
        ({"Hostname": "n1", "gpu": "0", "UUID": "GPU-a"}, 10.0),
        ({"Hostname": "n1", "gpu": "0", "UUID": "GPU-b"}, 12.0),
        ({"Hostname": "n1", "gpu": "1", "UUID": "GPU-c"}, 20.0),
        ({"Hostname": "n1", "gpu": "2", "UUID": "GPU-d"}, 30.0),
        ({"Hostname": "n2", "gpu": "0", "UUID": "GPU-e"}, 1.0),
        ({"Hostname": "10.0.0.2", "gpu": "0", "UUID": "GPU-e"}, 1.0),
    ]
    duplicates = [{"Hostname": "n1", "gpu": "1"}]
    found = gpu_device_rows(NVIDIA, identity, {}, {}, NODES, duplicates)
    assert [(r["node_name"], r["gpu_id"], r["serial"]) for r in found.rows] == [("n1", 2, "GPU-d")]
    assert found.duplicated == {("n1", 0), ("n1", 1), ("n2", 0)}
    assert nodes_without_gpu_series({"n1", "n2"}, found.nodes) == []  # seen, only not believed


def test_impossible_figures_are_unknown_and_named():
    identity = [
        ({"hostname": "n1", "gpu_id": "0", "serial_number": "S0"}, 1e6),
        ({"hostname": "n1", "gpu_id": "1", "serial_number": "S1"}, -3.0),
        ({"hostname": "n1", "gpu_id": "2", "serial_number": "S2"}, 100.0),
    ]
    figures = {
        "temperature": [
            ({"hostname": "n1", "gpu_id": "0"}, 65535.0),
            ({"hostname": "n1", "gpu_id": "2"}, 40.0),
        ],
        "power": [({"hostname": "n1", "gpu_id": "1"}, -1.0), ({"hostname": "n1", "gpu_id": "2"}, 0.0)],
        "vram_total": [
            ({"hostname": "n1", "gpu_id": "1"}, -196592.0),
            ({"hostname": "n1", "gpu_id": "2"}, 8.0),
        ],
    }
    found = gpu_device_rows(AMD, identity, figures, {}, NODES)
    figures_of = {
        r["gpu_id"]: (r["utilization"], r["temperature"], r["power"], r["memory"]) for r in found.rows
    }
    assert figures_of == {0: (None, None, None, None), 1: (None, None, None, None), 2: (100.0, 40.0, 0.0, 8)}
    assert sorted(found.out_of_range) == [
        "n1/0 temperature=65535",
        "n1/0 utilization=1e+06",
        "n1/1 memory=[-196592.0]",
        "n1/1 power=-1",
        "n1/1 utilization=-3",
    ]
    assert not found.nonfinite


def test_node_index_reads_hosts_of_instances():
    assert NODES.resolve("10.0.0.2:9100") == "n2"
    assert NODES.resolve("n1") == "n1" and NODES.resolve("n1.lan") == "n1"
    assert NODES.resolve("[fd00::1]:9100") is None and NODES.resolve("") is None
    ipv6 = NodeIndex([_node("v6", "fd00::1")])
    assert ipv6.resolve("[fd00::1]:9100") == "v6" and ipv6.resolve("fd00::1") == "v6"


def test_changes_record_adds_removes_and_replaced_cards():
    before = {("n1", 0): ("MI300X", "S0"), ("n1", 1): ("MI300X", "S1"), ("n1", 2): ("MI300X", "S2")}
    after = {("n1", 0): ("MI300X", "S0"), ("n1", 1): ("MI300X", "S9"), ("n1", 3): ("MI300X", "S3")}
    ops = [(c["op"], c["device_uuid"]) for c in device_changes(before, after)]
    assert ops == [("DELETE", "S1"), ("CREATE", "S9"), ("DELETE", "S2"), ("CREATE", "S3")]
    assert device_changes(before, before) == []


def test_nics_from_node_exporter_info():
    samples = [
        (
            {
                "node": "n1",
                "device": "mlx5_0",
                "firmware_version": "28.39.1002",
                "hca_type": "MT4129",
                "board_id": "MT_0000000838",
            },
            1.0,
        ),
        ({"device": "mlx5_1"}, 1.0),
    ]
    rows, unmatched = rdma_device_rows(samples, INFINIBAND, NODES)
    assert rows == [{"node_name": "n1", "ifname": "mlx5_0", "fw": "28.39.1002", "node_type": "MT4129"}]
    assert unmatched == {"(no node label)"}
    by_instance = replace(INFINIBAND, node_label="instance")
    rows, unmatched = rdma_device_rows(
        [({"instance": "10.0.0.2:9100", "device": "mlx5_0"}, 1.0)], by_instance, NODES
    )
    assert [r["node_name"] for r in rows] == ["n2"] and not unmatched


def test_amd_default_labels_name_the_model_by_the_node_product_label_then_card_model():
    """AMD's exporter by default has no `card_series` (the market name), only `card_model` (a board
    part number): the node's product label names the model, `card_model` only without one."""
    identity = [
        ({"hostname": "n1", "gpu_id": "0", "serial_number": "S0", "card_model": "102-G30211-00"}, 1.0),
        ({"hostname": "n2", "gpu_id": "0", "serial_number": "S1", "card_model": "102-G30211-00"}, 1.0),
    ]
    assert "card_model" in AMD.identity_query()
    rows = gpu_device_rows(AMD, identity, {}, {"n1": "AMD_Instinct_MI300X_OAM"}, NODES).rows
    assert [r["gpu_model"] for r in rows] == ["AMD_Instinct_MI300X_OAM", "102-G30211-00"]


def test_an_index_label_that_is_no_plain_number_is_no_index():
    """ "²" and other scripts' digits pass `str.isdigit` but not `int`; a 20-digit index fits no
    column: each is a series without a GPU index (counted by the asset), never an exception."""
    identity = [
        ({"hostname": "n1", "gpu_id": index, "serial_number": f"S{n}"}, 1.0)
        for n, index in enumerate(["²", "٣", "99999999999999999999", "-1", " 1", "3"])
    ]
    found = gpu_device_rows(AMD, identity, {}, {}, NODES)
    assert [(r["gpu_id"], r["serial"]) for r in found.rows] == [(3, "S5")]
    assert len(found.without_index) == 5
