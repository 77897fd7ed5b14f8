"""pod_resource.bound_at of pods that ended before 0007: from their last snapshot, else their creation

Revision ID: 0010_lens
Revises: 0009_lens
Create Date: 2026-11-26 04:00:00.000000

0007 added `bound_at` and left it NULL for pods already gone, so their GPU-hours fell to 0 after an
upgrade (live pods get theirs on the next `gpu_pods` run). An ended pod gets, as `gpu_pods` would
have given it: the time its PodScheduled condition turned True in its newest stored snapshot, else
its start time there, else (bound to a node but no time known) its creation, which is what every
version before 0007 counted from; a pod whose snapshot and row name no node keeps NULL (it held
nothing). The steps are this migration's own, not the collectors' (which may change later).
"""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

from lens_pipeline.store.types import JSONDocument, UTCDateTime

revision: str = "0010_lens"
down_revision: str | None = "0009_lens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHUNK = 500

pod_resource = sa.table(
    "pod_resource",
    sa.column("id", sa.Integer),
    sa.column("cluster_name", sa.String),
    sa.column("uid", sa.String),
    sa.column("created_at", UTCDateTime()),
    sa.column("bound_at", UTCDateTime()),
    sa.column("end_at", UTCDateTime()),
)
gpu_pods = sa.table(
    "gpu_pods",
    sa.column("cluster_name", sa.String),
    sa.column("uid", sa.String),
    sa.column("node_name", sa.String),
)
pod_snapshot = sa.table(
    "pod_snapshot",
    sa.column("cluster_name", sa.String),
    sa.column("pod_uid", sa.String),
    sa.column("spec", JSONDocument),
    sa.column("status", JSONDocument),
    sa.column("resource_version", sa.BigInteger),
)


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _bound_at(snapshot: dict | None, node_name: str | None, created: datetime | None) -> datetime | None:
    """When the ended pod got its node, from its last snapshot; its creation when only its row
    says it had a node; None when nothing says it had one."""
    spec = snapshot.get("spec") if snapshot else None
    status = snapshot.get("status") if snapshot else None
    had_node = bool(node_name) or (isinstance(spec, dict) and bool(spec.get("nodeName")))
    if not had_node:
        return None
    if isinstance(status, dict):
        conditions = status.get("conditions")
        for condition in conditions if isinstance(conditions, list) else ():
            if (
                isinstance(condition, dict)
                and condition.get("type") == "PodScheduled"
                and condition.get("status") == "True"
                and _time(condition.get("lastTransitionTime"))
            ):
                return _time(condition.get("lastTransitionTime"))
        if _time(status.get("startTime")):
            return _time(status.get("startTime"))
    return created


def upgrade() -> None:
    bind = op.get_bind()
    pending = bind.execute(
        sa.select(
            pod_resource.c.id, pod_resource.c.cluster_name, pod_resource.c.uid, pod_resource.c.created_at
        )
        .where(pod_resource.c.bound_at.is_(None), pod_resource.c.end_at.is_not(None))
        .order_by(pod_resource.c.id)
    ).all()
    for start in range(0, len(pending), CHUNK):
        chunk = pending[start : start + CHUNK]
        uids = sorted({row.uid for row in chunk})
        nodes = {
            (r.cluster_name, r.uid): r.node_name
            for r in bind.execute(
                sa.select(gpu_pods.c.cluster_name, gpu_pods.c.uid, gpu_pods.c.node_name).where(
                    gpu_pods.c.uid.in_(uids)
                )
            )
        }
        snapshots: dict[tuple[str, str], dict] = {}
        for r in bind.execute(
            sa.select(
                pod_snapshot.c.cluster_name,
                pod_snapshot.c.pod_uid,
                pod_snapshot.c.spec,
                pod_snapshot.c.status,
            )
            .where(pod_snapshot.c.pod_uid.in_(uids))
            .order_by(pod_snapshot.c.resource_version)
        ):
            snapshots[(r.cluster_name, r.pod_uid)] = {"spec": r.spec, "status": r.status}  # the newest wins
        for row in chunk:
            key = (row.cluster_name, row.uid)
            bound = _bound_at(snapshots.get(key), nodes.get(key), row.created_at)
            if bound is not None:
                bind.execute(
                    sa.update(pod_resource).where(pod_resource.c.id == row.id).values(bound_at=bound)
                )


def downgrade() -> None:
    pass  # 0007's downgrade drops the column
