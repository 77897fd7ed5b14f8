"""The fleet: cluster partitions kept equal to the registry."""
