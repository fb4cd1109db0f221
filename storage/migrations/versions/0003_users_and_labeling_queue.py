"""users and labeling queue

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 22:09:23.054392
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('user',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('role', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('password_hash', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('active', sa.Boolean(), nullable=False),
    sa.Column('created_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('user', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_user_name'), ['name'], unique=True)

    with op.batch_alter_table('rewardlabel', schema=None) as batch_op:
        batch_op.add_column(sa.Column('kind', sqlmodel.sql.sqltypes.AutoString(), nullable=False, server_default='label'))

    with op.batch_alter_table('rollout', schema=None) as batch_op:
        batch_op.add_column(sa.Column('label_status', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        batch_op.add_column(sa.Column('labels_needed', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('suggested_reward', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('suggested_detail', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('judge_unsure', sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.create_index(batch_op.f('ix_rollout_label_status'), ['label_status'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('rollout', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rollout_label_status'))
        batch_op.drop_column('judge_unsure')
        batch_op.drop_column('suggested_detail')
        batch_op.drop_column('suggested_reward')
        batch_op.drop_column('labels_needed')
        batch_op.drop_column('label_status')

    with op.batch_alter_table('rewardlabel', schema=None) as batch_op:
        batch_op.drop_column('kind')

    with op.batch_alter_table('user', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_user_name'))

    op.drop_table('user')
