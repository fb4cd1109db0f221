"""A/B experiments with a start and fixed arms (issue 50)

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28 19:50:00.000000
"""

import sqlalchemy as sa  # noqa: F401
import sqlmodel  # noqa: F401
from alembic import op  # noqa: F401

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
