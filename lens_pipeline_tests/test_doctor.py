"""`lens doctor` against simulated clusters over real HTTP: a fleet whose exporters speak every
dialect passes with nothing configured; each misconfiguration fails with the reason and the culprit."""

from __future__ import annotations

import subprocess
import sys

from lens_pipeline.cli import main
from lens_pipeline.sim.dialects import DIALECTS
from lens_pipeline_tests.defs.support import DEAD_URL, edit_registry, served_fleet


def _doctor(capsys, registry, *extra: str) -> tuple[int, str]:
    code = main(["doctor", "--registry", str(registry), "--timeout", "3", *extra])
    return code, capsys.readouterr().out


def test_every_dialect_passes_with_nothing_configured_but_capacities_without_quota(tmp_path, capsys):
    served = served_fleet(
        tmp_path, clusters=2 * len(DIALECTS), nodes=3, seed=4, vendor="mixed", dialect="mixed"
    )
    with served as (fleet, _server, registry):
        uncapped = sorted(c.name for c in fleet if not c.dialect.juicefs_quota)
        code, out = _doctor(capsys, registry)
        failing = sorted({line.split()[0] for line in out.splitlines() if " FAIL " in line})
        assert code == 1 and failing == uncapped, out
        assert all("JuiceFS volumes without quota" in line for line in out.splitlines() if " FAIL " in line)

        # What no Prometheus can tell, the registry does: the volumes' capacities.
        def capacities(document: dict) -> None:
            for entry in document["clusters"]:
                if entry["name"] in uncapped:
                    entry["juicefs_capacity_bytes"] = {"primus-data": 2**45, "primus-ckpt": 2**44}

        edit_registry(registry, capacities)
        code, out = _doctor(capsys, registry)
    assert code == 0, out
    assert "FAIL" not in out and f"every enabled cluster ({len(fleet)}) would be collected in full" in out
    assert "(prefix 'amd_')" in out and "pod by 'exported_namespace'/'exported_pod'" in out
    assert "matched by 'instance'" in out and "node by 'hostname'" in out


def test_misconfigured_clusters_fail_with_the_reason(tmp_path, capsys):
    with served_fleet(tmp_path, clusters=4, nodes=3, seed=2, vendor="mixed") as (fleet, _server, registry):
        names = [c.name for c in fleet]

        def break_them(document: dict) -> None:
            entries = {e["name"]: e for e in document["clusters"]}
            entries[names[0]]["prometheus_url"] = DEAD_URL
            entries[names[1]]["exporters"] = {"node_label": "kubernetes_node"}  # a label it does not have
            entries[names[2]]["exporters"] = {"metric_prefix": "amd_"}  # not this cluster's prefix
            entries[names[3]]["juicefs_capacity_bytes"] = {"not-a-volume": 1}

        edit_registry(registry, break_them)
        # A wrong token: the API answers 401.
        kubeconfig = tmp_path / "kubeconfigs" / f"{names[3]}.yaml"
        kubeconfig.write_text(kubeconfig.read_text().replace(fleet.cluster(names[3]).token, "wrong-token"))
        code, out = _doctor(capsys, registry)
    assert code == 1
    lines = {line for line in out.splitlines() if "FAIL" in line}
    assert any(
        names[0] in line and "prometheus" in line and "Connection refused" in line for line in lines
    ), out
    assert any(names[1] in line and "Ready GPU nodes have no GPU series" in line for line in lines), out
    assert any(names[2] in line and "no GPU exporter series" in line for line in lines), out
    assert any(names[3] in line and "kubernetes" in line and "401" in line for line in lines), out
    assert f"4 cluster(s) would have missing data: {', '.join(sorted(names))}" in out


def test_no_quota_storage_and_registry_errors_fail_and_the_command_runs(tmp_path):
    with served_fleet(tmp_path, clusters=1, nodes=2, seed=3, vendor="amd", dialect="no-quota") as (
        _,
        _,
        registry,
    ):
        edit_registry(registry, lambda d: d["clusters"].append({"name": "Bad_Name", "in_cluster": True}))
        done = subprocess.run(
            [sys.executable, "-m", "lens_pipeline.cli", "doctor", "--registry", str(registry)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "JuiceFS volumes without quota, capacity unknown" in done.stdout
    assert "Bad_Name" in done.stdout and "DNS-1123" in done.stdout
