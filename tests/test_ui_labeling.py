"""UI tests of the Labeling page (Streamlit AppTest): a real training run waits for labels, people label
it through the page, and every change lands in the database through core.records.review.labeling."""

from __future__ import annotations

import json
import re

import pytest
from sqlmodel import Session, select

from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.grpo.training import execute_run
from core.records.people.users import add_user
from core.records.tasks.demos import CONVERSATION_TASK, DEMO_TASK, ensure_conversation_task
from core.records.tasks.lookup import get_task
from storage import db, queries
from storage.tables import Evaluation, RewardLabel, Rollout, Run
from tests.ui_support import markdown_texts, run_app, scripted_gateway, seeded_run, table_with
from ui.common import AUTH_KEY, REVIEWER_KEY, TASK_KEY

PAGE = "pages/labeling.py"
JUDGE_REPLY = json.dumps({"reason": "Polite but it never names the quantity asked for.", "score": 4,
                          "confident": False})


@pytest.fixture
def engine(app_engine):
    """The app's database with the demo task (shadows the conftest engine on purpose)."""
    return app_engine


def person_task(engine, method: str = "human", **settings) -> None:
    """Switch the demo task to a reward method that needs people (1-5 scale, one label by default)."""
    with db.session_scope(engine) as session:
        task = get_task(session, DEMO_TASK)
        task.reward_method = method
        task.reward_settings = {"scale": "1-5", "labels_per_rollout": 1, **settings}
        session.add(task)


def waiting_run(engine, method: str = "human", **settings) -> tuple[int, list[Rollout]]:
    """A real run (2 queries x G=2, scripted model) that stops after its first step's rollouts."""
    person_task(engine, method, **settings)
    run_id = seeded_run(engine, "auto", judge=JUDGE_REPLY)
    with Session(engine) as session:
        run = session.get(Run, run_id)
        assert run.status == "awaiting_labels", run.error
        [step] = queries.steps(session, run_id)
        rollouts = sorted(queries.step_rollouts(session, step.id), key=lambda r: r.id)
        session.expunge_all()
    assert len(rollouts) == 4 and all(r.label_status == "needed" for r in rollouts)
    return run_id, rollouts


def open_page(person: str = "alice", **state):
    at = run_app(page=PAGE, session_state={TASK_KEY: DEMO_TASK, REVIEWER_KEY: person, **state})
    assert [t.value for t in at.title] == ["Labeling"]
    return at


def click(at, key: str):
    at.button(key=key).click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def label(at, score: int):
    """Press one score key on the rollout shown: one keystroke, one label."""
    return click(at, f"label_score_{score}")


def shown_rollout(at) -> int | None:
    """The id of the rollout the page offers for labelling (its caption starts `Rollout N ·`)."""
    found = [int(m.group(1)) for c in at.caption if (m := re.match(r"Rollout (\d+) · ", c.value))]
    assert len(found) <= 1, found
    return found[0] if found else None


def progress_line(at) -> str:
    [line] = [m.value for m in at.markdown if m.value.startswith("You: ")]
    return line


def bar(at) -> tuple[int, str]:
    [element] = at.get("progress")
    return element.proto.value, element.proto.text


def codes(at) -> list[str]:
    return [c.value for c in at.code]


def labels(engine) -> list[RewardLabel]:
    with Session(engine) as session:
        rows = list(session.exec(select(RewardLabel).order_by(RewardLabel.id)))
        session.expunge_all()
    return rows


def rollout(engine, rollout_id: int) -> Rollout:
    with Session(engine) as session:
        row = session.get(Rollout, rollout_id)
        session.expunge(row)
    return row


def run_status(engine, run_id: int) -> str:
    with Session(engine) as session:
        return session.get(Run, run_id).status


def captions(at) -> list[str]:
    return [c.value for c in at.caption]


def dispute_picker(at):
    """The Agreement tab's picker of the dispute to decide (its key names the disputes it offers)."""
    [picker] = [s for s in at.selectbox if s.label == "Rollout to decide"]
    return picker


