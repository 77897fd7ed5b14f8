"""A cluster's exporter dialect, learned from its Prometheus in a few cheap requests: the metric
names of the last minutes, then the label names of each exporter's utilization series (and, when
its `pod` label could be the scrape target's, of its targets), and where more than one name is
present, which has series now (one instant query)."""

from __future__ import annotations

from lens_pipeline.prom.reader import PromReader
from lens_pipeline.vendors import Dialect, ExporterOverrides, learn_dialect


def read_dialect(prom: PromReader, vendor: str, overrides: ExporterOverrides) -> Dialect:
    """What `prom` really has (raises `PromError` when it cannot be asked)."""
    return learn_dialect(
        vendor,
        prom.metric_names(),
        prom.label_names,
        overrides,
        pod_is_targets_of=prom.pod_is_targets,
        series_counts=prom.series_counts,
    )
