"""Pause, resume and cancel runs (and resume evaluations): a person's requests, written as status changes.

The worker executing a run reads its status at every progress tick and stops cleanly when it
reads `paused` or `cancelled`; `resume` puts the job back in the queue for any worker to claim.
Every change is an audit event.
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

from core.errors import Conflict, NotFound
from core.records.people import require_role
from core.records.workers import job_health
from storage.db import session_scope
from storage.statuses import (
    EVALUATION_MAY_RESUME,
    PERSON_MAY_CANCEL,
    PERSON_MAY_PAUSE,
    PERSON_MAY_RESUME,
    JobStatus,
)
from storage.tables import AuditEvent, Evaluation, Run, utcnow


def _change(engine: Engine, table, job_id: int, actor: str, allowed: tuple[str, ...], new_status: str,
            verb: str) -> str:
    kind = table.__name__.lower()
    with session_scope(engine) as session:
        require_role(session, actor, "reviewer", f"pausing, resuming or cancelling a {kind}")
        row = session.get(table, job_id)
        if row is None:
            raise NotFound(f"no {kind} {job_id}")
        shown = job_health(row.status, row.heartbeat_at)
        if shown not in allowed:
            raise Conflict(f"{kind} {job_id} is {shown}; only {', '.join(allowed)} can be {verb}")
        before = row.status
        row.status = new_status
        if new_status == JobStatus.QUEUED:
            # A new lease generation: a stalled worker that wakes up later finds its job gone and writes nothing.
            row.error, row.worker_id, row.lease = None, None, row.lease + 1
        if new_status == JobStatus.CANCELLED:
            row.finished_at = utcnow()
        session.add(row)
        session.add(AuditEvent(actor=actor, action=f"{kind}.{verb}", object_type=kind, object_id=job_id,
                               before={"status": before}, after={"status": new_status}))
        return new_status


def pause_run(engine: Engine, run_id: int, actor: str) -> str:
    """A queued run waits; a running one stops at its next progress tick (what is done stays done)."""
    return _change(engine, Run, run_id, actor, PERSON_MAY_PAUSE, JobStatus.PAUSED, "paused")


def resume_run(engine: Engine, run_id: int, actor: str) -> str:
    """Queue a paused, failed or stalled run again; a worker continues it where it stopped."""
    return _change(engine, Run, run_id, actor, PERSON_MAY_RESUME, JobStatus.QUEUED, "resumed")


def cancel_run(engine: Engine, run_id: int, actor: str) -> str:
    """End a run for good; versions it already created stay."""
    return _change(engine, Run, run_id, actor, PERSON_MAY_CANCEL, JobStatus.CANCELLED, "cancelled")


def resume_evaluation(engine: Engine, evaluation_id: int, actor: str) -> str:
    """Queue a failed or stalled evaluation again; stored rollouts are reused."""
    return _change(engine, Evaluation, evaluation_id, actor, EVALUATION_MAY_RESUME, JobStatus.QUEUED, "resumed")
