"""Rollouts: one query's group of outputs side by side, from a training step or an evaluation.

Read-only but for one action: a person's label on an output, which overrides its automatic reward
(core.records.review.labeling.submit_label; every label is kept). Only the chosen group is loaded (`storage.queries.step_rollouts` with a sample id, or
`evaluation_sample_rollouts`); the query list is counted in SQL. Everything a model or a dataset
wrote (query, reference, answers, summaries, trajectories, errors) is shown as text, long texts clipped
with a "Show all" toggle (ui.display).

A conversation task's group is a row of chat transcripts (up to four side by side, more in further rows), read
from each rollout's messages: above each, its reward and per-criterion scores; a rule that failed is shown
under the turn where it failed (or above the transcript when no turn decides it).
"""

from __future__ import annotations

import streamlit as st
from sqlmodel import Session

from core.domain.code_runs import code_runs
from core.models.judge import choices
from core.records.library.selection import ShownEntries, shown_entries
from core.records.review.labeling import label_scale, submit_label
from core.records.tasks.scenarios import is_conversation, persona_name, personas_by_name, segment_of
from storage import queries
from storage.statuses import EvaluationPurpose, LabelStatus
from storage.tables import Rollout, Sample, Task
from ui.common import (
    SCORE,
    Flash,
    after_label,
    allowed,
    context,
    engine,
    id_select,
    keep_valid_choice,
    plain,
    require_task,
    reward_text,
    run_action,
    run_page,
    show_in_url,
    status_label,
)
from ui.display import chat_turns, clip, show_chat, show_code_runs, show_long, show_turns, table

FLASH = Flash("rollouts_flash")
SOURCES = ("Training run", "Evaluation")
SIDE_BY_SIDE_MAX = 4
NAME_CHARS = 200  # a rule's or criterion's name in a heading line
SOURCE_KEY, RUN_KEY, STEP_KEY, EVAL_KEY, QUERY_KEY = (
    "rollouts_source", "rollouts_run", "rollouts_step", "rollouts_evaluation", "rollouts_query")
MIXED_KEY, FAILURES_KEY = "rollouts_only_mixed", "rollouts_only_failures"


def group_label(group: dict) -> str:
    """Selectbox option text for a query's group: sample id, G, mean reward, mixed or not."""
    mean = "–" if group["mean"] is None else f"{group['mean']:.2f}"
    kind = "mixed" if group["mixed"] else "uniform"
    errors = f" · {group['errors']} errors" if group["errors"] else ""
    return f"sample {group['sample_id']} · {str(group['external_id'])[:40]} · G={group['n']} · mean {mean} · {kind}{errors}"


def filtered(groups: list[dict], only_mixed: bool, only_failures: bool) -> list[dict]:
    return [g for g in groups if (g["mixed"] or not only_mixed) and (g["failed"] or not only_failures)]


def save_label(rollout_id: int) -> None:
    value = st.session_state.get(f"rollouts_label_value_{rollout_id}")
    comment = st.session_state.get(f"rollouts_label_comment_{rollout_id}", "")
    result = run_action(FLASH, "label", submit_label, engine(), rollout_id, value, context().reviewer, comment,
                        success=lambda _: f"Label {value:g} saved on rollout {rollout_id}")
    if result is not None:
        after_label(result)


def label_control(rollout: Rollout, task: Task, can_label: bool) -> None:
    """A person's score for this output; it replaces the automatic reward (which stays in the history)."""
    if rollout.error or not can_label:
        return
    with st.popover("Label this output"):
        values = [value for _, value in choices(label_scale(task))]
        st.radio("Reward", values, key=f"rollouts_label_value_{rollout.id}", horizontal=True,
                 format_func=lambda v: f"{v:g}")
        st.text_input("Comment", key=f"rollouts_label_comment_{rollout.id}")
        st.button("Save label", key=f"rollouts_label_save_{rollout.id}", on_click=save_label, args=(rollout.id,))


