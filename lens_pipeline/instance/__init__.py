"""The local Dagster instance and workspace the demo starts (the top-level dagster.yaml and workspace.yaml link here): package data, so that an installed `lens` finds them."""
