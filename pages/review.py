"""Review: per step, the semantic advantages with the rollouts they came from, and the proposed operations.

A reviewer approves, rejects, edits or reopens each operation (or all pending ones at once). Every
decision goes through `core.review`; once nothing in a step that waits for review is pending, core
applies it (a new library version) and queues the run again, and this page starts a worker for it.
Buttons act in callbacks, so the page that follows is drawn from the state after the decision.
Model-written text (queries, answers, summaries, advantages, operations, rationales) is shown as code,
long texts clipped with a "Show all" toggle, and tables through pages._display.
"""

from __future__ import annotations

import difflib

import streamlit as st
from sqlmodel import Session

from core import review
from core.attribution import effects_for_library as experience_effects
from pages._common import (
    DATETIME,
    Flash,
    allowed,
    context,
    engine,
    keep_valid_choice,
    require_task,
    reward_text,
    role_note,
    run_action,
    run_page,
    show_text,
    start_worker_if_needed,
    status_label,
)
from pages._display import show_long, show_turns, table
from storage import queries
from storage.models import Advantage, LibraryVersion, Operation, Rollout, Run, Step
from storage.statuses import (
    DECIDED,
    LEARNING_KINDS,
    GateDecision,
    JobStatus,
    OperationStatus,
    OpKind,
    StepStatus,
)

FLASH = Flash("review_flash")
RUN_KEY, STEP_KEY = "review_run", "review_step"
NOTE_KEY = "review_note"


def editing_key(op_id: int) -> str:
    return f"review_editing_{op_id}"


def edit_text_key(op_id: int) -> str:
    return f"review_edit_text_{op_id}"


def edit_ids_key(op_id: int) -> str:
    return f"review_edit_ids_{op_id}"


# --- actions (button callbacks) ---------------------------------------------------------------


def after_decision(run_id: int) -> None:
    """A decision may have applied the step and queued the run again: make sure a worker takes it."""
    with Session(engine()) as session:
        run = queries.run_by_id(session, run_id)
    if run is not None and run.status == JobStatus.QUEUED:
        start_worker_if_needed()


def act(run_id: int, action, *args, success: str) -> object:
    """Call a core.review function for a button; errors (e.g. AlreadyDecided) show as messages."""
    result = run_action(FLASH, "decisions", action, engine(), *args, success=success)
    after_decision(run_id)
    return result


def note() -> str | None:
    """The reviewer's note for the next decision (needed to approve against a failed validation gate)."""
    return (st.session_state.get(NOTE_KEY) or "").strip() or None


def decide(op_id: int, decision: str, run_id: int) -> None:
    act(run_id, review.decide_operation, op_id, decision, context().reviewer, note(),
        success=f"Operation {op_id} {decision}.")


def reopen(op_id: int, run_id: int) -> None:
    act(run_id, review.reopen_operation, op_id, context().reviewer, success=f"Operation {op_id} reopened.")


def start_edit(op_id: int) -> None:
    st.session_state[editing_key(op_id)] = True


def cancel_edit(op_id: int) -> None:
    for key in (editing_key(op_id), edit_text_key(op_id), edit_ids_key(op_id)):
        st.session_state.pop(key, None)


def save_edit(op_id: int, run_id: int) -> None:
    text = st.session_state.get(edit_text_key(op_id), "")
    ids = [part.strip() for part in str(st.session_state.get(edit_ids_key(op_id), "")).split(",") if part.strip()]
    if act(run_id, review.edit_operation, op_id, text, ids, context().reviewer, note(),
           success=f"Operation {op_id} edited.") is not None:
        cancel_edit(op_id)


def decide_all(step_id: int, decision: str, run_id: int) -> None:
    act(run_id, review.decide_step, step_id, decision, context().reviewer, note(),
        success=f"Every pending operation {decision}.")


def apply_decisions(step_id: int, run_id: int) -> None:
    act(run_id, review.apply_if_decided, step_id, context().reviewer, success="Step applied.")


# --- display ----------------------------------------------------------------------------------


