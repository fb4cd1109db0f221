"""webhooks: the endpoints an administrator configured and the outbox of deliveries (core/records/notifications/webhooks.py)

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28 02:40:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'webhookendpoint',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sqlmodel.sql.sqltypes.AutoString(length=60), nullable=False),
        sa.Column('url', sa.Text(), nullable=False),
        sa.Column('events', sa.JSON(), nullable=False),
        sa.Column('secret', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column('secret_env', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column('active', sa.Boolean(), nullable=False),
        sa.Column('created_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column('busy_by', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column('busy_until', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('name'),
    )
    op.create_table(
        'webhookdelivery',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('endpoint_id', sa.Integer(), nullable=False),
        sa.Column('message_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('event_type', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('payload', sa.JSON(), nullable=False),
        sa.Column('status', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('next_attempt_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column('last_code', sa.Integer(), nullable=True),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.Column('replay_of', sa.Integer(), nullable=True),
        sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column('delivered_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(['endpoint_id'], ['webhookendpoint.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('webhookdelivery', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhookdelivery_endpoint_id'), ['endpoint_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_webhookdelivery_message_id'), ['message_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_webhookdelivery_status'), ['status'], unique=False)


def downgrade() -> None:
    op.drop_table('webhookdelivery')
    op.drop_table('webhookendpoint')