def show_output(rollout: Rollout, task: Task, can_label: bool, *, in_expander: bool) -> None:
    """One output: reward and its source, final answer, summary, error, cost, the code it ran (python mode),
    trajectory."""
    if not in_expander:
        st.markdown(f"**Output {rollout.group_index}**")
    waiting = " · waiting for a label" if rollout.label_status == LabelStatus.NEEDED else ""
    st.caption(f"Reward {reward_text(rollout.reward)} · source {rollout.reward_source or '–'}{waiting}")
    label_control(rollout, task, can_label)
    key = f"rollout_{rollout.id}"
    st.caption("Final answer")
    show_long(rollout.final_answer, f"{key}_final", empty="(no final answer)")
    if rollout.reward_detail:
        st.caption("Reward detail")
        show_long(rollout.reward_detail, f"{key}_detail")
    st.caption("Summary")
    show_long(rollout.summary, f"{key}_summary", empty="(no summary)")
    if rollout.error:
        st.caption("Error")
        show_long(rollout.error, f"{key}_error")
    st.caption(f"{rollout.tokens_in} tokens in · {rollout.tokens_out} tokens out · "
               f"{rollout.latency_ms / 1000:.1f} s")
    show_code_runs(rollout.messages or [], key)
    if in_expander:  # expanders are not nested: the trajectory follows inline
        st.caption("Trajectory")
        show_turns(rollout.messages or [], key)
    else:
        with st.expander("Trajectory"):
            show_turns(rollout.messages or [], key)


def failed_rules(rollout: Rollout) -> list[dict]:
    """The rules the conversation failed, from the rollout's scores (`passed` is False; None is unjudged)."""
    rules = (rollout.scores or {}).get("rules") or []
    return [rule for rule in rules if isinstance(rule, dict) and rule.get("passed") is False]


def rule_turn(rule: dict, turns: int) -> int | None:
    """The 0-based turn a failed rule names, if the transcript has it."""
    turn = rule.get("turn")
    return turn if isinstance(turn, int) and not isinstance(turn, bool) and 0 <= turn < turns else None


def show_rule_failure(rule: dict, key: str, *, here: bool) -> None:
    """One failed rule: our line naming it, then its reason (which quotes the judge) verbatim as code."""
    name = clip(str(rule.get("name") or "?"), NAME_CHARS)
    turn = rule.get("turn")
    where = "failed here" if here else (
        f"failed (turn {turn + 1})" if isinstance(turn, int) and not isinstance(turn, bool) else "failed")
    st.error(plain(f"Rule “{name}” {where}"))
    if rule.get("reason"):
        show_long(str(rule["reason"]), key)


def criteria_line(rollout: Rollout) -> str | None:
    """The per-criterion scores in [0, 1], e.g. "empathy 0.75 · resolution 0.50" (names escaped for Markdown)."""
    criteria = (rollout.scores or {}).get("criteria") or {}
    shown = [f"{clip(str(name), NAME_CHARS)} {value:.2f}" for name, value in criteria.items()
             if isinstance(value, int | float) and not isinstance(value, bool)]
    return plain("Criteria: " + " · ".join(shown)) if shown else None


def show_conversation(rollout: Rollout, task: Task, can_label: bool) -> None:
    """One conversation of a group: reward, criteria, failed rules (each at its turn), the transcript."""
    st.markdown(f"**Conversation {rollout.group_index}**")
    waiting = " · waiting for a label" if rollout.label_status == LabelStatus.NEEDED else ""
    unsure = " · judge unsure" if rollout.judge_unsure else ""
    st.caption(f"Reward {reward_text(rollout.reward)} · source {rollout.reward_source or '–'}{waiting}{unsure}")
    line = criteria_line(rollout)
    if line:
        st.caption(line)
    key = f"rollout_{rollout.id}"
    messages = rollout.messages or []
    turns = len(chat_turns(messages))
    failed = failed_rules(rollout)
    at_turn: dict[int, list[tuple[int, dict]]] = {}
    for number, rule in enumerate(failed):
        turn = rule_turn(rule, turns)
        if turn is None:
            show_rule_failure(rule, f"{key}_rule_{number}", here=False)
        else:
            at_turn.setdefault(turn, []).append((number, rule))
    label_control(rollout, task, can_label)

    def under(turn: int) -> None:
        for number, rule in at_turn.get(turn, []):
            show_rule_failure(rule, f"{key}_rule_{number}", here=True)

    show_chat(messages, key, under_turn=under)
    if rollout.error:
        st.caption("Error")
        show_long(rollout.error, f"{key}_error")
    st.caption(f"{turns} turns · {rollout.tokens_in} tokens in · {rollout.tokens_out} tokens out · "
               f"{rollout.latency_ms / 1000:.1f} s")
    if rollout.reward_detail or rollout.summary:
        with st.expander("Reward detail and summary"):
            st.caption("Reward detail")
            show_long(rollout.reward_detail, f"{key}_detail", empty="(no detail)")
            st.caption("Summary")
            show_long(rollout.summary, f"{key}_summary", empty="(no summary)")


