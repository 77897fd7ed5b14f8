"""The cluster partitions: one dynamic partition per registered cluster, kept equal to the registry
by `cluster_registry_sensor`."""

from dagster import DynamicPartitionsDefinition

CLUSTER_PARTITIONS_NAME = "cluster"
cluster_partitions = DynamicPartitionsDefinition(name=CLUSTER_PARTITIONS_NAME)

# Tag carried by every collection run; the run queue allows one run per value at a time.
CLUSTER_TAG = "lens/cluster"
