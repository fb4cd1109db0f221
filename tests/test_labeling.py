"""The labeling queue (core.records.review.labeling): runs and evaluations wait for labels, labels settle rewards,
agreement between labellers, and a label overriding an automatic reward."""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session, select

from core.errors import InvalidInput, PermissionDenied
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.grpo.training import RunSettings, create_run, execute_run
from core.records.people.users import add_user
from core.records.review.labeling import (
    ACCEPTED,
    accept_suggestion,
    agreement,
    cohen_kappa,
    decide_label,
    fleiss_kappa,
    next_item,
    progress,
    spot_checked,
    submit_label,
)
from core.records.tasks.demos import DEMO_TASK, SUPPORT_TASK, ensure_demo_tasks
from storage import queries
from storage.db import session_scope
from storage.queries import label_history
from storage.tables import (
    Advantage,
    AuditEvent,
    Evaluation,
    LibraryVersion,
    RewardLabel,
    Rollout,
    Run,
    Step,
    Task,
)
from tests.ui_support import scripted_gateway, seeded_run


def set_reward(engine, method: str, **settings) -> Task:
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        task.reward_method, task.reward_settings = method, settings
        session.add(task)
        return task


def rollouts(engine, **where) -> list[Rollout]:
    with Session(engine) as session:
        query = select(Rollout).order_by(Rollout.id)
        for name, value in where.items():
            query = query.where(getattr(Rollout, name) == value)
        return list(session.exec(query))


def task_row(engine) -> Task:
    with Session(engine) as session:
        return session.exec(select(Task).where(Task.name == DEMO_TASK)).one()


def run_status(engine, run_id: int) -> str:
    with Session(engine) as session:
        return session.get(Run, run_id).status


def judge_reply(score: int, confident: bool = True) -> str:
    return json.dumps({"reason": f"scored {score}", "score": score, "confident": confident})


def test_a_human_rewarded_run_waits_for_its_batch_and_continues_once_labelled(engine, demo_task):
    set_reward(engine, "human")
    run_id = seeded_run(engine, "auto")
    assert run_status(engine, run_id) == "awaiting_labels"
    queued = rollouts(engine, label_status="needed")
    assert len(queued) == 4 and all(r.reward is None for r in queued)

    # one right and one wrong answer per query, so both groups are mixed (rollout ids interleave the queries)
    given = {r.id: 1.0 if r.group_index == 0 else 0.0 for r in queued}
    for rollout_id, value in given.items():
        assert run_status(engine, run_id) == "awaiting_labels"
        submit_label(engine, rollout_id, value, "ann")
    assert run_status(engine, run_id) == "queued"
    assert {r.id: r.reward for r in rollouts(engine)} == given
    assert {r.reward_source for r in rollouts(engine)} == {"human"}

    _model, gateway = scripted_gateway(engine)
    finished = execute_run(engine, run_id, gateway=gateway)
    assert finished.status == "completed"
    with Session(engine) as session:
        assert len(session.exec(select(LibraryVersion)).all()) == 2  # the labels gave a mixed group -> an ADD
        actions = [e.action for e in session.exec(select(AuditEvent))]
    assert actions.count("rollout.label") == 4 and "run.labels_complete" in actions


def test_the_queue_gives_each_person_what_they_have_not_labelled_and_skips_come_last(engine, demo_task):
    set_reward(engine, "human", labels_per_rollout=2)
    seeded_run(engine, "auto")
    task = task_row(engine)
    with Session(engine) as session:
        first = next_item(session, task, "ann")
        skipped = next_item(session, task, "ann", skip=[first.rollout.id])
        assert skipped.rollout.id != first.rollout.id
    submit_label(engine, first.rollout.id, 1.0, "ann")
    with Session(engine) as session:
        assert next_item(session, task, "ann").rollout.id != first.rollout.id
        assert next_item(session, task, "bob").rollout.id == first.rollout.id  # needs a second person
        mine = progress(session, task, "ann")
        assert (mine.needed, mine.mine_to_do) == (4, 3)
        only_left = [r.id for r in rollouts(engine) if r.id != first.rollout.id]
        assert next_item(session, task, "ann", skip=only_left).rollout.id in only_left  # skipped comes back


