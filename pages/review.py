"""Review: per step, the proposed operations, each card carrying its evidence, its quality flags and its decision.

A pending operation is a full card: its quality flags (core.records.review.decisions.step_flags: cut off, near duplicate, a
query's numbers, too long), the before → after diff, the rationale, and the groups it came from (query,
semantic advantage, rollouts with rewards) in "Evidence" expanders; a decided or invalid one shrinks to one
collapsed line. One pending card is focused (the first, or one chosen with Next / Previous / Focus) and only
its buttons have keys, because a key binds to one button per page: A approve, X reject (Streamlit reserves
R), E edit, J next, K previous. A reject's optional reason is stored as the decision's comment and told to
the learner in the run's later steps. Every widget of a card is keyed by its operation (the gate note by its
step), so nothing typed or chosen for one carries over to another, and every toast names what was decided
as the page names it ("Operation 2 rejected.", "Every pending operation of run 3 · epoch 1 · batch 2
approved."). Tab out of a reason lands on a harmless note, never on Approve; E (Edit) puts the cursor in the
editor. When a decision leaves its step with nothing to decide, the page stays on the step, says its outcome
(applied as a version; after a measurement "landed as #5" or "the gate refused it: 0.40 → 0.38") and which
step waits next, with a Next waiting step button (N). Every few seconds it reads the step again: a decision
made elsewhere (the CLI, a colleague) redraws the page, saying what was decided and by whom; once the step has
nothing left to decide it follows the run, to its next waiting step or to the line that says the run ended.
All of the step's groups, with trajectories, are in a collapsed section at the bottom.

Every decision goes through `core.records.review.decisions`; once nothing in a step that waits for review is pending, core
applies it (a new library version) and queues the run again, and this page starts a worker for it. When the
decided library is not the one the validation gate measured (part of the step approved, an operation edited),
core queues its measurement instead: the page then says how far it is ("measuring the decided library: N of M",
core.records.review.decisions.remeasure_progress, every two seconds) with no Apply button, redraws itself when it ends, and
shows the gate's line before review and after it. The table's reason column is each decision's reason (a reject's
reason, a note, the gate's).
Buttons act in callbacks, so the page that follows is drawn from the state after the decision.
Model-written text (queries, answers, summaries, advantages, operations, rationales) is shown as code,
long texts clipped with a "Show all" toggle, and tables through ui.display.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

import streamlit as st
from sqlmodel import Session

from core.domain.facts import HELD
from core.domain.library import EXAMPLE, replaced_ids
from core.domain.metrics import attempts_failed
from core.domain.quality import Flag, rank_sources
from core.grpo.attribution import effects_for_library as experience_effects
from core.records.review import decisions as review
from core.records.review.gate_verdict import GateVerdict
from core.records.runs.outcome import space_note
from core.records.runs.settings import run_settings
from core.records.tasks.scenarios import is_conversation
from storage import queries
from storage.statuses import (
    DECIDED,
    LEARNING_KINDS,
    GateDecision,
    JobStatus,
    OperationStatus,
    StepStatus,
)
from storage.tables import Advantage, LibraryVersion, Operation, Rollout, Run, Step
from ui.common import (
    DATETIME,
    Flash,
    Outcome,
    allowed,
    context,
    engine,
    id_select,
    plain,
    require_task,
    reward_text,
    role_note,
    run_action,
    run_page,
    show_text,
    start_worker_if_needed,
    status_label,
)
from ui.display import show_code_runs, show_long, show_turns, tab_stop, table

FLASH = Flash("review_flash")
RUN_KEY, STEP_KEY = "review_run", "review_step"
NOTE_KEY = "review_note"  # + _<step id>: a note is written for one step's failed gate, see note_key
FOCUS_EDITOR_KEY, FOCUS_COUNT_KEY = "review_focus_editor", "review_focus_count"  # the editor to focus, E presses
SEEN_KEY = "review_seen"  # + _<step id>: the step's state as the page last drew it (watch_step)
RUN_SEEN_KEY = "review_run_seen"  # (run id, its status, the next waiting step's id) as the page last drew them
FOLLOW_KEY = "review_follow"  # (run id, step id) the page follows the run to at its next draw (watch_step)
FOLLOWED_KEY = "review_followed"  # (step id, its pending count when first drawn, notice): why the page moved there
REFRESH_S = 3  # seconds between two reads of decisions made elsewhere


def editing_key(op_id: int) -> str:
    return f"review_editing_{op_id}"


def edit_text_key(op_id: int) -> str:
    return f"review_edit_text_{op_id}"


def edit_ids_key(op_id: int) -> str:
    return f"review_edit_ids_{op_id}"


def reason_key(op_id: int) -> str:
    return f"review_reason_{op_id}"


def focus_key(step_id: int) -> str:
    return f"review_focused_{step_id}"


def op_name(op: Operation) -> str:
    """How a card names its operation ("Operation 2": its place in the step), and so every decision's toast
    about it; the database id would name another card."""
    return f"Operation {op.position + 1}"


# --- actions (button callbacks) ---------------------------------------------------------------


def after_decision(run_id: int) -> None:
    """A decision may have applied the step and queued the run again: make sure a worker takes it."""
    with Session(engine()) as session:
        run = queries.run_by_id(session, run_id)
    if run is not None and run.status == JobStatus.QUEUED:
        start_worker_if_needed()


def act(run_id: int, action, *args, success: str, step_id: int | None = None) -> object:
    """Call a core.records.review.decisions function for a button; errors (e.g. AlreadyDecided) show as messages.
    Given the step the decision was made in, a step left with nothing to decide gives way to the next one
    that waits (move_on)."""
    result = run_action(FLASH, "decisions", action, engine(), *args, success=success)
    after_decision(run_id)
    if result is not None and step_id is not None:
        move_on(step_id)
    return result


def step_name(step: Step) -> str:
    return f"run {step.run_id} · epoch {step.epoch + 1} · batch {step.batch_index + 1}"


def move_on(step_id: int) -> None:
    """After a decision: when its step has nothing left to decide, say so and which step waits next. The page
    stays on the step, so its outcome (applied as a version, or measured first) is read where it was decided;
    the Next waiting step button goes on (open_step)."""
    with Session(engine()) as session:
        step = queries.steps_by_ids(session, [step_id]).get(step_id)
        run = queries.run_by_id(session, step.run_id) if step else None
        if step is None or run is None:
            return
        waiting = queries.steps_waiting_for_review(session, run.task_id, kinds=LEARNING_KINDS)
        nxt = review.next_waiting_step(session, run.task_id, step, LEARNING_KINDS)
    if any(s.id == step_id for s in waiting):
        return
    done = f"Run {step_name(step).removeprefix('run ')} has nothing left to decide."
    if nxt is None:
        FLASH.set("decisions", Outcome(True, f"{done} No other step of this task waits for review."))
        return
    FLASH.set("decisions", Outcome(True, f"{done} Next step waiting for review: {step_name(nxt)} (the Next "
                                         "waiting step button opens it)."))


def open_step(run_id: int, step_id: int) -> None:
    """The Next waiting step button's callback: the run and step pickers choose that step."""
    st.session_state[RUN_KEY], st.session_state[STEP_KEY] = run_id, step_id


