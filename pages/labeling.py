"""Labeling: domain experts score rollouts of the sidebar's task where no automatic check decides.

One rollout at a time from `core.records.review.labeling.next_item`, with the query, criteria, reference, answer and
the judge's suggestion; below it the agreement between labellers, the disagreements a reviewer settles
(with the same evidence), and the latest labels.

Keys, one keystroke per label: a digit writes that score as this person's label and the next rollout
follows; A writes the judge's suggestion the same way; S skips. There is no select-then-submit pair, so
no second key can arrive while the rerun of the first is in flight and be dropped. A comment goes with
the key pressed after it: type it, Tab out of the box (keys type text inside it), press the digit; the
box's value travels with the key. Each button's widget key and callback args name the rollout it was
drawn for: a doubled or stale press names the old rollout, whose callback is gone or whose second label
core refuses (`submit_label(once=True)`), so it never lands on the next rollout and never counts twice.
Under each score button its meaning, from the rubric's own "1: ..." lines or generic words.

A conversation (a task of kind `conversation`) shows its scenario (persona, goal, opening, must and
must-not) and its transcript turn by turn, `Turn N · User` / `Turn N · Agent` captions over the text as
code, the rules the judge found broken with what that means for the reward, and, when the task is
scored by a rubric, one radio per criterion with the meaning of each point and the judge's score marked
(not preselected: a label that only echoes the judge is taken with "Accept judge", which says so in its
comment) and one Submit (`core.records.review.labeling.submit_criteria_label`, once). A reviewer decides such a
disagreement per criterion the same way. Digits label nothing there; A and S work as above.

A dispute's form (score, reason, Decide) is keyed by the rollout it decides, and the picker by the disputes
it offers; after a decision the picker is set to the next dispute, whose form starts empty. Nothing chosen
or typed for one rollout can reach another, and the form, its Decide button and the toast name the rollout.

The tab is bound to the address (`?label_tab=Agreement` once a person picks it), so a reload opens the same
one; the Overview's "Settle disputes" chooses Agreement through the session (ui.common.open_in_context).

Buttons act in callbacks, so the page that follows is drawn from the state after the label. Every
change goes through `core.records.review.labeling`; text written by models or people is shown as code (long texts
clipped with a "Show all" toggle) or in tables, through ui.display, short rubric words as escaped
captions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import streamlit as st
from sqlmodel import Session

from core.domain.rubric import SCALES
from core.models.judge import anchors, choices, criteria_text, score_of
from core.records.review import labeling
from core.records.review.labeling import (
    Agreement,
    ConversationView,
    CriterionChoice,
    Labelled,
    Progress,
    QueueItem,
    RuleFinding,
)
from storage import queries
from storage.tables import RewardLabel, Rollout, Sample, Task
from ui.common import (
    DATETIME,
    LABEL_TAB_KEY,
    Flash,
    after_label,
    allowed,
    context,
    engine,
    keep_valid_choice,
    plain,
    require_task,
    reward_text,
    role_note,
    run_action,
    run_page,
)
from ui.display import clip, show_long, tab_stop, table

FLASH = Flash("label_flash")
SKIPPED_KEY, WARN_KEY = "label_skipped", "label_warn"
DECIDE_ROLLOUT_KEY = "label_decide_rollout"
HISTORY_LIMIT = 50
ANCHOR_CHARS = 60
KAPPA_WORDS = ((0.2, "poor"), (0.4, "fair"), (0.6, "moderate"), (0.8, "substantial"))


# The buttons that keys press keep one key whatever the rollout, so each shortcut is bound by exactly one
# button that stays on the page from rollout to rollout; their callbacks get the rollout they were last
# drawn for. Keyed per rollout, every labelled rollout left a stale binding behind in Streamlit 1.67's
# frontend, and on a busy machine a press went to the old rollouts' buttons (refused as repeats) instead
# of the one on screen: a lost keystroke.
SHORTCUT_KEYS = {"A": "label_accept", "S": "label_skip"}


def score_key(score: int) -> str:
    return f"label_score_{score}"


def comment_key(rollout_id: int) -> str:
    return f"label_comment_{rollout_id}"


QUEUE_CRITERION, DECIDE_CRITERION = "label_criterion", "label_decide_criterion"


# A dispute's form is keyed by the rollout it decides (`label_decide_score_<rollout>` ...): a widget keyed the
# same for every dispute kept, in the browser, the score chosen and the reason typed for the previous one, and
# the next press of Decide stored them on the next rollout.
def decide_score_key(rollout_id: int) -> str:
    return f"label_decide_score_{rollout_id}"


def decide_comment_key(rollout_id: int) -> str:
    return f"label_decide_comment_{rollout_id}"


def decide_button_key(rollout_id: int) -> str:
    return f"label_decide_{rollout_id}"


def criterion_key(prefix: str, rollout_id: int, index: int) -> str:
    """A criterion's radio: `label_criterion_<rollout>_<i>` in the queue, `label_decide_criterion_...` in a decision."""
    return f"{prefix}_{rollout_id}_{index}"


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


