"""sign-in attempts

signinattempt: one row per sign-in attempt (user name, client, outcome, time), written before the
password is checked so that attempts running at the same time count each other; core.records.people.users derives
the per-name and per-client back-off from the last hour of rows and deletes older ones.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 10:00:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('signinattempt',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('client', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('outcome', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('signinattempt', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_signinattempt_name'), ['name'], unique=False)
        batch_op.create_index(batch_op.f('ix_signinattempt_client'), ['client'], unique=False)
        batch_op.create_index(batch_op.f('ix_signinattempt_created_at'), ['created_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('signinattempt', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_signinattempt_created_at'))
        batch_op.drop_index(batch_op.f('ix_signinattempt_client'))
        batch_op.drop_index(batch_op.f('ix_signinattempt_name'))
    op.drop_table('signinattempt')
