"""SaFE's statistics (spec §6.1, §6.2), pure: a node's utilization as SaFE's DECIMAL(5,2) holds it,
and a SaFE Workload's three-hour figures from its hourly rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from lens_pipeline.collect.problems import MalformedObject
from lens_pipeline.collect.stored import stored_count, stored_figure, stored_mapping, stored_text

SAFE_GROUP_VERSION = "amd.com/v1"
SAFE_CLUSTER_LABEL = "primus-safe.cluster.id"
STATISTIC_TYPE = "3h"
WINDOW = timedelta(hours=3)


def percent(value: float | None) -> Decimal | None:
    """A percentage as SaFE's DECIMAL(5,2) holds it; None when unknown or not a percentage (NaN,
    1e6: a broken counter would overflow the column and fail the cluster's whole write)."""
    if value is None or not 0.0 <= value <= 100.0:
        return None
    return Decimal(str(value)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def node_statistic_row(node: Mapping[str, Any]) -> dict[str, Any]:
    """A GPU node's SaFE row; raises MalformedObject when its stored utilization is no percentage
    (the caller still writes the node, with its utilization unknown)."""
    return {
        "node_name": node["name"],
        "gpu_utilization": percent(stored_figure(node, "gpu_utilization", 0.0, 100.0)),
    }


def workload_statistic_row(
    workload: Mapping[str, Any], hours: Sequence[Mapping[str, Any]], cluster: str
) -> dict[str, Any] | None:
    """A SaFE Workload's 3-hour figures from its hourly rows; None while it has no utilization yet
    (SaFE shows "unknown", -1, as the original did). The average is weighted by samples (the
    original averaged the hourly averages, so an hour of one sample weighed like a full one)."""
    samples = [(stored_count(h, "sample_count"), h) for h in hours]
    samples = [(n, h) for n, h in samples if n]
    if not samples:
        return None
    count = sum(n for n, _ in samples)
    total = sum(stored_figure(h, "total_sum", 0.0) or 0.0 for _, h in samples)
    peaks = [stored_figure(h, "max_utilization") for _, h in samples]
    if None in peaks:
        raise MalformedObject("max_utilization should be a number: the hour has samples")
    peak = max(p for p in peaks if p is not None)
    return {
        "workload_id": stored_text(workload, "name"),
        "statistic_type": STATISTIC_TYPE,
        "workload_uid": workload["uid"],
        "cluster": stored_mapping(workload, "labels").get(SAFE_CLUSTER_LABEL) or cluster,
        "workspace": stored_text(workload, "namespace"),
        "avg_gpu_usage_3h": percent(total / count),
        "max_gpu_usage_3h": percent(peak),
        "data_points_count": count,
    }


def usage_within_bounds(row: Mapping[str, Any]) -> bool:
    """Average and peak are both percentages and the average is not above the peak."""
    average, peak = row["avg_gpu_usage_3h"], row["max_gpu_usage_3h"]
    return average is not None and peak is not None and 0 <= average <= peak <= 100
