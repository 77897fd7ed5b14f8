"""A seeded fleet of fake GPU clusters served over real HTTP (Kubernetes API, Prometheus, exporter
/metrics) with its own ground truth, for tests, the demo and benchmarks."""

from lens_pipeline.sim.fleet import SimCluster, SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.sim.truth import cluster_truth

__all__ = ["SimCluster", "SimFleet", "SimServer", "cluster_truth", "write_registry"]
