"""Pause, resume and cancel runs, cancel and resume evaluations and measurements: a person's requests,
written as status changes.

The worker executing a run reads its status at every progress tick and stops cleanly when it
reads `paused` or `cancelled`; one executing an evaluation (or a measurement's variant) reads it every
second between and during its model calls (core.grpo.evaluation.STOP_CHECK_EVERY) and abandons the calls
in flight; every answered rollout is stored as it comes, so nothing answered is lost. `resume` puts the
job back in the queue for any worker to claim. Every change is an audit event naming who asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Engine

from core.errors import Conflict, NotFound
from core.records.people.roles import require_role
from core.records.runs.workers import job_health
from storage.db import session_scope
from storage.statuses import (
    EVALUATION_MAY_CANCEL,
    EVALUATION_MAY_RESUME,
    PERSON_MAY_CANCEL,
    PERSON_MAY_PAUSE,
    PERSON_MAY_RESUME,
    EvaluationPurpose,
    JobStatus,
    RunKind,
)
from storage.tables import AuditEvent, Evaluation, Run, utcnow


def _change(engine: Engine, table, job_id: int, actor: str, allowed: tuple[str, ...], new_status: str,
            verb: str, refuse: Callable[[Any], str | None] | None = None) -> str:
    """Move a job to `new_status` when its shown status is one of `allowed` and `refuse(row)` names no reason
    against it; audited as `<table>.<verb>` by `actor`."""
    kind = table.__name__.lower()
    with session_scope(engine) as session:
        require_role(session, actor, "reviewer", f"pausing, resuming or cancelling a {kind}")
        row = session.get(table, job_id)
        if row is None:
            raise NotFound(f"no {kind} {job_id}")
        reason = refuse(row) if refuse is not None else None
        if reason:
            raise Conflict(reason)
        shown = job_health(row.status, row.heartbeat_at)
        if shown not in allowed:
            raise Conflict(f"{kind} {job_id} is {shown}; only {', '.join(allowed)} can be {verb}")
        before = row.status
        row.status = new_status
        if new_status == JobStatus.QUEUED:
            # A new lease generation: a stalled worker that wakes up later finds its job gone and writes nothing.
            row.error, row.worker_id, row.lease, row.finished_at = None, None, row.lease + 1, None
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
    """Queue a failed, stalled, incomplete or cancelled evaluation again; stored rollouts are reused, so only
    the rollouts without an answer are paid for."""
    return _change(engine, Evaluation, evaluation_id, actor, EVALUATION_MAY_RESUME, JobStatus.QUEUED, "resumed")


def cancel_evaluation(engine: Engine, evaluation_id: int, actor: str) -> str:
    """Stop a queued, running, stalled or label-waiting evaluation: a worker executing it stops within seconds
    (the calls in flight are abandoned); its answered rollouts stay, and `resume_evaluation` continues it.
    A gate's or a measurement's evaluation belongs to its run: cancel the run instead."""
    return _change(engine, Evaluation, evaluation_id, actor, EVALUATION_MAY_CANCEL, JobStatus.CANCELLED, "cancelled",
                   refuse=_not_a_persons_evaluation)


def cancel_attribution(engine: Engine, run_id: int, actor: str) -> str:
    """Stop a measurement of experiences (a run of kind `attribute`) for good: a worker executing it stops
    within seconds, in the middle of a variant too; finished variants and answered rollouts stay in the
    database (and in the ledger's cache, so measuring the version again does not pay for them twice)."""
    return _change(engine, Run, run_id, actor, PERSON_MAY_CANCEL, JobStatus.CANCELLED, "cancelled",
                   refuse=lambda run: None if run.kind == RunKind.ATTRIBUTE else
                   f"run {run_id} is a {run.kind} run, not a measurement of experiences; cancel it as a run")


def _not_a_persons_evaluation(ev: Evaluation) -> str | None:
    if ev.purpose == EvaluationPurpose.EVALUATION:
        return None
    return (f"evaluation {ev.id} is run {ev.run_id}'s {ev.purpose} evaluation; it stops and resumes with its run "
            f"(cancel or pause run {ev.run_id})")
