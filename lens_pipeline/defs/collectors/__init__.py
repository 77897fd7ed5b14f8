"""The collectors: per-cluster assets that read a cluster and write the Lens tables."""
