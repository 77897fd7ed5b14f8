"""Shared fixtures: real databases (SQLite always; PostgreSQL and MariaDB when their URLs are set).

`LENS_TEST_POSTGRES_URL` / `LENS_TEST_MYSQL_URL` point at a server where the tests may create and
drop databases. Unset, those tests skip with a reason; on CI (`CI=true`) a skip is a failure, so
a missing service cannot pass unnoticed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from lens_pipeline.store.db import dispose_engines
from lens_pipeline_tests.ports import free_port

ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
DIALECT_ENV = {"postgresql": "LENS_TEST_POSTGRES_URL", "mysql": "LENS_TEST_MYSQL_URL"}
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): a worker per core this process may run on, at most
    `MAX_WORKERS`. Each worker starts simulated fleets, Dagster, Prometheus and databases of its own,
    and the suite's waits were set on a 2-core machine with two; xdist's own count (physical cores,
    blind to CPU affinity) gave a large host a worker per core."""
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


def skip_unless(condition: bool, reason: str) -> None:
    """Skip a test that needs something absent; on CI the absence is a failure instead."""
    if condition:
        return
    if ON_CI:
        pytest.fail(f"required on CI: {reason}")
    pytest.skip(reason)


def _server_database(dialect: str, purpose: str) -> Iterator[str]:
    env = DIALECT_ENV[dialect]
    admin_url = os.environ.get(env)
    skip_unless(bool(admin_url), f"{env} is not set: no {dialect} server to test against")
    name = f"{purpose}_t_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        dispose_engines()
        with admin.connect() as conn:
            if dialect == "postgresql":
                conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            else:
                conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def db_urls(request: pytest.FixtureRequest, tmp_path) -> Iterator[tuple[str, str]]:
    """(Lens URL, SaFE URL) of two fresh, empty databases of one dialect."""
    dialect = request.param
    if dialect == "sqlite":
        yield f"sqlite:///{tmp_path / 'lens.db'}", f"sqlite:///{tmp_path / 'safe.db'}"
        dispose_engines()
        return
    lens = _server_database(dialect, "lens")
    safe = _server_database(dialect, "safe")
    try:
        yield next(lens), next(safe)
    finally:
        for generator in (lens, safe):
            generator.close()


@pytest.fixture
def lens_url(db_urls: tuple[str, str]) -> str:
    return db_urls[0]


@pytest.fixture
def sqlite_url(tmp_path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'lens.db'}"
    dispose_engines()


_skipped_on_ci: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if ON_CI and report.skipped and not hasattr(report, "wasxfail"):
        _skipped_on_ci.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # On CI nothing may quietly skip: a missing service or tool is a failure there.
    if ON_CI and _skipped_on_ci and exitstatus == 0:
        print(
            f"\nCI: {len(_skipped_on_ci)} tests were skipped, which CI does not allow: {_skipped_on_ci[:10]}"
        )
        session.exitstatus = 1


# -- proxies in front of the simulator (Debian's tinyproxy and microsocks) ----------------------


def _installed(tool: str) -> None:
    skip_unless(bool(shutil.which(tool)), f"Debian's {tool} is not installed (apt-get install {tool})")


def _serving(process: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + 10
    while True:
        assert process.poll() is None, log.read_text()
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


@pytest.fixture
def http_proxy(tmp_path) -> Iterator[tuple[str, Path]]:
    """tinyproxy on a free port, with a user and password: (its URL with them, its log, where each
    CONNECT is written)."""
    _installed("tinyproxy")
    port = free_port()
    config = tmp_path / "tinyproxy.conf"
    config.write_text(
        f"Port {port}\nListen 127.0.0.1\nTimeout 60\nLogLevel Connect\nAllow 127.0.0.1\nBasicAuth lens pr0xy\n"
    )
    log = tmp_path / "tinyproxy.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["tinyproxy", "-d", "-c", str(config)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        _serving(process, port, log)
        yield f"http://lens:pr0xy@127.0.0.1:{port}", log
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def socks_proxy(tmp_path) -> Iterator[tuple[int, Path]]:
    """microsocks on a free port, with a user and password: (its port, its log)."""
    _installed("microsocks")
    port = free_port()
    log = tmp_path / "microsocks.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["microsocks", "-i", "127.0.0.1", "-p", str(port), "-u", "lens", "-P", "s0cks"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _serving(process, port, log)
        yield port, log
    finally:
        process.terminate()
        process.wait(10)
