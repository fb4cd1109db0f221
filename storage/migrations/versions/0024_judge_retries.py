"""a failed production judge call is retried, not sent to people (issue 60, item 4); a receiver back is heard
(issue 61, item 4)

trace.judge_attempts: failed judge calls since the last verdict; trace.judge_retry_at: when the next is due (back-off);
trace.judge_failed_at: the first failure of the current run of failures, for "judge unavailable since ...". A trace
whose call failed has judge_status 'retry'. Traces that an outage already sent to people (judge_status 'unsure'
with no value and a detail that says the call failed) go back to the judge, and their label status back to none
unless a person labelled them. webhookendpoint.probed_at: when its waiting head delivery was last tried early, so a
receiver that answers again gets what waits within a minute instead of at the next step of the back-off.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-02 03:30:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('trace', schema=None) as batch_op:
        batch_op.add_column(sa.Column('judge_attempts', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('judge_retry_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True))
        batch_op.add_column(sa.Column('judge_failed_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True))
    with op.batch_alter_table('webhookendpoint', schema=None) as batch_op:
        batch_op.add_column(sa.Column('probed_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True))
    op.execute(sa.text(
        "UPDATE trace SET judge_status = 'retry', judge_attempts = 1, judge_retry_at = judged_at, "
        "judge_failed_at = judged_at, label_status = CASE WHEN label_status = 'done' THEN label_status ELSE NULL END "
        "WHERE judge_status = 'unsure' AND judge_score IS NULL AND label_value IS NULL "
        "AND judge_detail LIKE 'judge call failed:%'"))


def downgrade() -> None:
    op.execute(sa.text("UPDATE trace SET judge_status = 'unsure', label_status = 'needed' "
                       "WHERE judge_status = 'retry'"))
    with op.batch_alter_table('webhookendpoint', schema=None) as batch_op:
        batch_op.drop_column('probed_at')
    with op.batch_alter_table('trace', schema=None) as batch_op:
        batch_op.drop_column('judge_failed_at')
        batch_op.drop_column('judge_retry_at')
        batch_op.drop_column('judge_attempts')
