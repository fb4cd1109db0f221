"""Conversation tasks in the engine, with scripted model replies: rollouts played against the simulator and
stored turn by turn, scored by the rubric judge and the rules, learned from, and resumed mid-conversation."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from sqlmodel import Session, select

from core.grpo.agent import agent_settings
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.grpo.rollouts import stored_rollout
from core.grpo.training import RunSettings, create_run, execute_run
from core.models.gateway import Scope
from core.records.library.versions import import_library
from core.records.review.labeling import submit_label
from core.records.tasks.demo_data import conversation_demo
from core.records.tasks.demos import CONVERSATION_TASK, ensure_conversation_task
from core.records.tasks.lookup import get_task
from core.records.tasks.scenarios import personas_by_name, segment_of
from storage import queries
from storage.db import session_scope
from storage.statuses import JobStatus
from storage.tables import (
    Advantage,
    ConversationTurn,
    Evaluation,
    LibraryVersion,
    LLMCall,
    Rollout,
    Run,
    Sample,
)

LESSON = "Ask for the order number before promising anything."


def rubric_reply(empathy: int = 4, discovery: int = 3, resolution: int = 5, unsure: bool = False) -> str:
    return json.dumps({"criteria": {"empathy": {"score": empathy, "reason": "calm"},
                                    "discovery": {"score": discovery, "reason": "asked once"},
                                    "resolution": {"score": resolution, "reason": "clear next step"}},
                       "unsure": unsure})


def must_not_statements() -> set[str]:
    return {text for row in conversation_demo()[1] for text in row.meta["must_not"]}


def rule_answer(messages: list[dict], must_holds: bool = True) -> str:
    """A must-rule holds (or not, as asked) in turn 2; what a must-not rule forbids was avoided (its question
    asks whether the agent avoided it)."""
    question = messages[1]["content"].split("Question: ", 1)[1].split("\n", 1)[0]
    forbidden = any(text in question for text in must_not_statements())
    holds = True if forbidden else must_holds
    return json.dumps({"holds": holds, "turn": 2, "reason": "the agent offered a colleague"})


def judge(rule_holds: bool = True, **scores):
    """The judge answers a rule's question or the rubric."""
    def reply(messages: list[dict]) -> str:
        if "You check one rule" in messages[0]["content"]:
            return rule_answer(messages, rule_holds)
        return rubric_reply(**scores)
    return reply


def simulator_ends_on_second_reply():
    seen: dict[str, int] = {}

    def reply(messages: list[dict]) -> str:
        key = messages[0]["content"]
        seen[key] = seen.get(key, 0) + 1
        return "Fine, thanks. [END]" if seen[key] >= 2 else "It is order NW-48213."
    return reply


def conversation_replies(**overrides) -> dict:
    return {"rollout": "I am sorry to hear that. Could you give me your order number?",
            "simulator": simulator_ends_on_second_reply(), "judge": judge(), **overrides}


def first_train_samples(engine, n: int) -> list[Sample]:
    with Session(engine) as session:
        task = get_task(session, CONVERSATION_TASK)
        return queries.samples(session, task.id, "train")[:n]


def play_one(engine, gateway, sample: Sample, *, experiences=(), group_index: int = 0) -> Rollout:
    with Session(engine) as session:
        task = get_task(session, CONVERSATION_TASK)
    agent = agent_settings(task, model=task.policy_model, temperature=0.7)
    evaluation_id = _evaluation(engine, task)
    return asyncio.run(stored_rollout(engine, gateway, agent, task, sample, group_index=group_index, sample_index=0,
                                      experiences=[{"id": "G0", "text": t} for t in experiences],
                                      scope=Scope(evaluation_id=evaluation_id), evaluation_id=evaluation_id,
                                      people=False))


def _evaluation(engine, task) -> int:
    with Session(engine) as session:
        found = session.exec(select(Evaluation).where(Evaluation.task_id == task.id)).first()
        if found:
            return found.id
        row = Evaluation(task_id=task.id, split="train", model=task.policy_model)
        session.add(row)
        session.commit()
        return row.id


@pytest.fixture
def conversation_task(engine):
    return ensure_conversation_task(engine)