def test_one_digit_labels_the_rollout_with_its_comment_and_moves_on(engine):
    _run_id, queued = waiting_run(engine)
    first = queued[0]
    with Session(engine) as session:
        sample = queries.samples_by_ids(session, [first.sample_id])[0]
    at = open_page()
    assert shown_rollout(at) == first.id
    assert sample.query in codes(at) and first.response in codes(at) and sample.reference in codes(at)
    assert progress_line(at) == "You: 0 done; 4 left for you"
    assert bar(at) == (0, "0 of 4 rollouts have all their labels")
    assert not any(first.response in text for text in markdown_texts(at))
    assert (f"Keys for rollout {first.id}: 1-5 label and next, S skip. For a comment, type it, Tab out of the "
            "box, then press the key." in captions(at))
    assert not [b for b in at.button if b.key == "label_accept"]  # no judge, nothing to accept

    at.text_input(key=f"label_comment_{first.id}").input("names the right quantity")
    click(at, "label_score_4")

    [row] = labels(engine)
    assert (row.rollout_id, row.value, row.labeler, row.kind, row.comment) == (
        first.id, 0.75, "alice", "label", "names the right quantity")
    after = rollout(engine, first.id)
    assert (after.reward, after.reward_source, after.label_status) == (0.75, "human", "done")
    assert shown_rollout(at) == queued[1].id
    assert progress_line(at) == "You: 1 done; 3 left for you"
    assert bar(at) == (25, "1 of 4 rollouts have all their labels")
    assert at.text_input(key=f"label_comment_{queued[1].id}").value == ""
    history = table_with(at, "labeller")
    assert history[["rollout", "labeller", "value", "kind", "comment"]].values.tolist() == [
        [first.id, "alice", 0.75, "label", "names the right quantity"]]


def test_each_score_button_says_what_it_means_from_the_rubric_or_generic_words(engine):
    waiting_run(engine, criteria="Name the quantity.\n1: off topic or no number\n5 = the right number, named")
    at = open_page()
    assert shown_rollout(at) is not None
    row = captions(at)
    assert ["off topic or no number", "mostly wrong", "partly right", "right, minor gaps",
            "the right number, named"] == [c for c in row if c in (
                "off topic or no number", "mostly wrong", "partly right", "right, minor gaps",
                "the right number, named", "wrong or unusable", "fully correct and complete")]
    assert [at.button(key=f"label_score_{score}").label for score in range(1, 6)] == list("12345")
    assert not any(at.button(key=f"label_score_{score}").help for score in range(1, 6))  # see the page


def test_skip_moves_on_and_the_skipped_rollout_comes_back_last(engine):
    _run_id, queued = waiting_run(engine)
    at = open_page()
    click(at, "label_skip")

    assert labels(engine) == []
    assert shown_rollout(at) == queued[1].id
    for expected in queued[1:]:
        assert shown_rollout(at) == expected.id
        label(at, 5)
    assert shown_rollout(at) == queued[0].id
    assert [row.rollout_id for row in labels(engine)] == [r.id for r in queued[1:]]
    assert rollout(engine, queued[0].id).label_status == "needed"


def test_labelling_the_whole_step_queues_the_run_again_and_it_finishes(engine):
    run_id, queued = waiting_run(engine)
    at = open_page()
    scores = (1, 5, 2, 4)
    for score, item in zip(scores[:-1], queued[:-1], strict=True):
        assert shown_rollout(at) == item.id
        label(at, score)
        assert run_status(engine, run_id) == "awaiting_labels"
    label(at, scores[-1])

    assert run_status(engine, run_id) == "queued"
    assert shown_rollout(at) is None
    assert any(s.value.startswith("Nothing waiting for you") for s in at.success)
    assert progress_line(at) == "You: 4 done; 0 left for you"
    assert bar(at) == (100, "4 of 4 rollouts have all their labels")
    assert [rollout(engine, r.id).reward for r in queued] == [0.0, 1.0, 0.25, 0.75]

    _model, gateway = scripted_gateway(engine)
    finished = execute_run(engine, run_id, gateway=gateway)
    assert finished.status == "completed", finished.error
    assert [rollout(engine, r.id).reward_source for r in queued] == ["human"] * 4