def test_labels_on_a_scale_must_be_points_of_it(engine, demo_task):
    set_reward(engine, "human", scale="1-5")
    seeded_run(engine, "auto")
    target = rollouts(engine)[0]
    with pytest.raises(ValueError, match="one of 0, 0.25, 0.5, 0.75, 1"):
        submit_label(engine, target.id, 0.6, "ann")
    submit_label(engine, target.id, 0.75, "ann")
    assert rollouts(engine)[0].reward == 0.75


def test_disagreement_is_disputed_with_the_mean_until_a_reviewer_decides(engine, demo_task):
    set_reward(engine, "human", labels_per_rollout=2)
    run_id = seeded_run(engine, "auto")
    first, *rest = rollouts(engine)
    submit_label(engine, first.id, 1.0, "ann", comment="clear and right")
    submit_label(engine, first.id, 0.0, "bob", comment="wrong number")
    row = rollouts(engine)[0]
    assert (row.label_status, row.reward) == ("disputed", 0.5)
    task = task_row(engine)
    with Session(engine) as session:
        found = agreement(session, task)
    assert [d["rollout"] for d in found.disagreements] == [first.id]

    decide_label(engine, first.id, 1.0, "carol", comment="the answer is right")
    row = rollouts(engine)[0]
    assert (row.label_status, row.reward, row.reward_source) == ("done", 1.0, "human")
    with Session(engine) as session:
        assert [h.kind for h in label_history(session, first.id)] == ["label", "label", "decision"]
    for rollout in rest:  # both agree on the others: the run continues though one was disputed
        submit_label(engine, rollout.id, 0.0, "ann")
        submit_label(engine, rollout.id, 0.0, "bob")
    assert run_status(engine, run_id) == "queued"


def test_a_label_overrides_a_verifier_reward_and_keeps_the_automatic_one(engine, demo_task):
    seeded_run(engine, "auto", epochs=1)
    scored = rollouts(engine)[0]
    assert scored.reward_source == "verifier" and scored.label_status is None
    submit_label(engine, scored.id, 1.0 - scored.reward, "ann", comment="the verifier misread it")
    row = rollouts(engine)[0]
    assert row.reward == 1.0 - scored.reward and row.reward_source == "human"
    assert (row.suggested_reward, row.suggested_detail) == (scored.reward, scored.reward_detail)


def test_judge_human_queues_the_unsure_and_the_spot_check_share_only(engine, demo_task):
    set_reward(engine, "judge_human", spot_check_share=0.0)
    unsure = iter([False, True, True, True])  # the first rollout's verdict is unsure
    run_id = seeded_run(engine, "auto", judge=lambda _m: judge_reply(1, confident=next(unsure)))
    assert run_status(engine, run_id) == "awaiting_labels"
    rows = rollouts(engine)
    queued = [r for r in rows if r.label_status == "needed"]
    assert len(queued) == 1 and queued[0].judge_unsure and queued[0].suggested_reward == 1.0
    assert all(r.reward == 1.0 and r.reward_source == "judge" for r in rows if r.label_status is None)


def test_spot_check_choice_is_stable_and_near_the_share(engine, demo_task):
    task = set_reward(engine, "judge_human", spot_check_share=0.3)
    keys = [f"step:{i}" for i in range(2000)]
    chosen = [spot_checked(task, k) for k in keys]
    assert chosen == [spot_checked(task, k) for k in keys]
    assert 0.25 < sum(chosen) / len(chosen) < 0.35


def test_an_evaluation_waits_for_labels_then_scores_them(engine, demo_task):
    set_reward(engine, "human")
    evaluation_id = create_evaluation(engine, DEMO_TASK, "empty", split="test", k=1, limit=2, created_by="cli")
    _model, gateway = scripted_gateway(engine)
    assert execute_evaluation(engine, evaluation_id, gateway=gateway).status == "awaiting_labels"
    for rollout, value in zip(rollouts(engine, evaluation_id=evaluation_id), [1.0, 0.0], strict=True):
        submit_label(engine, rollout.id, value, "ann")
    with Session(engine) as session:
        assert session.get(Evaluation, evaluation_id).status == "queued"
    done = execute_evaluation(engine, evaluation_id, gateway=gateway)
    assert (done.status, done.mean_at_k) == ("completed", 0.5)


