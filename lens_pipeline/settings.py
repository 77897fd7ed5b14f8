"""Where things live when nobody says otherwise: database URLs and the state directory.

Read at call time, never at import time, so tests and the demo can set the environment first.
"""

from __future__ import annotations

import os
from pathlib import Path

LENS_DATABASE_URL = "LENS_DATABASE_URL"
LENS_SAFE_DATABASE_URL = "LENS_SAFE_DATABASE_URL"
LENS_CLUSTERS_FILE = "LENS_CLUSTERS_FILE"
LENS_API_TOKEN = "LENS_API_TOKEN"
LENS_API_DEFAULT_CLUSTER = "LENS_API_DEFAULT_CLUSTER"


def state_dir() -> Path:
    """`$DAGSTER_HOME` when set, else `./.lens/`: where the embedded SQLite files go."""
    home = os.environ.get("DAGSTER_HOME")
    path = Path(home) if home else Path.cwd() / ".lens"
    path.mkdir(parents=True, exist_ok=True)
    return path


def lens_database_url() -> str:
    return os.environ.get(LENS_DATABASE_URL) or f"sqlite:///{state_dir() / 'lens.db'}"


def safe_database_url() -> str:
    return os.environ.get(LENS_SAFE_DATABASE_URL) or f"sqlite:///{state_dir() / 'safe.db'}"


def clusters_file() -> str | None:
    return os.environ.get(LENS_CLUSTERS_FILE) or None


LENS_CLUSTERS_PER_RUN = "LENS_CLUSTERS_PER_RUN"
DEFAULT_CLUSTERS_PER_RUN = 10


def clusters_per_run() -> int:
    """How many clusters one collection run (scheduled, or of a backfill) covers at most: each run
    pays seconds of process start and code load, so healthy clusters share runs."""
    value = os.environ.get(LENS_CLUSTERS_PER_RUN, "")
    try:
        return max(1, int(value)) if value else DEFAULT_CLUSTERS_PER_RUN
    except ValueError:
        raise ValueError(f"{LENS_CLUSTERS_PER_RUN} must be a whole number, not {value!r}") from None
