"""No second job by accident: a form sent twice (Enter in a box, a double click, a second tab) must not queue an
evaluation or a run identical to one already queued or running; the queueing functions
(core.grpo.evaluation.create_evaluation, core.grpo.training.create_run) refuse it with DuplicateJob, which names
the job to follow, so the pages, the CLI and the API all say the same. A form also refuses an evaluation identical to
one that ended within the last minute (`ended_within_s`): Enter in a box sends it again once the first has ended,
and the page says so and offers to queue it on purpose.

The check holds the task's row until the transaction ends (PostgreSQL's row lock, SQLite's write lock), so two
requests at the same moment are queued one after the other and the second sees the first.
"""

from __future__ import annotations

import json
from datetime import UTC, timedelta
from typing import Any

from sqlalchemy import update
from sqlmodel import Session, col, select

from core.errors import DuplicateJob
from storage.statuses import ACTIVE, EvaluationPurpose
from storage.tables import Evaluation, Run, Task, utcnow


def lock_task(session: Session, task_id: int) -> None:
    """Hold the task until this transaction ends: jobs of one task are queued one after the other."""
    session.exec(update(Task).where(Task.id == task_id).values(name=Task.name))


def _same(a: Any, b: Any) -> bool:
    """Equal as stored (JSON): a tuple and a list, or 1 and 1.0, are the same setting."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str) or a == b


def _when(job: Evaluation | Run) -> str:
    return f"queued by {job.created_by} at {job.created_at:%Y-%m-%d %H:%M:%S} UTC"


def _same_evaluation(ev: Evaluation, new: Evaluation) -> bool:
    return ((ev.version_id, ev.split, ev.k, ev.limit, ev.model) == (new.version_id, new.split, new.k, new.limit,
                                                                    new.model)
            and _same(ev.temperature, new.temperature) and _same(ev.routes or None, new.routes or None))


def refuse_second_evaluation(session: Session, new: Evaluation, *, ended_within_s: float | None = None) -> None:
    """Raise DuplicateJob when an evaluation a person asked for with the same version, split, k, query limit,
    model, temperature and segment routes is queued or running (call with the task locked); with
    `ended_within_s` (a form: Enter pressed again in a box once the first had ended) also when one ended that
    recently, saying when and how it ended."""
    for ev in session.exec(select(Evaluation).where(
            Evaluation.task_id == new.task_id, Evaluation.purpose == EvaluationPurpose.EVALUATION,
            col(Evaluation.status).in_(ACTIVE)).order_by(Evaluation.id)):
        if _same_evaluation(ev, new):
            raise DuplicateJob(f"evaluation {ev.id} of the same version, split, k and model is already {ev.status} "
                               f"({_when(ev)}): nothing new was queued; follow evaluation {ev.id} (cancel it first "
                               "to queue it again)", "evaluation", ev.id)
    if not ended_within_s:
        return
    since = utcnow() - timedelta(seconds=ended_within_s)
    for ev in session.exec(select(Evaluation).where(
            Evaluation.task_id == new.task_id, Evaluation.purpose == EvaluationPurpose.EVALUATION,
            col(Evaluation.finished_at).is_not(None)).order_by(col(Evaluation.id).desc()).limit(50)):
        ended = ev.finished_at if ev.finished_at.tzinfo else ev.finished_at.replace(tzinfo=UTC)
        if ended >= since and _same_evaluation(ev, new):
            ago = max(0, round((utcnow() - ended).total_seconds()))
            raise DuplicateJob(f"evaluation {ev.id} of the same version, split, k and model ended {ago} s ago "
                               f"({ev.status}): nothing new was queued; its figures are in the table. To measure it "
                               "again on purpose, press Evaluate again", "evaluation", ev.id)


def refuse_second_run(session: Session, new: Run) -> None:
    """Raise DuplicateJob when a run of the same kind, library, start version and settings is queued or running
    (call with the task locked)."""
    for run in session.exec(select(Run).where(Run.task_id == new.task_id, Run.library_id == new.library_id,
                                              Run.kind == new.kind, col(Run.status).in_(ACTIVE)).order_by(Run.id)):
        if run.start_version_id == new.start_version_id and _same(run.settings, new.settings):
            raise DuplicateJob(f"run {run.id} with the same settings is already {run.status} ({_when(run)}): nothing "
                               f"new was queued; follow run {run.id} (cancel it first to queue it again)", "run", run.id)
