"""one person per (issuer, subject), sign-in audit (issue 51)

user: a unique index on (issuer, subject), so two first sign-ins of one provider identity at once cannot bind two
people (NULLs are distinct in a unique index on SQLite and PostgreSQL alike, so people without a provider identity
are not constrained); a database where that already happened keeps the binding of the oldest user and forgets the
others' (they are found again by their email). user.provider_iat: the issue time of the ID token whose sign-in the
audit log has, so a page load of the same sign-in is not audited again (core.records.people.oidc).

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 19:50:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text(
        'UPDATE "user" SET issuer = NULL, subject = NULL WHERE issuer IS NOT NULL AND subject IS NOT NULL AND id > '
        '(SELECT MIN(older.id) FROM "user" AS older WHERE older.issuer = "user".issuer '
        'AND older.subject = "user".subject)'))
    with op.batch_alter_table('user', schema=None) as batch_op:
        batch_op.add_column(sa.Column('provider_iat', sa.Integer(), nullable=True))
        batch_op.create_index('ux_user_identity', ['issuer', 'subject'], unique=True)


def downgrade() -> None:
    with op.batch_alter_table('user', schema=None) as batch_op:
        batch_op.drop_index('ux_user_identity')
        batch_op.drop_column('provider_iat')
