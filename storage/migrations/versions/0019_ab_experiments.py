"""A/B experiments with a start and fixed arms (issue 50)

abexperiment: a library's split of production traffic from its start to its end, with the version each arm served
(core/records/production/ab_experiments.py). trace.ab_experiment_id, ab_arm, ab_excluded: the experiment running when a trace
arrived, the arm the studio serves its user, and why it does not count (None: it counts). A split already on
becomes an experiment that starts now: traces from before it were counted under whatever the labels pointed at.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28 19:50:00.000000
"""

from datetime import UTC, datetime

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    experiments = op.create_table(
        'abexperiment',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('task_id', sa.Integer(), nullable=False),
        sa.Column('library_id', sa.Integer(), nullable=False),
        sa.Column('candidate_label', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('share', sa.Float(), nullable=False),
        sa.Column('production_version_id', sa.Integer(), nullable=False),
        sa.Column('candidate_version_id', sa.Integer(), nullable=False),
        sa.Column('started_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column('started_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('ended_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column('ended_by', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column('end_reason', sa.Text(), nullable=True),
        sa.Column('final', sa.JSON(), nullable=True),
        sa.Column('decided', sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(['candidate_version_id'], ['libraryversion.id']),
        sa.ForeignKeyConstraint(['library_id'], ['library.id']),
        sa.ForeignKeyConstraint(['production_version_id'], ['libraryversion.id']),
        sa.ForeignKeyConstraint(['task_id'], ['task.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('abexperiment', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_abexperiment_library_id'), ['library_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_abexperiment_task_id'), ['task_id'], unique=False)
    with op.batch_alter_table('trace', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ab_experiment_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('ab_arm', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        batch_op.add_column(sa.Column('ab_excluded', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        batch_op.create_index(batch_op.f('ix_trace_ab_experiment_id'), ['ab_experiment_id'], unique=False)
    _splits_already_on(experiments)


def _splits_already_on(experiments: sa.Table) -> None:
    """Each library whose split is on, with both labels still there, gets an experiment that starts now."""
    connection = op.get_bind()
    rows = connection.execute(sa.text(
        "SELECT library.id, library.task_id, library.ab_label, library.ab_share, production.version_id, "
        "candidate.version_id FROM library "
        "JOIN librarylabel AS production ON production.library_id = library.id AND production.name = 'production' "
        "JOIN librarylabel AS candidate ON candidate.library_id = library.id AND candidate.name = library.ab_label "
        "WHERE library.ab_label IS NOT NULL AND library.ab_share > 0")).all()
    now = datetime.now(UTC)
    if rows:
        op.bulk_insert(experiments, [
            {"library_id": library_id, "task_id": task_id, "candidate_label": label, "share": share,
             "production_version_id": production, "candidate_version_id": candidate, "started_at": now,
             "started_by": "migration 0019"}
            for library_id, task_id, label, share, production, candidate in rows])


def downgrade() -> None:
    with op.batch_alter_table('trace', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_trace_ab_experiment_id'))
        batch_op.drop_column('ab_excluded')
        batch_op.drop_column('ab_arm')
        batch_op.drop_column('ab_experiment_id')
    op.drop_table('abexperiment')
