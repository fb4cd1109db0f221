"""Labelling a conversation per rubric criterion (core.records.review.labeling.submit_criteria_label): the scores are checked
against the task's criteria, the label keeps them raw and is worth their weighted mean, and from there it is a
label like any other (roles, audit, once, agreement, disputes, the waiting evaluation queued again). The queue
item carries the scenario, the turns, the criteria with their anchors and the judge's scores and rule findings."""

from __future__ import annotations

import asyncio
import json

import pytest
from sqlmodel import Session, select

from core.errors import InvalidInput, PermissionDenied
from core.grpo.agent import agent_settings
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.grpo.rollouts import stored_rollout
from core.models.gateway import Scope
from core.models.judge import GENERIC_ANCHORS
from core.records.people.users import add_user
from core.records.review.labeling import (
    ACCEPTED,
    accept_suggestion,
    agree,
    agreement,
    decide_criteria_label,
    decide_label,
    label_scale,
    next_item,
    submit_criteria_label,
    submit_label,
)
from core.records.tasks.demo_data import conversation_demo
from core.records.tasks.demos import CONVERSATION_TASK, DEMO_TASK, ensure_conversation_task
from core.records.tasks.lookup import get_task
from storage import queries
from storage.db import session_scope
from storage.tables import AuditEvent, Evaluation, RewardLabel, Rollout, Sample, Task
from tests.ui_support import seeded_run

SCORES = {"empathy": 5, "discovery": 1, "resolution": 3}
WEIGHTED = (1.0 + 0.0 + 2 * 0.5) / 4  # resolution weighs 2
CARD = "Please send me your full card number."


def must_not_statements() -> set[str]:
    return {text for row in conversation_demo()[1] for text in row.meta["must_not"]}


def judge(empathy: int = 4, discovery: int = 3, resolution: int = 5, *, unsure: bool = False,
          must_holds: bool = True):
    """The judge: a rule's question answered (a must-not was avoided; a must holds as asked), or the rubric."""
    def reply(messages: list[dict]) -> str:
        if "You check one rule" in messages[0]["content"]:
            question = messages[1]["content"].split("Question: ", 1)[1].split("\n", 1)[0]
            holds = True if any(text in question for text in must_not_statements()) else must_holds  # avoided
            return json.dumps({"holds": holds, "turn": 2, "reason": "the agent never offered a colleague"})
        return json.dumps({"criteria": {"empathy": {"score": empathy, "reason": "calm"},
                                        "discovery": {"score": discovery, "reason": "asked once"},
                                        "resolution": {"score": resolution, "reason": "a next step"}},
                           "unsure": unsure})
    return reply


def simulator(messages: list[dict]) -> str:
    return "Fine, thanks. [END]" if sum(m["role"] == "assistant" for m in messages) >= 3 else "It is NW-48213."


def replies(**overrides) -> dict:
    return {"rollout": "I am sorry to hear that. Could you give me your order number?", "simulator": simulator,
            "judge": judge(), **overrides}


@pytest.fixture
def conversation_task(engine) -> Task:
    return ensure_conversation_task(engine)


def set_settings(engine, **settings) -> Task:
    with session_scope(engine) as session:
        task = get_task(session, CONVERSATION_TASK)
        task.reward_settings = {**task.reward_settings, **settings}
        session.add(task)
        return task


def task_row(engine, name: str = CONVERSATION_TASK) -> Task:
    with Session(engine) as session:
        return get_task(session, name)


def rollout(engine, rollout_id: int) -> Rollout:
    with Session(engine) as session:
        return session.get(Rollout, rollout_id)


def labels(engine) -> list[RewardLabel]:
    with Session(engine) as session:
        return list(session.exec(select(RewardLabel).order_by(RewardLabel.id)))


def waiting_evaluation(engine, scripted, limit: int = 2, **overrides) -> tuple[int, list[Rollout]]:
    """An evaluation of the conversation task whose judge replies are unusable: every conversation waits."""
    _, gateway = scripted(engine, **replies(judge="not json", **overrides))
    eval_id = create_evaluation(engine, CONVERSATION_TASK, "empty", split="test", k=1, limit=limit,
                                created_by="system")
    evaluation = execute_evaluation(engine, eval_id, gateway=gateway)
    assert evaluation.status == "awaiting_labels", evaluation.error
    with Session(engine) as session:
        rows = list(session.exec(select(Rollout).where(Rollout.evaluation_id == eval_id).order_by(Rollout.id)))
    assert len(rows) == limit and all(r.label_status == "needed" and r.reward is None for r in rows)
    return eval_id, rows