def test_two_labellers_see_their_own_progress_disagree_and_a_reviewer_decides_with_the_evidence(engine):
    _run_id, queued = waiting_run(engine, labels_per_rollout=2, criteria="Name the quantity asked for.")
    first = queued[0]
    at = open_page("alice")
    assert any(c.value.endswith("label 1 of 2") for c in at.caption)
    for _ in queued:
        label(at, 5)
    assert rollout(engine, first.id).label_status == "needed"
    assert progress_line(at) == "You: 4 done; 4 wait for a second labeller; 0 left for you"
    assert bar(at) == (0, "0 of 4 rollouts have all their labels")

    at.session_state[REVIEWER_KEY] = "bob"
    at.run()
    assert shown_rollout(at) == first.id
    assert any(c.value.endswith("label 2 of 2") for c in at.caption)
    at.text_input(key=f"label_comment_{first.id}").input("the number is wrong")
    click(at, "label_score_1")
    for _ in queued[1:]:
        label(at, 5)

    disputed = rollout(engine, first.id)
    assert (disputed.label_status, disputed.reward) == ("disputed", 0.5)
    assert progress_line(at) == "You: 4 done; 0 wait for a second labeller; 0 left for you"
    assert bar(at) == (100, "4 of 4 rollouts have all their labels · 1 disputed, for a reviewer")
    disagreements = table_with(at, "reward now")
    assert disagreements[["rollout", "labels", "score now", "reward now"]].values.tolist() == [
        [first.id, "alice 5, bob 1", 3, 0.5]]
    pairs = table_with(at, "Cohen's kappa")
    assert pairs[["labeller A", "labeller B", "n"]].values.tolist() == [["alice", "bob", 4]]

    at.session_state[REVIEWER_KEY] = "rita"
    at.run()
    assert dispute_picker(at).value == first.id
    with Session(engine) as session:
        sample = queries.samples_by_ids(session, [first.sample_id])[0]
    for evidence in (sample.query, sample.reference, first.response, "Name the quantity asked for."):
        assert evidence in codes(at)
    [shown] = [t.value for t in at.dataframe if "score" in t.value.columns and "rollout" not in t.value.columns]
    assert shown[["labeller", "kind", "score", "comment"]].values.tolist() == [
        ["alice", "label", 5, ""], ["bob", "label", 1, "the number is wrong"]]
    click(at, f"label_decide_{first.id}")
    assert "Choose the final score before deciding; nothing was saved." in [w.value for w in at.warning]
    assert len(labels(engine)) == 8
    at.radio(key=f"label_decide_score_{first.id}").set_value(4)
    at.text_input(key=f"label_decide_comment_{first.id}").input("partly right")
    click(at, f"label_decide_{first.id}")

    decided = rollout(engine, first.id)
    assert (decided.label_status, decided.reward, decided.reward_source) == ("done", 0.75, "human")
    decision = labels(engine)[-1]
    assert (decision.kind, decision.labeler, decision.value, decision.comment) == ("decision", "rita", 0.75,
                                                                                   "partly right")
    assert not [t for t in at.dataframe if "reward now" in t.value.columns]
    assert "No disagreement waits for a decision." in [c.value for c in at.caption]


def disputes(engine, count: int = 4) -> list[Rollout]:
    """The waiting run's rollouts, each labelled 5 by alice and 1 by bob: `count` disputes for a reviewer."""
    from core.records.review.labeling import submit_label

    _run_id, queued = waiting_run(engine, labels_per_rollout=2)
    for item in queued[:count]:
        submit_label(engine, item.id, 1.0, "alice")
        submit_label(engine, item.id, 0.0, "bob")
    assert [rollout(engine, r.id).label_status for r in queued[:count]] == ["disputed"] * count
    return queued[:count]


def decide_widget_keys(at) -> set[str]:
    return {w.key for w in [*at.radio, *at.text_input, *at.button] if w.key and w.key.startswith("label_decide")}


