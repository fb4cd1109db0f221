"""schema agrees with models

JSON columns with a default ({} or []) become NOT NULL, as storage/tables.py declares them (its
`_json` helper used to say the opposite, and 0001 was generated from it); NULLs, if any, get the
default first. The two JSON columns without a default, auditevent.before and .after (`dict | None`),
become nullable. tests/test_migrations.py checks that the models and the migrations agree.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 14:40:00.000000
"""

from collections.abc import Callable

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

# table -> {column: the value that replaces its NULLs}
NOT_NULL_JSON = {
    'task': {'reward_settings': {}},
    'sample': {'meta': {}},
    'libraryversion': {'experiences': []},
    'run': {'settings': {}, 'progress': {}},
    'step': {'sample_ids': [], 'stats': {}},
    'evaluation': {'metrics': {}},
    'rollout': {'messages': []},
    'advantage': {'proposals': []},
    'operation': {'target_ids': [], 'source_advantage_ids': []},
    'llmcall': {'request': {}},
}
NULLABLE_JSON = {'auditevent': ['before', 'after']}


def _fill(table: str, column: str, value) -> None:
    t = sa.table(table, sa.column(column, sa.JSON()))
    op.execute(t.update().where(t.c[column].is_(None)).values({column: value}))


def _alter(table: str, columns, nullable: bool) -> None:
    with op.batch_alter_table(table, schema=None) as batch_op:
        for column in columns:
            batch_op.alter_column(column, existing_type=sa.JSON(), existing_nullable=not nullable,
                                  nullable=nullable)


def _without_foreign_keys(change: Callable[[], None]) -> None:
    """Run `change` with SQLite's foreign keys off, as SQLite's own recipe for rebuilding a table asks.

    Batch mode rebuilds each table (copy, DROP, rename); with foreign keys on, the DROP of a table
    that other rows point at fails ("FOREIGN KEY constraint failed"), and deferring the check does not
    help because the rename never un-counts those rows. The pragma only takes effect outside a
    transaction, which holds when this database comes from 0003 (nothing written yet in this upgrade).
    Upgrading from an earlier revision runs inside a transaction, where the pragma is a no-op: fine for
    a new, empty database. Afterwards every reference is checked, and the connection is marked to be
    replaced when the pool hands it out next, so the replacement gets foreign keys on again from the
    engine's connect hook (storage.db._sqlite_pragmas).
    """
    bind = op.get_bind()
    if bind.dialect.name != 'sqlite' or not bind.exec_driver_sql('PRAGMA foreign_keys').scalar():
        change()
        return
    bind.exec_driver_sql('PRAGMA foreign_keys=OFF')
    if bind.exec_driver_sql('PRAGMA foreign_keys').scalar():  # inside a transaction: keys stay on
        change()
        return
    try:
        change()
        broken = bind.exec_driver_sql('PRAGMA foreign_key_check').fetchall()
        if broken:
            raise RuntimeError(f'foreign keys broken by the migration: {broken[:5]}')
    finally:
        bind.connection.invalidate(soft=True)


def _upgrade() -> None:
    for table, columns in NOT_NULL_JSON.items():
        for column, value in columns.items():
            _fill(table, column, value)
        _alter(table, columns, nullable=False)
    for table, columns in NULLABLE_JSON.items():
        _alter(table, columns, nullable=True)


def _downgrade() -> None:
    for table, columns in NULLABLE_JSON.items():
        for column in columns:
            _fill(table, column, sa.JSON.NULL)  # the JSON value null, which 0003 stored for None
        _alter(table, columns, nullable=False)
    for table, columns in NOT_NULL_JSON.items():
        _alter(table, columns, nullable=True)


def upgrade() -> None:
    _without_foreign_keys(_upgrade)


def downgrade() -> None:
    _without_foreign_keys(_downgrade)
