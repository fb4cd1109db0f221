"""The review commands: what waits in a run's steps for a reviewer, and the decisions on it, through the same
core.records.review.decisions functions the Review page calls (decide_operation, edit_operation, reopen_operation,
decide_step, apply_if_decided), acting as `cli`.

`review RUN [--step N]` lists each operation with its id (what the deciding commands take), its kind, text,
targets, quality flags, evidence and status, under its step's validation gate line; `--json` for scripts.
A step is named by its place in the run, as `run N` names it: step 1 is epoch 1 · batch 1.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.cli.base import UsageError, engine_of, name_list
from core.cli.report import plural, step_title, steps_total, worker_or_here
from core.domain.metrics import attempts_failed
from core.domain.quality import rank_sources
from core.errors import InvalidInput, NotFound
from core.records.review.decisions import (
    apply_if_decided,
    decide_operation,
    decide_step,
    edit_operation,
    example_sources,
    reopen_operation,
    step_flags,
    written_kind,
)
from core.records.review.gate_verdict import GateVerdict
from storage import queries
from storage.statuses import JobStatus, OperationStatus, StepStatus
from storage.tables import LibraryVersion, Operation, Run, Step

ACTOR = "cli"


# ---- reading a run's steps ---------------------------------------------------------------------------------


def _run_and_steps(session: Session, run_id: int) -> tuple[Run, list[Step]]:
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound(f"no run {run_id}")
    return run, queries.steps(session, run_id)


def _at(steps: list[Step], run: Run, position: int) -> Step:
    if not 1 <= position <= len(steps):
        raise NotFound(f"run {run.id} has no step {position}: it has {plural(len(steps), 'step')} so far "
                       "(step 1 is epoch 1 · batch 1)")
    return steps[position - 1]


def _waiting(session: Session, steps: list[Step], run_id: int) -> list[Step]:
    """The steps a reviewer has something to do in: awaiting review, or with an operation pending."""
    pending = queries.pending_operations_by_step(session, run_id)
    return [s for s in steps if s.status == StepStatus.AWAITING_REVIEW or pending.get(s.id)]


def _step_to_decide(engine: Engine, run_id: int, position: int | None) -> tuple[Step, int]:
    """The step `--step` names, else the run's only step that waits for review; with its position."""
    with Session(engine) as session:
        run, steps = _run_and_steps(session, run_id)
        if position is not None:
            return _at(steps, run, position), position
        waiting = _waiting(session, steps, run_id)
    if len(waiting) != 1:
        which = ", ".join(str(steps.index(s) + 1) for s in waiting)
        raise InvalidInput(f"run {run_id} has no step waiting for review; name one with --step N" if not waiting
                           else f"run {run_id} has {len(waiting)} steps waiting for review ({which}): name one "
                           "with --step N")
    return waiting[0], steps.index(waiting[0]) + 1