def test_each_dispute_has_its_own_form_and_a_decision_leaves_nothing_for_the_next(engine):
    first, second, *_ = disputes(engine)
    at = open_page("rita")
    assert dispute_picker(at).value == first.id
    assert f"Deciding rollout {first.id} · sample {first.sample_id}" in captions(at)
    assert decide_widget_keys(at) == {f"label_decide_score_{first.id}", f"label_decide_comment_{first.id}",
                                      f"label_decide_{first.id}"}
    assert at.button(key=f"label_decide_{first.id}").label == f"Decide rollout {first.id}"
    at.radio(key=f"label_decide_score_{first.id}").set_value(4)
    at.text_input(key=f"label_decide_comment_{first.id}").input("partly right")
    click(at, f"label_decide_{first.id}")

    assert [t.value for t in at.toast] == [f"Rollout {first.id} decided: 4."]
    assert dispute_picker(at).value == second.id
    assert decide_widget_keys(at) == {f"label_decide_score_{second.id}", f"label_decide_comment_{second.id}",
                                      f"label_decide_{second.id}"}
    assert at.radio(key=f"label_decide_score_{second.id}").value is None
    assert at.text_input(key=f"label_decide_comment_{second.id}").value == ""
    click(at, f"label_decide_{second.id}")
    assert "Choose the final score before deciding; nothing was saved." in [w.value for w in at.warning]
    assert [(row.rollout_id, row.value, row.comment) for row in labels(engine) if row.kind == "decision"] == [
        (first.id, 0.75, "partly right")]
    assert rollout(engine, second.id).label_status == "disputed"


def test_agreement_and_history_show_scores_on_the_scale_labellers_pressed(engine):
    """A 1-5 task: labels pressed 5 and 1 read 5 and 1 (not 1 and 0), and a decision of 4 reads 4."""
    first, second, *_ = disputes(engine, count=2)
    at = open_page("rita")
    disagreements = table_with(at, "reward now")
    assert disagreements[["rollout", "labels", "score now", "reward now"]].values.tolist() == [
        [first.id, "alice 5, bob 1", 3, 0.5], [second.id, "alice 5, bob 1", 3, 0.5]]
    at.radio(key=f"label_decide_score_{first.id}").set_value(4)
    click(at, f"label_decide_{first.id}")

    [history] = [t.value for t in at.dataframe if {"rollout", "labeller"} <= set(t.value.columns)]
    assert history[["rollout", "labeller", "score", "value", "kind"]].values.tolist() == [
        [first.id, "rita", 4, 0.75, "decision"], [second.id, "bob", 1, 0.0, "label"],
        [second.id, "alice", 5, 1.0, "label"], [first.id, "bob", 1, 0.0, "label"], [first.id, "alice", 5, 1.0, "label"]]
    note = "Scores on the 1-5 scale labellers press; value and reward are the reward in 0-1"
    assert sum(c.startswith(note) for c in captions(at)) == 2  # under the disagreements and the history


def test_a_labeller_cannot_decide_a_disagreement(engine):
    _run_id, queued = waiting_run(engine, labels_per_rollout=2)
    for name, role in (("lena", "labeler"), ("lars", "labeler")):
        add_user(engine, name, role, "a long enough password", actor="system")
    at = open_page(**{AUTH_KEY: "lena"})
    label(at, 5)
    at.session_state[AUTH_KEY] = "lars"
    at.run()
    label(at, 1)

    assert rollout(engine, queued[0].id).label_status == "disputed"
    assert table_with(at, "reward now")["rollout"].tolist() == [queued[0].id]
    assert not [b for b in at.button if b.key.startswith("label_decide")]
    assert any("Deciding disagreements needs the reviewer role" in i.value for i in at.info)
    assert [(row.labeler, row.kind) for row in labels(engine)] == [("lena", "label"), ("lars", "label")]


