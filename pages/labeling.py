"""Labeling: domain experts score rollouts of the sidebar's task where no automatic check decides.

One rollout at a time from `core.labeling.next_item`, with the query, criteria, reference, answer and
the judge's suggestion; a button per scale point (digit keys), Submit (Enter) and Skip (S). Below it
the agreement between labellers, the disagreements a reviewer settles, and the latest labels.
Buttons act in callbacks, so the page that follows is drawn from the state after the label. Every
change goes through `core.labeling`; text written by models or people is shown as code (long texts
clipped with a "Show all" toggle) or in tables, through pages._display.
"""

from __future__ import annotations

import streamlit as st
from sqlmodel import Session

from core import labeling
from core.judge import choices, criteria_text, scale_of, score_of
from core.labeling import Agreement, Progress, QueueItem
from pages._common import (
    DATETIME,
    Flash,
    after_label,
    allowed,
    context,
    engine,
    keep_valid_choice,
    require_task,
    reward_text,
    role_note,
    run_action,
    run_page,
)
from pages._display import show_long, table
from storage import queries
from storage.models import Rollout, Task

FLASH = Flash("label_flash")
SKIPPED_KEY, SELECTED_KEY, WARN_KEY = "label_skipped", "label_selected", "label_warn"
DECIDE_ROLLOUT_KEY, DECIDE_SCORE_KEY = "label_decide_rollout", "label_decide_score"
DECIDE_COMMENT_KEY = "label_decide_comment"
HISTORY_LIMIT = 50
KAPPA_WORDS = ((0.2, "poor"), (0.4, "fair"), (0.6, "moderate"), (0.8, "substantial"))


def comment_key(rollout_id: int) -> str:
    return f"label_comment_{rollout_id}"


# --- reads ------------------------------------------------------------------------------------


def origin(session: Session, rollout: Rollout) -> str:
    """Where a rollout came from, so a labeller can tell a training step from an evaluation."""
    step = queries.steps_by_ids(session, [rollout.step_id]).get(rollout.step_id) if rollout.step_id else None
    if step is not None:
        return f"run {step.run_id} · epoch {step.epoch + 1} · batch {step.batch_index + 1}"
    if rollout.evaluation_id is not None:
        return f"evaluation {rollout.evaluation_id}"
    return "no run or evaluation"


# --- display helpers --------------------------------------------------------------------------


def kappa_word(kappa: float | None) -> str:
    """The usual reading of a kappa value (Landis and Koch, with everything below 0.2 called poor)."""
    if kappa is None:
        return "not defined"
    return next((word for limit, word in KAPPA_WORDS if kappa < limit), "almost perfect")


def score_label(score: int, scale: str) -> str:
    if scale == "binary":
        return f"{score} · {'meets' if score else 'fails'}"
    return str(score)


def selected_for(rollout_id: int) -> dict | None:
    chosen = st.session_state.get(SELECTED_KEY)
    return chosen if chosen and chosen.get("rollout") == rollout_id else None


# --- actions (button callbacks) ---------------------------------------------------------------


def select_score(rollout_id: int, score: int, value: float) -> None:
    st.session_state[SELECTED_KEY] = {"rollout": rollout_id, "score": score, "value": value}
    st.session_state.pop(WARN_KEY, None)


def move_on(rollout_id: int) -> None:
    for key in (SELECTED_KEY, WARN_KEY, comment_key(rollout_id)):
        st.session_state.pop(key, None)


def submit(rollout_id: int) -> None:
    chosen = selected_for(rollout_id)
    if chosen is None:
        st.session_state[WARN_KEY] = rollout_id
        return
    comment = st.session_state.get(comment_key(rollout_id), "")
    result = run_action(FLASH, "queue", labeling.submit_label, engine(), rollout_id, chosen["value"],
                        context().reviewer, comment, success=f"Labelled rollout {rollout_id}: {chosen['score']}.")
    if result is not None:
        move_on(rollout_id)
        after_label(result)


def skip(rollout_id: int) -> None:
    skipped = list(st.session_state.get(SKIPPED_KEY, []))
    if rollout_id not in skipped:
        skipped.append(rollout_id)
    st.session_state[SKIPPED_KEY] = skipped
    move_on(rollout_id)


