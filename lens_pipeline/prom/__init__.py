"""Reading a cluster's Prometheus: instant queries, grouped so that one query covers every node."""
