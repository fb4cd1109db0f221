"""validation gate and attribution

run.validation_ids (the gate's queries), step.gate (its figures and decision), operation.reason (why the
engine decided, e.g. `validation`), and evaluation.purpose / sample_ids / experiences / run_id / step_id /
left_out for the evaluations a gate or an experience measurement runs on a fixed query set and on
experiences that are no stored version.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 17:00:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('run', schema=None) as batch_op:
        batch_op.add_column(sa.Column('validation_ids', sa.JSON(), nullable=True))
    with op.batch_alter_table('step', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gate', sa.JSON(), nullable=True))
    with op.batch_alter_table('operation', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reason', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
    with op.batch_alter_table('evaluation', schema=None) as batch_op:
        batch_op.add_column(sa.Column('purpose', sqlmodel.sql.sqltypes.AutoString(), nullable=False,
                                      server_default='evaluation'))
        batch_op.add_column(sa.Column('sample_ids', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('experiences', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('run_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('step_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('left_out', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        batch_op.create_index(batch_op.f('ix_evaluation_purpose'), ['purpose'], unique=False)
        batch_op.create_index(batch_op.f('ix_evaluation_run_id'), ['run_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('evaluation', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_evaluation_run_id'))
        batch_op.drop_index(batch_op.f('ix_evaluation_purpose'))
        for name in ('left_out', 'step_id', 'run_id', 'experiences', 'sample_ids', 'purpose'):
            batch_op.drop_column(name)
    with op.batch_alter_table('operation', schema=None) as batch_op:
        batch_op.drop_column('reason')
    with op.batch_alter_table('step', schema=None) as batch_op:
        batch_op.drop_column('gate')
    with op.batch_alter_table('run', schema=None) as batch_op:
        batch_op.drop_column('validation_ids')