def decide(rollout_id: int, values: dict[int, float]) -> None:
    score = st.session_state.get(DECIDE_SCORE_KEY)
    if score not in values:
        st.session_state[WARN_KEY] = "decide"
        return
    result = run_action(FLASH, "agreement", labeling.decide_label, engine(), rollout_id, values[score],
                        context().reviewer, st.session_state.get(DECIDE_COMMENT_KEY, ""),
                        success=f"Rollout {rollout_id} decided: {score}.")
    if result is not None:
        for key in (DECIDE_ROLLOUT_KEY, DECIDE_SCORE_KEY, DECIDE_COMMENT_KEY):
            st.session_state.pop(key, None)
        after_label(result)


# --- sections ---------------------------------------------------------------------------------


def show_progress(progress: Progress) -> None:
    st.markdown(f"{progress.mine_to_do} waiting for you · {progress.done} done · {progress.disputed} disputed")
    total = progress.total
    st.progress(progress.done / total if total else 0.0, text=f"{progress.done} of {total} labelled")


def show_item(task: Task, item: QueueItem, where: str) -> None:
    rollout, sample = item.rollout, item.sample
    with st.container(border=True):
        count = f" · label {item.labels_so_far + 1} of {rollout.labels_needed}" if rollout.labels_needed > 1 else ""
        st.caption(f"Rollout {rollout.id} · sample {sample.id} · {where}{count}")
        key = f"label_rollout_{rollout.id}"
        st.caption("Query")
        show_long(sample.query, f"{key}_query")
        st.caption("Criteria")
        show_long(criteria_text(task, sample), f"{key}_criteria")
        if sample.reference:
            st.caption("Reference answer")
            show_long(sample.reference, f"{key}_reference")
        st.caption("Answer")
        show_long(rollout.response, f"{key}_answer", empty="(no answer)")
        if rollout.suggested_reward is not None or rollout.judge_unsure:
            unsure = " · judge unsure" if rollout.judge_unsure else ""
            if rollout.suggested_reward is None:
                st.caption(f"Judge suggestion: none{unsure}")
            else:
                point = score_of(rollout.suggested_reward, item.scale)
                st.caption(f"Judge suggestion: {point} ({rollout.suggested_reward:g}){unsure}")
            show_long(rollout.suggested_detail, f"{key}_judge", empty="(no reason given)")
        score_buttons(item)


def score_buttons(item: QueueItem) -> None:
    rollout_id = item.rollout.id
    chosen = selected_for(rollout_id)
    columns = st.columns(len(item.choices))
    for column, (score, value) in zip(columns, item.choices, strict=True):
        column.button(score_label(score, item.scale), key=f"label_score_{score}", shortcut=str(score),
                      type="primary" if chosen and chosen["score"] == score else "secondary",
                      on_click=select_score, args=(rollout_id, score, value), width="stretch")
    st.markdown(f"Selected: {chosen['score']} ({chosen['value']:g})" if chosen else "Selected: none")
    if st.session_state.get(WARN_KEY) == rollout_id:
        st.warning("Choose a score before submitting; nothing was saved.")
    st.text_input("Comment (optional)", key=comment_key(rollout_id), max_chars=2000)
    submit_col, skip_col = st.columns(2)
    submit_col.button("Submit and next", key="label_submit", type="primary", shortcut="Enter", on_click=submit,
                      args=(rollout_id,), width="stretch")
    skip_col.button("Skip", key="label_skip", shortcut="S", on_click=skip, args=(rollout_id,), width="stretch")
    low, high = item.choices[0][0], item.choices[-1][0]
    st.caption(f"Keys: {low}-{high} score, Enter submit, S skip (outside the comment box).")


def queue_section(task: Task, reviewer: str) -> None:
    with Session(engine()) as session:
        progress = labeling.progress(session, task, labeler=reviewer)
        skipped = [int(i) for i in st.session_state.get(SKIPPED_KEY, [])]
        item = labeling.next_item(session, task, reviewer, skip=skipped)
        where = origin(session, item.rollout) if item else ""
    FLASH.show("queue")
    show_progress(progress)
    if not labeling.is_person_method(task):
        st.caption(f"This task's reward method is {task.reward_method}; rollouts wait here only for the human "
                   "and judge_human methods.")
    if item is None:
        st.success("Nothing waiting for you in this task.")
        others = progress.needed
        if others:
            st.info(f"{others} rollout{'s' if others != 1 else ''} still wait for labels from other people.")
        if progress.disputed:
            st.info(f"{progress.disputed} disputed rollout{'s' if progress.disputed != 1 else ''} wait for a "
                    "reviewer's decision (Agreement).")
        return
    if not allowed("labeler"):
        role_note("labeler", "labelling rollouts")
        return
    show_item(task, item, where)


