"""counts shared by every API process: a key's request allowance, refusals per client address

apicounter: `name` (key:<id> for a key's token bucket, refused:<address> for the unknown-key refusals from
one address not audited yet), `value` (tokens left, or refusals counted), `updated_at` (seconds since the
epoch: the bucket's last refill, or when that address's refusals were last audited).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 10:00:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'apicounter',
        sa.Column('name', sqlmodel.sql.sqltypes.AutoString(length=300), nullable=False),
        sa.Column('value', sa.Float(), nullable=False),
        sa.Column('updated_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('name'),
    )


def downgrade() -> None:
    op.drop_table('apicounter')
