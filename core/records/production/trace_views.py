"""What the Production page reads of a task's traces under its filters, in a few aggregate queries, so a busy
task costs the same as a quiet one: the totals, the figures per day and version, one page of rows, the lowest
scored and the oldest one waiting for a person. No query loads the whole window; each row query has a LIMIT.

The score that counts is computed in the database by core.records.production.scores.score_column, the SQL twin
of trace_score, and the interval of each day's mean from its count, sum and sum of squares
(core.domain.metrics.mean_interval_of_sums), as mean_interval does from the values.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from sqlalchemy import case, func
from sqlmodel import Session, select

from core.domain.metrics import mean_interval_of_sums
from core.records.production.scores import score_column
from core.records.production.traces import TraceFilter, version_name
from core.records.tasks.lookup import get_task
from storage.statuses import LabelStatus
from storage.tables import Trace

PAGE_SIZE = 200  # rows of one page of the traces table
LOWEST = 10


@dataclass(frozen=True)
class TraceTotals:
    """How many traces the filters choose, how many have a score, and how many wait for a person."""

    traces: int
    scored: int
    waiting: int

    @property
    def scored_share(self) -> float | None:
        return self.scored / self.traces if self.traces else None


def totals(session: Session, task_name: str, chosen: TraceFilter) -> TraceTotals:
    task = get_task(session, task_name)
    score = score_column()
    traces, scored, waiting = session.exec(
        select(func.count(), func.count(score), func.coalesce(func.sum(case(
            (Trace.label_status == LabelStatus.NEEDED, 1), else_=0)), 0))
        .where(*chosen.where(task.id))).one()
    return TraceTotals(int(traces), int(scored), int(waiting))


def daily_rows(session: Session, task_name: str, chosen: TraceFilter, numbers: dict[int, int]) -> list[dict]:
    """Per day (UTC) and version: traces, the share with a score, and the mean score with its 95% interval, the
    rows the Production page and `python -m core traces` print."""
    task = get_task(session, task_name)
    score = score_column()
    day = func.date(Trace.created_at)
    found = session.exec(
        select(day, Trace.version_id, func.count(), func.count(score), func.sum(score), func.sum(score * score))
        .where(*chosen.where(task.id)).group_by(day, Trace.version_id)).all()
    rows = []
    for when, version_id, count, scored, total, squares in sorted(
            found, key=lambda row: (str(row[0]), row[1] or 0)):
        low, high = mean_interval_of_sums(scored, total or 0.0, squares or 0.0) if scored else (None, None)
        rows.append({"day": date.fromisoformat(str(when)[:10]), "version": version_name(version_id, numbers),
                     "version_id": version_id, "traces": int(count), "scored": int(scored),
                     "scored share": round(scored / count, 3),
                     "mean score": round(total / scored, 3) if scored else None,
                     "low": None if low is None else round(low, 3), "high": None if high is None else round(high, 3)})
    return rows




def lowest_traces(session: Session, task_name: str, chosen: TraceFilter, count: int = LOWEST) -> list[Trace]:
    """The `count` lowest-scored traces, lowest first (the newest first among equal scores); unscored ones are left
    out."""
    task = get_task(session, task_name)
    score = score_column()
    return list(session.exec(select(Trace).where(*chosen.where(task.id), score.is_not(None))
                             .order_by(score.asc(), Trace.created_at.desc(), Trace.id.desc()).limit(count)))


def oldest_waiting(session: Session, task_name: str, chosen: TraceFilter) -> Trace | None:
    """The oldest trace the filters choose that waits for a person's label."""
    task = get_task(session, task_name)
    return session.exec(select(Trace).where(*chosen.where(task.id), Trace.label_status == LabelStatus.NEEDED)
                        .order_by(Trace.created_at.asc(), Trace.id.asc()).limit(1)).first()