def show_gate(step: Step, can_decide: bool) -> None:
    """The validation gate's figures above the operations: what the candidate did on held-out queries."""
    gate = step.gate
    if not gate:
        st.caption("No validation gate ran for this step (gate off, or the step has not reached it).")
        return
    shown = {GateDecision.PASSED: st.success, GateDecision.FAILED: st.error}.get(gate.get("decision"), st.info)
    shown(gate.get("line", ""), icon=None)  # core's own words and figures (core.gate.gate_line)
    if gate.get("decision") == GateDecision.FAILED and step.status == StepStatus.AWAITING_REVIEW and can_decide:
        st.text_input("Note for approving against the failed gate (required to approve or edit)", key=NOTE_KEY)
    if gate.get("evaluation_before"):
        st.caption(f"Gate evaluations: {gate['evaluation_before']} (starting library) and "
                   f"{gate['evaluation_after']} (candidate); their queries side by side are on the Rollouts page.")


def operation_diff(op: Operation, before: list[dict], before_number: int | None) -> str:
    """Before (the target experiences in the step's starting version) against after (the op's text)."""
    texts = {exp.get("id"): exp.get("text", "") for exp in before}
    missing = f"(not in version #{before_number})" if before_number is not None else "(unknown)"
    old = [f"[{i}] {texts[i]}" if i in texts else f"[{i}] {missing}" for i in op.target_ids]
    kind = (op.op or "").upper()
    if kind == "KEEP":
        new = list(old)
    elif kind == "DELETE":
        new = []
    elif kind == "MODIFY" and len(op.target_ids) == 1:
        new = [f"[{op.target_ids[0]}] {op.text or ''}"]
    else:
        new = [f"[new] {op.text or ''}"]
    lines = list(difflib.unified_diff(old, new, fromfile="before", tofile="after", lineterm=""))
    return "\n".join(lines) if lines else "(no change)"


def show_group(index: int, sample_id: int, query: str | None, advantage: Advantage | None,
               rollouts: list[Rollout]) -> None:
    with st.container(border=True):
        status = advantage.status if advantage else "not computed yet"
        st.markdown(f"**Group {index}** · sample #{sample_id} · advantage {status}")
        st.caption("Query")
        show_long(query, f"review_query_{sample_id}")
        left, right = st.columns(2)
        with left:
            st.caption("Semantic advantage")
            show_long(advantage.text if advantage else None, f"review_advantage_{sample_id}", empty="(no advantage)")
            if advantage and advantage.proposals:
                st.caption("Proposed experiences")
                show_long("\n".join(f"- {p}" for p in advantage.proposals), f"review_proposals_{sample_id}")
            if advantage and advantage.error:
                st.caption("Error")
                show_long(advantage.error, f"review_advantage_error_{sample_id}")
        with right:
            if not rollouts:
                st.caption("No rollouts.")
            for rollout in rollouts:
                key = f"review_rollout_{rollout.id}"
                st.caption(f"Output {rollout.group_index} · reward {reward_text(rollout.reward)} · "
                           f"source {rollout.reward_source or '–'}")
                show_long(rollout.final_answer, f"{key}_final", empty="(no final answer)")
                show_long(rollout.summary, f"{key}_summary", empty="(no summary)")
                if rollout.error:
                    show_long(rollout.error, f"{key}_error")
                with st.expander(f"Trajectory · output {rollout.group_index}"):
                    show_turns(rollout.messages or [], key)


def effect_lines(op: Operation, before: LibraryVersion | None, effects: dict) -> list[str]:
    """The measured effect of each experience an operation modifies, merges or deletes (Measure experiences
    on the Library page), saying when it was measured on another text of that id."""
    texts = {exp.get("id"): exp.get("text") for exp in (before.experiences if before else [])}
    lines = []
    for exp_id in op.target_ids if op.op in (OpKind.MODIFY, OpKind.MERGE, OpKind.DELETE) else []:
        effect = effects.get(exp_id)
        if effect is None:
            lines.append(f"{exp_id}: not measured")
            continue
        other = "" if texts.get(exp_id) == effect.text else ", on an earlier text of this id"
        lines.append(f"{exp_id}: {effect.verdict}, effect {effect.delta:+.3f} {effect.interval} on {effect.n} "
                     f"{effect.split} queries x {effect.k} (measured in version #{effect.version_number}{other})")
    return lines