def test_demo_conversation_task_has_personas_segments_and_scenarios(engine, conversation_task):
    with Session(engine) as session:
        personas = personas_by_name(session, conversation_task)
        samples = queries.samples(session, conversation_task.id)
    segments = {persona.segment for persona in personas.values()}
    assert len(personas) >= 10 and len(segments) >= 4 and "at_risk" in segments
    assert len(samples) >= 30
    test_personas = {s.meta["persona"] for s in samples if s.split == "test"}
    train_personas = {s.meta["persona"] for s in samples if s.split == "train"}
    assert test_personas and not test_personas & train_personas  # held-out personas are never trained on
    at_risk = [s for s in samples if segment_of(s, personas) == "at_risk"]
    assert at_risk and all(any("human colleague" in rule for rule in s.meta["must"]) for s in at_risk)


def test_a_conversation_ends_on_the_end_marker_and_every_turn_is_stored(engine, conversation_task, scripted):
    model, gateway = scripted(engine, **conversation_replies())
    sample = first_train_samples(engine, 1)[0]
    row = play_one(engine, gateway, sample)
    assert row.error is None
    with Session(engine) as session:
        turns = session.exec(select(ConversationTurn).where(ConversationTurn.sample_id == sample.id)
                             .order_by(ConversationTurn.position)).all()
    assert [t.role for t in turns] == ["user", "assistant", "user", "assistant", "user"]
    assert turns[0].text == sample.query and turns[-1].ended and turns[-1].text == "Fine, thanks."
    assert model.count("rollout") == 2 and model.count("simulator") == 2
    assert "Agent: I am sorry" in row.response and row.messages[0]["role"] == "system"


def test_a_conversation_stops_at_max_turns(engine, conversation_task, scripted):
    model, gateway = scripted(engine, **conversation_replies(simulator="Still broken."))
    row = play_one(engine, gateway, first_train_samples(engine, 1)[0])
    assert model.count("rollout") == conversation_task.max_turns == 4
    assert row.messages[-1]["role"] == "assistant" and row.error is None


def test_the_simulator_never_sees_the_library(engine, conversation_task, scripted):
    model, gateway = scripted(engine, **conversation_replies())
    play_one(engine, gateway, first_train_samples(engine, 1)[0], experiences=[LESSON])
    agent_requests = [m for stage, m in model.calls if stage == "rollout"]
    simulator_requests = [m for stage, m in model.calls if stage == "simulator"]
    assert agent_requests and all(LESSON in m[0]["content"] for m in agent_requests)
    assert simulator_requests and not any(LESSON in json.dumps(m) for m in simulator_requests)
    assert not any(LESSON in json.dumps(m) for stage, m in model.calls if stage == "judge")


def test_per_criterion_scores_and_weights_make_the_reward(engine, conversation_task, scripted):
    _, gateway = scripted(engine, **conversation_replies(judge=judge(empathy=5, discovery=1, resolution=3)))
    row = play_one(engine, gateway, first_train_samples(engine, 1)[0])
    assert row.scores["criteria"] == {"empathy": 1.0, "discovery": 0.0, "resolution": 0.5}
    assert row.reward == pytest.approx((1.0 + 0.0 + 2 * 0.5) / 4)  # resolution weighs 2
    assert row.reward_source == "judge"


def test_a_failed_must_rule_sets_the_reward_to_zero_and_says_why(engine, conversation_task, scripted):
    with Session(engine) as session:
        task = get_task(session, CONVERSATION_TASK)
        samples = queries.samples(session, task.id, "train")
        must = next(s for s in samples if s.meta["must"])
    _, gateway = scripted(engine, **conversation_replies(judge=judge(rule_holds=False, empathy=5, discovery=5,
                                                                      resolution=5)))
    row = play_one(engine, gateway, must)
    assert row.reward == 0.0
    assert "must-rule" in row.reward_detail and "failed" in row.reward_detail
    failed = [r for r in row.scores["rules"] if r["passed"] is False]
    assert failed and failed[0]["turn"] == 1  # the judge named turn 2 (1-based): index 1


def test_a_regex_must_not_rule_is_checked_on_the_agents_turns(engine, conversation_task, scripted):
    _, gateway = scripted(engine, **conversation_replies(rollout="Please send me your full card number."))
    row = play_one(engine, gateway, first_train_samples(engine, 1)[0])
    assert row.reward == 0.0 and "no card details" in row.reward_detail
    broken = next(r for r in row.scores["rules"] if r["name"] == "no card details")
    assert broken["passed"] is False and broken["turn"] == 1