def score_label(score: int, meaning: str) -> str:
    """A scale point with what it means, escaped: the meaning may be rubric text someone typed."""
    return f"{score} · {plain(clip(meaning, ANCHOR_CHARS))}"


def waiting_words(count: int, labels_per_rollout: int) -> str:
    who = "a second labeller" if labels_per_rollout == 2 else "other labellers"
    return f"{count} {'waits' if count == 1 else 'wait'} for {who}"


def labelled_said(rollout_id: int, score: int | str) -> Callable[[Labelled], str]:
    """The toast after a label, or after a press that came twice and wrote nothing."""
    def said(result: Labelled) -> str:
        if result.repeated:
            return f"Rollout {rollout_id} already has your label; nothing more was written."
        return f"Labelled rollout {rollout_id}: {score}."
    return said


# --- actions (button callbacks) ---------------------------------------------------------------


def move_on(rollout_id: int) -> None:
    for key in [k for k in st.session_state if str(k).startswith(f"{QUEUE_CRITERION}_{rollout_id}_")]:
        st.session_state.pop(key, None)
    st.session_state.pop(comment_key(rollout_id), None)


def chosen_scores(prefix: str, rollout_id: int, names: list[str]) -> dict[str, int]:
    """The criteria scored so far in a form; core names any left out."""
    chosen = {name: st.session_state.get(criterion_key(prefix, rollout_id, i)) for i, name in enumerate(names)}
    return {name: score for name, score in chosen.items() if score is not None}


def finish(rollout_id: int, result: Labelled | None) -> None:
    if result is not None:
        move_on(rollout_id)
        after_label(result)


def submit(rollout_id: int, score: int, value: float) -> None:
    """One key, one label: the score and the comment typed so far, for the rollout the button was drawn for."""
    comment = st.session_state.get(comment_key(rollout_id), "")
    result = run_action(FLASH, "queue", labeling.submit_label, engine(), rollout_id, value, context().reviewer,
                        comment, once=True, success=labelled_said(rollout_id, score))
    finish(rollout_id, result)


def submit_criteria(rollout_id: int, names: list[str]) -> None:
    """One Submit, one per-criterion label, for the rollout the form was drawn for."""
    comment = st.session_state.get(comment_key(rollout_id), "")
    scores = chosen_scores(QUEUE_CRITERION, rollout_id, names)
    result = run_action(FLASH, "queue", labeling.submit_criteria_label, engine(), rollout_id, scores,
                        context().reviewer, comment, once=True,
                        success=labelled_said(rollout_id, ", ".join(f"{n} {s}" for n, s in scores.items())))
    finish(rollout_id, result)


def accept(rollout_id: int) -> None:
    comment = st.session_state.get(comment_key(rollout_id), "")
    result = run_action(FLASH, "queue", labeling.accept_suggestion, engine(), rollout_id, context().reviewer,
                        comment, success=labelled_said(rollout_id, "the judge's score"))
    finish(rollout_id, result)


def skip(rollout_id: int) -> None:
    skipped = list(st.session_state.get(SKIPPED_KEY, []))
    if rollout_id not in skipped:
        skipped.append(rollout_id)
    st.session_state[SKIPPED_KEY] = skipped
    move_on(rollout_id)


