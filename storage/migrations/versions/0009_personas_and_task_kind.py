"""personas and task kind

task.kind: single (one answer per query, every task so far) or conversation (played as multi-turn
conversations with a user simulator); existing rows become single through the server default.
persona: the users a conversation task's simulator plays, name unique per task; core/domain/personas.py
checks each one before it is written.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 10:00:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('task', schema=None) as batch_op:
        batch_op.add_column(sa.Column('kind', sqlmodel.sql.sqltypes.AutoString(), nullable=False,
                                      server_default='single'))
    op.create_table('persona',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('task_id', sa.Integer(), nullable=False),
    sa.Column('name', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('segment', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('hidden_facts', sa.JSON(), nullable=False),
    sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['task_id'], ['task.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('task_id', 'name')
    )
    with op.batch_alter_table('persona', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_persona_task_id'), ['task_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('persona', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_persona_task_id'))
    op.drop_table('persona')
    with op.batch_alter_table('task', schema=None) as batch_op:
        batch_op.drop_column('kind')
