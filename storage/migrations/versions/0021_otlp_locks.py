"""OTLP resources stored once, held spans, key scope (issue 51)

otlpresource: a resource's attributes once, by hash (a span's trace refers to it instead of copying it).
otlpheldspan: spans of a service mapped to no task yet, or with a model call but no readable message.
apikey.task_id / library / any_task: where an ingest key writes. Ingest keys made before this revision wrote
anywhere; they are marked any_task so their agents keep working, and the People page shows them as such.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 19:50:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'otlpresource',
        sa.Column('hash', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column('attributes', sa.JSON(), nullable=False),
        sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint('hash'),
    )
    op.create_table(
        'otlpheldspan',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('service', sqlmodel.sql.sqltypes.AutoString(length=300), nullable=False),
        sa.Column('reason', sqlmodel.sql.sqltypes.AutoString(length=20), nullable=False),
        sa.Column('client_id', sqlmodel.sql.sqltypes.AutoString(length=80), nullable=False),
        sa.Column('span', sa.JSON(), nullable=False),
        sa.Column('api_key_id', sa.Integer(), nullable=True),
        sa.Column('received_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(['api_key_id'], ['apikey.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('client_id'),
    )
    with op.batch_alter_table('otlpheldspan', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_otlpheldspan_service'), ['service'], unique=False)
        batch_op.create_index(batch_op.f('ix_otlpheldspan_received_at'), ['received_at'], unique=False)
    # plain ADD COLUMN, no batch rebuild (trace rows reference apikey) and so no foreign key: SQLite cannot add one
    op.add_column('apikey', sa.Column('task_id', sa.Integer(), nullable=True))
    op.add_column('apikey', sa.Column('library', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
    op.add_column('apikey', sa.Column('any_task', sa.Boolean(), nullable=False, server_default=sa.false()))
    op.execute(sa.text("UPDATE apikey SET any_task = :yes WHERE role = 'ingest'").bindparams(yes=True))


def downgrade() -> None:
    with op.batch_alter_table('apikey', schema=None) as batch_op:
        batch_op.drop_column('any_task')
        batch_op.drop_column('library')
        batch_op.drop_column('task_id')
    with op.batch_alter_table('otlpheldspan', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_otlpheldspan_received_at'))
        batch_op.drop_index(batch_op.f('ix_otlpheldspan_service'))
    op.drop_table('otlpheldspan')
    op.drop_table('otlpresource')