def show_operation(op: Operation, step: Step, before: LibraryVersion | None, run_id: int, can_decide: bool,
                   effects: dict) -> None:
    with st.container(border=True):
        st.markdown(f"**Operation {op.position + 1}** · {op.status}")
        key = f"review_op_{op.id}"
        show_long(f"{op.op} {', '.join(op.target_ids)}".strip(), f"{key}_targets")
        if op.status == OperationStatus.INVALID:
            st.warning("Invalid: this operation will not be applied. Reason:")
            show_long(op.validation_error, f"{key}_invalid")
        st.caption("Rationale")
        show_long(op.rationale, f"{key}_rationale", empty="(no rationale)")
        st.caption("Before → after")
        show_long(operation_diff(op, before.experiences if before else [], before.number if before else None),
                  f"{key}_diff", language="diff")
        measured = effect_lines(op, before, effects)
        if measured:
            st.caption("Measured effect of the experiences it changes")
            show_text("\n".join(measured))
        if op.reviewer or op.decided_at:
            st.caption("Decision")
            when = f"{op.decided_at:%Y-%m-%d %H:%M:%S}" if op.decided_at else "–"
            show_long(f"{op.status} by {op.reviewer or '–'} at {when}", f"{key}_decision")
            if op.comment:
                show_long(op.comment, f"{key}_comment")
        if not can_decide:
            return
        if op.status == OperationStatus.PENDING:
            approve, reject, edit = st.columns(3)
            approve.button("Approve", key=f"review_approve_{op.id}", type="primary", on_click=decide,
                           args=(op.id, OperationStatus.APPROVED, run_id))
            reject.button("Reject", key=f"review_reject_{op.id}", on_click=decide, args=(op.id, OperationStatus.REJECTED, run_id))
            edit.button("Edit", key=f"review_edit_{op.id}", on_click=start_edit, args=(op.id,))
            if st.session_state.get(editing_key(op.id)):
                if edit_text_key(op.id) not in st.session_state:
                    st.session_state[edit_text_key(op.id)] = op.text or ""
                    st.session_state[edit_ids_key(op.id)] = ", ".join(op.target_ids)
                st.text_area("Experience text", key=edit_text_key(op.id))
                st.text_input("Target ids (comma-separated)", key=edit_ids_key(op.id))
                save, cancel = st.columns(2)
                save.button("Save edit", key=f"review_save_edit_{op.id}", type="primary", on_click=save_edit,
                            args=(op.id, run_id))
                cancel.button("Cancel edit", key=f"review_cancel_edit_{op.id}", on_click=cancel_edit,
                              args=(op.id,))
        elif op.status in DECIDED and step.status != StepStatus.COMPLETED:
            st.button("Reopen", key=f"review_reopen_{op.id}", on_click=reopen, args=(op.id, run_id))


def choose_run(runs: list[Run], pending_by_run: dict[int, int]) -> int:
    """Default: the first run awaiting review, else the newest."""
    by_id = {run.id: run for run in runs}
    ids = list(by_id)
    waiting = [run.id for run in runs if run.status == JobStatus.AWAITING_REVIEW]
    keep_valid_choice(RUN_KEY, ids)
    return st.selectbox("Run", ids, index=ids.index(waiting[0]) if waiting else 0, key=RUN_KEY,
                        format_func=lambda i: f"Run {i} · {status_label(by_id[i].status, by_id[i].heartbeat_at)}"
                                              f" · {pending_by_run.get(i, 0)} pending")


def choose_step(steps: list[Step], pending_by_step: dict[int, int]) -> int:
    """Default: the first step with pending operations, else one awaiting review, else the last."""
    by_id = {step.id: step for step in steps}
    ids = list(by_id)
    waiting = [s.id for s in steps if pending_by_step.get(s.id)] or [
        s.id for s in steps if s.status == StepStatus.AWAITING_REVIEW]
    keep_valid_choice(STEP_KEY, ids)
    return st.selectbox("Step", ids, index=ids.index(waiting[0]) if waiting else len(ids) - 1, key=STEP_KEY,
                        format_func=lambda i: f"epoch {by_id[i].epoch + 1} · batch {by_id[i].batch_index + 1} · "
                                              f"{by_id[i].status} · {pending_by_step.get(i, 0)} pending")


