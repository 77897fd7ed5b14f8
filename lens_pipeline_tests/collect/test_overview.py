"""collect/overview.py: JuiceFS volumes from the grouped answers, and the cluster's storage figures."""

from __future__ import annotations

from lens_pipeline.collect.overview import JUICEFS_UNLIMITED_SPACE, juicefs_volumes, storage_figures

TIB = float(1 << 40)


def test_each_volume_takes_its_figures_and_a_volume_without_quota_has_no_capacity():
    figures = {
        "total_space": {
            "quota": 10 * TIB,
            "unlimited": JUICEFS_UNLIMITED_SPACE,
            "registered": JUICEFS_UNLIMITED_SPACE,
        },
        "used_space": {"quota": 4 * TIB, "unlimited": 1 * TIB, "registered": 3 * TIB},
        "total_inodes": {"quota": 1000.0},
        "used_inodes": {"quota": 10.0, "unlimited": 5.0},
        "read_bandwidth": {"quota": 7.0},
        "write_bandwidth": {},
    }
    volumes, uncapped = juicefs_volumes(
        ["quota", "unlimited", "registered", "silent"], figures, {"registered": 20 * TIB}
    )
    quota, unlimited, registered, silent = volumes
    assert (quota.total_space, quota.used_space, quota.total_inodes, quota.read_bandwidth) == (
        10 * TIB,
        4 * TIB,
        1000.0,
        7.0,
    )
    assert unlimited.total_space is None and unlimited.used_space == 1 * TIB  # 1 PiB made up: no capacity
    assert registered.total_space == 20 * TIB  # the registry's capacity wins over the made-up total
    assert silent.used_space is None and silent.write_bandwidth is None  # no series: unknown, not 0
    assert uncapped == ["unlimited", "silent"]
    totals = storage_figures(volumes)
    assert totals["storage_used_space"] is None  # one volume's usage is unknown: so is the sum
