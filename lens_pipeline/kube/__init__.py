"""Reading a cluster's Kubernetes API: paged LISTs of raw JSON, nothing else."""