def note_key(step_id: int) -> str:
    """The gate note's key names its step: a note typed against one step's failed gate never goes with a
    decision on another step (the page moves on to the next waiting step by itself)."""
    return f"{NOTE_KEY}_{step_id}"


def note(step_id: int) -> str | None:
    """The reviewer's note for the next decision (needed to approve against a failed validation gate)."""
    return (st.session_state.get(note_key(step_id)) or "").strip() or None


def decide(op_id: int, decision: str, run_id: int, name: str, step_id: int) -> None:
    """A reject carries the card's reason (told to the learner later); either carries the gate note. `name` is
    the card's own name for the operation, which the toast repeats."""
    reason = (st.session_state.get(reason_key(op_id)) or "").strip() or None
    comment = (reason or note(step_id)) if decision == OperationStatus.REJECTED else note(step_id)
    act(run_id, review.decide_operation, op_id, decision, context().reviewer, comment,
        success=f"{name} {decision}.", step_id=step_id)


def set_focus(step_id: int, op_id: int) -> None:
    st.session_state[focus_key(step_id)] = op_id


def move_focus(step_id: int, pending_ids: list[int], current: int, delta: int) -> None:
    """Next or previous pending operation, wrapping round."""
    at = pending_ids.index(current) if current in pending_ids else 0
    set_focus(step_id, pending_ids[(at + delta) % len(pending_ids)])


def reopen(op_id: int, run_id: int, name: str) -> None:
    act(run_id, review.reopen_operation, op_id, context().reviewer, success=f"{name} reopened.")


def start_edit(op_id: int) -> None:
    """Edit (or E): open the card's editor and put the cursor in it (focus_editor, on the run that follows)."""
    st.session_state[editing_key(op_id)] = True
    st.session_state[FOCUS_EDITOR_KEY] = op_id
    st.session_state[FOCUS_COUNT_KEY] = st.session_state.get(FOCUS_COUNT_KEY, 0) + 1