def picker_key(offered: list[int]) -> str:
    """The dispute picker's key names the disputes it offers, so a list that changed (a decision here or by
    someone else) draws a new picker: a picker kept under one key showed, in the browser, the name of a
    rollout it no longer offered after that choice was forgotten."""
    return f"{DECIDE_ROLLOUT_KEY}_{hashlib.sha256(','.join(map(str, offered)).encode()).hexdigest()[:12]}"


def next_dispute(rollout_id: int, offered: list[int]) -> None:
    """After a decision, the next picker starts on the dispute that followed the decided one (else the one
    before it)."""
    st.session_state.pop(picker_key(offered), None)
    rest = [i for i in offered if i != rollout_id]
    if rest:
        following = offered[offered.index(rollout_id) + 1:] if rollout_id in offered else []
        st.session_state[picker_key(rest)] = following[0] if following else rest[-1]


def forget_decision(rollout_id: int, keys: list[str], offered: list[int]) -> None:
    for key in keys:
        st.session_state.pop(key, None)
    next_dispute(rollout_id, offered)


def decide(rollout_id: int, values: dict[int, float], offered: list[int]) -> None:
    """The reviewer's score and reason for the rollout the form was drawn for, read from its own keys."""
    score = st.session_state.get(decide_score_key(rollout_id))
    if score not in values:
        st.session_state[WARN_KEY] = rollout_id
        return
    result = run_action(FLASH, "agreement", labeling.decide_label, engine(), rollout_id, values[score],
                        context().reviewer, st.session_state.get(decide_comment_key(rollout_id), ""),
                        success=f"Rollout {rollout_id} decided: {score}.")
    if result is not None:
        forget_decision(rollout_id, [decide_score_key(rollout_id), decide_comment_key(rollout_id)], offered)
        after_label(result)


def decide_criteria(rollout_id: int, names: list[str], offered: list[int]) -> None:
    scores = chosen_scores(DECIDE_CRITERION, rollout_id, names)
    result = run_action(FLASH, "agreement", labeling.decide_criteria_label, engine(), rollout_id, scores,
                        context().reviewer, st.session_state.get(decide_comment_key(rollout_id), ""),
                        success=f"Rollout {rollout_id} decided.")
    if result is not None:
        forget_decision(rollout_id, [decide_comment_key(rollout_id),
                                     *[criterion_key(DECIDE_CRITERION, rollout_id, i) for i in range(len(names))]],
                        offered)
        after_label(result)


# --- sections ---------------------------------------------------------------------------------


def show_progress(progress: Progress, labels_per_rollout: int) -> None:
    """The person's own part first (what they did, what waits on others, what is left), then the queue's."""
    mine = [f"You: {progress.mine_done} done"]
    if labels_per_rollout > 1 or progress.mine_waiting:
        mine.append(waiting_words(progress.mine_waiting, labels_per_rollout))
    mine.append(f"{progress.mine_to_do} left for you")
    st.markdown("; ".join(mine))
    total = progress.total
    disputed = f" · {progress.disputed} disputed, for a reviewer" if progress.disputed else ""
    st.progress(progress.complete / total if total else 0.0,
                text=f"{progress.complete} of {total} rollouts have all their labels{disputed}")


def scenario_text(view: ConversationView) -> str:
    lines = [f"Persona: {view.persona}", f"Goal: {view.goal}", f"Opening: {view.opening}"]
    lines += [f"Must: {text}" for text in view.must] + [f"Must not: {text}" for text in view.must_not]
    return "\n".join(lines)


def show_conversation(view: ConversationView, key: str) -> None:
    """A conversation as a person reads it: the scenario, then every turn as plain text under its speaker,
    numbered as the judge's rule findings number them, then the rules the judge found broken."""
    st.caption("Scenario")
    show_long(scenario_text(view), f"{key}_scenario")
    st.caption("Transcript")
    if not view.turns:
        st.caption("(no turn was recorded)")
    for number, (speaker, text) in enumerate(view.turns, start=1):
        st.caption(f"Turn {number} · {speaker}")
        show_long(text, f"{key}_turn_{number}")
    for index, rule in enumerate(view.failed_rules):
        show_failed_rule(rule, f"{key}_rule_{index}")


