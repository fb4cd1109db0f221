"""How many answers an evaluation holds and how many it plans, for tables that list evaluations.

A finished evaluation says it in its metrics; a cancelled, failed or running one has no metrics yet, but its
answers are stored: they are counted from its rollouts, so a cancelled evaluation with 278 answers never reads
"answered —". A queued one has no progress yet: its plan (queries x k) follows from its split, limit or fixed
queries, so it never reads "0 of ?".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import case, func
from sqlmodel import Session, col, select

from storage import queries
from storage.tables import Evaluation, Rollout, Sample


@dataclass(frozen=True)
class Counts:
    """An evaluation's answers (rollouts with a reward to count), rollouts stored, and rollouts planned
    (None only when its task has no such split to plan from)."""

    answered: int
    stored: int
    planned: int | None

    @property
    def answered_text(self) -> str:
        """"answered/planned", as the tables' `answered` column reads it."""
        return f"{self.answered}/{self.planned if self.planned is not None else self.stored}"

    @property
    def progress_text(self) -> str:
        return f"{self.stored}/{self.planned if self.planned is not None else '?'}"


def planned_rollouts(session: Session, evaluation: Evaluation) -> int | None:
    """Queries x k: from its progress once a worker started it, else from the queries it will use."""
    total = (evaluation.progress or {}).get("rollouts_total")
    if total is not None:
        return int(total)
    if evaluation.sample_ids is not None:
        return len(evaluation.sample_ids) * evaluation.k
    n = session.exec(select(func.count()).select_from(Sample).where(
        Sample.task_id == evaluation.task_id, Sample.split == evaluation.split)).one()
    n = min(n, evaluation.limit) if evaluation.limit else n
    return n * evaluation.k if n else None


def evaluation_counts(session: Session, evaluations: Iterable[Evaluation]) -> dict[int, Counts]:
    """Each evaluation's counts by id: from its metrics when it finished, else from its stored rollouts (one
    query for all of them)."""
    evaluations = list(evaluations)
    unfinished = [e.id for e in evaluations if "answered" not in (e.metrics or {})]
    stored: dict[int, tuple[int, int]] = {}
    if unfinished:
        rows = session.exec(select(Rollout.evaluation_id, func.count(), func.sum(case((queries.answered(), 1), else_=0)))
                            .where(col(Rollout.evaluation_id).in_(unfinished)).group_by(Rollout.evaluation_id)).all()
        stored = {ev_id: (int(answered or 0), int(n)) for ev_id, n, answered in rows}
    counts = {}
    for e in evaluations:
        metrics = e.metrics or {}
        if "answered" in metrics:
            total = int(metrics.get("rollouts", 0))
            counts[e.id] = Counts(int(metrics["answered"]), total, total)
        else:
            answered, n = stored.get(e.id, (0, 0))
            counts[e.id] = Counts(answered, n, planned_rollouts(session, e))
    return counts