def focus_editor(op_id: int, nonce: int) -> None:
    """Put the cursor at the end of the card's experience text box, as if a person had clicked in it: after
    E, the text is typed at once, not reached by some thirty Tab presses. Fixed code with the operation's id
    (an int) and a counter, so pressing E again runs it again; it waits for the box to be drawn."""
    st.html(f"""<script>/* focus {nonce} */ (() => {{ let tries = 0; const go = () => {{
        const box = document.querySelector('.st-key-{edit_text_key(int(op_id))} textarea');
        if (box) {{ box.focus(); box.setSelectionRange(box.value.length, box.value.length); }}
        else if (tries++ < 100) setTimeout(go, 100); }}; go(); }})();</script>""", unsafe_allow_javascript=True)


def cancel_edit(op_id: int) -> None:
    for key in (editing_key(op_id), edit_text_key(op_id), edit_ids_key(op_id)):
        st.session_state.pop(key, None)


def save_edit(op_id: int, run_id: int, name: str, step_id: int) -> None:
    text = st.session_state.get(edit_text_key(op_id), "")
    ids = [part.strip() for part in str(st.session_state.get(edit_ids_key(op_id), "")).split(",") if part.strip()]
    if act(run_id, review.edit_operation, op_id, text, ids, context().reviewer, note(step_id),
           success=f"{name} edited.", step_id=step_id) is not None:
        cancel_edit(op_id)


def decide_all(step_id: int, decision: str, run_id: int, name: str) -> None:
    """Every pending operation of the step; the toast names the step as the step picker does."""
    act(run_id, review.decide_step, step_id, decision, context().reviewer, note(step_id),
        success=f"Every pending operation of {name} {decision}.", step_id=step_id)


def apply_decisions(step_id: int, run_id: int, name: str) -> None:
    """Apply a decided step; when its decided library was never measured, core queues that measurement instead
    and the toast says so (nothing is applied yet)."""
    named = f"{name[:1].upper()}{name[1:]}"
    act(run_id, review.apply_if_decided, step_id, context().reviewer, step_id=step_id,
        success=lambda version: f"{named} applied." if version is not None
        else f"{named}: nothing applied yet; the decided library is measured first.")


# --- display ----------------------------------------------------------------------------------


def show_gate(step: Step, can_decide: bool) -> None:
    """The validation gate's figures above the operations: what the candidate did on held-out queries."""
    gate = GateVerdict.of(step)
    if gate is None:
        st.caption("No validation gate ran for this step (gate off, or the step has not reached it).")
        return
    shown = {GateDecision.PASSED: st.success, GateDecision.FAILED: st.error,
             GateDecision.UNDECIDED: st.warning}.get(gate.decision, st.info)
    if gate.remeasure:  # the reviewed library waits for its own measurement by a worker
        shown = st.info
    shown(gate.line, icon=None)  # core's own words and figures (core.grpo.gate.gate_line)
    if gate.proposed:
        st.caption(plain(f"Before review, all proposed operations together: {gate.proposed.line}"))
    if gate.remeasure and step.status == StepStatus.AWAITING_REVIEW:
        remeasure_view(step.id)
    if gate.failed and step.status == StepStatus.AWAITING_REVIEW and can_decide:
        st.text_input("Note for approving against the failed gate (required to approve or edit)",
                      key=note_key(step.id))
        tab_stop("Why a note", "The candidate did worse than the starting library on held-out queries; an approval "
                 "or edit against that is recorded with this note.", key="review_note_stop")
    if gate.evaluation_before:
        st.caption(f"Gate evaluations: {gate.evaluation_before} (starting library) and "
                   f"{gate.evaluation_after} (candidate); their queries side by side are on the Rollouts page.")


@st.fragment(run_every=2)
def remeasure_view(step_id: int) -> None:
    """While a worker measures the step's decided library: how far it is, redrawn every two seconds; when the
    measurement ends, the whole page is drawn again with its result (both gate lines, the step applied or its
    operations back for a person)."""
    with Session(engine()) as session:
        step = queries.steps_by_ids(session, [step_id]).get(step_id)
        state = review.remeasure_progress(session, step) if step is not None else None
    if state is None:
        st.rerun(scope="app")
    words = state.words
    st.info(plain(words[:1].upper() + words[1:]), icon=":material/hourglass_top:")
    st.progress(min(1.0, state.done / state.total) if state.total else 0.0)
    st.caption("Nothing is applied until it is measured: the step lands if the decided library passes the gate, "
               "otherwise its operations wait for a person again. This page follows it by itself.")


def seen_key(step_id: int) -> str:
    return f"{SEEN_KEY}_{step_id}"


