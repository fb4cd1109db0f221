"""OTLP resources stored once, held spans, key scope (issue 51)

otlpresource: a resource's attributes once, by hash (a span's trace refers to it instead of copying it); the
resource each stored OTLP trace copied is moved there (the file shrinks only after a VACUUM).
otlpheldspan: spans of a service mapped to no task yet, or with a model call but no readable message.
apikey.task_id / library / any_task: where an ingest key writes. Ingest keys made before this revision wrote
anywhere; they are marked any_task so their agents keep working, and the People page shows them as such.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 19:50:00.000000
"""

import hashlib
import json
from datetime import UTC, datetime

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
    _resources_once()


BATCH = 500


def _resources_once() -> None:
    """Each OTLP trace's copied resource into otlpresource, the trace keeping its hash (the hash is
    core/records/production/otlp_held.py resource_hash's: sha256 of the JSON with sorted keys)."""
    trace = sa.table('trace', sa.column('id', sa.Integer), sa.column('meta', sa.JSON))
    resource = sa.table('otlpresource', sa.column('hash', sa.String), sa.column('attributes', sa.JSON),
                        sa.column('created_at', sqlmodel.sql.sqltypes.UTCDateTime))
    connection = op.get_bind()
    stored, last = set(), 0
    while True:
        rows = connection.execute(sa.select(trace.c.id, trace.c.meta).where(trace.c.id > last)
                                  .order_by(trace.c.id).limit(BATCH)).all()
        if not rows:
            return
        last = rows[-1].id
        for row in rows:
            otlp = (row.meta or {}).get("otlp") if isinstance(row.meta, dict) else None
            if not isinstance(otlp, dict) or "resource" not in otlp:
                continue
            attributes = otlp.pop("resource") or {}
            text = json.dumps(attributes, sort_keys=True, ensure_ascii=False, default=str)
            digest = hashlib.sha256(text.encode()).hexdigest()
            if digest not in stored:
                stored.add(digest)
                connection.execute(resource.insert().values(hash=digest, attributes=attributes,
                                                            created_at=datetime.now(UTC)))
            otlp["resource_hash"] = digest
            connection.execute(trace.update().where(trace.c.id == row.id).values(meta=row.meta))


def downgrade() -> None:
    _resources_copied_back()
    with op.batch_alter_table('apikey', schema=None) as batch_op:
        batch_op.drop_column('any_task')
        batch_op.drop_column('library')
        batch_op.drop_column('task_id')
    with op.batch_alter_table('otlpheldspan', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_otlpheldspan_received_at'))
        batch_op.drop_index(batch_op.f('ix_otlpheldspan_service'))
    op.drop_table('otlpheldspan')
    op.drop_table('otlpresource')


def _resources_copied_back() -> None:
    trace = sa.table('trace', sa.column('id', sa.Integer), sa.column('meta', sa.JSON))
    resource = sa.table('otlpresource', sa.column('hash', sa.String), sa.column('attributes', sa.JSON))
    connection = op.get_bind()
    resources = {row.hash: row.attributes for row in connection.execute(sa.select(resource.c.hash,
                                                                                  resource.c.attributes))}
    if not resources:
        return
    for row in connection.execute(sa.select(trace.c.id, trace.c.meta)).all():
        otlp = (row.meta or {}).get("otlp") if isinstance(row.meta, dict) else None
        if isinstance(otlp, dict) and otlp.get("resource_hash") in resources:
            otlp["resource"] = resources[otlp.pop("resource_hash")]
            connection.execute(trace.update().where(trace.c.id == row.id).values(meta=row.meta))
