"""OTLP traces: a trace's version may be unknown, and OpenTelemetry services map to tasks

trace.version_id becomes nullable: a span received over OTLP whose library version was neither named by an
attribute nor recognised in its system instructions is stored as "unknown version", never guessed.
otlpservice: a resource's service.name mapped to a task (and library) on the Production page.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 02:30:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'otlpservice',
        sa.Column('service_name', sqlmodel.sql.sqltypes.AutoString(length=300), nullable=False),
        sa.Column('task_id', sa.Integer(), nullable=False),
        sa.Column('library', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('created_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(['task_id'], ['task.id']),
        sa.PrimaryKeyConstraint('service_name'),
    )
    with op.batch_alter_table('otlpservice', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_otlpservice_task_id'), ['task_id'], unique=False)
    # nothing references trace, so SQLite's batch rebuild of it is safe with foreign keys on
    with op.batch_alter_table('trace', schema=None) as batch_op:
        batch_op.alter_column('version_id', existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM trace WHERE version_id IS NULL"))
    with op.batch_alter_table('trace', schema=None) as batch_op:
        batch_op.alter_column('version_id', existing_type=sa.Integer(), nullable=False)
    with op.batch_alter_table('otlpservice', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_otlpservice_task_id'))
    op.drop_table('otlpservice')
