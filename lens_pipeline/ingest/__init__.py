"""The gRPC/HTTP sidecar that takes node agents' container events into the event log (its own process)."""
