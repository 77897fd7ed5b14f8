"""Where things live when nobody says otherwise: database URLs and the state directory.

Read at call time, never at import time, so tests and the demo can set the environment first.
"""

from __future__ import annotations

import os
from pathlib import Path

from lens_pipeline.bearer import split_tokens

LENS_DATABASE_URL = "LENS_DATABASE_URL"
LENS_SAFE_DATABASE_URL = "LENS_SAFE_DATABASE_URL"
LENS_CLUSTERS_FILE = "LENS_CLUSTERS_FILE"
LENS_API_TOKEN = "LENS_API_TOKEN"
LENS_API_DEFAULT_CLUSTER = "LENS_API_DEFAULT_CLUSTER"
LENS_API_ACCESS_LOG = "LENS_API_ACCESS_LOG"
LENS_API_CORS_ORIGINS = "LENS_API_CORS_ORIGINS"


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


LENS_WATCH_CACHE_URL = "LENS_WATCH_CACHE_URL"


def watch_cache_url() -> str | None:
    """The watch cache (`lens watch`) the collection runs ask before the API servers, if any."""
    return os.environ.get(LENS_WATCH_CACHE_URL) or None


LENS_WATCH_CACHE_TOKEN = "LENS_WATCH_CACHE_TOKEN"


def watch_cache_tokens() -> list[str]:
    """The watch cache's bearer tokens, comma-separated during a rotation: `lens watch` accepts
    each, the runs send the first. None: the cache asks for no token."""
    return split_tokens(os.environ.get(LENS_WATCH_CACHE_TOKEN))


LENS_CLUSTERS_PER_RUN = "LENS_CLUSTERS_PER_RUN"
DEFAULT_CLUSTERS_PER_RUN = 10


def clusters_per_run() -> int:
    """How many clusters one collection run (scheduled, or of a backfill) covers at most: each run
    pays seconds of process start and code load, so healthy clusters share runs."""
    return _whole_number(LENS_CLUSTERS_PER_RUN, DEFAULT_CLUSTERS_PER_RUN, 1)


LENS_HISTORY_DAYS = "LENS_HISTORY_DAYS"
DEFAULT_HISTORY_DAYS = 15
LENS_HISTORY_BACKFILL_DAYS = "LENS_HISTORY_BACKFILL_DAYS"
DEFAULT_HISTORY_BACKFILL_DAYS = 7
LENS_HISTORY_PARTITIONS_PER_RUN = "LENS_HISTORY_PARTITIONS_PER_RUN"
DEFAULT_HISTORY_PARTITIONS_PER_RUN = 12


def _whole_number(variable: str, default: int, least: int) -> int:
    value = os.environ.get(variable, "")
    try:
        return max(least, int(value)) if value else default
    except ValueError:
        raise ValueError(f"{variable} must be a whole number, not {value!r}") from None


def history_days() -> int:
    """How many days back the hourly history's partitions go (Prometheus keeps 15 by default):
    older hours cannot be recomputed, their rows stay."""
    return _whole_number(LENS_HISTORY_DAYS, DEFAULT_HISTORY_DAYS, 1)


def history_backfill_days() -> int:
    """How many days of hours the automation fills in for a new cluster, or after an outage."""
    return min(_whole_number(LENS_HISTORY_BACKFILL_DAYS, DEFAULT_HISTORY_BACKFILL_DAYS, 0), history_days())


def history_partitions_per_run() -> int:
    """(cluster, hour) partitions one hourly history run covers at most: one hour of that many
    clusters, or that many hours of one cluster."""
    return _whole_number(LENS_HISTORY_PARTITIONS_PER_RUN, DEFAULT_HISTORY_PARTITIONS_PER_RUN, 1)


def api_access_log() -> bool:
    """Whether `lens api` writes a JSON line per request to its standard output (on unless "0")."""
    return os.environ.get(LENS_API_ACCESS_LOG, "1").strip() not in ("0", "false", "no", "off")


def api_cors_origins() -> tuple[str, ...]:
    """The web origins (`https://lens.example.com`, or `*` for any) whose pages may read `lens api`
    from a browser: comma-separated in `$LENS_API_CORS_ORIGINS`, none by default. An entry that is
    no origin (a path, a trailing slash, no scheme) is refused by name: it would match no page."""
    origins = tuple(o.strip() for o in os.environ.get(LENS_API_CORS_ORIGINS, "").split(",") if o.strip())
    for origin in origins:
        scheme, sep, host = origin.partition("://")
        # (A browser sends the scheme in lower case: `HTTPS://` would match no page.)
        if origin != "*" and not (scheme in ("http", "https") and sep and host and "/" not in host):
            raise ValueError(
                f"{LENS_API_CORS_ORIGINS}: {origin!r} is not an origin: scheme://host[:port], "
                "no path nor trailing slash (e.g. https://lens.example.com), or *"
            )
    return origins