def judged_rollout(engine, scripted, sample: Sample | None = None, **overrides) -> Rollout:
    """One conversation scored by the judge and put in the queue by the spot check (share 1)."""
    set_settings(engine, spot_check_share=1.0)
    task = task_row(engine)
    with Session(engine) as session:
        evaluation = Evaluation(task_id=task.id, split="train", model=task.policy_model)
        session.add(evaluation)
        session.commit()
        evaluation_id = evaluation.id
        sample = session.get(Sample, sample.id) if sample else queries.samples(session, task.id, "train")[0]
        session.expunge(sample)
    _, gateway = scripted(engine, **replies(**overrides))
    agent = agent_settings(task, model=task.policy_model, temperature=0.7)
    row = asyncio.run(stored_rollout(engine, gateway, agent, task, sample, group_index=0, sample_index=0,
                                     experiences=[], scope=Scope(evaluation_id=evaluation_id),
                                     evaluation_id=evaluation_id))
    assert row.label_status == "needed" and row.scores, row.reward_detail
    return row


# ---- validation and value -----------------------------------------------------------------------------


def test_a_per_criterion_label_is_worth_the_weighted_mean_and_keeps_the_raw_scores(engine, conversation_task,
                                                                                 scripted):
    _eval_id, queued = waiting_evaluation(engine, scripted, limit=1)
    result = submit_criteria_label(engine, queued[0].id, dict(SCORES), "ann", "resolution half done")

    [label] = labels(engine)
    assert (label.value, label.scores, label.kind, label.labeler) == (pytest.approx(WEIGHTED), SCORES, "label", "ann")
    assert list(label.scores) == ["empathy", "discovery", "resolution"]  # the rubric's order
    assert (result.rollout.reward, result.rollout.reward_source, result.rollout.label_status) == (
        pytest.approx(WEIGHTED), "human", "done")
    with Session(engine) as session:
        [event] = session.exec(select(AuditEvent).where(AuditEvent.action == "rollout.label")).all()
    assert event.after["scores"] == SCORES and event.after["value"] == pytest.approx(WEIGHTED)
    assert event.after["comment"] == "resolution half done"


def test_the_binary_criteria_of_a_rubric_are_scored_0_or_1(engine, conversation_task, scripted):
    set_settings(engine, rubric=[{"name": "polite", "scale": "binary", "weight": 3},
                                 {"name": "solved", "scale": "1-5", "weight": 1}])
    _eval_id, queued = waiting_evaluation(engine, scripted, limit=1)
    with pytest.raises(InvalidInput, match=r"criterion 'polite': score 2 is not on the binary scale \(0 to 1\)"):
        submit_criteria_label(engine, queued[0].id, {"polite": 2, "solved": 5}, "ann")
    submit_criteria_label(engine, queued[0].id, {"polite": 1, "solved": 1}, "ann")
    assert rollout(engine, queued[0].id).reward == pytest.approx(0.75)


@pytest.mark.parametrize(("scores", "problem"), [
    ({"empathy": 5, "discovery": 1}, "no score for criteria resolution"),
    ({**SCORES, "speed": 3}, "scores for unknown criteria speed"),
    ({**SCORES, "empathy": 6}, r"criterion 'empathy': score 6 is not on the 1-5 scale \(1 to 5\)"),
    ({**SCORES, "discovery": 0}, r"criterion 'discovery': score 0 is not on the 1-5 scale"),
    ({**SCORES, "discovery": 2.5}, r"criterion 'discovery': score 2.5 is not on the 1-5 scale"),
    ({**SCORES, "discovery": True}, r"criterion 'discovery': score True is not on the 1-5 scale"),
    ({**SCORES, "discovery": "3"}, r"criterion 'discovery': score '3' is not on the 1-5 scale"),
    ({}, "needs a score for each criterion"),
    ([5, 1, 3], "needs a score for each criterion"),
])
def test_scores_must_cover_every_criterion_on_its_scale_and_no_other(engine, conversation_task, scripted, scores,
                                                                     problem):
    _eval_id, queued = waiting_evaluation(engine, scripted, limit=1)
    with pytest.raises(InvalidInput, match=problem):
        submit_criteria_label(engine, queued[0].id, scores, "ann")
    assert labels(engine) == [] and rollout(engine, queued[0].id).label_status == "needed"


def test_a_task_without_a_rubric_takes_no_per_criterion_label(engine, demo_task):
    with session_scope(engine) as session:
        task = get_task(session, DEMO_TASK)
        task.reward_method, task.reward_settings = "human", {}
        session.add(task)
    seeded_run(engine, "auto")
    with Session(engine) as session:
        first = session.exec(select(Rollout).order_by(Rollout.id)).first()
    with pytest.raises(InvalidInput, match="is not scored by a rubric .*label it with one score"):
        submit_criteria_label(engine, first.id, {"correct": 1}, "ann")
    assert label_scale(task_row(engine, DEMO_TASK)) == "binary"


