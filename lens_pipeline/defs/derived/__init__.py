"""Assets derived from the collectors' tables: the cluster overview, workload GPU statistics, GPU
consumers, and the SaFE database's node and workload statistics."""
