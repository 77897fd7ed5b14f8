"""lens-pipeline: GPU cluster observability for Kubernetes fleets, as one Dagster code location."""

__version__ = "0.1.0"