def run_seen(session: Session, run: Run, step: Step) -> tuple[int, str, int | None]:
    """What the page shows of the run around a step: its status and the step a reviewer goes on to."""
    nxt = review.next_waiting_step(session, run.task_id, step, LEARNING_KINDS)
    return run.id, run.status, nxt.id if nxt is not None else None


def follow_run(step_id: int, now: review.StepState | None) -> None:
    """After the shown step has nothing left to decide, the run goes on without the page: when its status or the
    step that waits next changed since the page drew it, the page follows the run to its next waiting step (or
    says the run ended) by drawing itself again."""
    drawn = st.session_state.get(RUN_SEEN_KEY)
    if drawn is None or now is None or any(op.status == OperationStatus.PENDING for op in now.operations):
        return
    with Session(engine()) as session:
        run, step = queries.run_by_id(session, drawn[0]), queries.steps_by_ids(session, [step_id]).get(step_id)
        seen = run_seen(session, run, step) if run is not None and step is not None else None
        nxt = queries.steps_by_ids(session, [seen[2]]).get(seen[2]) if seen and seen[2] is not None else None
    if seen is None or seen == tuple(drawn):
        return
    if nxt is not None and nxt.run_id == run.id:
        st.session_state[FOLLOW_KEY] = (nxt.run_id, nxt.id)
        st.session_state[FOLLOWED_KEY] = (nxt.id, None, f"Run {run.id} went on: {step_name(nxt)} waits for "
                                                        "review (shown).")
    elif run.status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED):
        FLASH.set("decisions", Outcome(run.status == JobStatus.COMPLETED, f"Run {run.id} ended: {run.status}."))
    st.rerun(scope="app")


def followed_notice(step_id: int, pending: int) -> None:
    """Why the page moved to this step, shown on every draw until the reviewer decides something here or leaves:
    a notice shown once was lost when a timed rerun cut the draw that showed it (a loaded machine)."""
    followed = st.session_state.get(FOLLOWED_KEY)
    if followed is None:
        return
    shown_step, first_pending, notice = followed
    if shown_step != step_id or first_pending not in (None, pending):
        del st.session_state[FOLLOWED_KEY]
        return
    st.session_state[FOLLOWED_KEY] = (shown_step, pending, notice)
    st.success(notice)


def take_follow_request() -> None:
    """Before the run and step pickers are drawn: the step watch_step followed the run to becomes their choice."""
    request = st.session_state.pop(FOLLOW_KEY, None)
    if request is not None:
        st.session_state[RUN_KEY], st.session_state[STEP_KEY] = request


@st.fragment(run_every=REFRESH_S)
def watch_step(step_id: int) -> None:
    """Every few seconds: whether the step changed since the page drew it (a decision by the CLI or a colleague,
    the gate's); if so the whole page is drawn again, saying which operations were decided elsewhere and by
    whom, so a reviewer never acts on a card someone else has decided. While an editor is open it only says so
    (a redraw would replace what is being typed), until the edit is saved or cancelled. While the step stays as
    drawn and has nothing left to decide, it follows the run (follow_run)."""
    with Session(engine()) as session:
        now = review.step_state(session, step_id)
    drawn = st.session_state.get(seen_key(step_id))
    if now is None or drawn is None or now == drawn:  # the step as drawn: what may have moved is the run
        follow_run(step_id, now)
        return
    lines = review.decided_elsewhere(drawn, now)
    said = plain("Decided elsewhere: " + "; ".join(lines) + ".") if lines else ""
    if any(st.session_state.get(editing_key(op.id)) for op in drawn.operations):
        # a redraw would put back the editor's stored text over what is being typed: say it here instead
        st.info(f"{said} The page shows it when you save or cancel your edit." if said else
                "This step changed elsewhere; the page shows it when you save or cancel your edit.")
        return
    if said:
        FLASH.set("decisions", Outcome(True, said))
    st.rerun(scope="app")


def decision_reason(op: Operation) -> str:
    """Why an operation was decided as it was: the reviewer's reason or note, or the engine's reason (the gate's
    `validation` with its line)."""
    return ": ".join(part for part in (op.reason, op.comment) if part)


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
               rollouts: list[Rollout], conversation: bool = False) -> None:
    with st.container(border=True):
        status = advantage.status if advantage else "not computed yet"
        st.markdown(f"**Group {index}** · sample {sample_id} · advantage {status}")
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
                show_long(outcome(rollout, conversation), f"{key}_final", empty="(no final answer)")
                show_long(rollout.summary, f"{key}_summary", empty="(no summary)")
                if rollout.error:
                    show_long(rollout.error, f"{key}_error")
                show_code_runs(rollout.messages or [], key)  # the code it ran and the output it really got
                with st.expander(f"Trajectory · output {rollout.group_index}"):
                    show_turns(rollout.messages or [], key)