def show_failed_rule(rule: RuleFinding, key: str) -> None:
    label = "must-not rule" if rule.kind == "must_not" else "must-rule"
    where = f" in turn {rule.turn}" if rule.turn is not None else ""
    verb = "broken" if rule.kind == "must_not" else "failed"
    if rule.holds_reward:
        means = ("It is checked by the task's pattern, so this conversation's reward stays 0 whatever you score; "
                 "your criterion scores are kept.")
    else:
        means = ("The judge was asked about it; your label replaces its verdict, so the reward is the weighted "
                 "mean of your scores. Let the criteria say how much it matters.")
    st.warning(f"The judge found the {label} “{plain(clip(rule.name, 120))}” {verb}{where}. {means}")
    if rule.reason:
        show_long(rule.reason, key)


def show_evidence(task: Task, sample: Sample, rollout: Rollout, key: str,
                  view: ConversationView | None = None) -> None:
    """What a person needs to score an answer: the query, the criteria, the reference and the answer;
    for a conversation, the scenario and its transcript."""
    if view is not None:
        show_conversation(view, key)
        return
    st.caption("Query")
    show_long(sample.query, f"{key}_query")
    st.caption("Criteria")
    show_long(criteria_text(task, sample), f"{key}_criteria")
    if sample.reference:
        st.caption("Reference answer")
        show_long(sample.reference, f"{key}_reference")
    st.caption("Answer")
    show_long(rollout.response, f"{key}_answer", empty="(no answer)")


def show_item(task: Task, item: QueueItem, where: str) -> None:
    rollout, sample = item.rollout, item.sample
    with st.container(border=True):
        count = f" · label {item.labels_so_far + 1} of {rollout.labels_needed}" if rollout.labels_needed > 1 else ""
        st.caption(f"Rollout {rollout.id} · sample {sample.id} · {where}{count}")
        key = f"label_rollout_{rollout.id}"
        view = item.conversation
        show_evidence(task, sample, rollout, key, view)
        criteria = view.criteria if view is not None else []
        if rollout.suggested_reward is not None or rollout.judge_unsure:
            unsure = " · judge unsure" if rollout.judge_unsure else ""
            if rollout.suggested_reward is None:
                st.caption(f"Judge suggestion: none{unsure}")
            elif criteria:
                st.caption(f"Judge suggestion: {rollout.suggested_reward:.2f}{unsure}")
            else:
                point = score_of(rollout.suggested_reward, item.scale)
                st.caption(f"Judge suggestion: {point} ({rollout.suggested_reward:g}){unsure}")
            show_long(rollout.suggested_detail, f"{key}_judge", empty="(no reason given)")
        if criteria:
            criteria_controls(item, view)
        else:
            label_controls(item, anchors(task, sample))


def criterion_radios(criteria: list[CriterionChoice], prefix: str, rollout_id: int) -> None:
    """One radio per criterion, nothing chosen: each point says what it means, the judge's point is marked."""
    for index, criterion in enumerate(criteria):
        def shown(score: int, criterion: CriterionChoice = criterion) -> str:
            judge = " · judge" if score == criterion.suggested else ""
            return f"{score_label(score, criterion.anchors.get(score, ''))}{judge}"

        st.radio(f"{plain(clip(criterion.name, ANCHOR_CHARS))} · weight {criterion.weight:g}",
                 list(criterion.anchors), key=criterion_key(prefix, rollout_id, index), index=None,
                 horizontal=True, format_func=shown)
        if criterion.description:
            st.caption(plain(clip(criterion.description, 400)))