def test_the_judge_suggestion_is_shown_and_accepted_with_one_key(engine):
    _run_id, queued = waiting_run(engine, "judge_human", spot_check_share=0,
                                  criteria="Name the quantity the question asks for.")
    first = rollout(engine, queued[0].id)
    assert (first.suggested_reward, first.judge_unsure) == (0.75, True)
    at = open_page()

    assert "Judge suggestion: 4 (0.75) · judge unsure" in captions(at)
    assert first.suggested_detail in codes(at)
    assert "Polite but it never names the quantity asked for." in first.suggested_detail
    assert "Name the quantity the question asks for." in codes(at)
    accept = at.button(key="label_accept")
    assert accept.label == "Accept judge (A): 4"
    click(at, "label_accept")

    [row] = labels(engine)
    assert (row.rollout_id, row.value, row.labeler, row.comment) == (first.id, 0.75, "alice",
                                                                     "accepted the judge's suggestion")
    assert shown_rollout(at) == queued[1].id
    label(at, 2)
    assert (rollout(engine, queued[1].id).reward, rollout(engine, queued[1].id).suggested_reward) == (0.25, 0.75)


# ---- conversations, labelled per criterion ----------------------------------------------------------------


def conversation_queue(engine, scripted, limit: int = 2, **overrides) -> list[Rollout]:
    """An evaluation of the conversation demo whose conversations all wait for a label (spot-check share 1),
    with the judge's per-criterion scores (empathy 4, discovery 3, resolution 5) as suggestions."""
    from tests.test_labeling_criteria import replies

    task = ensure_conversation_task(engine)
    with db.session_scope(engine) as session:
        row = get_task(session, CONVERSATION_TASK)
        row.reward_settings = {**row.reward_settings, "spot_check_share": 1.0}
        session.add(row)
    _, gateway = scripted(engine, **replies(**overrides))
    eval_id = create_evaluation(engine, CONVERSATION_TASK, "empty", split="test", k=1, limit=limit,
                                created_by="system")
    evaluation = execute_evaluation(engine, eval_id, gateway=gateway)
    assert evaluation.status == "awaiting_labels", evaluation.error
    with Session(engine) as session:
        rows = sorted(queries.evaluation_rollouts(session, eval_id), key=lambda r: r.id)
        session.expunge_all()
    assert task.kind == "conversation" and all(r.label_status == "needed" and r.scores for r in rows)
    return rows


def test_a_conversation_is_shown_turn_by_turn_and_labelled_per_criterion(engine, scripted):
    first, second = conversation_queue(engine, scripted)
    with Session(engine) as session:
        sample = queries.samples_by_ids(session, [first.sample_id])[0]
    at = open_page(**{TASK_KEY: CONVERSATION_TASK})
    assert shown_rollout(at) == first.id
    scenario = next(c for c in codes(at) if c.startswith("Persona: "))
    assert scenario.startswith(f"Persona: {sample.meta['persona']}\nGoal: {sample.reference}\n"
                               f"Opening: {sample.query}")
    turn_captions = [c for c in captions(at) if c.startswith("Turn ")]
    assert turn_captions[:3] == ["Turn 1 · User", "Turn 2 · Agent", "Turn 3 · User"]
    assert sample.query in codes(at) and "I am sorry to hear that. Could you give me your order number?" in codes(at)
    assert not any("Could you give me your order number" in text or sample.query in text
                   for text in markdown_texts(at))  # model and scenario text only as plain text
    assert "Judge suggestion: 0.81" in captions(at)
    assert not [b for b in at.button if b.key.startswith("label_score_")]  # no single-score keys
    empathy = at.radio(key=f"label_criterion_{first.id}_0")
    assert empathy.label == "empathy · weight 1" and empathy.value is None  # the judge's score is marked, not chosen
    assert empathy.options == ["1 · wrong or unusable", "2 · mostly wrong", "3 · partly right",
                               "4 · right, minor gaps · judge", "5 · fully correct and complete"]
    assert at.radio(key=f"label_criterion_{first.id}_2").label == "resolution · weight 2"

    at.radio(key=f"label_criterion_{first.id}_0").set_value(5)
    at.radio(key=f"label_criterion_{first.id}_1").set_value(1)
    click(at, f"label_criteria_submit_{first.id}")  # resolution is not scored yet
    assert labels(engine) == [] and shown_rollout(at) == first.id
    assert any("no score for criteria resolution" in e.value for e in at.error)

    at.radio(key=f"label_criterion_{first.id}_2").set_value(3)
    at.text_input(key=f"label_comment_{first.id}").input("solved half of it")
    click(at, f"label_criteria_submit_{first.id}")

    [row] = labels(engine)
    assert (row.rollout_id, row.labeler, row.kind, row.comment) == (first.id, "alice", "label", "solved half of it")
    assert row.scores == {"empathy": 5, "discovery": 1, "resolution": 3}
    assert row.value == pytest.approx((1.0 + 0.0 + 2 * 0.5) / 4)
    after = rollout(engine, first.id)
    assert (after.reward, after.reward_source, after.label_status) == (pytest.approx(0.5), "human", "done")
    assert shown_rollout(at) == second.id
    assert at.radio(key=f"label_criterion_{second.id}_0").value is None
    history = table_with(at, "criteria")
    assert history[["rollout", "value", "criteria"]].values.tolist() == [
        [first.id, 0.5, "empathy 5, discovery 1, resolution 3"]]

    click(at, "label_accept")  # the judge's scores, marked as accepted
    accepted = labels(engine)[-1]
    assert accepted.scores == {"empathy": 4, "discovery": 3, "resolution": 5}
    assert accepted.comment == "accepted the judge's suggestion"
    assert shown_rollout(at) is None and run_status_of_evaluation(engine, first.evaluation_id) == "queued"