def effect_lines(op: Operation, before: LibraryVersion | None, effects: dict) -> list[str]:
    """The measured effect of each experience an operation modifies, merges or deletes (Measure experiences
    on the Library page), saying when it was measured on another text of that id."""
    texts = {exp.get("id"): exp.get("text") for exp in (before.experiences if before else [])}
    lines = []
    for exp_id in replaced_ids(op.op, op.target_ids):
        effect = effects.get(exp_id)
        if effect is None:
            lines.append(f"{exp_id}: not measured")
            continue
        other = "" if texts.get(exp_id) == effect.text else ", on an earlier text of this id"
        lines.append(f"{exp_id}: {effect.verdict}, effect {effect.delta:+.3f} {effect.interval} on {effect.n} "
                     f"{effect.split} queries x {effect.k} (measured in version #{effect.version_number}{other})")
    return lines


@dataclass
class Group:
    """One query's group of the step: what an operation's evidence expander shows."""

    index: int
    sample_id: int
    query: str | None
    advantage: Advantage | None
    rollouts: list[Rollout] = field(default_factory=list)

    def label(self) -> str:
        rewards = ", ".join(reward_text(r.reward) for r in self.rollouts) or "none"
        return f"Evidence: group {self.index} · sample {self.sample_id} · rewards {rewards}"


@dataclass
class StepView:
    """What every operation card of one step needs, read once per page run."""

    step: Step
    before: LibraryVersion | None
    run_id: int
    can_decide: bool
    effects: dict
    flags: dict[int, list[Flag]]
    groups: dict[int, Group]  # by Advantage id, as Operation.source_advantage_ids name them
    holds_flagged: bool  # auto review mode that leaves flagged operations to a person
    conversation: bool = False  # a conversation task: each output is a transcript


def outcome(rollout: Rollout, conversation: bool) -> str | None:
    """What an output came to: the final answer, or for a conversation the whole transcript (the semantic
    advantage names its turns, so the reviewer reads them beside it)."""
    return rollout.response if conversation else rollout.final_answer


def show_flags(flags: list[Flag]) -> None:
    if flags:
        st.warning("Flagged:\n" + "\n".join(f"- {plain(flag.message)}" for flag in flags))


def show_evidence(op: Operation, view: StepView, key: str) -> None:
    """The groups the operation came from, each a collapsed expander labelled with its rewards."""
    if not op.source_advantage_ids:
        st.caption("Evidence: no source group recorded.")
    missing = [adv_id for adv_id in op.source_advantage_ids if adv_id not in view.groups]
    if missing:
        st.caption(f"Evidence: groups of advantages {', '.join(map(str, missing))} not found in this step.")
    lessons = {adv_id: [*(view.groups[adv_id].advantage.proposals or []), view.groups[adv_id].advantage.text or ""]
               if view.groups[adv_id].advantage else [] for adv_id in op.source_advantage_ids if adv_id in view.groups}
    ranked = rank_sources(op.text, lessons)
    if len(ranked) > 1:
        st.caption("Groups ordered by how closely their lessons read like this operation (the learner does not "
                   "say which group each operation came from).")
    for place, (adv_id, score) in enumerate(ranked):
        group = view.groups[adv_id]
        closest = f" · closest ({score:.2f})" if place == 0 and len(ranked) > 1 and score > 0 else ""
        with st.expander(group.label() + closest):
            ev_key = f"{key}_ev_{adv_id}"
            st.caption("Query")
            show_long(group.query, f"{ev_key}_query")
            st.caption("Semantic advantage")
            show_long(group.advantage.text if group.advantage else None, f"{ev_key}_advantage",
                      empty="(no advantage)")
            for rollout in group.rollouts:
                st.caption(f"Output {rollout.group_index} · reward {reward_text(rollout.reward)} · "
                           f"source {rollout.reward_source or '–'}")
                show_long(outcome(rollout, view.conversation), f"{ev_key}_{rollout.id}_final",
                          empty="(no final answer)")
                show_long(rollout.summary, f"{ev_key}_{rollout.id}_summary", empty="(no summary)")


