"""Helpers the Dagster-level tests share."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer


@contextmanager
def served_fleet(tmp_path: Path, **generate: Any) -> Iterator[tuple[SimFleet, SimServer, Path]]:
    """A simulated fleet (`SimFleet.generate(**generate)`) served over HTTP, and a cluster registry
    file in `tmp_path` pointing at it."""
    fleet = SimFleet.generate(**generate)
    with SimServer(fleet) as server:
        yield fleet, server, write_registry(tmp_path / "clusters.yaml", server)


def failure_message(result: object) -> str:
    """Every message of the first step failure's error chain (retries wrap the real error)."""
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    error, parts = failure.event_specific_data.error, []
    while error is not None:
        parts.append(error.message)
        error = error.cause
    return "\n".join(parts)


def materialize_cluster(assets: list[str] | None = None, **kwargs):
    """`materialize` of the cluster assets (all of them, or the named ones) for the given partition."""
    from dagster import AssetKey, materialize

    from lens_pipeline.defs import resources
    from lens_pipeline.defs.cluster_assets import cluster_assets

    selection = [AssetKey(a) if isinstance(a, str) else a for a in assets] if assets is not None else None
    # Resources a test leaves out get their defaults (unused by the selected assets, never opened).
    kwargs["resources"] = {**resources.defs.resources, **kwargs.get("resources", {})}
    return materialize([cluster_assets], selection=selection, **kwargs)


def materializations(result, asset: str) -> list:
    """The materializations of one asset in a run of the cluster assets."""
    return [
        e for e in result.asset_materializations_for_node("cluster_assets") if e.asset_key.path == [asset]
    ]


def statistics_config(config: dict) -> dict:
    return {"ops": {"cluster_assets": {"config": {"statistics": config}}}}


# Prometheus requests that learn a cluster's exporter dialect, once per turn, when its GPUs carry a
# `pod` label (lens_pipeline.prom.dialect): metric names, the GPU series' labels, the exporter
# series' and the exporter targets' (instance, pod) pairs, the InfiniBand series' labels, and the
# current series of the node label candidates (the exporter's and `instance`), in one query.
DIALECT_REQUESTS = 6

# Nothing listens on port 9 (discard) here: connections are refused at once.
DEAD_URL = "http://127.0.0.1:9"


def edit_registry(path, change) -> None:
    """Rewrite a registry file with `change` applied to its parsed document."""
    import yaml

    document = yaml.safe_load(path.read_text())
    change(document)
    path.write_text(yaml.safe_dump(document))


def add_unreachable_cluster(path, name: str) -> None:
    """Add a registry entry for a cluster whose API refuses every connection."""
    edit_registry(
        path,
        lambda d: d["clusters"].append(
            {"name": name, "server": DEAD_URL, "token": "x", "request_timeout_seconds": 2}
        ),
    )