def agreement_section(task: Task) -> None:
    with Session(engine()) as session:
        result: Agreement = labeling.agreement(session, task)
        disputed = queries.rollouts_by_ids(session, [row["rollout"] for row in result.disagreements])
        histories = {rid: queries.label_history(session, rid) for rid in disputed}
    FLASH.show("agreement")
    if not result.items and not result.cohen:
        st.info("No rollout of this task has labels from two people yet.")
    else:
        if result.fleiss is None:
            st.markdown(f"Fleiss' kappa: not defined ({result.items} rollouts with {result.raters_per_item} "
                        "labels each; every label the same category, or too few).")
        else:
            st.markdown(f"Fleiss' kappa: {result.fleiss:.2f} ({kappa_word(result.fleiss)}) over {result.items} "
                        f"rollouts with {result.raters_per_item} labels each.")
        table([{"labeller A": a, "labeller B": b, "Cohen's kappa": kappa, "agreement": kappa_word(kappa), "n": n}
               for (a, b), (kappa, n) in result.cohen.items()], key="label_cohen_table",
              column_config={"Cohen's kappa": st.column_config.NumberColumn(format="%.2f")})
        st.caption("Kappa: below 0.2 poor, 0.2 fair, 0.4 moderate, 0.6 substantial, 0.8 almost perfect.")
    st.subheader("Disagreements", anchor=False)
    if not result.disagreements:
        st.caption("No disagreement waits for a decision.")
        return
    table([{"rollout": row["rollout"], "sample": row["sample"],
            "labels": ", ".join(f"{name} {value}" for name, value in row["labels"].items()),
            "reward now": row["reward now"]} for row in result.disagreements], key="label_disagreements_table")
    if not allowed("reviewer"):
        role_note("reviewer", "deciding disagreements")
        return
    ids = list(disputed)
    keep_valid_choice(DECIDE_ROLLOUT_KEY, ids)
    rollout_id = st.selectbox("Rollout to decide", ids, key=DECIDE_ROLLOUT_KEY,
                              format_func=lambda i: f"Rollout {i} · reward now {reward_text(disputed[i].reward)}")
    st.caption("Answer")
    show_long(disputed[rollout_id].response, f"label_disputed_{rollout_id}_answer", empty="(no answer)")
    table([{"labeller": h.labeler, "kind": h.kind, "value": h.value, "comment": h.comment, "when": h.created_at}
           for h in histories[rollout_id]], key="label_decide_history", column_config={"when": DATETIME})
    scale = scale_of(task)
    values = dict(choices(scale))
    st.radio("Final score", list(values), key=DECIDE_SCORE_KEY, horizontal=True, index=None,
             format_func=lambda s: f"{score_label(s, scale)} ({values[s]:g})")
    if st.session_state.get(WARN_KEY) == "decide":
        st.warning("Choose the final score before deciding; nothing was saved.")
        st.session_state.pop(WARN_KEY, None)
    st.text_input("Reason (optional)", key=DECIDE_COMMENT_KEY, max_chars=2000)
    st.button("Decide", key="label_decide", type="primary", on_click=decide, args=(rollout_id, values))


def history_section(task: Task) -> None:
    with Session(engine()) as session:
        rows = queries.recent_labels(session, task.id, HISTORY_LIMIT)
    if not rows:
        st.caption("No labels for this task yet.")
        return
    table([{"rollout": r.rollout_id, "labeller": r.labeler, "value": r.value, "kind": r.kind,
            "comment": r.comment, "when": r.created_at} for r in rows],
          key="label_history_table", column_config={"when": DATETIME})


def page() -> None:
    st.title("Labeling")
    ctx, task = require_task()
    queue, agreement, history = st.tabs(["Queue", "Agreement", f"History (latest {HISTORY_LIMIT})"])
    with queue:
        queue_section(task, ctx.reviewer)
    with agreement:
        agreement_section(task)
    with history:
        history_section(task)


run_page(page)
