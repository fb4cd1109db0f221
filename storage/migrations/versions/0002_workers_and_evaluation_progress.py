"""workers and evaluation progress

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 21:14:24.962736
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('worker',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('host', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('status', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('current', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('started_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.Column('heartbeat_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('evaluation', schema=None) as batch_op:
        batch_op.add_column(sa.Column('progress', sa.JSON(), nullable=False, server_default='{}'))
        batch_op.add_column(sa.Column('heartbeat_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True))
        batch_op.add_column(sa.Column('worker_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        batch_op.add_column(sa.Column('started_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True))

    with op.batch_alter_table('run', schema=None) as batch_op:
        batch_op.add_column(sa.Column('worker_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True))




def downgrade() -> None:

    with op.batch_alter_table('run', schema=None) as batch_op:
        batch_op.drop_column('worker_id')

    with op.batch_alter_table('evaluation', schema=None) as batch_op:
        batch_op.drop_column('started_at')
        batch_op.drop_column('worker_id')
        batch_op.drop_column('heartbeat_at')
        batch_op.drop_column('progress')

    op.drop_table('worker')