def _reward(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


def _evidence(op: Operation, groups: dict[int, dict]) -> list[dict]:
    """The groups an operation came from, closest first, as the Review page's evidence expanders order them
    (core.domain.quality.rank_sources: the learner does not say which group each operation came from)."""
    lessons = {adv_id: [*groups[adv_id]["proposals"], groups[adv_id]["advantage"] or ""]
               for adv_id in op.source_advantage_ids if adv_id in groups}
    ranked = rank_sources(op.text, lessons)
    found = [{**groups[adv_id], "closeness": round(score, 3)} for adv_id, score in ranked]
    missing = [{"advantage_id": adv_id, "missing": True} for adv_id in op.source_advantage_ids if adv_id not in groups]
    return found + missing


def _example_source(step: Step, op: Operation, groups: dict[int, dict]) -> dict | None:
    """Where a worked example came from: the sample's reference (with how its group went) or one output."""
    source = example_sources(step).get(op.position)
    if source is None:
        return None
    group = groups.get(source["advantage_id"]) or {}
    if source["rollout_id"] is None:
        return {"from": "reference", "group": group.get("group"), "sample_id": group.get("sample_id"),
                "attempts": group.get("attempts")}
    rollout = next((r for r in group.get("rollouts", []) if r["rollout_id"] == source["rollout_id"]), None)
    return {"from": "rollout", "group": group.get("group"), "rollout_id": source["rollout_id"],
            "output": rollout and rollout["output"], "reward": rollout and rollout["reward"]}


def _groups(session: Session, step: Step) -> dict[int, dict]:
    """The step's groups by Advantage id (as Operation.source_advantage_ids names them), numbered in the
    step's order as the Review page numbers them."""
    sample_ids, samples, advantages, rollouts = queries.step_groups(session, step)
    queries_of = {sample_id: sample.query for sample_id, sample in samples.items()}
    return {adv.id: {"group": index, "sample_id": sample_id, "advantage_id": adv.id, "query": queries_of.get(sample_id),
                     "advantage": adv.text, "proposals": list(adv.proposals or []), "advantage_status": adv.status,
                     "attempts": attempts_failed(rollouts.get(sample_id, []), of=f" of group {index}"),
                     "rollouts": [{"rollout_id": r.id, "output": r.group_index, "reward": r.reward,
                                   "source": r.reward_source, "answer": r.final_answer, "summary": r.summary}
                                  for r in rollouts.get(sample_id, [])]}
            for index, sample_id in enumerate(sample_ids, start=1) if (adv := advantages.get(sample_id)) is not None}


def _when(value: datetime | None) -> str | None:
    return None if value is None else f"{value:%Y-%m-%d %H:%M:%S}"


def step_record(session: Session, run: Run, step: Step, position: int, total: int) -> dict:
    """One step as `review` shows it: its gate line and every operation with its kind, flags and evidence."""
    before = session.get(LibraryVersion, step.version_before_id) if step.version_before_id else None
    after = session.get(LibraryVersion, step.version_after_id) if step.version_after_id else None
    operations = queries.step_operations(session, step.id)
    flags = step_flags(session, step, operations)
    groups = _groups(session, step)
    gate = GateVerdict.of(step)
    return {
        "run_id": run.id, "step": position, "of": total, "step_id": step.id, "epoch": step.epoch + 1,
        "batch": step.batch_index + 1, "title": step_title(step, position, total), "status": step.status,
        "pending": sum(op.status == OperationStatus.PENDING for op in operations),
        "starts_from_version": before.number if before else None,
        "applied_as_version": after.number if after and step.status == StepStatus.COMPLETED else None,
        "error": step.error,
        "gate": None if gate is None else {
            "line": gate.line, "decision": gate.decision, "failed": gate.failed, "remeasure": gate.remeasure,
            "before_review": gate.proposed.line if gate.proposed else None,
            "note_required": gate.failed and step.status == StepStatus.AWAITING_REVIEW},
        "operations": [{
            "id": op.id, "operation": op.position + 1, "op": op.op,
            "kind": written_kind(step, op, before.experiences if before else []), "status": op.status,
            "text": op.text, "target_ids": list(op.target_ids), "rationale": op.rationale,
            "flags": [{"code": flag.code, "message": flag.message} for flag in flags.get(op.id, [])],
            "evidence": _evidence(op, groups), "example_source": _example_source(step, op, groups),
            "reviewer": op.reviewer, "decided_at": _when(op.decided_at), "comment": op.comment, "reason": op.reason,
            "validation_error": op.validation_error} for op in operations],
    }


# ---- printing ----------------------------------------------------------------------------------------------


def _field(label: str, text: object, indent: int = 2) -> None:
    """`label  text`, a multi-line text's later lines indented under its first."""
    lines = str(text).splitlines() or [""]
    pad = " " * indent
    print(f"{pad}{label:<10} {lines[0]}")
    for line in lines[1:]:
        print(f"{pad}{'':<10} {line}")


def _one_line(text: str | None, width: int = 160) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= width else flat[:width - 1] + "…"


def _print_evidence(group: dict) -> None:
    if group.get("missing"):
        _field("evidence", f"the group of advantage {group['advantage_id']} is not in this step")
        return
    rewards = ", ".join(_reward(r["reward"]) for r in group["rollouts"]) or "none"
    _field("evidence", f"group {group['group']} · sample #{group['sample_id']} · rewards {rewards}"
                       f" · closeness {group['closeness']:.2f}")
    _field("", f"query: {group['query'] or '(none)'}", indent=4)
    _field("", f"semantic advantage: {group['advantage'] or '(no advantage)'}", indent=4)
    for r in group["rollouts"]:
        _field("", f"output {r['output']} · reward {_reward(r['reward'])}: {_one_line(r['answer']) or '(no answer)'}",
               indent=4)


def print_step(record: dict) -> None:
    print(f"{record['title']} · {record['status']} · {plural(record['pending'], 'operation')} pending"
          + (f" · starts from version #{record['starts_from_version']}" if record["starts_from_version"] else "")
          + (f" · applied as version #{record['applied_as_version']}" if record["applied_as_version"] else ""))
    gate = record["gate"]
    if gate is None:
        print("gate: none ran for this step (gate off, or the step has not reached it)")
    else:
        print(f"gate: {gate['line']}")
        if gate["before_review"]:
            print(f"  before review, all proposed operations together: {gate['before_review']}")
        if gate["note_required"]:
            print("  the gate failed: approving or editing needs --note saying why")
    if record["error"]:
        _field("error", record["error"], indent=0)
    if not record["operations"]:
        print("  this step proposed no operations")
    for op in record["operations"]:
        print(f"\nop {op['id']} · operation {op['operation']} · {op['op']} {op['kind']} · {op['status']}")
        if op["target_ids"]:
            _field("targets", ", ".join(op["target_ids"]))
        _field("text", op["text"] or "(no text)")
        for flag in op["flags"]:
            _field("flag", f"{flag['code']}: {flag['message']}")
        _field("rationale", op["rationale"] or "(no rationale)")
        source = op["example_source"]
        if source is not None and source["from"] == "reference":
            _field("example", f"made from sample #{source['sample_id']}'s reference answer: {source['attempts']}")
        elif source is not None:
            _field("example", f"compressed from group {source['group']} output {source['output']} · reward "
                              f"{_reward(source['reward'])}")
        for group in op["evidence"]:
            _print_evidence(group)
        if not op["evidence"]:
            _field("evidence", "no source group recorded")
        if op["reviewer"] or op["decided_at"]:
            _field("decision", f"{op['status']} by {op['reviewer'] or '–'} at {op['decided_at'] or '–'}"
                   + (f": {op['comment']}" if op["comment"] else "") + (f" ({op['reason']})" if op["reason"] else ""))
        if op["validation_error"]:
            _field("invalid", op["validation_error"])


def cmd_show(args: argparse.Namespace) -> int:
    """What waits for review in a run (or one step of it, whatever its status)."""
    with Session(engine_of(args)) as session:
        run, steps = _run_and_steps(session, args.run_id)
        total = steps_total(run, steps)
        chosen = [_at(steps, run, args.step)] if args.step is not None else _waiting(session, steps, run.id)
        records = [step_record(session, run, step, steps.index(step) + 1, total) for step in chosen]
    if args.json:
        print(json.dumps({"run_id": run.id, "status": run.status, "steps": records}, default=str))
        return 0
    print(f"run {run.id}: {run.status}")
    if not records:
        print(f"no step of run {run.id} waits for review; show one with --step N (1 to {len(steps)})" if steps
              else f"run {run.id} has no steps yet")
        return 0
    for record in records:
        print()
        print_step(record)
        if record["pending"]:
            step = f"{run.id} --step {record['step']}"
            print(f"\ndecide: python -m core review approve OP [OP ...] [--note TEXT] | reject OP [OP ...] "
                  f"[--reason TEXT] | edit OP --text TEXT [--targets E1,E2]\n        python -m core review "
                  f"approve-all {step} | reject-all {step}")
    return 0


# ---- deciding ----------------------------------------------------------------------------------------------


def outcome(engine: Engine, step_id: int) -> str:
    """What became of a step after a decision: applied as a version, queued to measure the decided library
    first, every operation decided but not applied, or still waiting."""
    with Session(engine) as session:
        step = session.get(Step, step_id)
        run, steps = _run_and_steps(session, step.run_id)
        title = step_title(step, steps.index(step) + 1, steps_total(run, steps))
        pending = sum(op.status == OperationStatus.PENDING for op in queries.step_operations(session, step_id))
        after = session.get(LibraryVersion, step.version_after_id) if step.version_after_id else None
    goes_on = (f"; run {run.id} is queued to go on: {worker_or_here(run)}" if run.status == JobStatus.QUEUED
               else f"; run {run.id} is {run.status}")
    if step.status == StepStatus.COMPLETED:
        if after is None or step.version_after_id == step.version_before_id:
            return f"{title} applied: the library did not change" + goes_on
        return f"{title} applied as version #{after.number}" + goes_on
    if pending:
        return f"{title} still waits: {plural(pending, 'operation')} pending (python -m core review {run.id})"
    gate = GateVerdict.of(step)
    if gate is not None and gate.remeasure and run.status == JobStatus.QUEUED:
        return (f"{title} decided, not applied yet: {gate.line}; run {run.id} is queued to measure it: "
                f"{worker_or_here(run)}")
    return (f"{title}: every operation is decided but the step was not applied; apply it: python -m core review "
            f"apply {run.id} --step {steps.index(step) + 1}")


def _say_outcomes(engine: Engine, step_ids: list[int | None]) -> None:
    for step_id in dict.fromkeys(step_ids):
        if step_id is not None:
            print(outcome(engine, step_id))


def _text(value: str | None) -> str | None:
    return (value or "").strip() or None


def _comment(args: argparse.Namespace) -> str | None:
    """The decision's comment: --note (approve, edit), or --reason (reject), stored as the page stores it."""
    return _text(getattr(args, "note", None) or getattr(args, "reason", None))


def cmd_decide(args: argparse.Namespace) -> int:
    """Each operation in turn, as the Review page's Approve or Reject decides one (the first error stops). A
    reject's reason is stored as the decision's comment and told to the learner in later steps."""
    engine = engine_of(args)
    steps = []
    for op_id in dict.fromkeys(args.ops):
        op = decide_operation(engine, op_id, args.decision, ACTOR, _comment(args))
        print(f"op {op.id} (operation {op.position + 1}) {args.decision}")
        steps.append(op.step_id)
    _say_outcomes(engine, steps)
    return 0


def cmd_edit(args: argparse.Namespace) -> int:
    """The operation with a reviewer's text and targets (each defaults to what the learner proposed)."""
    if args.text is None and args.targets is None:
        raise UsageError("review edit: give --text, --targets or both")
    engine = engine_of(args)
    with Session(engine) as session:
        op = session.get(Operation, args.op)
        if op is None:
            raise NotFound(f"no operation {args.op}")
        text = op.text if args.text is None else args.text
        targets = list(op.target_ids) if args.targets is None else name_list(args.targets)
    op = edit_operation(engine, args.op, text, targets, ACTOR, _text(args.note))
    print(f"op {op.id} (operation {op.position + 1}) edited: {op.op} {', '.join(op.target_ids)}".rstrip())
    _say_outcomes(engine, [op.step_id])
    return 0


def cmd_reopen(args: argparse.Namespace) -> int:
    engine = engine_of(args)
    op = reopen_operation(engine, args.op, ACTOR)
    print(f"op {op.id} (operation {op.position + 1}) reopened: pending")
    return 0


def cmd_decide_step(args: argparse.Namespace) -> int:
    """Every pending operation of one step, as the Review page's "Approve all pending" / "Reject all pending"."""
    engine = engine_of(args)
    step, position = _step_to_decide(engine, args.run_id, args.step)
    decided = decide_step(engine, step.id, args.decision, ACTOR, _comment(args))
    print(f"{plural(decided, 'operation')} of run {args.run_id} step {position} {args.decision}")
    _say_outcomes(engine, [step.id])
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    """A step whose operations are all decided but which was not applied (two reviewers finished at once):
    the Review page's "Apply decisions"."""
    engine = engine_of(args)
    step, _position = _step_to_decide(engine, args.run_id, args.step)
    apply_if_decided(engine, step.id, ACTOR)
    _say_outcomes(engine, [step.id])
    return 0