def page() -> None:
    st.title("Review")
    _ctx, task = require_task()
    can_decide = allowed("reviewer")
    with Session(engine()) as session:
        runs = queries.runs(session, task.id, kinds=LEARNING_KINDS)
        if not runs:
            st.info("This task has no training runs yet. Start one on the Train page.")
            return
        run_id = choose_run(runs, queries.pending_operations_by_run(session))
        run = queries.run_by_id(session, run_id)
        steps = queries.steps(session, run_id)
        if not steps:
            st.markdown(f"Run status: **{status_label(run.status, run.heartbeat_at)}**")
            st.info("This run has no steps yet.")
            return
        pending_by_step = queries.pending_operations_by_step(session, run_id)
        step_id = choose_step(steps, pending_by_step)
        step = next(s for s in steps if s.id == step_id)
        before = queries.version_by_id(session, step.version_before_id) if step.version_before_id else None
        after = queries.version_by_id(session, step.version_after_id) if step.version_after_id else None
        advantages = {a.sample_id: a for a in queries.step_advantages(session, step_id)}
        rollouts: dict[int, list[Rollout]] = {}
        for rollout in queries.step_rollouts(session, step_id):
            rollouts.setdefault(rollout.sample_id, []).append(rollout)
        sample_ids = list(dict.fromkeys([*step.sample_ids, *advantages, *rollouts]))
        samples = {s.id: s for s in queries.samples_by_ids(session, sample_ids)}
        operations = queries.step_operations(session, step_id)

    st.markdown(f"Run status: **{status_label(run.status, run.heartbeat_at)}** · step status: **{step.status}**"
                + (f" · starts from version #{before.number}" if before else ""))
    if run.error:
        st.caption("Run error")
        show_long(run.error, f"review_run_error_{run.id}")
    if step.error:
        st.caption("Step error")
        show_long(step.error, f"review_step_error_{step.id}")
    if step.status == StepStatus.COMPLETED and after is not None:
        unchanged = " (the library did not change)" if step.version_after_id == step.version_before_id else ""
        st.success(f"Applied as version #{after.number}{unchanged}")

    pending = [op for op in operations if op.status == OperationStatus.PENDING]
    st.header("Proposed operations", anchor=False)
    show_gate(step, can_decide)
    FLASH.show("decisions")
    if not operations:
        st.info("This step proposed no operations.")
    else:
        table([{"#": op.position + 1, "op": op.op, "targets": ", ".join(op.target_ids),
                "status": op.status, "reviewer": op.reviewer or "", "reason": op.reason or "",
                "decided at": op.decided_at, "validation error": op.validation_error or ""} for op in operations],
              column_config={"decided at": DATETIME}, key="review_operations_table")
        if can_decide:
            bulk_approve, bulk_reject = st.columns(2)
            bulk_approve.button("Approve all pending", key="review_approve_all", disabled=not pending,
                                on_click=decide_all, args=(step_id, OperationStatus.APPROVED, run_id))
            bulk_reject.button("Reject all pending", key="review_reject_all", disabled=not pending,
                               on_click=decide_all, args=(step_id, OperationStatus.REJECTED, run_id))
        else:
            role_note("reviewer", "deciding operations")
        effects = experience_effects(engine(), run.library_id)
        for op in operations:
            show_operation(op, step, before, run_id, can_decide, effects)
    if step.status == StepStatus.AWAITING_REVIEW and not pending and can_decide:
        st.warning("Every operation of this step is decided, but the step was not applied yet.")
        st.button("Apply decisions", key="review_apply", type="primary", on_click=apply_decisions,
                  args=(step_id, run_id))

    st.header("Groups and their semantic advantages", anchor=False)
    if not sample_ids:
        st.info("This step has no groups yet.")
    for index, sample_id in enumerate(sample_ids, start=1):
        sample = samples.get(sample_id)
        show_group(index, sample_id, sample.query if sample else None, advantages.get(sample_id),
                   rollouts.get(sample_id, []))


run_page(page)
