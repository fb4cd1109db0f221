"""leases and natural keys

run.lease, evaluation.lease: the lease generation that fences a worker's writes (storage/fencing.py).
Unique keys on the natural identity of what a job writes, so a second writer can never duplicate it:
a rollout per (step, sample, group index) and per (evaluation, sample, group index), an advantage per
(step, sample), an operation per (step, position). Duplicates that unfenced workers left behind are
folded first: the oldest row (lowest id) stays, a person's reward labels on a dropped rollout move to the
one kept.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 23:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

ROLLOUT_KEYS = {"step": ("step_id", "sample_id", "group_index"),
                "evaluation": ("evaluation_id", "sample_id", "group_index")}


def _same(columns: tuple[str, ...], left: str, right: str) -> str:
    return " AND ".join(f"{left}.{c} = {right}.{c}" for c in columns)


def _fold_rollouts() -> None:
    for owner, columns in ROLLOUT_KEYS.items():
        same = _same(columns, "kept", "dup")
        op.execute(f"""
            UPDATE rewardlabel SET rollout_id = (
                SELECT MIN(kept.id) FROM rollout kept, rollout dup
                WHERE dup.id = rewardlabel.rollout_id AND {same})
            WHERE rollout_id IN (
                SELECT dup.id FROM rollout dup, rollout kept
                WHERE dup.{owner}_id IS NOT NULL AND {same} AND kept.id < dup.id)""")
        op.execute(f"""
            DELETE FROM rollout WHERE {owner}_id IS NOT NULL AND id > (
                SELECT MIN(kept.id) FROM rollout kept WHERE {_same(columns, 'kept', 'rollout')})""")


def _fold(table: str, columns: tuple[str, ...]) -> None:
    op.execute(f"""
        DELETE FROM {table} WHERE id > (
            SELECT MIN(kept.id) FROM {table} kept WHERE {_same(columns, 'kept', table)})""")


def upgrade() -> None:
    for table in ("run", "evaluation"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column('lease', sa.Integer(), nullable=False, server_default='0'))
    _fold_rollouts()
    _fold("advantage", ("step_id", "sample_id"))
    _fold("operation", ("step_id", "position"))
    op.create_index('uq_rollout_step_sample_group', 'rollout', ['step_id', 'sample_id', 'group_index'], unique=True,
                    sqlite_where=sa.text('step_id IS NOT NULL'), postgresql_where=sa.text('step_id IS NOT NULL'))
    op.create_index('uq_rollout_evaluation_sample_group', 'rollout', ['evaluation_id', 'sample_id', 'group_index'],
                    unique=True, sqlite_where=sa.text('evaluation_id IS NOT NULL'),
                    postgresql_where=sa.text('evaluation_id IS NOT NULL'))
    with op.batch_alter_table('advantage', schema=None) as batch_op:
        batch_op.create_unique_constraint('uq_advantage_step_id_sample_id', ['step_id', 'sample_id'])
    with op.batch_alter_table('operation', schema=None) as batch_op:
        batch_op.create_unique_constraint('uq_operation_step_id_position', ['step_id', 'position'])


def downgrade() -> None:
    with op.batch_alter_table('operation', schema=None) as batch_op:
        batch_op.drop_constraint('uq_operation_step_id_position', type_='unique')
    with op.batch_alter_table('advantage', schema=None) as batch_op:
        batch_op.drop_constraint('uq_advantage_step_id_sample_id', type_='unique')
    op.drop_index('uq_rollout_evaluation_sample_group', table_name='rollout')
    op.drop_index('uq_rollout_step_sample_group', table_name='rollout')
    for table in ("evaluation", "run"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column('lease')