def criteria_controls(item: QueueItem, view: ConversationView) -> None:
    """The comment box, a score per criterion, Submit; Accept judge (A) takes the judge's scores, S skips."""
    rollout_id = item.rollout.id
    criterion_radios(view.criteria, QUEUE_CRITERION, rollout_id)
    st.text_input("Comment (optional)", key=comment_key(rollout_id), max_chars=2000)
    tab_stop("How a comment is kept", "It is saved with Submit label or Accept judge; Skip drops it.",
             key=f"label_comment_stop_{rollout_id}")
    names = [criterion.name for criterion in view.criteria]
    submit_col, accept_col, skip_col = st.columns(3)
    submit_col.button("Submit label", key=f"label_criteria_submit_{rollout_id}", type="primary",
                      on_click=submit_criteria, args=(rollout_id, names), width="stretch")
    suggested = view.suggested_scores
    if suggested is not None and item.rollout.suggested_reward is not None:
        accept_col.button(f"Accept judge (A): {item.rollout.suggested_reward:.2f}", key=SHORTCUT_KEYS["A"],
                          shortcut="A", on_click=accept, args=(rollout_id,), width="stretch")
    skip_col.button("Skip (S)", key=SHORTCUT_KEYS["S"], shortcut="S", on_click=skip, args=(rollout_id,),
                    width="stretch")
    judge = "A accepts the judge's scores, " if suggested is not None else ""
    st.caption(f"Score every criterion, then Submit label; the reward is their weighted mean. Keys for rollout "
               f"{rollout_id}: {judge}S skip.")


def label_controls(item: QueueItem, meanings: dict[int, str]) -> None:
    """The comment box, a button per scale point with its meaning beneath, Accept judge and Skip.

    No button with a shortcut has a `help` tooltip: Streamlit 1.67 then draws the button twice, both
    copies bind the key, and one press fires twice.
    """
    rollout_id = item.rollout.id
    st.text_input("Comment (optional; goes with the next key you press)", key=comment_key(rollout_id),
                  max_chars=2000)
    tab_stop("How a comment is kept", "Tab out of the box, then press a digit or A: the comment is saved with that "
             "label. S skips and drops it.", key=f"label_comment_stop_{rollout_id}")
    for column, (score, value) in zip(st.columns(len(item.choices)), item.choices, strict=True):
        column.button(str(score), key=score_key(score), shortcut=str(score), on_click=submit,
                      args=(rollout_id, score, value), width="stretch")
        column.caption(plain(clip(meanings[score], ANCHOR_CHARS)))
    accept_col, skip_col = st.columns(2)
    suggested = item.rollout.suggested_reward
    if suggested is not None:
        point = score_of(suggested, item.scale)
        accept_col.button(f"Accept judge (A): {point}", key=SHORTCUT_KEYS["A"], shortcut="A",
                          on_click=accept, args=(rollout_id,), width="stretch")
    skip_col.button("Skip (S)", key=SHORTCUT_KEYS["S"], shortcut="S", on_click=skip, args=(rollout_id,),
                    width="stretch")
    low, high = item.choices[0][0], item.choices[-1][0]
    judge = ", A accept the judge" if suggested is not None else ""
    st.caption(f"Keys for rollout {rollout_id}: {low}-{high} label and next{judge}, S skip. For a comment, type "
               "it, Tab out of the box, then press the key.")


def queue_section(task: Task, reviewer: str) -> None:
    with Session(engine()) as session:
        progress = labeling.progress(session, task, labeler=reviewer)
        skipped = [int(i) for i in st.session_state.get(SKIPPED_KEY, [])]
        item = labeling.next_item(session, task, reviewer, skip=skipped)
        where = origin(session, item.rollout) if item else ""
    FLASH.show("queue")
    show_progress(progress, labeling.labels_per_rollout(task))
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
        samples = {s.id: s for s in queries.samples_by_ids(session, [r.sample_id for r in disputed.values()])}
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
            "score now": row["score now"], "reward now": row["reward now"]} for row in result.disagreements],
          key="label_disagreements_table")
    st.caption(scale_note(task, "the labels' mean until a reviewer decides"))
    if not allowed("reviewer"):
        role_note("reviewer", "deciding disagreements")
        return
    ids = [row["rollout"] for row in result.disagreements if row["rollout"] in disputed]
    keep_valid_choice(picker_key(ids), ids)
    rollout_id = st.selectbox("Rollout to decide", ids, key=picker_key(ids),
                              format_func=lambda i: f"Rollout {i} · reward now {reward_text(disputed[i].reward)}")
    decide_form(task, disputed[rollout_id], samples[disputed[rollout_id].sample_id], histories[rollout_id], ids)


def scores_text(scores: dict | None) -> str:
    return ", ".join(f"{name} {score}" for name, score in (scores or {}).items())


