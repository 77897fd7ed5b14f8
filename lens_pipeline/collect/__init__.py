"""Pure transforms: Kubernetes JSON and metric samples in, table rows out. No I/O, no Dagster.

One module per Kubernetes kind. Each object that cannot be read becomes a `Problem` (counted and
reported by the asset) instead of stopping the whole cluster.
"""

from lens_pipeline.collect.problems import MalformedObject, Problem

__all__ = ["MalformedObject", "Problem"]
