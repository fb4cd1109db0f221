"""production loop: API keys, production traces, labelling rules, A/B arms

apikey: keys live agents send to the HTTP API (sha256 only). trace: production interactions sent back,
one per (task, client id). task.production_rules: which traces go to people. library.ab_label and
library.ab_share: a second label served to a stable share of users.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 10:00:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('task', schema=None) as batch_op:
        batch_op.add_column(sa.Column('production_rules', sa.JSON(), nullable=False, server_default='{}'))
    with op.batch_alter_table('library', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ab_label', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        batch_op.add_column(sa.Column('ab_share', sa.Float(), nullable=True))
    op.create_table('apikey',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('role', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('prefix', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('key_hash', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.Column('revoked_by', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('revoked_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
    sa.Column('last_used_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('apikey', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_apikey_key_hash'), ['key_hash'], unique=True)
    op.create_table('trace',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('task_id', sa.Integer(), nullable=False),
    sa.Column('client_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('library_id', sa.Integer(), nullable=False),
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('served_label', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('input', sa.Text(), nullable=False),
    sa.Column('output', sa.Text(), nullable=True),
    sa.Column('turns', sa.JSON(), nullable=True),
    sa.Column('score', sa.Float(), nullable=True),
    sa.Column('thumbs', sa.Integer(), nullable=True),
    sa.Column('comment', sa.Text(), nullable=True),
    sa.Column('segment', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('user_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('meta', sa.JSON(), nullable=False),
    sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.Column('received_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.Column('api_key_id', sa.Integer(), nullable=True),
    sa.Column('label_status', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('label_value', sa.Float(), nullable=True),
    sa.Column('labelled_by', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('sample_id', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['api_key_id'], ['apikey.id'], ),
    sa.ForeignKeyConstraint(['library_id'], ['library.id'], ),
    sa.ForeignKeyConstraint(['sample_id'], ['sample.id'], ),
    sa.ForeignKeyConstraint(['task_id'], ['task.id'], ),
    sa.ForeignKeyConstraint(['version_id'], ['libraryversion.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('task_id', 'client_id')
    )
    with op.batch_alter_table('trace', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_trace_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_trace_label_status'), ['label_status'], unique=False)
        batch_op.create_index(batch_op.f('ix_trace_segment'), ['segment'], unique=False)
        batch_op.create_index(batch_op.f('ix_trace_task_id'), ['task_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_trace_version_id'), ['version_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('trace', schema=None) as batch_op:
        for column in ('version_id', 'task_id', 'segment', 'label_status', 'created_at'):
            batch_op.drop_index(batch_op.f(f'ix_trace_{column}'))
    op.drop_table('trace')
    with op.batch_alter_table('apikey', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_apikey_key_hash'))
    op.drop_table('apikey')
    with op.batch_alter_table('library', schema=None) as batch_op:
        batch_op.drop_column('ab_share')
        batch_op.drop_column('ab_label')
    with op.batch_alter_table('task', schema=None) as batch_op:
        batch_op.drop_column('production_rules')
