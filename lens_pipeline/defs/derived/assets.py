"""Every derived asset, in the order a cluster's run materializes them."""

from dagster import Definitions

from lens_pipeline.defs.derived.overview import cluster_overview_cache
from lens_pipeline.defs.derived.safe import safe_node_statistic, safe_workload_statistic
from lens_pipeline.defs.derived.statistics import gpu_consumers, workload_gpu_statistics

VIEWS = (
    cluster_overview_cache,
    workload_gpu_statistics,
    gpu_consumers,
    safe_node_statistic,
    safe_workload_statistic,
)

defs = Definitions(assets=list(VIEWS))
