"""reply status

llmcall.reply_status: how a structured reply was read (parsed, repaired by json-repair, or
malformed); NULL for calls that ask no JSON and for rows written before this revision.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 10:00:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('llmcall', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reply_status', sqlmodel.sql.sqltypes.AutoString(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('llmcall', schema=None) as batch_op:
        batch_op.drop_column('reply_status')
