"""conversation turns, simulator settings, rubric scores, segment libraries

conversationturn: each turn of a conversation rollout, written as it is spoken (resume mid-conversation).
task.simulator_model ("" = the policy model) and task.max_turns: how a conversation task's rollouts are
played. rollout.scores and rewardlabel.scores: a conversation's score per rubric criterion and its rules.
library.segment: the persona segment a library serves; evaluation.routes: a segment-routed evaluation's
version per segment.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 10:00:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

TURN_KEYS = {"step": "step_id IS NOT NULL", "evaluation": "evaluation_id IS NOT NULL"}


def upgrade() -> None:
    with op.batch_alter_table('task', schema=None) as batch_op:
        batch_op.add_column(sa.Column('simulator_model', sqlmodel.sql.sqltypes.AutoString(), nullable=False,
                                      server_default=''))
        batch_op.add_column(sa.Column('max_turns', sa.Integer(), nullable=False, server_default='4'))
    with op.batch_alter_table('library', schema=None) as batch_op:
        batch_op.add_column(sa.Column('segment', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
    with op.batch_alter_table('rollout', schema=None) as batch_op:
        batch_op.add_column(sa.Column('scores', sa.JSON(), nullable=True))
    with op.batch_alter_table('rewardlabel', schema=None) as batch_op:
        batch_op.add_column(sa.Column('scores', sa.JSON(), nullable=True))
    with op.batch_alter_table('evaluation', schema=None) as batch_op:
        batch_op.add_column(sa.Column('routes', sa.JSON(), nullable=True))
    op.create_table('conversationturn',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('step_id', sa.Integer(), nullable=True),
    sa.Column('evaluation_id', sa.Integer(), nullable=True),
    sa.Column('sample_id', sa.Integer(), nullable=False),
    sa.Column('group_index', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('role', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('tokens_in', sa.Integer(), nullable=False),
    sa.Column('tokens_out', sa.Integer(), nullable=False),
    sa.Column('ended', sa.Boolean(), nullable=False),
    sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['evaluation_id'], ['evaluation.id'], ),
    sa.ForeignKeyConstraint(['sample_id'], ['sample.id'], ),
    sa.ForeignKeyConstraint(['step_id'], ['step.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('conversationturn', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_conversationturn_evaluation_id'), ['evaluation_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_conversationturn_step_id'), ['step_id'], unique=False)
        for owner, where in TURN_KEYS.items():
            batch_op.create_index(f'uq_turn_{owner}_sample_group_position',
                                  [f'{owner}_id', 'sample_id', 'group_index', 'position'], unique=True,
                                  sqlite_where=sa.text(where), postgresql_where=sa.text(where))


def downgrade() -> None:
    with op.batch_alter_table('conversationturn', schema=None) as batch_op:
        for owner in TURN_KEYS:
            batch_op.drop_index(f'uq_turn_{owner}_sample_group_position')
        batch_op.drop_index(batch_op.f('ix_conversationturn_step_id'))
        batch_op.drop_index(batch_op.f('ix_conversationturn_evaluation_id'))
    op.drop_table('conversationturn')
    with op.batch_alter_table('evaluation', schema=None) as batch_op:
        batch_op.drop_column('routes')
    for table in ('rewardlabel', 'rollout'):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column('scores')
    with op.batch_alter_table('library', schema=None) as batch_op:
        batch_op.drop_column('segment')
    with op.batch_alter_table('task', schema=None) as batch_op:
        batch_op.drop_column('max_turns')
        batch_op.drop_column('simulator_model')
