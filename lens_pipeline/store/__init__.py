"""The Lens and SaFE databases: schema, migrations, bulk writes, the container event log."""
