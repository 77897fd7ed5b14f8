"""The hourly history: cluster, namespace, label and workload GPU hours and allocation snapshots,
partitioned by cluster and hour."""
