"""The sidecar's metrics: one bulk observation per message is what one per event would be."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lens_pipeline.ingest.metrics import IngestMetrics, observe_many


@pytest.mark.parametrize("seconds", [0.0, 0.0005, 0.001, 0.0015, 0.512, 3.0, 99.0])
def test_observe_many_is_count_observes(seconds):
    one_by_one, bulk = IngestMetrics(), IngestMetrics()
    for _ in range(20):
        one_by_one.processing.labels("k8s").observe(seconds)
    observe_many(bulk.processing.labels("k8s"), seconds, 20)
    observe_many(bulk.processing.labels("k8s"), seconds, 0)  # a message with no accepted event
    expected, got = _histogram(one_by_one), _histogram(bulk)
    assert got.pop("sum") == pytest.approx(expected.pop("sum"))
    assert got == expected  # every bucket and the count


def _histogram(metrics: IngestMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    (family,) = (f for f in text_string_to_metric_families(text) if f.type == "histogram")
    return {
        sample.labels.get("le", sample.name.rsplit("_", 1)[-1]): sample.value
        for sample in family.samples
        if not sample.name.endswith("_created")
    }
