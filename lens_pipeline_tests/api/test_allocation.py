"""GPU-hours a workload was allocated count from each pod's binding to a node to its end: a pod
that never got a node costs nothing, whatever the time it waited (on every dialect)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert

from lens_pipeline.api.queries import gpu_allocation
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.migrate import ensure_schema
from lens_pipeline.store.schema import pod_resource, workload_pod_reference

NOW = datetime(2026, 11, 25, 12, tzinfo=UTC)
CREATED = NOW - timedelta(days=30)  # every pod was created a month ago


def test_pending_pods_cost_no_gpu_time(db_urls):
    engine = get_engine(db_urls[0])
    ensure_schema(engine, "lens")
    pods = {
        # uid: (bound, end): never scheduled; scheduled then evicted; done; running now.
        "pending": (None, None),
        "evicted": (NOW - timedelta(hours=10), NOW - timedelta(hours=4)),
        "succeeded": (NOW - timedelta(hours=3), NOW - timedelta(hours=1)),
        "running": (NOW - timedelta(hours=2), None),
    }
    with engine.begin() as conn:
        conn.execute(
            insert(pod_resource),
            [
                {
                    "cluster_name": "c",
                    "uid": uid,
                    "gpu_model": "MI300X",
                    "gpu_allocated": 2,
                    "created_at": CREATED,
                    "bound_at": bound,
                    "end_at": end,
                }
                for uid, (bound, end) in pods.items()
            ],
        )
        conn.execute(
            insert(workload_pod_reference),
            [{"cluster_name": "c", "workload_uid": "w", "pod_uid": uid} for uid in pods],
        )
    with engine.connect() as conn:
        (allocation,) = gpu_allocation(conn, "c", ["w"], now=NOW).values()
    # 2 GPUs x (6 h evicted + 2 h succeeded + 2 h running); the pending pod's 30 days count nothing.
    assert allocation["hours"] == {"MI300X": pytest.approx(2 * (6 + 2 + 2))}
    assert allocation["gpus"] == 6
