"""production traces scored by the task's reward, harvested samples (issue 50)

trace: judge_status, judge_score, judge_detail, judge_claim, judged_at: the task's own reward (its judge) scores
chosen production traces in the worker, each once (core/records/production/scoring.py).
llmcall.trace_id: the trace a production judge call scored, so its cost is found per task.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 19:50:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('trace', schema=None) as batch_op:
        batch_op.add_column(sa.Column('judge_status', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        batch_op.add_column(sa.Column('judge_score', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('judge_detail', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('judge_claim', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        batch_op.add_column(sa.Column('judged_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True))
        batch_op.create_index(batch_op.f('ix_trace_judge_status'), ['judge_status'], unique=False)
    with op.batch_alter_table('llmcall', schema=None) as batch_op:
        batch_op.add_column(sa.Column('trace_id', sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f('ix_llmcall_trace_id'), ['trace_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('llmcall', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_llmcall_trace_id'))
        batch_op.drop_column('trace_id')
    with op.batch_alter_table('trace', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_trace_judge_status'))
        batch_op.drop_column('judged_at')
        batch_op.drop_column('judge_claim')
        batch_op.drop_column('judge_detail')
        batch_op.drop_column('judge_score')
        batch_op.drop_column('judge_status')