def test_an_unusable_judge_reply_sends_the_conversation_to_people(engine, conversation_task, scripted):
    with Session(engine) as session:
        task = get_task(session, CONVERSATION_TASK)
    _, gateway = scripted(engine, **conversation_replies(judge="not json at all"))
    sample = first_train_samples(engine, 1)[0]
    agent = agent_settings(task, model=task.policy_model, temperature=0.7)
    evaluation_id = _evaluation(engine, task)
    row = asyncio.run(stored_rollout(engine, gateway, agent, task, sample, group_index=0, sample_index=0,
                                     experiences=[], scope=Scope(evaluation_id=evaluation_id),
                                     evaluation_id=evaluation_id))
    assert row.label_status == "needed" and row.reward is None


def test_resume_mid_conversation_pays_for_no_completed_turn(engine, conversation_task, scripted):
    """The simulator's provider fails on its second message (a killed call): the turns spoken so far stay;
    the next attempt replays them from storage, without a request and without even a cache lookup."""
    sample = first_train_samples(engine, 1)[0]
    calls = {"n": 0}

    def flaky(messages):
        calls["n"] += 1
        return ValueError("provider went away") if calls["n"] >= 2 else "It is order NW-48213."

    model, gateway = scripted(engine, **conversation_replies(simulator=flaky))
    first = play_one(engine, gateway, sample)
    assert first.error and "provider went away" in first.error
    with Session(engine) as session:
        spoken = session.exec(select(ConversationTurn).where(ConversationTurn.sample_id == sample.id)).all()
        calls_before = len(session.exec(select(LLMCall)).all())
    assert len(spoken) == 4  # opening, agent, user, agent: the simulator's next message failed
    agent_calls_before = model.count("rollout")

    model2, gateway2 = scripted(engine, **conversation_replies(simulator="Thanks. [END]"))
    second = play_one(engine, gateway2, sample)
    assert second.error is None
    assert model2.count("rollout") == 0  # both agent turns came back from storage
    assert model2.count("simulator") == 1  # only the turn that had failed
    with Session(engine) as session:
        new_calls = session.exec(select(LLMCall).order_by(LLMCall.id)).all()[calls_before:]
    assert not [c for c in new_calls if c.stage == "rollout"]  # not even a cache hit
    assert agent_calls_before == 2


def test_a_run_learns_from_conversations_and_names_turns(engine, conversation_task, scripted):
    import_library(engine, CONVERSATION_TASK, json.dumps([LESSON]), "lib.json", actor="system")
    started: dict[str, int] = {}

    def agent(messages):
        """The first conversation of each scenario is the careful one (A), the second the careless one (B)."""
        earlier = [m["content"] for m in messages if m["role"] == "assistant"]
        if earlier:
            return earlier[0]
        opening = messages[1]["content"]
        started[opening] = started.get(opening, 0) + 1
        return "(A) I am sorry. Your order number, please?" if started[opening] == 1 else "(B) Not my problem."

    def varied(messages):
        if "You check one rule" in messages[0]["content"]:
            return rule_answer(messages)
        return rubric_reply(resolution=5 if "(A)" in messages[1]["content"] else 2)

    with Session(engine) as session:  # no spot checks: every verdict stands, the run needs no person
        task = get_task(session, CONVERSATION_TASK)
        task.reward_settings = {**task.reward_settings, "spot_check_share": 0.0}
        session.add(task)
        session.commit()
    model, gateway = scripted(engine, **conversation_replies(judge=varied, rollout=agent))
    run_id = create_run(engine, CONVERSATION_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2,
                                                               gate="off", validation_size=0), created_by="system")
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == JobStatus.COMPLETED, run.error
    summaries = [m for stage, m in model.calls if stage == "summary"]
    advantages = [m for stage, m in model.calls if stage == "advantage"]
    assert summaries and "Turn 1. User:" in summaries[0][1]["content"] and "(Turn N)" in summaries[0][1]["content"]
    assert advantages and "which turn made the difference" in advantages[0][1]["content"]
    assert "segment" in advantages[0][1]["content"]  # the learner reads who the user was