def show_conversations(rollouts: list[Rollout], task: Task, can_label: bool) -> None:
    """A conversation task's group: its transcripts side by side, SIDE_BY_SIDE_MAX to a row."""
    width = min(len(rollouts), SIDE_BY_SIDE_MAX)
    for start in range(0, len(rollouts), width):
        for column, rollout in zip(st.columns(width), rollouts[start:start + width], strict=False):
            with column:
                show_conversation(rollout, task, can_label)


def show_group(rollouts: list[Rollout], task: Task, can_label: bool) -> None:
    """The group side by side when it is small, a table plus one expander per output otherwise; a
    conversation task's group as transcripts side by side."""
    if not rollouts:
        st.info("This query has no outputs yet.")
        return
    if is_conversation(task):
        show_conversations(rollouts, task, can_label)
        return
    if len(rollouts) <= SIDE_BY_SIDE_MAX:
        for column, rollout in zip(st.columns(len(rollouts)), rollouts, strict=True):
            with column:
                show_output(rollout, task, can_label, in_expander=False)
        return
    table([{"index": r.group_index, "reward": r.reward, "source": r.reward_source or "",
            "final answer": r.final_answer or "", "code runs": len(code_runs(r.messages)), "error": r.error or ""}
           for r in rollouts],
          column_config={"reward": SCORE}, key="rollouts_group_table")
    for rollout in rollouts:
        with st.expander(f"Output {rollout.group_index} · reward {reward_text(rollout.reward)}"):
            show_output(rollout, task, can_label, in_expander=True)


def choose_training_step(session: Session, task_id: int) -> int | None:
    """Run and step pickers; returns the chosen step id."""
    runs = queries.runs(session, task_id)
    if not runs:
        st.info("This task has no training runs yet. Start one on the Train page.")
        return None
    by_id = {run.id: run for run in runs}
    run_id = id_select("Run", list(by_id), RUN_KEY, "run", format_func=lambda i: (
        f"Run {i} · {status_label(by_id[i].status, by_id[i].heartbeat_at)} · "
        f"{by_id[i].created_at:%Y-%m-%d %H:%M}"))
    steps = queries.steps(session, run_id)
    if not steps:
        st.info("This run has no steps yet.")
        return None
    step_by_id = {step.id: step for step in steps}
    return id_select("Step", list(step_by_id), STEP_KEY, "step", format_func=lambda i: (
        f"epoch {step_by_id[i].epoch + 1} · batch {step_by_id[i].batch_index + 1} · {step_by_id[i].status}"))


def choose_evaluation(session: Session, task_id: int) -> int | None:
    evaluations = queries.evaluations(session, task_id, purpose=None)  # a gate's and an attribution's too
    if not evaluations:
        st.info("This task has no evaluations yet. Start one on the Evaluate page.")
        return None
    by_id = {ev.id: ev for ev in evaluations}
    numbers = queries.version_numbers(session, sorted({ev.version_id for ev in evaluations if ev.version_id}))
    return id_select("Evaluation", list(by_id), EVAL_KEY, "evaluation",
                     format_func=lambda i: evaluation_label(by_id[i], numbers))


def evaluation_label(ev, numbers: dict[int, int]) -> str:
    """An evaluation as the picker names it: by its id (its one name) and its version by the version's number."""
    version = (f"#{numbers.get(ev.version_id, '?')}" if ev.version_id is not None
               else "candidate" if ev.experiences else "empty")
    purpose = "" if ev.purpose == EvaluationPurpose.EVALUATION else f"{ev.purpose} of run {ev.run_id} · "
    left_out = f" without {ev.left_out}" if ev.left_out else ""
    return f"Evaluation {ev.id} · {purpose}version {version}{left_out} · {ev.split} · k={ev.k} · {ev.status}"


