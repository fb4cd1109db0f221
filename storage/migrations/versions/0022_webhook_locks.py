"""webhook secrets at rest, delivery schedule (issue 51)

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28 19:50:00.000000
"""

import sqlalchemy as sa  # noqa: F401
import sqlmodel  # noqa: F401
from alembic import op  # noqa: F401

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ADD COLUMN (nullable, no foreign key): no batch rebuild of the outbox
    op.add_column('webhookdelivery', sa.Column('claimed_by', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
    op.add_column('webhookdelivery', sa.Column('claimed_until', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True))
    op.add_column('webhookdelivery', sa.Column('dismissed_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('webhookdelivery', schema=None) as batch_op:
        batch_op.drop_column('dismissed_at')
        batch_op.drop_column('claimed_until')
        batch_op.drop_column('claimed_by')
