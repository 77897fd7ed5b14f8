"""SQLite: every stored time with its fraction of a second, as SQLAlchemy compares times

Revision ID: 0009_lens
Revises: 0008_lens
Create Date: 2026-11-26 03:20:00.000000
"""

from collections.abc import Sequence

from alembic import op

from lens_pipeline.store.migrate import normalize_sqlite_times

revision: str = "0009_lens"
down_revision: str | None = "0008_lens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    normalize_sqlite_times(op.get_bind())


def downgrade() -> None:
    pass  # the longer form is what every version reads
