"""The `lens` command as a user runs it: a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lens_pipeline.store.db import get_engine
from lens_pipeline.store.migrate import current_revision, head_revision


def test_lens_db_upgrade_creates_both_databases_from_the_environment(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "LENS_DATABASE_URL": "", "LENS_SAFE_DATABASE_URL": ""}
    lens = Path(sys.executable).with_name("lens")
    result = subprocess.run(
        [str(lens), "db", "upgrade"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "lens.db").exists() and (tmp_path / "safe.db").exists()
    for database in ("lens", "safe"):
        engine = get_engine(f"sqlite:///{tmp_path / f'{database}.db'}")
        assert current_revision(engine, database) == head_revision(database)
    assert "at revision head" in result.stdout


def test_lens_without_a_command_explains_itself():
    lens = Path(sys.executable).with_name("lens")
    result = subprocess.run([str(lens)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "demo" in result.stderr


def test_lens_demo_on_a_taken_port_says_which_flag_to_change(tmp_path):
    """Before starting anything: a port something listens on is a clear error naming the flag."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        lens = Path(sys.executable).with_name("lens")
        result = subprocess.run(
            [
                str(lens),
                "demo",
                "--state-dir",
                str(tmp_path / "demo"),
                "--port",
                "0",
                "--api-port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert f"port {port} is taken on 127.0.0.1: choose another with --api-port PORT" in result.stderr
    assert not (tmp_path / "demo").exists()  # nothing was started or written


def test_lens_api_serves_the_database_of_the_environment(tmp_path):
    """`lens api` in its own process: the schema is created, health answers, a token guards /v1."""
    import json
    import time
    import urllib.error
    import urllib.request

    from lens_pipeline_tests.ports import free_port

    port = free_port()
    url = f"sqlite:///{tmp_path / 'lens.db'}"
    env = {**os.environ, "LENS_DATABASE_URL": url, "LENS_API_TOKEN": "t0ken"}
    lens = Path(sys.executable).with_name("lens")
    server = subprocess.Popen([str(lens), "api", "--host", "127.0.0.1", "--port", str(port)], env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
                    assert json.load(response)["meta"]["code"] == 2000
                break
            except OSError:
                assert time.monotonic() < deadline, "lens api did not answer"
                time.sleep(0.2)
        assert current_revision(get_engine(url), "lens") == head_revision("lens")
        request = urllib.request.Request(f"{base}/v1/clusters/overview?cluster=none")
        try:
            urllib.request.urlopen(request, timeout=5)
            raise AssertionError("no token, no answer")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
        request.add_header("Authorization", "Bearer t0ken")
        try:
            urllib.request.urlopen(request, timeout=5)
            raise AssertionError("an unknown cluster is 404")
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
    finally:
        server.terminate()
        # uvicorn shuts down gracefully, then re-raises the signal: -SIGTERM is a clean stop.
        assert server.wait(timeout=30) in (0, -15)


def test_dagster_asset_materialize_and_job_backfill_from_the_shell(tmp_path):
    """`dagster asset materialize` from the shell, on an instance that knows the partitions: the
    collectors and views of one cluster partition; then `dagster job backfill` of chosen clusters.
    (A range of clusters is a backfill: from the UI it is cut into runs of `$LENS_CLUSTERS_PER_RUN`
    clusters, see test_browser.py; the CLI's `asset materialize --partition-range` needs a
    single-run policy, which would let one run grow past run monitoring's limit.)"""
    from dagster import DagsterInstance
    from sqlalchemy import select

    from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
    from lens_pipeline.sim.fleet import SimFleet
    from lens_pipeline.sim.registry import write_registry
    from lens_pipeline.sim.server import SimServer
    from lens_pipeline.store.schema import cluster_overview_cache

    home = tmp_path / "dagster_home"
    home.mkdir()
    lens_url = f"sqlite:///{tmp_path / 'lens.db'}"
    fleet = SimFleet.generate(clusters=3, nodes=4, seed=2, vendor="nvidia")
    names = [c.name for c in fleet]
    cluster = names[0]
    with SimServer(fleet) as server:
        registry = write_registry(tmp_path / "clusters.yaml", server)
        with DagsterInstance.from_config(str(home)) as instance:
            instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, names)
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "LENS_CLUSTERS_FILE": str(registry),
            "LENS_DATABASE_URL": lens_url,
            "LENS_SAFE_DATABASE_URL": f"sqlite:///{tmp_path / 'safe.db'}",
        }
        dagster = Path(sys.executable).with_name("dagster")
        command = [str(dagster), "asset", "materialize", "-m", "lens_pipeline.definitions"]
        command += ["--select", "gpu_nodes,gpu_devices,storage_backends,cluster_overview_cache"]
        result = subprocess.run(
            [*command, "--partition", cluster], env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr[-3000:]
        with get_engine(lens_url).connect() as conn:
            rows = conn.execute(select(cluster_overview_cache.c.cluster_name)).all()
        assert [r[0] for r in rows] == [cluster]

        # `dagster job backfill` of chosen clusters: one queued run per cluster, for the daemon.
        backfill = [
            str(dagster),
            "job",
            "backfill",
            "-m",
            "lens_pipeline.definitions",
            "-j",
            "collect_cluster",
        ]
        backfill += ["--partitions", f"{names[0]},{names[2]}", "--noprompt"]
        result = subprocess.run(backfill, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0 and "Launched backfill" in result.stdout, result.stderr[-3000:]
        with DagsterInstance.from_config(str(home)) as instance:
            queued = [r for r in instance.get_runs() if "dagster/backfill" in r.tags]
        assert sorted(r.tags["dagster/partition"] for r in queued) == [names[0], names[2]]
        assert {r.job_name for r in queued} == {"collect_cluster"}


def test_the_demo_finds_its_instance_in_the_package_not_the_checkout():
    """`pip install .` (not editable) ships no repository: the demo's dagster.yaml and workspace.yaml
    are package data, and the checkout's top-level files are links to them."""
    from lens_pipeline import cli

    root = Path(cli.__file__).resolve().parents[1]
    for name in ("dagster.yaml", "workspace.yaml"):
        packaged = cli.INSTANCE_DIR / name
        assert packaged.is_file() and cli.INSTANCE_DIR.is_relative_to(Path(cli.__file__).resolve().parent)
        assert (root / name).resolve() == packaged.resolve()
    assert "REPO_ROOT" not in Path(cli.__file__).read_text()


def test_the_demo_and_the_simulator_say_they_are_not_in_the_production_image(monkeypatch, capsys):
    """The production image has no simulator: `lens demo` and `lens sim` say so instead of failing
    on an import. Elsewhere they need nothing beyond `pip install .` (no protoc)."""
    import importlib.util

    from lens_pipeline import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "lens_pipeline.sim" else real(name, *a)
    )
    for command in ("demo", "sim"):
        assert cli.main([command]) == 2
        error = capsys.readouterr().err
        assert "no module lens_pipeline.sim" in error and "production image" in error
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert cli._simulator_missing() is None


def test_the_demo_stops_on_sigint_even_when_started_with_sigint_ignored(tmp_path):
    """A shell starting a command in the background (`lens demo &`, nohup, CI scripts) hands it
    SIGINT ignored, and Python leaves it so: `kill -INT` (Ctrl-C) must still stop the demo and
    everything it started, promptly (its children would otherwise inherit the ignored signal)."""
    import signal
    import threading
    import time

    import psutil

    from lens_pipeline_tests.ports import free_port

    lens = Path(sys.executable).with_name("lens")
    command = [str(lens), "demo", "--clusters", "1", "--nodes", "2", "--state-dir", str(tmp_path / "demo")]
    command += ["--port", str(free_port()), "--api-port", str(free_port()), "--ingest-port", str(free_port())]
    command += ["--watch-port", str(free_port())]
    demo = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(demo.stdout or ()), daemon=True).start()
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 90
        # dagster dev's webserver and daemon, and the three sidecars, are up.
        while time.monotonic() < deadline and demo.poll() is None:
            tree = psutil.Process(demo.pid).children(recursive=True)
            commands = " ".join(" ".join(p.cmdline()) for p in tree if p.is_running())
            if all(
                w in commands
                for w in ("dagster._daemon", "dagster_webserver", " api ", " ingest ", " watch ")
            ):
                break
            time.sleep(1)
        else:
            raise AssertionError(f"the demo did not start everything: {''.join(lines)[-2000:]}")
        started = time.monotonic()
        os.kill(demo.pid, signal.SIGINT)
        assert demo.wait(timeout=60) == 0, "".join(lines)[-2000:]
        assert (tmp_path / "demo" / "sim-epoch").is_file()  # generated as of its own epoch
        assert time.monotonic() - started < 40
        time.sleep(2)
        left = [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert left == [], f"processes left: {left}"
    finally:
        for process in [*tree, psutil.Process(demo.pid) if demo.poll() is None else None]:
            if process is not None and process.is_running():
                process.kill()


def test_the_demo_generates_its_clusters_settled_before_the_first_hour_of_its_history(tmp_path, monkeypatch):
    """`lens demo` generates its clusters as of a day before the first hour the UI offers (so that
    Prometheus' answers for any of its hours match the objects), not as of the simulator's fixed
    default instant long gone; a restarted demo keeps the instant and so makes the same objects,
    unless its history has been made to reach further back."""
    from datetime import UTC, datetime, timedelta

    from lens_pipeline import cli, settings
    from lens_pipeline.defs.history.partitions import first_hour

    monkeypatch.setenv(settings.LENS_HISTORY_DAYS, "7")
    now = datetime(2026, 11, 29, 5, 30, tzinfo=UTC)
    epoch = cli._demo_epoch(tmp_path, now)
    assert epoch == datetime(2026, 11, 21, tzinfo=UTC).timestamp()
    assert first_hour(now, 7).timestamp() - epoch == 86400
    assert cli._demo_epoch(tmp_path, now + timedelta(days=3)) == epoch
    (tmp_path / "fresh").mkdir()
    assert cli._demo_epoch(tmp_path / "fresh", now + timedelta(days=3)) == epoch + 3 * 86400
    monkeypatch.setenv(settings.LENS_HISTORY_DAYS, "10")
    assert cli._demo_epoch(tmp_path, now) == epoch - 3 * 86400
    for garbage in ("-inf", "nan", "yesterday", "\x00"):
        (tmp_path / "sim-epoch").write_text(garbage)
        assert cli._demo_epoch(tmp_path, now) == epoch - 3 * 86400


def test_lens_api_refuses_a_cors_entry_that_is_no_origin(tmp_path, monkeypatch, capsys):
    from lens_pipeline.cli import main

    monkeypatch.setenv("LENS_API_CORS_ORIGINS", "https://lens.example.com/ui")
    assert main(["api", "--database-url", f"sqlite:///{tmp_path / 'lens.db'}"]) == 2
    assert "'https://lens.example.com/ui' is not an origin" in capsys.readouterr().err


def test_lens_ingest_refuses_a_metrics_port_shared_with_its_other_ports(tmp_path, capsys):
    from lens_pipeline.cli import main

    database = f"sqlite:///{tmp_path / 'lens.db'}"
    for clash in (["--http-port", "9301"], ["--grpc-port", "9301"]):
        assert main(["ingest", "--database-url", database, "--metrics-port", "9301", *clash]) == 2
        assert "--metrics-port must differ" in capsys.readouterr().err
