"""What each webhook event says, written to the outbox in the caller's transaction (core/records/notifications/webhooks.py sends).

Each `notify_*` is the one-line call the place of the change makes (training, labeling, evaluation, promotion), so
the event lands with the change or not at all; each decides itself whether it applies (a completed run is no
failure, another label is not production), so the call sites stay one line. A label move is not called from the
library: `notify_label_moved` registers on its hook (core/records/library/events.py).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, or_, select

from core.domain import webhooks as wh
from core.records.library.events import LabelMoved, on_label_moved
from core.records.runs.workers import stall_after
from core.settings import get_settings
from storage import queries
from storage.db import session_scope
from storage.fencing import holding
from storage.statuses import EvaluationPurpose, JobStatus, LabelStatus
from storage.tables import (
    Evaluation,
    Library,
    Rollout,
    Run,
    Step,
    Task,
    WebhookDelivery,
    WebhookEndpoint,
    as_utc,
    utcnow,
)


def raise_event(session: Session, event_type: str, text: str, data: dict, *, message_id: str | None = None,
                only: int | None = None) -> int:
    """Write the event to the outbox of every active endpoint that hears it (or of endpoint `only`), in the
    caller's session, so it lands with the change that raised it or not at all. Returns rows written."""
    query = select(WebhookEndpoint).where(WebhookEndpoint.active == True)  # noqa: E712
    if only is not None:
        query = select(WebhookEndpoint).where(WebhookEndpoint.id == only)
    targets = [row for row in session.exec(query) if wh.hears(row.events or [], event_type)]
    if not targets:
        return 0
    data = {**data, "studio": get_settings().app_url}
    payload = wh.body(event_type, text, data, utcnow())
    message_id = message_id or f"msg_{uuid.uuid4().hex}"
    for row in targets:
        session.add(WebhookDelivery(endpoint_id=row.id, message_id=message_id, event_type=event_type,
                                    payload=payload))
    return len(targets)


def _place(session: Session, task_id: int, library_id: int | None) -> tuple[str, str | None]:
    task = session.get(Task, task_id)
    library = session.get(Library, library_id) if library_id else None
    return (task.name if task else str(task_id)), (library.name if library else None)


def notify_step_awaiting_review(session: Session, run: Run, step: Step) -> None:
    """A step's operations wait for a reviewer: the gate's line says what the measurement found."""
    task, library = _place(session, run.task_id, run.library_id)
    gate = (step.gate or {}).get("line") or "no validation gate measured this step"
    where = f"epoch {step.epoch + 1} batch {step.batch_index + 1}"
    raise_event(session, "step.awaiting_review", f"Run {run.id} ({task}) waits for review at {where}: {gate}", {
        "task": task, "library": library, "run": run.id, "step": step.id, "epoch": step.epoch + 1,
        "batch": step.batch_index + 1, "gate": gate,
        "link": wh.link(get_settings().app_url, "review", task=task, library=library, run=run.id, step=step.id)})


def notify_labels_waiting(session: Session, waiting: bool, *, step_id: int | None = None,
                          evaluation_id: int | None = None) -> None:
    """A run's step or an evaluation stopped for labels: how many rollouts wait, of which task."""
    if not waiting:
        return
    owner = Rollout.step_id == step_id if step_id is not None else Rollout.evaluation_id == evaluation_id
    count = len(session.exec(select(Rollout.id).where(owner, Rollout.label_status == LabelStatus.NEEDED)).all())
    if step_id is not None:
        step = session.get(Step, step_id)
        run = session.get(Run, step.run_id)
        task, library = _place(session, run.task_id, run.library_id)
        what, ids = f"run {run.id}", {"run": run.id, "step": step_id}
    else:
        evaluation = session.get(Evaluation, evaluation_id)
        task, library = _place(session, evaluation.task_id, None)
        what, ids = f"evaluation {evaluation_id}", {"evaluation": evaluation_id}
    raise_event(session, "labels.waiting", f"{count} rollouts of {task} wait for a label ({what} waits for them)", {
        "task": task, "library": library, "count": count, **ids,
        "link": wh.link(get_settings().app_url, "labeling", task=task, library=library)})


def notify_dispute(session: Session, rollout: Rollout, task: Task, agreed: bool) -> None:
    """Labellers disagree on a rollout that did not disagree before: a reviewer must decide."""
    if agreed or rollout.label_status == LabelStatus.DISPUTED:
        return
    raise_event(session, "dispute.opened", f"Labellers disagree on rollout {rollout.id} of {task.name}: a reviewer "
                "decides on Labeling's Agreement tab", {
                    "task": task.name, "rollout": rollout.id, "run_step": rollout.step_id,
                    "evaluation": rollout.evaluation_id,
                    "link": wh.link(get_settings().app_url, "labeling", task=task.name, label_tab="Agreement")})