def test_evaluation_of_a_conversation_task(engine, conversation_task, scripted):
    _, gateway = scripted(engine, **conversation_replies())
    eval_id = create_evaluation(engine, CONVERSATION_TASK, "empty", split="test", k=1, limit=3, created_by="system")
    ev = execute_evaluation(engine, eval_id, gateway=gateway)
    assert ev.status == JobStatus.COMPLETED, ev.error
    assert ev.n == 3 and ev.mean_at_k is not None


@pytest.mark.parametrize("quote, broken", [("", False), ("I promise a refund today", False),
                                           ("Could you give me your order number", True)])
def test_a_must_not_rule_is_broken_only_with_a_real_quote(engine, conversation_task, scripted, quote, broken):
    """A small judge says whatever; without words that are really in the agent's turn, its claim that a must-not
    rule was broken is not counted."""
    with Session(engine) as session:
        task = get_task(session, CONVERSATION_TASK)
        sample = next(s for s in queries.samples(session, task.id, "train") if s.meta["must_not"])

    def says_it_happened(messages):  # "no, it was not avoided" to a must-not rule's question, with `quote`
        if "You check one rule" in messages[0]["content"]:
            avoided = "Did the agent avoid" in messages[1]["content"]
            return json.dumps({"holds": not avoided, "turn": 2, "quote": quote, "reason": "it happened"})
        return rubric_reply()

    _, gateway = scripted(engine, **conversation_replies(judge=says_it_happened))
    row = play_one(engine, gateway, sample)
    must_not = [r for r in row.scores["rules"] if r["kind"] == "must_not" and r["name"] != "no card details"]
    assert must_not and all(r["passed"] is (not broken) for r in must_not)
    assert (row.reward == 0.0) is broken