def show_example_source(op: Operation, view: StepView, key: str) -> None:
    """A worked example beside the rollout it was compressed from (core.records.review.decisions.example_sources): the
    reviewer checks that the example's steps are the ones that reached the right answer."""
    source = review.example_sources(view.step).get(op.position)
    if source is None:
        return
    group = view.groups.get(source["advantage_id"])
    rollout = next((r for r in group.rollouts if r.id == source["rollout_id"]), None) if group else None
    left, right = st.columns(2)
    with left:
        st.caption("Worked example")
        show_long(op.text, f"{key}_example", empty="(no text)")
    with right:
        if source["rollout_id"] is None:
            went = attempts_failed(group.rollouts if group else [], of=" of its group")
            st.caption(f"Made from the sample's reference answer: {went}.")
            return
        if rollout is None:
            st.caption(f"Compressed from rollout {source['rollout_id']}, not found in this step.")
            return
        st.caption(f"Compressed from output {rollout.group_index} · reward {reward_text(rollout.reward)}")
        show_long(outcome(rollout, view.conversation), f"{key}_example_final", empty="(no final answer)")
        show_code_runs(rollout.messages or [], f"{key}_example_source_runs")
        with st.expander(f"Trajectory · output {rollout.group_index}"):
            show_turns(rollout.messages or [], f"{key}_example_source")


def operation_body(op: Operation, view: StepView) -> None:
    """Everything about one operation but its buttons: flags, targets, diff, rationale, effect, evidence."""
    key = f"review_op_{op.id}"
    show_flags(view.flags.get(op.id, []))
    if op.status == OperationStatus.PENDING and view.holds_flagged and view.flags.get(op.id):
        st.caption("Held for a person: auto review mode approved only the unflagged operations of this step.")
    example = review.written_kind(view.step, op, view.before.experiences if view.before else []) == EXAMPLE
    show_long(f"{op.op} {', '.join(op.target_ids)}".strip() + (" · worked example" if example else ""),
              f"{key}_targets")
    if op.status == OperationStatus.INVALID and (op.validation_error or "").startswith(HELD):
        st.warning("Held for a person: auto review did not apply this rewrite, which changes what a verified entry "
                   "states. Reason:")
        show_long(op.validation_error, f"{key}_invalid")
    elif op.status == OperationStatus.INVALID:
        st.warning("Invalid: this operation will not be applied. Reason:")
        show_long(op.validation_error, f"{key}_invalid")
    before = view.before
    st.caption("Before → after")
    show_long(operation_diff(op, before.experiences if before else [], before.number if before else None),
              f"{key}_diff", language="diff")
    st.caption("Rationale")
    show_long(op.rationale, f"{key}_rationale", empty="(no rationale)")
    show_example_source(op, view, key)
    measured = effect_lines(op, before, view.effects)
    if measured:
        st.caption("Measured effect of the experiences it changes")
        show_text("\n".join(measured))
    show_evidence(op, view, key)
    if op.reviewer or op.decided_at:
        st.caption("Decision")
        when = f"{op.decided_at:%Y-%m-%d %H:%M:%S}" if op.decided_at else "–"
        show_long(f"{op.status} by {op.reviewer or '–'} at {when}", f"{key}_decision")
        if op.comment:
            show_long(op.comment, f"{key}_comment")


def decision_buttons(op: Operation, view: StepView, focused: bool, pending_ids: list[int]) -> None:
    """Approve / Reject / Edit, with keys on the focused card only (a key binds one button per page)."""
    run_id, step_id = view.run_id, view.step.id

    def keyed(shortcut: str) -> dict:
        return {"shortcut": shortcut} if focused else {}

    st.text_input("Reason (optional, told to the learner)", key=reason_key(op.id), max_chars=500)
    tab_stop("What the reason does", "It goes with Reject: the learner is told it in the run's later steps, so it "
             "does not propose this again. Keys act outside text boxes: A approve, X reject, E edit, J next, "
             "K previous.", key=f"review_reason_stop_{op.id}")
    approve, reject, edit, move = st.columns(4)
    approve.button("Approve", key=f"review_approve_{op.id}", type="primary", on_click=decide,
                   args=(op.id, OperationStatus.APPROVED, run_id, op_name(op), step_id), width="stretch",
                   **keyed("A"))
    reject.button("Reject", key=f"review_reject_{op.id}", on_click=decide,
                  args=(op.id, OperationStatus.REJECTED, run_id, op_name(op), step_id), width="stretch",
                  **keyed("X"))
    edit.button("Edit", key=f"review_edit_{op.id}", on_click=start_edit, args=(op.id,), width="stretch",
                **keyed("E"))
    if not focused:
        move.button("Focus", key=f"review_focus_{op.id}", on_click=set_focus, args=(step_id, op.id), width="stretch")
    elif len(pending_ids) > 1:
        previous, following = move.columns(2)
        previous.button("Previous", key="review_previous", shortcut="K", on_click=move_focus,
                        args=(step_id, pending_ids, op.id, -1), width="stretch")
        following.button("Next", key="review_next", shortcut="J", on_click=move_focus,
                         args=(step_id, pending_ids, op.id, 1), width="stretch")
    if st.session_state.get(editing_key(op.id)):
        if edit_text_key(op.id) not in st.session_state:
            st.session_state[edit_text_key(op.id)] = op.text or ""
            st.session_state[edit_ids_key(op.id)] = ", ".join(op.target_ids)
        st.text_area("Experience text", key=edit_text_key(op.id))
        if st.session_state.get(FOCUS_EDITOR_KEY) == op.id:  # once, on the run after Edit or E
            del st.session_state[FOCUS_EDITOR_KEY]
            focus_editor(op.id, st.session_state.get(FOCUS_COUNT_KEY, 0))
        st.text_input("Target ids (comma-separated)", key=edit_ids_key(op.id))
        tab_stop("How an edit is checked", "Save edit checks the text and target ids as the learner's operations "
                 "are checked; a valid edit counts as this operation's decision.", key=f"review_edit_stop_{op.id}")
        save, cancel = st.columns(2)
        save.button("Save edit", key=f"review_save_edit_{op.id}", type="primary", on_click=save_edit,
                    args=(op.id, run_id, op_name(op), step_id))
        cancel.button("Cancel edit", key=f"review_cancel_edit_{op.id}", on_click=cancel_edit, args=(op.id,))