def test_only_people_with_a_role_may_label_and_only_reviewers_decide(engine, demo_task):
    set_reward(engine, "human")
    seeded_run(engine, "auto")
    add_user(engine, "lab", "labeler", "password1")
    target = rollouts(engine)[0]
    with pytest.raises(PermissionDenied, match="is not a signed-in user"):
        submit_label(engine, target.id, 1.0, "stranger")
    with pytest.raises(PermissionDenied, match="lab is a labeler; deciding a disputed label needs the reviewer"):
        decide_label(engine, target.id, 1.0, "lab")
    submit_label(engine, target.id, 1.0, "lab")
    assert rollouts(engine)[0].reward == 1.0


def test_kappa_matches_worked_examples():
    # Cohen: two raters, 50 items: 20 yes/yes, 15 no/no, 5 yes/no, 10 no/yes -> po 0.7, pe 0.5, kappa 0.4.
    a = [1] * 20 + [0] * 15 + [1] * 5 + [0] * 10
    b = [1] * 20 + [0] * 15 + [0] * 5 + [1] * 10
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert cohen_kappa([1, 0, 1], [1, 0, 1]) == pytest.approx(1.0)
    # Fleiss (Wikipedia's example: 10 items, 14 raters, 5 categories) -> 0.210.
    table = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
             [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]
    assert fleiss_kappa(table) == pytest.approx(0.210, abs=0.001)
    assert fleiss_kappa([[2, 0], [1, 1]]) is not None and fleiss_kappa([]) is None


def test_agreement_over_the_queue(engine, demo_task):
    set_reward(engine, "human", labels_per_rollout=2)
    seeded_run(engine, "auto")
    for rollout, (x, y) in zip(rollouts(engine), [(1, 1), (0, 0), (1, 0), (0, 0)], strict=True):
        submit_label(engine, rollout.id, x, "ann")
        submit_label(engine, rollout.id, y, "bob")
    with Session(engine) as session:
        found = agreement(session, task_row(engine))
    assert (found.items, found.raters_per_item) == (4, 2)
    kappa, n = found.cohen[("ann", "bob")]
    assert n == 4 and kappa == pytest.approx(cohen_kappa([1, 0, 1, 0], [1, 0, 0, 0]))
    assert found.fleiss == pytest.approx(fleiss_kappa([[0, 2], [2, 0], [1, 1], [2, 0]]))
    assert len(found.disagreements) == 1


def label_rows(engine) -> list[tuple[int, str, float]]:
    with Session(engine) as session:
        return [(r.rollout_id, r.labeler, r.value) for r in session.exec(select(RewardLabel).order_by(RewardLabel.id))]


def test_a_label_from_the_queue_is_written_once_per_person_and_rollout(engine, demo_task):
    set_reward(engine, "human", labels_per_rollout=2)
    seeded_run(engine, "auto")
    target = rollouts(engine)[0]
    first = submit_label(engine, target.id, 1.0, "ann", once=True)
    again = submit_label(engine, target.id, 0.0, "ann", once=True)  # a doubled key press
    assert (first.repeated, again.repeated) == (False, True)
    assert again.rollout.id == target.id and not again.released
    assert label_rows(engine) == [(target.id, "ann", 1.0)]
    assert rollouts(engine)[0].label_status == "needed"  # still one label of the two it needs
    submit_label(engine, target.id, 0.0, "bob", once=True)
    submit_label(engine, target.id, 1.0, "ann")  # a correction elsewhere (not once) is kept: the newest counts
    assert label_rows(engine)[-2:] == [(target.id, "bob", 0.0), (target.id, "ann", 1.0)]


def test_accepting_the_suggestion_labels_its_nearest_scale_point_once(engine, demo_task):
    set_reward(engine, "human", scale="1-5")
    seeded_run(engine, "auto")
    target, other, *_ = rollouts(engine)
    with session_scope(engine) as session:
        row = session.get(Rollout, target.id)
        row.suggested_reward = 0.7  # a verifier's reward between two points
        session.add(row)
    done = accept_suggestion(engine, target.id, "ann")
    assert not done.repeated and done.rollout.reward == 0.75
    assert accept_suggestion(engine, target.id, "ann", "again").repeated
    with Session(engine) as session:
        [label] = label_history(session, target.id)
    assert (label.value, label.labeler, label.comment) == (0.75, "ann", ACCEPTED)
    with pytest.raises(InvalidInput, match="no suggested reward"):
        accept_suggestion(engine, other.id, "ann")
    with Session(engine) as session:
        assert label_history(session, other.id) == []