def test_a_conversation_run_waits_for_labels_that_decide_its_groups_then_its_evaluation_asks_for_the_unsure(
        engine, conversation_task, scripted):
    """One short step of the conversation demo (2 scenarios, G=2, 2 agent turns) and an evaluation of the result
    on 2 held-out scenarios: every conversation stored turn by turn as spoken, and judged.

    The training step sends every rollout to a person with the judge's suggestion (spot checks on all), and the
    labels decide both cases: the first group is labelled 1 and 0, so it is mixed and summarised by the learner;
    the second is labelled 0.5 twice, so it is skipped with the reason and costs the learner nothing. The
    evaluation keeps the judge's verdicts as rewards; the one the judge is unsure of goes to a person.

    Moved off the real model (it was test_model_e2e.py::test_a_conversation_run_and_evaluation_on_the_embedded_model,
    where which group tied and which verdict was unsure were the small judge's luck): the embedded model's path
    through a run is tests/test_model_e2e.py::test_train_and_eval_on_the_embedded_model, and its judge under a JSON
    schema test_model_e2e.py::test_the_embedded_judge_scores_a_support_reply."""
    def spot_check(share: float) -> None:
        with session_scope(engine) as s:
            task = get_task(s, CONVERSATION_TASK)
            task.reward_settings = {**task.reward_settings, "spot_check_share": share}
            s.add(task)

    with Session(engine) as s:
        doubtful = queries.samples(s, conversation_task.id, "test")[0]  # the evaluation's first scenario
    spoken = iter(range(1, 1000))

    def agent(_messages):  # each turn its own text, so the stored turns can be matched to the calls
        return f"I am sorry to hear that. Could you give me your order number? ({next(spoken)})"

    def rubric(messages):
        if "You check one rule" in messages[0]["content"]:
            return rule_answer(messages)
        return rubric_reply(unsure=doubtful.query in messages[1]["content"])

    spot_check(1.0)
    model, gateway = scripted(engine, **conversation_replies(rollout=agent, simulator="It is order NW-48213.",
                                                             judge=rubric))
    settings = RunSettings(epochs=1, batch_size=2, group_size=2, limit=2, gate="off", hold_flagged=False,
                           max_tokens=120, learner_max_tokens=400, max_operations=1, max_turns=2)
    run_id = create_run(engine, CONVERSATION_TASK, settings)
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "awaiting_labels", run.error
    with Session(engine) as s:
        waiting = s.exec(select(Rollout).where(Rollout.step_id.is_not(None))
                         .order_by(Rollout.sample_id, Rollout.group_index)).all()
    # the judge was asked about every conversation; its verdict waits beside it
    assert len(waiting) == 4 and all(r.error is None and r.label_status == "needed" and r.reward is None
                                     and r.suggested_detail for r in waiting)
    assert model.count("summary") == model.count("advantage") == 0  # nothing learned before the labels
    mixed, tied = waiting[0].sample_id, waiting[-1].sample_id
    for rollout in waiting:
        label = (1.0 if rollout.group_index == 0 else 0.0) if rollout.sample_id == mixed else 0.5
        submit_label(engine, rollout.id, label, "cli")
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "completed", run.error
    with Session(engine) as s:
        rollouts = s.exec(select(Rollout).where(Rollout.step_id.is_not(None))).all()
        advantages = {a.sample_id: a for a in s.exec(select(Advantage)).all()}
        turns = s.exec(select(ConversationTurn).where(ConversationTurn.step_id.is_not(None))
                       .order_by(ConversationTurn.sample_id, ConversationTurn.group_index,
                                 ConversationTurn.position)).all()
        calls = s.exec(select(LLMCall).where(LLMCall.run_id == run_id)).all()
    by_stage = Counter(c.stage for c in calls)
    assert len(rollouts) == 4 and all(r.error is None and r.reward_source == "human" for r in rollouts)

    # every conversation stored turn by turn as spoken: the opening, then the agent and the simulated user in turn
    # (2 agent turns: opening, agent, user, agent), each turn the text of its model call
    assert len(turns) == 4 * 4
    for key in {(t.sample_id, t.group_index) for t in turns}:
        roles = [t.role for t in turns if (t.sample_id, t.group_index) == key]
        assert roles == ["user", "assistant", "user", "assistant"], roles
    assert (Counter(t.text for t in turns if t.role == "assistant")
            == Counter(c.response for c in calls if c.stage == "rollout"))
    assert len(set(c.response for c in calls if c.stage == "rollout")) == by_stage["rollout"] == 8
    assert sum(1 for t in turns if t.role == "user" and t.position > 0) == by_stage["simulator"] == 4

    # the mixed group is summarised by the learner and given an advantage; the tied one is skipped with the
    # reason, unsummarised
    assert set(advantages) == {mixed, tied} and mixed != tied
    assert sorted((r.sample_id, r.reward) for r in rollouts) == sorted([(mixed, 0.0), (mixed, 1.0), (tied, 0.5),
                                                                       (tied, 0.5)])
    assert advantages[mixed].status == "ok", advantages[mixed]
    assert advantages[tied].status == "skipped", advantages[tied]
    assert advantages[tied].text == "all 2 rewards equal (0.5): no group advantage"
    assert all((r.summary is not None) == (r.sample_id == mixed) for r in rollouts)
    assert by_stage["summary"] == 2 and by_stage["advantage"] == 1 and by_stage["update"] == 1
    assert {"rollout", "simulator", "judge", "summary", "advantage"} <= set(by_stage)

    # the evaluation: the judge's verdicts are the rewards; the one it was unsure of waits for a person
    spot_check(0.0)
    with Session(engine) as s:
        version = s.get(LibraryVersion, s.get(Run, run_id).current_version_id).number
    eval_id = create_evaluation(engine, CONVERSATION_TASK, str(version), split="test", k=1, limit=2)
    ev = execute_evaluation(engine, eval_id, gateway=gateway)
    assert ev.status == "awaiting_labels", ev.error
    with Session(engine) as s:
        [unsure] = s.exec(select(Rollout).where(Rollout.label_status == "needed")).all()
    assert unsure.evaluation_id == eval_id and unsure.sample_id == doubtful.id and unsure.judge_unsure
    submit_label(engine, unsure.id, 0.5, "cli")
    ev = execute_evaluation(engine, eval_id, gateway=gateway)
    assert ev.status == "completed", ev.error
    with Session(engine) as s:
        ev = s.get(Evaluation, eval_id)
        scored = s.exec(select(Rollout).where(Rollout.evaluation_id == eval_id)).all()
    assert len(scored) == 2 and all(r.error is None and r.reward is not None for r in scored)
    assert all(r.reward_source == ("human" if r.judge_unsure or r.suggested_reward is None else "judge") for r in scored)
    assert sorted(r.reward_source for r in scored) == ["human", "judge"]
    assert ev.n == 2 and ev.metrics["segments"] and sum(r["n"] for r in ev.metrics["segments"].values()) == 2
