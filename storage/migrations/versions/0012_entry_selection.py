"""entries chosen per query: a library's selection, what each rollout was shown, an evaluation's selection

library.selection and library.selection_k: `all` (every entry, the paper's behaviour) or `top_k` with k, the
entries most similar to the query (core/domain/selection.py); existing libraries read as `all`, k 3.
rollout.shown_ids: the ids of the entries the agent was shown (NULL for rollouts stored before).
evaluation.selection: the selection an evaluation was run with (NULL, for older rows, is `all`).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 10:00:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('library', schema=None) as batch_op:
        batch_op.add_column(sa.Column('selection', sqlmodel.sql.sqltypes.AutoString(), nullable=False,
                                      server_default='all'))
        batch_op.add_column(sa.Column('selection_k', sa.Integer(), nullable=False, server_default='3'))
    with op.batch_alter_table('rollout', schema=None) as batch_op:
        batch_op.add_column(sa.Column('shown_ids', sa.JSON(), nullable=True))
    with op.batch_alter_table('evaluation', schema=None) as batch_op:
        batch_op.add_column(sa.Column('selection', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('evaluation', schema=None) as batch_op:
        batch_op.drop_column('selection')
    with op.batch_alter_table('rollout', schema=None) as batch_op:
        batch_op.drop_column('shown_ids')
    with op.batch_alter_table('library', schema=None) as batch_op:
        batch_op.drop_column('selection_k')
        batch_op.drop_column('selection')