def decision_note(rollout_id: int) -> None:
    tab_stop("What a decision does", "Decide makes this the rollout's reward in place of the labels' mean, with "
             "the reason; every label is kept.", key=f"label_decide_stop_{rollout_id}")


def decide_form(task: Task, rollout: Rollout, sample: Sample, history: list[RewardLabel], offered: list[int]) -> None:
    """The evidence of one disagreement (query, criteria, reference, answer, every label and why) and the
    reviewer's decision: a reviewer settles it as a labeller would, not from the numbers alone; for a
    conversation scored by a rubric, per criterion."""
    rollout_id = rollout.id
    view = labeling.conversation_view(task, sample, rollout)
    st.caption(f"Deciding rollout {rollout_id} · sample {sample.id}")
    show_evidence(task, sample, rollout, f"label_disputed_{rollout_id}", view)
    criteria = view.criteria if view is not None else []
    st.caption("Labels")
    if criteria:
        table([{"labeller": h.labeler, "kind": h.kind, "value": h.value, "criteria": scores_text(h.scores),
                "comment": h.comment, "when": h.created_at} for h in history],
              key="label_decide_history", column_config={"when": DATETIME})
        criterion_radios(criteria, DECIDE_CRITERION, rollout_id)
        st.text_input("Reason (optional)", key=decide_comment_key(rollout_id), max_chars=2000)
        decision_note(rollout_id)
        st.button(f"Decide rollout {rollout_id}", key=decide_button_key(rollout_id), type="primary",
                  on_click=decide_criteria, args=(rollout_id, [criterion.name for criterion in criteria], offered))
        return
    scale = labeling.label_scale(task)
    table([{"labeller": h.labeler, "kind": h.kind, "score": score_of(h.value, scale), "value": h.value,
            "comment": h.comment, "when": h.created_at} for h in history],
          key="label_decide_history", column_config={"when": DATETIME})
    values, meanings = dict(choices(scale)), anchors(task, sample)
    st.radio("Final score", list(values), key=decide_score_key(rollout_id), horizontal=True, index=None,
             format_func=lambda s: f"{score_label(s, meanings.get(s, ''))} ({values[s]:g})")
    if st.session_state.get(WARN_KEY) == rollout_id:
        st.warning("Choose the final score before deciding; nothing was saved.")
        st.session_state.pop(WARN_KEY, None)
    st.text_input("Reason (optional)", key=decide_comment_key(rollout_id), max_chars=2000)
    decision_note(rollout_id)
    st.button(f"Decide rollout {rollout_id}", key=decide_button_key(rollout_id), type="primary", on_click=decide,
              args=(rollout_id, values, offered))


def scale_note(task: Task, reward: str) -> str:
    """What the numbers of a labels table are: scores on the scale people pressed, and the reward in 0-1."""
    scale = labeling.label_scale(task)
    low, high = SCALES[scale]
    means = " (a rubric label's weighted mean, on the grid its decisions use)" if labeling.is_rubric(task) else ""
    return (f"Scores on the {low}-{high} scale labellers press{means}; value and reward are the reward in 0-1, "
            f"{reward}.")


def history_section(task: Task) -> None:
    with Session(engine()) as session:
        rows = queries.recent_labels(session, task.id, HISTORY_LIMIT)
    if not rows:
        st.caption("No labels for this task yet.")
        return
    per_criterion = any(r.scores for r in rows)
    table([{"rollout": r.rollout_id, "labeller": r.labeler, "score": labeling.label_score(task, r.value),
            "value": r.value, "kind": r.kind, **({"criteria": scores_text(r.scores)} if per_criterion else {}),
            "comment": r.comment, "when": r.created_at} for r in rows],
          key="label_history_table", column_config={"when": DATETIME})
    st.caption(scale_note(task, "what the label sets"))


def page() -> None:
    st.title("Labeling")
    ctx, task = require_task()
    queue, agreement, history = st.tabs(["Queue", "Agreement", f"History (latest {HISTORY_LIMIT})"],
                                        key=LABEL_TAB_KEY, bind="query-params")
    with queue:
        queue_section(task, ctx.reviewer)
    with agreement:
        agreement_section(task)
    with history:
        history_section(task)


run_page(page)
