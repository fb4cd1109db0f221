"""one person per (issuer, subject), sign-in audit (issue 51)

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 19:50:00.000000
"""

import sqlalchemy as sa  # noqa: F401
import sqlmodel  # noqa: F401
from alembic import op  # noqa: F401

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
