"""people signed in through an OpenID Connect provider, and API keys per person

user.email (unique, lower case), user.issuer and user.subject: the provider's identity a person is known by
(core.records.people.users.provider_sign_in). apikey.person: the user a key acts for; it carries at most their role
(core.records.keys.api_keys.check_key). Existing rows keep NULL: a user signs in with their password as before, a key
is a key of its own.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28 02:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('user', schema=None) as batch_op:
        batch_op.add_column(sa.Column('email', sa.String(), nullable=True))
        batch_op.add_column(sa.Column('issuer', sa.String(), nullable=True))
        batch_op.add_column(sa.Column('subject', sa.String(), nullable=True))
        batch_op.create_index(batch_op.f('ix_user_email'), ['email'], unique=True)
    with op.batch_alter_table('apikey', schema=None) as batch_op:
        batch_op.add_column(sa.Column('person', sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('apikey', schema=None) as batch_op:
        batch_op.drop_column('person')
    with op.batch_alter_table('user', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_user_email'))
        batch_op.drop_column('subject')
        batch_op.drop_column('issuer')
        batch_op.drop_column('email')