def notify_evaluation_ended(session: Session, evaluation: Evaluation) -> None:
    """An evaluation a person asked for ended: its figures, or why it is incomplete or failed (a gate's or an
    attribution's evaluation belongs to its run, which speaks for it)."""
    if evaluation.purpose != EvaluationPurpose.EVALUATION:
        return
    task, _ = _place(session, evaluation.task_id, None)
    number = queries.version_number(session, evaluation.version_id)
    version = f"version #{number}" if number else "the empty library"
    if evaluation.status == JobStatus.FAILED:
        verdict = f"failed: {evaluation.error}"
    else:
        verdict = (f"Mean@{evaluation.k} {evaluation.mean_at_k:.3f}, Pass@{evaluation.k} {evaluation.pass_at_k:.3f} "
                   f"over {evaluation.n} queries" if evaluation.mean_at_k is not None else "no figures")
        if evaluation.status == JobStatus.INCOMPLETE:
            verdict += f"; incomplete: {evaluation.error}"
    raise_event(session, "evaluation.ended", f"Evaluation {evaluation.id} of {task} ({version}, {evaluation.split}) "
                f"{evaluation.status}: {verdict}", {
                    "task": task, "evaluation": evaluation.id, "version": number, "split": evaluation.split,
                    "k": evaluation.k, "status": evaluation.status, "mean_at_k": evaluation.mean_at_k,
                    "pass_at_k": evaluation.pass_at_k, "n": evaluation.n, "verdict": verdict,
                    "link": wh.link(get_settings().app_url, "rollouts", task=task, evaluation=evaluation.id)})


def notify_run_failed(session: Session, run: Run) -> None:
    """A run ended in failure (called where every run ends; says nothing for the other endings)."""
    if run.status != JobStatus.FAILED:
        return
    task, library = _place(session, run.task_id, run.library_id)
    step = session.exec(select(Step).where(Step.run_id == run.id).order_by(col(Step.id).desc())).first()
    raise_event(session, "run.failed", f"Run {run.id} of {task} failed: {run.error}", {
        "task": task, "library": library, "run": run.id, "step": step.id if step else None, "error": run.error,
        "link": wh.link(get_settings().app_url, "train", task=task, library=library, run=run.id)})


def notify_stalled_jobs(engine: Engine) -> int:
    """Raise `run.stalled` once per stall (a running run or evaluation whose heartbeat is older than the stall
    window, per lease generation); the worker's delivery pass calls it. Returns the events raised."""
    stale_before = utcnow() - timedelta(seconds=stall_after())
    raised = 0
    with holding(None), session_scope(engine) as session:
        if session.exec(select(WebhookEndpoint.id).where(WebhookEndpoint.active == True)).first() is None:  # noqa: E712
            return 0
        for table, kind in ((Run, "run"), (Evaluation, "evaluation")):
            stalled = session.exec(select(table).where(table.status == JobStatus.RUNNING,
                                                       or_(col(table.heartbeat_at).is_(None),
                                                           table.heartbeat_at < stale_before)))
            for job in stalled:
                if kind == "evaluation" and job.run_id is not None:
                    continue  # a gate's evaluation: its run stalls with it
                message_id = f"msg_{kind}{job.id}_stalled_{job.lease}"
                if session.exec(select(WebhookDelivery.id).where(WebhookDelivery.message_id == message_id)).first():
                    continue
                task, library = _place(session, job.task_id, getattr(job, "library_id", None))
                beat = as_utc(job.heartbeat_at)
                raised += raise_event(session, "run.stalled", f"{kind.capitalize()} {job.id} of {task} stalled: its "
                                      f"worker {job.worker_id} stopped beating at {beat:%Y-%m-%d %H:%M:%S} UTC; an "
                                      "idle worker takes it over, or resume it", {
                                          "task": task, "library": library, kind: job.id, "worker": job.worker_id,
                                          "heartbeat_at": beat.isoformat() if beat else None,
                                          "link": wh.link(get_settings().app_url,
                                                          "train" if kind == "run" else "evaluate", task=task,
                                                          library=library, **({"run": job.id} if kind == "run" else {}))},
                                      message_id=message_id)
    return raised


@on_label_moved
def notify_label_moved(event: LabelMoved) -> None:
    """Production moved (registered on every label move; other labels say nothing): from which version to which,
    by whom and why, each version by its number in its library (`before` is the label.move audit record's, which
    carries the number)."""
    if event.name != "production":
        return
    session, version, record = event.session, event.version, event.record
    library = session.get(Library, version.library_id)
    task, library_name = _place(session, library.task_id, library.id)
    was = (event.before or {}).get("number")
    reason = record.get("reason") or record.get("evidence") or "no reason given"
    raise_event(session, "production.moved", f"Production of {task} / {library_name} moved from "
                f"{f'#{was}' if was else 'no version'} to #{version.number} by {event.actor}: {reason}", {
                    "task": task, "library": library_name, "from_version": was, "to_version": version.number,
                    "by": event.actor, "reason": record.get("reason"), "evidence": record.get("evidence"),
                    "link": wh.link(get_settings().app_url, "library", task=task, library=library_name)})