def test_a_single_value_on_a_rubric_task_is_a_point_of_the_five_point_grid(engine, conversation_task, scripted):
    _eval_id, queued = waiting_evaluation(engine, scripted, limit=1)
    assert label_scale(task_row(engine)) == "1-5"
    with pytest.raises(InvalidInput, match="one of 0, 0.25, 0.5, 0.75, 1"):
        submit_label(engine, queued[0].id, 0.6, "ann")
    submit_label(engine, queued[0].id, 0.75, "ann")
    assert rollout(engine, queued[0].id).reward == 0.75 and labels(engine)[0].scores is None


# ---- a label like any other ---------------------------------------------------------------------------


def test_roles_and_once_apply_as_to_any_label(engine, conversation_task, scripted):
    _eval_id, queued = waiting_evaluation(engine, scripted, limit=1)
    add_user(engine, "lab", "labeler", "password1")
    with pytest.raises(PermissionDenied, match="is not a signed-in user"):
        submit_criteria_label(engine, queued[0].id, SCORES, "stranger")
    with pytest.raises(PermissionDenied, match="lab is a labeler; deciding a disputed label needs the reviewer"):
        decide_criteria_label(engine, queued[0].id, SCORES, "lab")

    first = submit_criteria_label(engine, queued[0].id, SCORES, "lab", once=True)
    again = submit_criteria_label(engine, queued[0].id, {"empathy": 1, "discovery": 1, "resolution": 1}, "lab",
                                  once=True)
    assert (first.repeated, again.repeated) == (False, True)
    assert [label.scores for label in labels(engine)] == [SCORES]
    assert rollout(engine, queued[0].id).reward == pytest.approx(WEIGHTED)


def test_labelling_every_conversation_queues_the_waiting_evaluation_again(engine, conversation_task, scripted):
    eval_id, queued = waiting_evaluation(engine, scripted)
    first = submit_criteria_label(engine, queued[0].id, SCORES, "ann")
    assert not first.released
    last = submit_criteria_label(engine, queued[1].id, {"empathy": 5, "discovery": 5, "resolution": 5}, "ann")
    assert last.released
    with Session(engine) as session:
        assert session.get(Evaluation, eval_id).status == "queued"
        actions = [e.action for e in session.exec(select(AuditEvent))]
    assert actions.count("rollout.label") == 2 and "evaluation.labels_complete" in actions
    assert [rollout(engine, r.id).reward for r in queued] == [pytest.approx(WEIGHTED), 1.0]


def test_close_labels_agree_far_ones_are_disputed_and_a_reviewer_decides_per_criterion(engine, conversation_task,
                                                                                      scripted):
    set_settings(engine, labels_per_rollout=2)
    _eval_id, queued = waiting_evaluation(engine, scripted)
    near, far = queued
    submit_criteria_label(engine, near.id, {"empathy": 4, "discovery": 4, "resolution": 4}, "ann")  # 0.75
    assert rollout(engine, near.id).label_status == "needed"
    submit_criteria_label(engine, near.id, {"empathy": 5, "discovery": 4, "resolution": 4}, "bob")  # 0.8125
    agreed = rollout(engine, near.id)
    assert agreed.label_status == "done" and agreed.reward == pytest.approx((0.75 + 0.8125) / 2)

    submit_criteria_label(engine, far.id, {"empathy": 5, "discovery": 5, "resolution": 5}, "ann")  # 1
    submit_criteria_label(engine, far.id, {"empathy": 1, "discovery": 1, "resolution": 3}, "bob")  # 0.25
    disputed = rollout(engine, far.id)
    assert (disputed.label_status, disputed.reward) == ("disputed", pytest.approx(0.625))
    with Session(engine) as session:
        found = agreement(session, task_row(engine))
    assert [row["rollout"] for row in found.disagreements] == [far.id] and found.items == 2

    decided = decide_criteria_label(engine, far.id, {"empathy": 3, "discovery": 3, "resolution": 3}, "rita",
                                    "middling")
    assert (decided.rollout.label_status, decided.rollout.reward) == ("done", 0.5)
    assert labels(engine)[-1].kind == "decision" and labels(engine)[-1].scores == {
        "empathy": 3, "discovery": 3, "resolution": 3}
    decide_label(engine, far.id, 0.25, "rita", "on the grid")
    assert rollout(engine, far.id).reward == 0.25


def test_labels_agree_within_half_a_step_of_their_scale():
    assert agree([1.0, 1.0], "binary") and not agree([0.0, 1.0], "binary")
    assert agree([0.75, 0.75], "1-5") and not agree([0.5, 0.75], "1-5")  # points of a scale: the same point
    assert agree([0.625, 0.6875], "1-5")  # weighted means a sixteenth apart, on either side of a grid midpoint
    assert agree([0.5, 0.625], "1-5") and not agree([0.5, 0.6875], "1-5")
    assert not agree([0.5, 0.5625, 0.6875], "1-5")  # every pair counts, not neighbours


