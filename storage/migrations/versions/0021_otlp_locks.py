"""OTLP resources stored once, held spans, key scope (issue 51)

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 19:50:00.000000
"""

import sqlalchemy as sa  # noqa: F401
import sqlmodel  # noqa: F401
from alembic import op  # noqa: F401

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
