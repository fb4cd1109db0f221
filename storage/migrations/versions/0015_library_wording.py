"""a task's library wording: the line above the library in the agent's prompt and the line that opens its examples

task.library_header, task.examples_intro: NULL is the neutral default (core.domain.prompts.LibraryWording). The
arithmetic demo, created before these settings existed, keeps the paper's math wording it was measured with,
as a new demo gets it (core.records.tasks.demos.ensure_demo_task).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27 17:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

DEMO_TASK = "arithmetic word problems"  # core.records.tasks.demos.DEMO_TASK, written out: a migration imports no app code
PAPER_LIBRARY_HEADER = ("When solving problems, you MUST first carefully read and understand the helpful instructions "
                        "and experiences:")
PAPER_EXAMPLES_INTRO = "Worked examples of similar problems, solved correctly (follow the method, not the numbers):"


def upgrade() -> None:
    with op.batch_alter_table('task', schema=None) as batch_op:
        batch_op.add_column(sa.Column('library_header', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('examples_intro', sa.Text(), nullable=True))
    op.execute(sa.text("UPDATE task SET library_header = :header, examples_intro = :intro WHERE name = :name")
               .bindparams(header=PAPER_LIBRARY_HEADER, intro=PAPER_EXAMPLES_INTRO, name=DEMO_TASK))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35 and later), not batch mode: a batch rebuilds `task`, and with foreign
    # keys on, dropping the old table that samples and libraries point at fails.
    op.drop_column('task', 'examples_intro')
    op.drop_column('task', 'library_header')
