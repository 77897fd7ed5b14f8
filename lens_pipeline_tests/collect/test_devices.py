"""GPU and NIC rows from exporter samples, and the device changelog."""

from __future__ import annotations

from lens_pipeline.collect.devices import device_changes, gpu_device_rows, rdma_device_rows
from lens_pipeline.vendors import AMD, INFINIBAND, NVIDIA


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
    rows = gpu_device_rows(AMD, identity, figures, {})
    assert [(r["gpu_id"], r["serial"], r["utilization"], r["temperature"], r["power"]) for r in rows] == [
        (0, "S0", 10.0, 50.0, None),
        (1, "S1", 40.0, 70.0, 700.0),
    ]
    assert rows[0]["memory"] == 196592 and rows[0]["gpu_model"] == "AMD Instinct MI300X OAM"


def test_nvidia_memory_is_used_plus_free_and_model_falls_back_to_the_node_label():
    identity = [({"Hostname": "n1", "gpu": "0", "UUID": "GPU-1"}, 99.0)]
    figures = {
        "vram_used": [({"Hostname": "n1", "gpu": "0"}, 1000.0)],
        "vram_free": [({"Hostname": "n1", "gpu": "0"}, 80000.0)],
    }
    (row,) = gpu_device_rows(NVIDIA, identity, figures, {"n1": "NVIDIA-H100-80GB-HBM3"})
    assert row["memory"] == 81000 and row["gpu_model"] == "NVIDIA-H100-80GB-HBM3" and row["serial"] == "GPU-1"


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
    assert rdma_device_rows(samples, INFINIBAND) == [
        {"node_name": "n1", "ifname": "mlx5_0", "fw": "28.39.1002", "node_type": "MT4129"}
    ]
