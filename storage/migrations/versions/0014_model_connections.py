"""model connections: where a model is served and how it is reached, named once and picked by name

modelconnection: `name` (unique; a model is then written `<name>/<model>`), `kind` (openai: an
OpenAI-compatible server at `base_url`; litellm: a litellm provider, `provider`), `key_env` (the name of the
environment variable holding its API key; the key itself is never stored), `params` (default request
parameters), who made it and when. llmcall.connection: the connection a call went through.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 10:05:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'modelconnection',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sqlmodel.sql.sqltypes.AutoString(length=60), nullable=False),
        sa.Column('kind', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('base_url', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column('provider', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column('key_env', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column('params', sa.JSON(), nullable=False),
        sa.Column('created_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('name'),
    )
    with op.batch_alter_table('llmcall', schema=None) as batch_op:
        batch_op.add_column(sa.Column('connection', sqlmodel.sql.sqltypes.AutoString(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('llmcall', schema=None) as batch_op:
        batch_op.drop_column('connection')
    op.drop_table('modelconnection')