def show_scenario(sample: Sample | None, segment: str | None, sample_id: int) -> None:
    """A conversation's scenario: the persona the simulator played, the opening message and the goal."""
    persona = persona_name(sample) if sample else ""
    if persona:
        st.caption(plain(f"Persona: {clip(persona, NAME_CHARS)}" + (f" · segment {segment}" if segment else "")))
    st.subheader("Opening message", anchor=False)
    show_long(sample.query if sample else None, f"rollouts_query_{sample_id}")
    st.subheader("Goal", anchor=False)
    show_long(sample.reference if sample else None, f"rollouts_reference_{sample_id}", empty="(no goal)")


def show_entries_shown(shown: ShownEntries) -> None:
    """The library entries the group's agent was shown (its selection chose them for this query), each with
    how many of the outputs had it in their prompt."""
    if not shown.recorded:
        if shown.total:
            st.caption("These outputs were stored before the studio recorded which entries each was shown.")
        return
    st.subheader("Entries shown", anchor=False)
    st.caption(f"Selection: {shown.selection.describe()} · recorded for {shown.recorded} of {shown.total} outputs")
    if shown.rows:
        table(shown.rows, key="rollouts_shown_table")
    else:
        st.caption("No entries: the library was empty.")


def page() -> None:
    st.title("Rollouts")
    _ctx, task = require_task()
    with Session(engine()) as session:
        if "evaluation" in st.query_params and SOURCE_KEY not in st.session_state:  # a link to an evaluation
            st.session_state[SOURCE_KEY] = SOURCES[1]
        source = st.radio("Source", SOURCES, key=SOURCE_KEY, horizontal=True)
        for param in ("evaluation",) if source == SOURCES[0] else ("run", "step"):
            show_in_url(param, None)
        step_id = evaluation_id = None
        if source == SOURCES[0]:
            step_id = choose_training_step(session, task.id)
            if step_id is None:
                return
            groups = queries.rollout_groups(session, step_id=step_id)
        else:
            evaluation_id = choose_evaluation(session, task.id)
            if evaluation_id is None:
                return
            groups = queries.rollout_groups(session, evaluation_id=evaluation_id)

        left, right = st.columns(2)
        only_mixed = left.checkbox("Only mixed groups", key=MIXED_KEY,
                                   help="Groups whose outputs got different rewards.")
        only_failures = right.checkbox("Only failures", key=FAILURES_KEY,
                                       help="Groups with a reward below 1, an unscored output or an error.")
        shown = filtered(groups, only_mixed, only_failures)
        st.caption(f"{len(shown)} of {len(groups)} queries shown")
        if not shown:
            st.info("No query matches the filters." if groups else "No outputs yet.")
            return
        by_sample = {g["sample_id"]: g for g in shown}
        keep_valid_choice(QUERY_KEY, list(by_sample))
        sample_id = st.selectbox("Query", list(by_sample), key=QUERY_KEY,
                                 format_func=lambda i: group_label(by_sample[i]))
        samples = queries.samples_by_ids(session, [sample_id])
        if step_id is not None:
            rollouts = queries.step_rollouts(session, step_id, sample_id)
        else:
            rollouts = queries.evaluation_sample_rollouts(session, evaluation_id, sample_id)
        conversation = is_conversation(task)
        segment = segment_of(samples[0], personas_by_name(session, task)) if conversation and samples else None
        shown = shown_entries(session, task, samples[0] if samples else None, rollouts)

    sample = samples[0] if samples else None
    if conversation:
        show_scenario(sample, segment, sample_id)
        st.subheader(f"Conversations (G = {len(rollouts)})", anchor=False)
    else:
        st.subheader("Query", anchor=False)
        show_long(sample.query if sample else None, f"rollouts_query_{sample_id}")
        st.subheader("Reference answer", anchor=False)
        show_long(sample.reference if sample else None, f"rollouts_reference_{sample_id}",
                  empty="(no reference answer)")
        st.subheader(f"Outputs (G = {len(rollouts)})", anchor=False)
    show_entries_shown(shown)
    FLASH.show("label")
    show_group(rollouts, task, allowed("labeler"))  # the role once per page, not once per output


run_page(page)