def test_a_broken_rule_is_shown_with_what_it_means_for_the_label(engine, scripted):
    [queued] = conversation_queue(engine, scripted, limit=1, rollout="Please send me your full card number.")
    at = open_page(**{TASK_KEY: CONVERSATION_TASK})
    [warning] = [w.value for w in at.warning if "no card details" in w.value]
    assert "must-not rule “no card details” broken in turn 2" in warning
    assert "reward stays 0 whatever you score" in warning
    for index in range(3):
        at.radio(key=f"label_criterion_{queued.id}_{index}").set_value(5)
    click(at, f"label_criteria_submit_{queued.id}")
    [row] = labels(engine)
    assert row.value == 0.0 and row.scores == {"empathy": 5, "discovery": 5, "resolution": 5}


def run_status_of_evaluation(engine, evaluation_id: int) -> str:
    with Session(engine) as session:
        return session.get(Evaluation, evaluation_id).status


def test_a_reviewer_decides_a_conversation_disagreement_per_criterion(engine, scripted):
    from core.records.review.labeling import submit_criteria_label

    ensure_conversation_task(engine)
    with db.session_scope(engine) as session:  # two labels per conversation
        task = get_task(session, CONVERSATION_TASK)
        task.reward_settings = {**task.reward_settings, "labels_per_rollout": 2}
        session.add(task)
    [queued] = conversation_queue(engine, scripted, limit=1)
    submit_criteria_label(engine, queued.id, {"empathy": 5, "discovery": 5, "resolution": 5}, "alice")
    submit_criteria_label(engine, queued.id, {"empathy": 1, "discovery": 1, "resolution": 2}, "bob", "rude")
    assert rollout(engine, queued.id).label_status == "disputed"

    at = open_page("rita", **{TASK_KEY: CONVERSATION_TASK})
    assert dispute_picker(at).value == queued.id
    assert "I am sorry to hear that. Could you give me your order number?" in codes(at)
    [shown] = [t.value for t in at.dataframe if "criteria" in t.value.columns and "rollout" not in t.value.columns]
    assert shown[["labeller", "criteria", "comment"]].values.tolist() == [
        ["alice", "empathy 5, discovery 5, resolution 5", ""], ["bob", "empathy 1, discovery 1, resolution 2", "rude"]]
    for index, score in enumerate((3, 3, 4)):
        at.radio(key=f"label_decide_criterion_{queued.id}_{index}").set_value(score)
    at.text_input(key=f"label_decide_comment_{queued.id}").input("fair, slow")
    click(at, f"label_decide_{queued.id}")

    decided = rollout(engine, queued.id)
    assert (decided.label_status, decided.reward) == ("done", pytest.approx((0.5 + 0.5 + 2 * 0.75) / 4))
    decision = labels(engine)[-1]
    assert (decision.kind, decision.labeler, decision.comment, decision.scores) == (
        "decision", "rita", "fair, slow", {"empathy": 3, "discovery": 3, "resolution": 4})
    assert "No disagreement waits for a decision." in captions(at)