def test_progress_counts_each_persons_share_and_complete_rollouts(engine, demo_task):
    set_reward(engine, "human", labels_per_rollout=2)
    seeded_run(engine, "auto")
    first, second, *rest = rollouts(engine)
    for rollout in (first, second, *rest):
        submit_label(engine, rollout.id, 1.0, "ann")
    submit_label(engine, first.id, 1.0, "bob")
    submit_label(engine, second.id, 0.0, "bob")
    task = task_row(engine)
    with Session(engine) as session:
        ann, bob, queue = progress(session, task, "ann"), progress(session, task, "bob"), progress(session, task)
    assert (ann.mine_done, ann.mine_waiting, ann.mine_to_do) == (4, 2, 0)
    assert (bob.mine_done, bob.mine_waiting, bob.mine_to_do) == (2, 0, 2)
    assert (queue.needed, queue.done, queue.disputed, queue.complete, queue.total) == (2, 1, 1, 2, 4)
    assert (queue.mine_done, queue.mine_waiting, queue.mine_to_do) == (0, 0, 0)


def test_a_support_run_waits_for_its_spot_checks_then_continues(engine):
    """The customer-support demo (judge_human) with every rollout spot-checked: the run waits with the judge's
    verdicts as suggestions, is released by the last label, and continues from the labels without sampling again.

    Moved off the real model (it was test_model_e2e.py::test_a_support_run_waits_for_spot_checks_then_continues):
    the embedded judge under a JSON schema is test_model_e2e.py::test_the_embedded_judge_scores_a_support_reply,
    the embedded model's path through a run test_model_e2e.py::test_train_and_eval_on_the_embedded_model."""
    ensure_demo_tasks(engine)
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == SUPPORT_TASK)).one()
        assert task.reward_method == "judge_human"
        task.reward_settings = {**task.reward_settings, "spot_check_share": 1.0}
        session.add(task)
        sample = queries.samples(session, task.id, "train", limit=1)[0]
    replies = iter(["I'm sorry about the double charge; it goes back to your card within 3-5 business days.",
                    "Not our problem. Talk to your bank."])
    model, gateway = scripted_gateway(engine, rollout=lambda _m: next(replies), judge=judge_reply(4))
    settings = RunSettings(epochs=1, batch_size=1, group_size=2, limit=1, review_mode="auto", max_tokens=200,
                           hold_flagged=False, learner_max_tokens=600, max_operations=1, gate="off")
    run_id = create_run(engine, SUPPORT_TASK, settings)

    assert execute_run(engine, run_id, gateway=gateway).status == "awaiting_labels"
    waiting = rollouts(engine)
    assert len(waiting) == 2 and all(r.sample_id == sample.id and r.response for r in waiting)
    assert [r.label_status for r in waiting] == ["needed", "needed"]
    assert all(r.reward is None and r.suggested_reward == 0.75 and r.suggested_detail.startswith("judge 4/5: ")
               for r in waiting)
    with Session(engine) as session:
        assert session.exec(select(Step)).one().status == "awaiting_labels"
        assert not session.exec(select(Advantage)).all()
    assert model.count("judge") == 2 and model.count("summary") == 0

    first, second = (r.id for r in waiting)
    labelled = submit_label(engine, first, 1.0, "cli")
    assert labelled.rollout.label_status == "done" and not labelled.released
    assert run_status(engine, run_id) == "awaiting_labels"  # one rollout still open
    labelled = submit_label(engine, second, 0.25, "cli")
    assert labelled.rollout.reward == 0.25 and labelled.released
    assert run_status(engine, run_id) == "queued"

    assert execute_run(engine, run_id, gateway=gateway).status == "completed"
    assert [(r.reward, r.reward_source, r.label_status) for r in rollouts(engine)] == [(1.0, "human", "done"),
                                                                                      (0.25, "human", "done")]
    with Session(engine) as session:
        assert session.exec(select(Step)).one().status == "completed"
        assert session.exec(select(Advantage)).one().status == "ok"  # the labels made the group mixed
    assert model.count("rollout") == 2 and model.count("judge") == 2  # nothing was sampled or judged again