def show_pending(op: Operation, view: StepView, focused: bool, pending_ids: list[int]) -> None:
    """A pending operation at full size; the focused one says so and which keys it answers to."""
    with st.container(border=True):
        if focused:
            st.caption(f"▶ focused: {op_name(op).lower()} · keys: A approve · X reject · E edit · J next · "
                       "K previous (outside text boxes)")
        st.markdown(f"**{'▶ ' if focused else ''}{op_name(op)}** · {op.status}")
        operation_body(op, view)
        if view.can_decide:
            decision_buttons(op, view, focused, pending_ids)


def decided_label(op: Operation, flags: list[Flag]) -> str:
    """One line for a collapsed card: our words, ids and the reviewer's name (escaped), no model text."""
    ids = f" {', '.join(op.target_ids)}" if op.target_ids and op.status != OperationStatus.INVALID else ""
    by = f" by {op.reviewer}" if op.reviewer else ""
    flagged = f" · {len(flags)} flag{'s' if len(flags) != 1 else ''}" if flags else ""
    return plain(f"{op_name(op)} · {op.op}{ids} · {op.status}{by}{flagged}")


def show_decided(op: Operation, view: StepView) -> None:
    """A decided (or invalid) operation as one collapsed line; opened, the whole card and Reopen."""
    with st.expander(decided_label(op, view.flags.get(op.id, [])), expanded=False):
        operation_body(op, view)
        if view.can_decide and op.status in DECIDED and view.step.status != StepStatus.COMPLETED:
            st.button("Reopen", key=f"review_reopen_{op.id}", on_click=reopen, args=(op.id, view.run_id, op_name(op)))


def choose_focus(op_ids: list[int], pending_ids: list[int], wanted: int | None) -> int | None:
    """The focused operation: the one chosen while it is pending, else the next pending one after it
    (the one just decided), else the first pending one."""
    if not pending_ids:
        return None
    if wanted in pending_ids:
        return wanted
    if wanted in op_ids:
        after = [i for i in op_ids[op_ids.index(wanted) + 1:] if i in pending_ids]
        if after:
            return after[0]
    return pending_ids[0]


def show_operations(operations: list[Operation], view: StepView) -> None:
    pending_ids = [op.id for op in operations if op.status == OperationStatus.PENDING]
    focus = choose_focus([op.id for op in operations], pending_ids, st.session_state.get(focus_key(view.step.id)))
    for op in operations:
        if op.status == OperationStatus.PENDING:
            show_pending(op, view, op.id == focus and view.can_decide, pending_ids)
        else:
            show_decided(op, view)


def choose_run(runs: list[Run], pending_by_run: dict[int, int]) -> int:
    """Default: the first run awaiting review, else the newest."""
    by_id = {run.id: run for run in runs}
    ids = list(by_id)
    waiting = [run.id for run in runs if run.status == JobStatus.AWAITING_REVIEW]
    return id_select("Run", ids, RUN_KEY, "run", default=waiting[0] if waiting else ids[0],
                     format_func=lambda i: f"Run {i} · {status_label(by_id[i].status, by_id[i].heartbeat_at)}"
                                           f" · {pending_by_run.get(i, 0)} pending")


def choose_step(steps: list[Step], pending_by_step: dict[int, int]) -> int:
    """Default: the first step with pending operations, else one awaiting review, else the last."""
    by_id = {step.id: step for step in steps}
    ids = list(by_id)
    waiting = [s.id for s in steps if pending_by_step.get(s.id)] or [
        s.id for s in steps if s.status == StepStatus.AWAITING_REVIEW]
    return id_select("Step", ids, STEP_KEY, "step", default=waiting[0] if waiting else ids[-1],
                     format_func=lambda i: f"epoch {by_id[i].epoch + 1} · batch {by_id[i].batch_index + 1} · "
                                           f"{by_id[i].status} · {pending_by_step.get(i, 0)} pending")


