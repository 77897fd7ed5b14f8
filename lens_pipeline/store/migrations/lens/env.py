"""Alembic environment: the shared body lives in lens_pipeline.store.migrate."""

from alembic import context

from lens_pipeline.store.migrate import run_env

run_env(context)