# ---- what the queue shows -----------------------------------------------------------------------------


def test_the_queue_item_carries_scenario_turns_criteria_anchors_and_the_judges_scores(engine, conversation_task,
                                                                                     scripted):
    row = judged_rollout(engine, scripted, judge=judge(empathy=4, discovery=3, resolution=5, unsure=True))
    with Session(engine) as session:
        item = next_item(session, task_row(engine), "ann")
        sample = session.get(Sample, row.sample_id)
    view = item.conversation
    assert item.rollout.id == row.id and item.scale == "1-5"
    assert (view.persona, view.opening, view.goal) == (sample.meta["persona"], sample.query, sample.reference)
    assert view.turns[0] == ("User", sample.query)
    assert [speaker for speaker, _ in view.turns] == ["User", "Agent", "User", "Agent", "User", "Agent", "User"]
    assert view.turns[-1] == ("User", "Fine, thanks.")
    assert [(c.name, c.scale, c.weight, c.suggested) for c in view.criteria] == [
        ("empathy", "1-5", 1.0, 4), ("discovery", "1-5", 1.0, 3), ("resolution", "1-5", 2.0, 5)]
    assert view.criteria[0].anchors == GENERIC_ANCHORS["1-5"] and "feelings" in view.criteria[0].description
    assert view.suggested_scores == {"empathy": 4, "discovery": 3, "resolution": 5}
    assert view.failed_rules == []


def test_an_unusable_judge_reply_suggests_no_scores(engine, conversation_task, scripted):
    _eval_id, queued = waiting_evaluation(engine, scripted, limit=1)
    with Session(engine) as session:
        item = next_item(session, task_row(engine), "ann")
    assert item.rollout.id == queued[0].id
    assert [c.suggested for c in item.conversation.criteria] == [None, None, None]
    assert item.conversation.suggested_scores is None
    with pytest.raises(InvalidInput, match="no suggested reward to accept"):
        accept_suggestion(engine, queued[0].id, "ann")


def test_a_broken_pattern_rule_keeps_the_persons_label_at_zero(engine, conversation_task, scripted):
    row = judged_rollout(engine, scripted, rollout=CARD)
    assert row.suggested_reward == 0.0
    with Session(engine) as session:
        item = next_item(session, task_row(engine), "ann")
    [finding] = item.conversation.failed_rules
    assert (finding.name, finding.kind, finding.turn, finding.holds_reward) == ("no card details", "must_not", 2,
                                                                                True)
    assert "broken in turn 2" in finding.reason
    submit_criteria_label(engine, row.id, {"empathy": 5, "discovery": 5, "resolution": 5}, "ann")
    [label] = labels(engine)
    assert label.value == 0.0 and label.scores == {"empathy": 5, "discovery": 5, "resolution": 5}
    assert rollout(engine, row.id).reward == 0.0


def test_a_person_overrides_a_rule_the_judge_was_asked_about(engine, conversation_task, scripted):
    with Session(engine) as session:
        must = next(s for s in queries.samples(session, conversation_task.id, "train") if s.meta["must"])
    row = judged_rollout(engine, scripted, sample=must, judge=judge(5, 5, 5, must_holds=False))
    assert row.suggested_reward == 0.0
    with Session(engine) as session:
        item = next_item(session, task_row(engine), "ann")
    failed = item.conversation.failed_rules
    assert failed and all(f.kind == "must" and not f.holds_reward and f.turn == 2 for f in failed)
    assert "never offered a colleague" in failed[0].reason
    submit_criteria_label(engine, row.id, SCORES, "ann")
    assert rollout(engine, row.id).reward == pytest.approx(WEIGHTED)


def test_accepting_the_judge_takes_its_scores_and_its_whole_verdict(engine, conversation_task, scripted):
    with Session(engine) as session:
        samples = queries.samples(session, conversation_task.id, "train")
        must = next(s for s in samples if s.meta["must"])
    row = judged_rollout(engine, scripted, sample=must, judge=judge(4, 3, 5, must_holds=False))
    accepted = accept_suggestion(engine, row.id, "ann", "fair")
    [label] = labels(engine)
    assert label.scores == {"empathy": 4, "discovery": 3, "resolution": 5}
    assert label.comment == f"{ACCEPTED}: fair"
    assert label.value == 0.0 == accepted.rollout.reward  # the judge's rule finding comes with its scores
    assert accept_suggestion(engine, row.id, "ann").repeated


def test_accepting_a_clean_verdict_gives_the_judges_reward(engine, conversation_task, scripted):
    row = judged_rollout(engine, scripted, judge=judge(4, 3, 5))
    accept_suggestion(engine, row.id, "ann")
    assert rollout(engine, row.id).reward == pytest.approx(row.suggested_reward) == pytest.approx((0.75 + 0.5 + 2) / 4)
