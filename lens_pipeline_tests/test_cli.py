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
    result = subprocess.run([str(lens), "db", "upgrade"], env=env, capture_output=True, text=True, timeout=120)
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