def page() -> None:
    st.title("Review")
    _ctx, task = require_task()
    can_decide = allowed("reviewer")
    take_follow_request()
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
        sample_ids, samples, advantages, rollouts = queries.step_groups(session, step)
        operations = queries.step_operations(session, step_id)
        flags = review.step_flags(session, step, operations)
        st.session_state[seen_key(step_id)] = review.step_state(session, step_id)  # what this run draws
        measured = review.measurement_outcome(session, step)
        nxt = review.next_waiting_step(session, task.id, step, LEARNING_KINDS)
        st.session_state[RUN_SEEN_KEY] = run_seen(session, run, step)

    st.markdown(f"Run status: **{status_label(run.status, run.heartbeat_at)}** · step status: **{step.status}**"
                + (f" · starts from version #{before.number}" if before else ""))
    if run.error:
        st.caption("Run error")
        show_long(run.error, f"review_run_error_{run.id}")
    if step.error:
        st.caption("Step error")
        show_long(step.error, f"review_step_error_{step.id}")
    watch_step(step_id)
    if measured:
        (st.success if step.status == StepStatus.COMPLETED else st.error)(
            f"{step_name(step)[:1].upper()}{step_name(step)[1:]}: {measured}.", icon=None)
    if step.status == StepStatus.COMPLETED and after is not None:
        unchanged = " (the library did not change)" if step.version_after_id == step.version_before_id else ""
        st.success(f"Applied as version #{after.number}{unchanged}")

    pending = [op for op in operations if op.status == OperationStatus.PENDING]
    if not pending and nxt is not None:
        st.button(f"Next waiting step: {step_name(nxt)}", key="review_next_step", icon=":material/skip_next:",
                  on_click=open_step, args=(nxt.run_id, nxt.id), shortcut="N",
                  help="This step has nothing left to decide; the next one of this task that waits for review (N).")
    conversation = is_conversation(task)
    st.header("Proposed operations", anchor=False)
    show_gate(step, can_decide)
    if space := space_note([step]):
        st.warning(space)
    followed_notice(step_id, len(pending))
    FLASH.show("decisions")
    if not operations:
        st.info("This step proposed no operations.")
    else:
        table([{"#": op.position + 1, "op": op.op, "targets": ", ".join(op.target_ids),
                "status": op.status, "flags": ", ".join(f.code for f in flags.get(op.id, [])),
                "reviewer": op.reviewer or "", "reason": decision_reason(op), "decided at": op.decided_at,
                "validation error": op.validation_error or ""} for op in operations],
              column_config={"decided at": DATETIME}, key="review_operations_table")
        if can_decide:
            bulk_approve, bulk_reject = st.columns(2)
            bulk_approve.button("Approve all pending", key="review_approve_all", disabled=not pending,
                                on_click=decide_all, args=(step_id, OperationStatus.APPROVED, run_id, step_name(step)))
            bulk_reject.button("Reject all pending", key="review_reject_all", disabled=not pending,
                               on_click=decide_all, args=(step_id, OperationStatus.REJECTED, run_id, step_name(step)))
        else:
            role_note("reviewer", "deciding operations")
        settings = run_settings(run)
        groups = {advantage.id: Group(index, sample_id, samples[sample_id].query if sample_id in samples else None,
                                      advantage, rollouts.get(sample_id, []))
                  for index, sample_id in enumerate(sample_ids, start=1)
                  if (advantage := advantages.get(sample_id)) is not None}
        show_operations(operations, StepView(
            step, before, run_id, can_decide, experience_effects(engine(), run.library_id), flags, groups,
            holds_flagged=settings.refuses_flagged(), conversation=conversation))
    if can_decide and review.waits_for_apply(step, operations):
        st.warning("Every operation of this step is decided, but the step was not applied yet.")
        st.button("Apply decisions", key="review_apply", type="primary", on_click=apply_decisions,
                  args=(step_id, run_id, step_name(step)))

    with st.expander(f"All groups of this step and their semantic advantages ({len(sample_ids)})"):
        if not sample_ids:
            st.info("This step has no groups yet.")
        for index, sample_id in enumerate(sample_ids, start=1):
            sample = samples.get(sample_id)
            show_group(index, sample_id, sample.query if sample else None, advantages.get(sample_id),
                       rollouts.get(sample_id, []), conversation)


run_page(page)
