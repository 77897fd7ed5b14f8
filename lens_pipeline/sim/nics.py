"""RDMA/InfiniBand NICs of a simulated GPU node, as /sys/class/infiniband (and so node_exporter's
infiniband collector and `rdma dev show`) describe them: one ConnectX HCA per GPU, port 1."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class SimNic:
    """One HCA port. `present` False: the device vanished (a PCIe or firmware fault) and the node's
    exporter no longer reports it."""

    device: str  # mlx5_0, mlx5_1, ...
    port: int
    node_guid: str  # as sysfs prints it: 4 groups of 4 hex digits
    firmware_version: str
    board_id: str
    hca_type: str
    rate_gbps: int
    link_layer: str
    if_index: int
    present: bool = True

    @property
    def rate_bytes_per_second(self) -> int:
        """node_infiniband_rate_bytes_per_second, as node_exporter derives it from the `rate` file."""
        return self.rate_gbps * 125_000_000


# ConnectX-7 (NDR) on most nodes, ConnectX-6 (HDR) on older racks.
_MODELS = (
    ("MT4129", "MT_0000000838", "28.39.2048", 400, 0.8),
    ("MT4123", "MT_0000000223", "20.38.1002", 200, 0.2),
)


def node_nics(rng: random.Random, count: int) -> list[SimNic]:
    """`count` HCAs of one model (nodes are built from one bill of materials)."""
    hca_type, board_id, firmware, rate, _ = rng.choices(_MODELS, weights=[m[4] for m in _MODELS])[0]
    nics = []
    for index in range(count):
        guid = rng.getrandbits(48)
        node_guid = (
            f"{0xB83F:04x}:{(guid >> 32) & 0xFFFF:04x}:{(guid >> 16) & 0xFFFF:04x}:{guid & 0xFFFF:04x}"
        )
        nics.append(
            SimNic(
                device=f"mlx5_{index}",
                port=1,
                node_guid=node_guid,
                firmware_version=firmware,
                board_id=board_id,
                hca_type=hca_type,
                rate_gbps=rate,
                link_layer="InfiniBand",
                # ib0 and friends follow lo and the two Ethernet ports.
                if_index=4 + index,
            )
        )
    return nics
