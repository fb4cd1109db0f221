"""production traces scored by the task's reward, harvested samples (issue 50)

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 19:50:00.000000
"""

import sqlalchemy as sa  # noqa: F401
import sqlmodel  # noqa: F401
from alembic import op  # noqa: F401

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
