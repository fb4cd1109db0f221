"""A reviewer's decisions on proposed operations: approve, reject, edit, reopen, and apply.

A decision is one conditional UPDATE from `pending`, so when two reviewers decide the same
operation at once exactly one wins and the other gets AlreadyDecided with who decided it. Once
the last pending operation of a step that waits for review is decided, the step is applied (a
new library version) and its run goes back in the queue, so it continues by itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from core.domain.facts import REWRITES
from core.domain.library import (
    EXAMPLE,
    LESSON,
    ProposedOp,
    apply_ops,
    experience_texts,
    kind_of,
    next_id_number,
    validate_ops,
)
from core.domain.quality import Flag, quality_flags
from core.errors import AlreadyDecided, Conflict, InvalidInput, NotFound
from core.models.gateway import clean_text
from core.records.library.versions import all_ids, create_version
from core.records.people.roles import require_role
from core.records.review.fact_checks import rewrite_check, train_references
from core.records.review.gate_verdict import GateVerdict
from core.records.runs.settings import run_settings
from core.records.runs.workers import job_health
from storage import queries
from storage.db import session_scope
from storage.statuses import TO_APPLY, EvaluationPurpose, JobStatus, OperationStatus, OpKind, StepStatus
from storage.tables import AuditEvent, Evaluation, Library, LibraryVersion, Operation, Run, Step, Task, utcnow

DECISIONS = {OperationStatus.APPROVED: "operation.approve", OperationStatus.REJECTED: "operation.reject"}


def _operation(session: Session, op_id: int) -> Operation:
    op = session.get(Operation, op_id)
    if op is None:
        raise NotFound(f"no operation {op_id}")
    return op


def _snapshot(op: Operation) -> dict:
    return {"status": op.status, "op": op.op, "target_ids": list(op.target_ids), "text": op.text}


def _from_pending(engine: Engine, op_id: int, actor: str, action: str, comment: str | None, **values) -> Operation:
    """Move a pending operation to a decided state, or raise AlreadyDecided naming who was first."""
    with session_scope(engine) as session:
        require_role(session, actor, "reviewer", "deciding operations")
        op = _operation(session, op_id)
        before = _snapshot(op)
        result = session.exec(update(Operation).where(Operation.id == op_id, Operation.status == OperationStatus.PENDING)
                              .values(reviewer=actor, decided_at=utcnow(), comment=comment or None, **values))
        if result.rowcount != 1:
            session.refresh(op)
            by = f" by {op.reviewer}" if op.reviewer else ""
            raise AlreadyDecided(f"operation {op_id} was already {op.status}{by}")
        session.refresh(op)
        session.add(AuditEvent(actor=actor, action=action, object_type="operation", object_id=op_id,
                               before=before, after=_snapshot(op)))
        return op


def _check_gate(engine: Engine, step_id: int | None, decision: str, comment: str | None) -> None:
    """Approving against a failed validation gate is allowed, with a note saying why."""
    if decision == OperationStatus.REJECTED or step_id is None or (comment or "").strip():
        return
    with Session(engine) as session:
        gate = GateVerdict.of(session.get(Step, step_id))
    if gate is not None and gate.failed:
        raise InvalidInput(f"the validation gate failed for this step ({gate.line}); "
                           "approving against it needs a note saying why")


def decide_operation(engine: Engine, op_id: int, decision: str, actor: str, comment: str | None = None) -> Operation:
    """Approve or reject one pending operation; applies its step when it was the last one."""
    if decision not in DECISIONS:
        raise InvalidInput("decision must be approved or rejected")
    with Session(engine) as session:
        _check_gate(engine, _operation(session, op_id).step_id, decision, comment)
    op = _from_pending(engine, op_id, actor, DECISIONS[decision], comment, status=decision)
    apply_if_decided(engine, op.step_id, actor)
    return op


def edit_operation(engine: Engine, op_id: int, text: str | None, target_ids: list[str], actor: str,
                   comment: str | None = None) -> Operation:
    """Replace a pending operation's text (and targets) with a reviewer's version, validated first."""
    with Session(engine) as session:
        require_role(session, actor, "reviewer", "editing operations")
        op = _operation(session, op_id)
        step = session.get(Step, op.step_id)
        before = session.get(LibraryVersion, step.version_before_id)
        settings = run_settings(session.get(Run, step.run_id))
        kind = operation_kind(step, op)
    text = clean_text(text or "") or None
    ids = [str(i).strip() for i in target_ids if str(i).strip()]
    checked = validate_ops(before.experiences, [ProposedOp(op.op, ids, text, op.rationale or "", kind)],
                           max_size=settings.max_experiences, max_examples=settings.max_examples)[0]
    if not checked.valid:
        raise InvalidInput(f"the edited operation is not valid: {checked.error}")
    _check_gate(engine, op.step_id, OperationStatus.EDITED, comment)
    op = _from_pending(engine, op_id, actor, "operation.edit", comment, status=OperationStatus.EDITED, text=text, target_ids=ids)
    apply_if_decided(engine, op.step_id, actor)
    return op


def reopen_operation(engine: Engine, op_id: int, actor: str) -> Operation:
    """Take a decision back while the step is not applied yet."""
    with session_scope(engine) as session:
        require_role(session, actor, "reviewer", "reopening operations")
        op = _operation(session, op_id)
        step = session.get(Step, op.step_id) if op.step_id else None
        if op.status not in (OperationStatus.APPROVED, OperationStatus.REJECTED, OperationStatus.EDITED) or (step and step.status == StepStatus.COMPLETED):
            raise AlreadyDecided(f"operation {op_id} is {op.status} in an applied step and cannot be reopened")
        before = _snapshot(op)
        op.status, op.reviewer, op.decided_at = OperationStatus.PENDING, None, None
        session.add(op)
        session.add(AuditEvent(actor=actor, action="operation.reopen", object_type="operation", object_id=op_id,
                               before=before, after=_snapshot(op)))
        return op


def decide_all(engine: Engine, step_id: int, decision: str, actor: str, *, comment: str | None = None,
               reason: str | None = None) -> int:
    """Approve or reject every pending operation of a step, each an audit event; returns how many this call
    decided. The step is not applied here (see decide_step); auto review mode calls this with actor `auto`
    (every pending operation: flagged ones were refused before the gate), a failed validation gate with actor
    `gate` and reason `validation`."""
    if decision not in DECISIONS:
        raise InvalidInput("decision must be approved or rejected")
    if actor not in ("auto", "gate"):
        _check_gate(engine, step_id, decision, comment)
    with Session(engine) as session:
        require_role(session, actor, "reviewer", "deciding operations")
        pending = [op.id for op in queries.step_operations(session, step_id)
                   if op.status == OperationStatus.PENDING]
    decided = 0
    for op_id in pending:
        try:
            _from_pending(engine, op_id, actor, DECISIONS[decision], comment, status=decision, reason=reason)
            decided += 1
        except AlreadyDecided:
            continue
    return decided


def step_flags(session: Session, step: Step, ops: list[Operation] | None = None) -> dict[int, list[Flag]]:
    """Each operation's quality flags (core.domain.quality), judged by the rules of the entry kind it writes,
    against the version its step started from and the step's queries; computed on read, so an edited text is
    judged as it now stands. Invalid operations never land and get none."""
    ops = queries.step_operations(session, step.id) if ops is None else ops
    before = session.get(LibraryVersion, step.version_before_id) if step.version_before_id else None
    experiences = before.experiences if before else []
    query_texts = [sample.query for sample in queries.samples_by_ids(session, list(step.sample_ids or []))]
    live = [op for op in ops if op.status != OperationStatus.INVALID]
    texts = {op.id: (f"operation {op.position + 1}", op.text or "") for op in live}
    flags = {op.id: quality_flags(op.text, op.op, op.target_ids, experiences,
                                  {label: text for other, (label, text) in texts.items() if other != op.id},
                                  query_texts=query_texts, entry_kind=written_kind(step, op, experiences))
             for op in live}
    rewrites = [op for op in live if op.op in REWRITES]
    if rewrites:  # a rewrite that changes a verified fact (core.domain.facts): what auto review would hold
        task = session.get(Task, session.get(Run, step.run_id).task_id)
        references = train_references(session, task)
        for op in rewrites:
            found = rewrite_check(session, task, op.source_advantage_ids, references).changes(
                op.op, op.target_ids, op.text, experiences)
            if found.changed:
                flags[op.id].append(Flag("facts", f"It changes what a verified entry states: {found.reason}."))
    return flags


def decide_step(engine: Engine, step_id: int, decision: str, actor: str, comment: str | None = None) -> int:
    """Approve or reject every pending operation of a step, then apply it if it waits for review."""
    decided = decide_all(engine, step_id, decision, actor, comment=comment)
    apply_if_decided(engine, step_id, actor)
    return decided


def all_decided(step: Step, ops: list[Operation]) -> bool:
    """A step that waits for review and has no pending operation: what applying it needs."""
    return step.status == StepStatus.AWAITING_REVIEW and not any(op.status == OperationStatus.PENDING for op in ops)


def waits_for_apply(step: Step, ops: list[Operation]) -> bool:
    """Every operation is decided but the step was not applied, and no measurement of its decided library is under
    way: the one case where a person's Apply (the Review page's button, `review --apply`) is what lands it."""
    gate = GateVerdict.of(step)
    return all_decided(step, ops) and not (gate and gate.remeasure)


def apply_if_decided(engine: Engine, step_id: int | None, actor: str) -> LibraryVersion | None:
    """Apply a step that waits for review once nothing in it is pending; its run is queued again. When the
    validation gate measured another library than the one the decisions would land (a reviewer approved only
    part of the step, or edited an operation), nothing lands yet: the run is queued so its worker measures
    the decided library first (core.grpo.training)."""
    if step_id is None:
        return None
    with Session(engine) as session:
        step = session.get(Step, step_id)
        if step is None or not all_decided(step, queries.step_operations(session, step_id)):
            return None
        unmeasured = decided_library_unmeasured(session, step)
    if unmeasured:
        _queue_remeasure(engine, step_id, actor)
        return None
    return apply_step_operations(engine, step_id, actor=actor)


def library_after(session: Session, step: Step, ops: list[Operation]) -> list[dict]:
    """The library the step would make if `ops` were applied, with the ids it would get (the gate's candidate,
    and what a reviewer's decisions would land)."""
    before, checked = check_step_operations(session, step, ops)
    return next_library(session, before, [item.op for _op, item in checked if item.valid])


def decided_library(session: Session, step: Step) -> list[dict]:
    """The experiences the step's approved and edited operations would make."""
    return library_after(session, step, [o for o in queries.step_operations(session, step.id) if o.status in TO_APPLY])


def decided_library_unmeasured(session: Session, step: Step) -> bool:
    """Whether the gate measured a step and what its decisions would land is another library, which no gate
    measured (a library that would not change needs no measurement)."""
    gate = GateVerdict.of(step)
    measured = session.get(Evaluation, gate.evaluation_after or -1) if gate else None
    if measured is None:
        return False
    after = experience_texts(decided_library(session, step))
    before = session.get(LibraryVersion, step.version_before_id)
    return after != experience_texts(before.experiences) and after != experience_texts(measured.experiences)


REMEASURE_LINE = ("the reviewed library differs from the one the validation gate measured (part of the step was "
                  "approved, or an operation edited): it is measured against the starting library before it lands")


def _queue_remeasure(engine: Engine, step_id: int, actor: str) -> None:
    """Mark the step for a new gate measurement of its decided library and queue its run for a worker. The
    gate's first verdict, of every proposed operation together, is kept under `proposed` (the line before
    review) before the step's line says what waits; a later measurement keeps that first one too."""
    with session_scope(engine) as session:
        step = session.get(Step, step_id)
        gate = GateVerdict.of(step) or GateVerdict()
        if gate.proposed is None and step.gate:
            gate.proposed = GateVerdict.model_validate(
                {key: value for key, value in step.gate.items() if key not in ("remeasure", "proposed")})
        gate.remeasure, gate.line = True, REMEASURE_LINE
        step.gate = gate.stored()
        session.add(step)
        run = session.get(Run, step.run_id)
        if run.status == JobStatus.AWAITING_REVIEW:
            run.status = JobStatus.QUEUED
            session.add(run)
        session.add(AuditEvent(actor=actor, action="step.remeasure", object_type="step", object_id=step_id,
                               after={"reason": REMEASURE_LINE}))


@dataclass(frozen=True)
class Remeasure:
    """Where the measurement of a step's decided library stands: answers done of those planned, and the run's
    status as a person sees it (core.records.runs.workers.job_health), in words."""

    done: int
    total: int
    status: str

    @property
    def words(self) -> str:
        said = f"measuring the decided library: {self.done} of {self.total} validation answers"
        if self.status == JobStatus.QUEUED:
            return f"{said} (queued: it starts when a worker takes the run)"
        if self.status == JobStatus.STALLED:
            return f"{said} (its worker stopped beating: an idle worker takes the run over, or resume it on Train)"
        if self.status in (JobStatus.PAUSED, JobStatus.FAILED, JobStatus.CANCELLED):
            return f"{said} (the run is {self.status}: resume it on the Train page to finish the measurement)"
        return said


def remeasure_progress(session: Session, step: Step) -> Remeasure | None:
    """The measurement a reviewer's decisions queued for a step (apply_if_decided), while it has not ended;
    None for a step that waits for none. Its worker measures the decided library against the starting one,
    whose evaluation is reused: the figure is the decided library's answers on the validation queries."""
    gate = GateVerdict.of(step)
    if gate is None or not gate.remeasure or step.status != StepStatus.AWAITING_REVIEW:
        return None
    run = session.get(Run, step.run_id)
    settings = run_settings(run)
    total = len(run.validation_ids or []) * settings.gate_k
    texts = experience_texts(decided_library(session, step))
    measuring = next((ev for ev in session.exec(select(Evaluation).where(
        Evaluation.step_id == step.id, Evaluation.purpose == EvaluationPurpose.GATE).order_by(col(Evaluation.id).desc()))
        if experience_texts(ev.experiences) == texts), None)
    progress = (measuring.progress or {}) if measuring is not None else {}
    return Remeasure(done=int(progress.get("rollouts_done") or 0),
                     total=int(progress.get("rollouts_total") or total), status=job_health(run.status, run.heartbeat_at))


def reopen_after_gate(engine: Engine, step_id: int, gate: GateVerdict) -> int:
    """The decided library failed its measurement: its approved and edited operations wait for a person
    again (the gate's line says why; approving against it needs a note). Returns how many were reopened."""
    with session_scope(engine) as session:
        reopened = 0
        for op in queries.step_operations(session, step_id):
            if op.status in TO_APPLY:
                before = _snapshot(op)
                op.status, op.reviewer, op.decided_at = OperationStatus.PENDING, None, None
                session.add(op)
                session.add(AuditEvent(actor="gate", action="operation.reopen", object_type="operation",
                                       object_id=op.id, before=before, after={**_snapshot(op), "reason": gate.line}))
                reopened += 1
        return reopened


def apply_step_operations(engine: Engine, step_id: int, actor: str) -> LibraryVersion | None:
    """Apply a step's approved and edited operations as one new version and complete the step.

    The operations are validated again against the version the step started from (a reviewer's
    edit may have broken one); whatever fails is marked invalid with its reason and not applied.
    """
    with session_scope(engine) as session:
        # A write first, so this transaction holds the step (SQLite write lock, PostgreSQL row lock) and two
        # reviewers finishing at the same moment cannot both apply it.
        claimed = session.exec(update(Step).where(Step.id == step_id, Step.status != StepStatus.COMPLETED)
                               .values(finished_at=utcnow())).rowcount
        step = session.get(Step, step_id)
        if step is None:
            raise NotFound(f"no step {step_id}")
        if not claimed or step.status == StepStatus.COMPLETED:
            return session.get(LibraryVersion, step.version_after_id) if step.version_after_id else None
        ops = queries.step_operations(session, step_id)
        if any(o.status == OperationStatus.PENDING for o in ops):
            raise Conflict(f"step {step_id} still has operations awaiting review")
        before, checked = check_step_operations(
            session, step, [o for o in ops if o.status in (OperationStatus.APPROVED, OperationStatus.EDITED)])
        valid = []
        for op, item in checked:
            if item.valid:
                valid.append(item.op)
            else:
                op.status, op.validation_error = OperationStatus.INVALID, item.error
                session.add(op)
        version = before
        if valid:
            library = session.get(Library, before.library_id)
            version = create_version(session, library, next_library(session, before, valid), parent_id=before.id,
                                     source="run", created_by=actor,
                                     note=f"run {step.run_id}, epoch {step.epoch + 1}, batch {step.batch_index + 1}",
                                     run_id=step.run_id, step_id=step.id)
        for op in ops:  # what is still approved or edited is a KEEP or passed the check (the rest is invalid now)
            if op.status in (OperationStatus.APPROVED, OperationStatus.EDITED):
                op.status, op.applied_version_id = OperationStatus.APPLIED, version.id
                session.add(op)
        _link_gate_evaluation(session, step, version)
        step.version_after_id, step.status, step.finished_at = version.id, StepStatus.COMPLETED, utcnow()
        session.add(step)
        run = session.get(Run, step.run_id)
        run.current_version_id = version.id
        if run.status == JobStatus.AWAITING_REVIEW:
            run.status = JobStatus.QUEUED
        session.add(run)
        return version


def _link_gate_evaluation(session: Session, step: Step, version: LibraryVersion) -> None:
    """The gate's evaluation of the candidate is the landed version's evaluation when their texts agree
    (a reviewer may have approved only some operations), so later steps and pages find it by version."""
    gate = GateVerdict.of(step)
    ev = session.get(Evaluation, gate.evaluation_after) if gate and gate.evaluation_after else None
    if ev is not None and ev.version_id is None and (
            experience_texts(ev.experiences) == experience_texts(version.experiences)):
        ev.version_id = version.id
        session.add(ev)


def check_step_operations(session: Session, step: Step, ops: list[Operation]) -> tuple[LibraryVersion, list]:
    """The step's starting version, and each operation that changes the library (not KEEP) with its check
    against that version: what applying `ops` would do. The gate's candidate is built the same way."""
    before = session.get(LibraryVersion, step.version_before_id)
    settings = run_settings(session.get(Run, step.run_id))
    changing = [o for o in ops if o.op != OpKind.KEEP]
    checked = validate_ops(before.experiences, [proposed_op(step, o) for o in changing],
                           max_size=settings.max_experiences, max_examples=settings.max_examples)
    return before, list(zip(changing, checked, strict=True))


def example_sources(step: Step) -> dict[int, dict]:
    """Where each worked-example operation of a step came from, by the operation's position in the step:
    {"advantage_id", "rollout_id"} (the group, as Operation.source_advantage_ids names it, and the rollout
    the example was compressed from). Written with the operations (record_examples)."""
    sources = ((step.stats or {}).get("examples") or {}).get("sources") or {}
    return {int(position): dict(source) for position, source in sources.items()}


def record_examples(stats: dict | None, positions: list[int], sources: list[tuple[int, int]], dropped: int) -> dict:
    """A step's stats with its worked examples: how many were proposed and dropped, and each example
    operation's group and rollout by position. An Operation row has no column for an entry's kind or its
    rollout and none is added (no migration): the operations at these positions are the step's examples."""
    by_position = {str(position): {"advantage_id": advantage_id, "rollout_id": rollout_id}
                   for position, (advantage_id, rollout_id) in zip(positions, sources, strict=True)}
    return {**(stats or {}), "examples": {"proposed": len(by_position), "dropped": dropped, "sources": by_position}}


def operation_kind(step: Step | None, op: Operation) -> str | None:
    """The entry kind an operation writes: `example` for a step's worked examples, else None (a lesson for an
    ADD, its targets' kind for a MODIFY or MERGE; validate_ops decides)."""
    return EXAMPLE if step is not None and op.position in example_sources(step) else None


def proposed_op(step: Step | None, op: Operation) -> ProposedOp:
    """A stored operation as the library's functions take it, with its kind."""
    return ProposedOp(op.op, list(op.target_ids), op.text, op.rationale or "", operation_kind(step, op))


def written_kind(step: Step | None, op: Operation, experiences: list[dict]) -> str:
    """The kind of the entries an operation writes or removes (`lesson` or `example`), for a card or a table:
    a step's worked example, else the kind of its targets in `experiences` (the library it changes)."""
    kinds = {exp.get("id"): kind_of(exp) for exp in experiences}
    targets = [kinds[i] for i in op.target_ids if i in kinds]
    return operation_kind(step, op) or (targets[0] if targets else LESSON)


def next_library(session: Session, before: LibraryVersion, valid: list[ProposedOp]) -> list[dict]:
    """The experiences after `valid` operations, new ones numbered after every id the library ever used."""
    return apply_ops(before.experiences, valid, first_new_id=next_id_number(all_ids(session, before.library_id)))


def measurement_outcome(session: Session, step: Step) -> str | None:
    """What the measurement of a step's decided library came to, once it ended (the step had one queued by
    apply_if_decided: its verdict keeps the first one under `proposed`): "landed as #5 (validation 0.40 -> 0.45)",
    or "the gate refused it: 0.40 -> 0.38" with its operations back for a person. None while it runs or when the
    step was never measured again."""
    gate = GateVerdict.of(step)
    if gate is None or gate.proposed is None or gate.remeasure:
        return None
    figures = f"{gate.mean_before:.2f} → {gate.mean_after:.2f}" if gate.measured else ""
    if step.status == StepStatus.COMPLETED:
        after = session.get(LibraryVersion, step.version_after_id) if step.version_after_id else None
        if after is None or step.version_after_id == step.version_before_id:
            return "the decided library was measured and nothing landed: the library did not change"
        return f"the decided library was measured and landed as #{after.number}" + (
            f" (validation {figures})" if figures else "")
    if gate.failed:
        return (f"the gate refused the decided library: {figures}; its operations wait for a person again "
                "(approving against the gate needs a note)")
    if gate.undecided:
        return (f"the gate could not decide on the decided library ({gate.reason}); its operations wait for a "
                "person again")
    return None


@dataclass(frozen=True)
class OperationState:
    """One operation as a page drew it: enough to tell what changed since (decided_elsewhere)."""

    id: int
    position: int
    status: str
    reviewer: str | None


@dataclass(frozen=True)
class StepState:
    """A step's status and its operations' decisions at one moment: a page keeps the one it drew and compares it
    with the stored one every few seconds, so a decision made elsewhere (the CLI, a colleague, the gate) shows."""

    status: str
    remeasure: bool
    operations: tuple[OperationState, ...]


def step_state(session: Session, step_id: int) -> StepState | None:
    step = session.get(Step, step_id)
    if step is None:
        return None
    gate = GateVerdict.of(step)
    return StepState(step.status, bool(gate and gate.remeasure),
                     tuple(OperationState(op.id, op.position, op.status, op.reviewer)
                           for op in queries.step_operations(session, step_id)))


def decided_elsewhere(drawn: StepState, now: StepState) -> list[str]:
    """Each operation a person decided or reopened since `drawn`, in words with who decided it ("Operation 2
    approved by cli"). What the engine did is left out: a decided operation applied or found invalid when its
    step landed, and the operations a measurement's refusal reopened (the step's outcome line says both)."""
    if drawn.remeasure and not now.remeasure:
        return []
    before = {op.id: op for op in drawn.operations}
    lines = []
    for op in now.operations:
        old = before.get(op.id)
        if old is not None and (old.status, old.reviewer) == (op.status, op.reviewer):
            continue
        if old is not None and old.status != OperationStatus.PENDING and op.status in (
                OperationStatus.APPLIED, OperationStatus.INVALID):
            continue
        name = f"Operation {op.position + 1}"
        if op.status == OperationStatus.PENDING:
            lines.append(f"{name} reopened")
        else:
            lines.append(f"{name} {op.status}" + (f" by {op.reviewer}" if op.reviewer else ""))
    return lines


def next_waiting_step(session: Session, task_id: int, step: Step, kinds) -> Step | None:
    """The step a reviewer goes on to from `step`: the next one of the same run that waits for review, else the
    first of the task's other runs (newest run first, as the run picker's default); None when none waits."""
    waiting = [s for s in queries.steps_waiting_for_review(session, task_id, kinds=kinds) if s.id != step.id]
    following = [s for s in waiting if s.run_id == step.run_id] or waiting
    return following[0] if following else None
