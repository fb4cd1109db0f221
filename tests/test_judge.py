"""The LLM judge (core.models.judge) on fixed replies: scales, reasons, doubt, and replies that are not the JSON asked for."""

from __future__ import annotations

import asyncio
import itertools
import json

import litellm
import pytest
from sqlmodel import Session, select

from core.domain.replies import JudgeReply
from core.models.gateway import Gateway, Scope
from core.models.judge import (
    GENERIC_ANCHORS,
    SCALES,
    anchors,
    choices,
    criteria_text,
    judge_messages,
    judge_response,
    parse_anchors,
    score_of,
    to_value,
)
from core.records.tasks.demos import DEMO_TASK
from storage.db import session_scope
from storage.tables import Rollout, Sample, Task
from tests.conftest import ScriptedModel
from tests.ui_support import seeded_run

_ANSWERS = itertools.count()


def verdict_for(engine, reply, *, scale: str = "binary", criteria: str = "States the right total."):
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        task.reward_method, task.reward_settings = "judge", {"scale": scale, "criteria": criteria}
        session.add(task)
        session.flush()
        sample = session.exec(select(Sample).where(Sample.task_id == task.id)).first()
        session.expunge_all()
    model = ScriptedModel({"judge": reply})
    gateway = Gateway(engine, mock=model, backoff_s=0.001, max_retries=0)
    answer = f"The total is 12. \\boxed{{12}} ({next(_ANSWERS)})"  # a new answer each time: no cached verdict
    verdict = asyncio.run(judge_response(gateway, task, sample, answer, scope=Scope()))
    return verdict, model


def reply(score, confident=True, reason="it adds the two numbers correctly") -> str:
    return json.dumps({"reason": reason, "score": score, "confident": confident})


def test_binary_verdicts_are_zero_or_one_with_the_reason(engine, demo_task):
    verdict, model = verdict_for(engine, reply(1))
    assert (verdict.value, verdict.unsure) == (1.0, False)
    assert verdict.detail == "judge 1/1: it adds the two numbers correctly"
    sent = model.calls[0][1][1]["content"]
    assert "States the right total." in sent and "The total is 12." in sent
    assert verdict_for(engine, reply(0))[0].value == 0.0


@pytest.mark.parametrize(("score", "value"), [(1, 0.0), (2, 0.25), (3, 0.5), (4, 0.75), (5, 1.0)])
def test_a_five_point_scale_maps_onto_zero_to_one(engine, demo_task, score, value):
    verdict, _ = verdict_for(engine, reply(score), scale="1-5")
    assert verdict.value == value and verdict.detail.startswith(f"judge {score}/5")


def test_an_unsure_judge_says_so(engine, demo_task):
    verdict, _ = verdict_for(engine, reply(1, confident=False))
    assert verdict.unsure and verdict.value == 1.0 and "(judge unsure)" in verdict.detail


def test_a_reply_that_is_not_the_json_asked_for_is_an_unsure_verdict_without_a_value(engine, demo_task):
    verdict, model = verdict_for(engine, "Looks good to me!")
    assert verdict.value is None and verdict.unsure
    assert "judge reply unusable" in verdict.detail and model.count("judge") == 2  # asked again once
    out_of_range, _ = verdict_for(engine, reply(7), scale="1-5")
    assert out_of_range.value is None and "between 1 and 5" in out_of_range.detail


def test_a_provider_error_is_an_unsure_verdict_not_a_crash(engine, demo_task):
    error = litellm.BadRequestError("model not found", model="x", llm_provider="openai")
    verdict, _ = verdict_for(engine, error)
    assert verdict.value is None and verdict.unsure and verdict.failed and "judge call failed" in verdict.detail


def test_a_judge_reply_rejects_what_is_not_a_score():
    def parse_verdict(data, scale):
        reply = JudgeReply.model_validate(data, context={"score_range": SCALES[scale]})
        return reply.score, reply.reason, reply.confident

    assert parse_verdict({"reason": "r", "score": 4.0, "confident": True}, "1-5") == (4, "r", True)
    for bad in ({"score": "4"}, {"score": True}, {"score": 2.5}, ["score", 4], {"reason": "no score"}):
        with pytest.raises(ValueError):
            parse_verdict(bad, "1-5")


def test_scale_points_and_criteria_text(demo_task):
    assert choices("1-5") == [(1, 0.0), (2, 0.25), (3, 0.5), (4, 0.75), (5, 1.0)]
    assert [score_of(v, "1-5") for _, v in choices("1-5")] == [1, 2, 3, 4, 5]
    assert to_value(1, "binary") == 1.0 and score_of(0.4, "binary") == 0
    task = Task(name="t", instructions="i", reward_settings={"criteria": "Be kind."})
    sample = Sample(task_id=1, external_id="a", query="q", rubric="Mention the refund.")
    assert criteria_text(task, sample) == "Be kind.\nMention the refund."
    messages = judge_messages("q", "c", None, "<b>answer</b>", "binary")
    assert "Reference answer" not in messages[1]["content"] and "<b>answer</b>" in messages[1]["content"]


def test_a_judged_run_stores_the_judges_reward_source_and_reason(engine, demo_task):
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        task.reward_method, task.reward_settings = "judge", {"scale": "1-5"}
        session.add(task)
    seeded_run(engine, "auto", judge=reply(4, reason="clear steps"))
    with Session(engine) as session:
        rows = session.exec(select(Rollout)).all()
    assert rows and all((r.reward, r.reward_source, r.reward_detail) == (0.75, "judge", "judge 4/5: clear steps")
                        for r in rows)
    assert all(r.label_status is None for r in rows)


def test_a_rubric_gives_its_own_scale_anchors_and_a_numbered_list_does_not():
    rubric = "Judge the reply.\n1: off topic\n- 3 - partly right\nScore 5 = complete and kind\nUse the 1-5 scale.\n10: x"
    assert parse_anchors(rubric, "1-5") == {1: "off topic", 3: "partly right", 5: "complete and kind"}
    assert parse_anchors("0: fails\n1 — meets", "binary") == {0: "fails", 1: "meets"}
    assert parse_anchors("1. Greet the customer.\n2. Name the refund.", "1-5") == {}
    assert parse_anchors("1) greet\n2) refund", "1-5") == {}
    assert parse_anchors("1: only one line", "1-5") == {}  # one line is no scale
    assert parse_anchors("0: zero\n6: six", "1-5") == {}  # off the scale
    assert parse_anchors(None, "binary") == {}


def test_anchors_take_the_rubrics_words_and_generic_ones_for_the_rest():
    task = Task(name="t", instructions="i", reward_settings={"scale": "1-5", "criteria": "1: rude\n5: kind"})
    sample = Sample(task_id=1, external_id="a", query="q", rubric="2 = cold but right")
    assert anchors(task, sample) == {1: "rude", 2: "cold but right", 3: GENERIC_ANCHORS["1-5"][3],
                                     4: GENERIC_ANCHORS["1-5"][4], 5: "kind"}
    plain_task = Task(name="t", instructions="i", reward_settings={})
    assert anchors(plain_task, Sample(task_id=1, external_id="a", query="q")) == {
        0: "fails the criteria", 1: "meets the criteria"}
    assert GENERIC_ANCHORS["1-5"][1] == "wrong or unusable" and GENERIC_ANCHORS["1-5"][5] == "fully correct and complete"
