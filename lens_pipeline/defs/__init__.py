"""Dagster wiring, one folder per concern; each exports its own `Definitions`, merged in definitions.py."""
