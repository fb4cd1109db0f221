"""Structured replies (core.domain.replies): the schema a request sends, parsing, json-repair as the last resort,
and the parsed / repaired / malformed counts on the ledger and in a run's counters."""

from __future__ import annotations

import asyncio
import json

import litellm
import pytest
from sqlmodel import Session, select

from core.domain.replies import AdvantageReply, DirectReply, JudgeReply, UpdateReply
from core.errors import StructuredOutputError
from core.grpo.training import RunSettings, create_run, execute_run, run_counters
from core.models.gateway import Gateway
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.tables import LLMCall, Run
from tests.conftest import ScriptedModel, mixed_rollouts

MSG = [{"role": "user", "content": "Compare the attempts."}]
HOSTED = "openai/gpt-4o-mini"
GOOD = '{"analysis": "The better attempt re-read the question.", "experiences": ["Re-read the question first."]}'


def ask(gateway: Gateway, reply=AdvantageReply, messages=MSG, **kw):
    return asyncio.run(gateway.complete_json(stage="advantage", model=HOSTED, messages=messages, reply=reply, **kw))


def statuses(engine) -> list[str | None]:
    with Session(engine) as session:
        return [row.reply_status for row in session.exec(select(LLMCall).order_by(LLMCall.id))]


def test_a_valid_reply_is_parsed_and_counted_parsed(engine):
    model = ScriptedModel({"advantage": GOOD})
    value, call = ask(Gateway(engine, mock=model))
    assert isinstance(value, AdvantageReply)
    assert value.experiences == ["Re-read the question first."] and value.analysis.startswith("The better")
    assert call.reply_status == "parsed" and statuses(engine) == ["parsed"] and len(model.calls) == 1


def test_prose_fences_and_raw_line_breaks_in_strings_still_count_as_parsed(engine):
    replies = ["Sure!\n```json\n" + GOOD + "\n```\nHope that helps.",
               '{"analysis": "line one\nline two", "experiences": ["a \\boxed{6} lesson"]}']
    gateway = Gateway(engine, mock=ScriptedModel({"advantage": replies}))
    fenced, _ = ask(gateway)
    broken_line, _ = ask(gateway, messages=MSG + MSG)
    assert fenced.experiences == ["Re-read the question first."]
    assert broken_line.analysis == "line one\nline two" and broken_line.experiences == ["a \\boxed{6} lesson"]
    assert statuses(engine) == ["parsed", "parsed"]


@pytest.mark.parametrize("text", [
    '{"analysis": "a", "experiences": ["Re-read the question first."],}',  # trailing comma
    '{"analysis": "a", "experiences": ["Re-read the question first."]',  # missing closing brace
    "{'analysis': 'a', 'experiences': ['Re-read the question first.']}",  # single quotes
    '{"analysis": "a", "experiences": ["Re-read the question first.", "Check the',  # cut off by max_tokens
    'Unlike [E1], {"analysis": "a", "experiences": ["Re-read the question first.",]} (see [2])',  # prose brackets
])
def test_broken_json_is_repaired_and_counted_repaired(engine, text):
    model = ScriptedModel({"advantage": text})
    value, call = ask(Gateway(engine, mock=model))
    assert value.experiences[0] == "Re-read the question first."
    assert call.reply_status == "repaired" and statuses(engine) == ["repaired"] and len(model.calls) == 1


def test_garbage_is_malformed_asked_again_then_raised(engine):
    model = ScriptedModel({"advantage": "I cannot answer that ###"})
    with pytest.raises(StructuredOutputError, match="not the JSON asked for") as info:
        ask(Gateway(engine, mock=model))
    assert info.value.raw == "I cannot answer that ###" and len(model.calls) == 2
    assert statuses(engine) == ["malformed", "malformed"]


def test_json_of_the_wrong_shape_is_malformed_with_the_reason(engine):
    model = ScriptedModel({"advantage": ['{"analysis": "no list"}', GOOD]})
    value, call = ask(Gateway(engine, mock=model))
    assert value.experiences and call.reply_status == "parsed"
    assert statuses(engine) == ["malformed", "parsed"]
    model.replies["direct"] = '{"experiences": ["", "  "]}'
    with pytest.raises(StructuredOutputError, match="no experiences in the reply"):
        asyncio.run(Gateway(engine, mock=model).complete_json(stage="direct", model=HOSTED, messages=MSG,
                                                               reply=DirectReply))


def test_the_schema_sent_is_the_models_schema(engine, monkeypatch):
    sent: list[dict] = []
    original = litellm.acompletion

    async def spy(**kwargs):
        sent.append(kwargs["response_format"])
        return await original(**kwargs)

    monkeypatch.setattr(litellm, "acompletion", spy)
    model = ScriptedModel({"advantage": GOOD})
    ask(Gateway(engine, mock=model))
    schema = AdvantageReply.prompt_schema()
    assert sent == [{"type": "json_schema", "json_schema": {"name": "advantage", "schema": schema, "strict": True}}]
    with Session(engine) as session:
        row = session.exec(select(LLMCall)).one()
    assert row.request["params"]["response_format"]["json_schema"]["schema"] == schema


@pytest.mark.parametrize("reply", [AdvantageReply, UpdateReply, DirectReply, JudgeReply])
def test_every_schema_is_strict_and_string_limits_go_to_local_models_only(reply):
    hosted, local = reply.prompt_schema(), reply.prompt_schema(local=True)

    def objects(node):
        if isinstance(node, dict):
            if node.get("type") == "object":
                yield node
            for value in node.values():
                yield from objects(value)

    for schema in (hosted, local):
        assert "$defs" not in json.dumps(schema) and "title" not in json.dumps(schema)
        for obj in objects(schema):
            assert obj["additionalProperties"] is False and obj["required"] == list(obj["properties"])
    assert "maxLength" not in json.dumps(hosted)
    # the learner's texts carry none (a cut-off lesson is worse than none); ids and the judge's reason do
    assert ("maxLength" in json.dumps(local)) == (reply in (UpdateReply, JudgeReply))


def test_the_string_limits_of_local_models_are_todays():
    advantage = AdvantageReply.prompt_schema(local=True)["properties"]
    assert "maxLength" not in advantage["analysis"] and "maxLength" not in advantage["experiences"]["items"]
    assert advantage["experiences"]["maxItems"] == 3
    operations = UpdateReply.prompt_schema(local=True)["properties"]["operations"]
    assert operations["maxItems"] == 4
    op = operations["items"]["properties"]
    assert (op["ids"]["items"]["maxLength"], op["ids"]["maxItems"]) == (12, 4)
    assert "maxLength" not in op["text"] and "maxLength" not in op["rationale"]
    assert op["op"]["enum"] == ["ADD", "MODIFY", "DELETE", "MERGE", "KEEP"]
    assert JudgeReply.prompt_schema(local=True)["properties"]["reason"]["maxLength"] == 400


def test_the_models_keep_the_old_parsers_tolerance():
    advantage = AdvantageReply.model_validate({"experiences": ["a", 3, None, {"x": 1}, "  ", "b", "c", "d"]})
    assert (advantage.analysis, advantage.experiences) == ("", ["a", "3", "b"])
    update = UpdateReply.model_validate({"operations": [
        {"op": "modify", "target_ids": "[E1]", "text": "Check units.", "rationale": None},
        {"op": "DELETE", "ids": ["E2 "]},
    ]})
    assert [(o.op, o.target_ids, o.text, o.rationale) for o in update.proposed()] == [
        ("MODIFY", ["E1"], "Check units.", ""), ("DELETE", ["E2"], None, "")]
    for bad in ({"operations": [{"ids": []}]}, {"operations": "ADD"}, {"operations": [{"op": "RENAME"}]}):
        with pytest.raises(ValueError):
            UpdateReply.model_validate(bad)
    with pytest.raises(ValueError, match="no experiences"):
        DirectReply.model_validate({"experiences": ["", " "]})
    judge = JudgeReply.model_validate({"score": 4.0, "reason": "x" * 900, "confident": "no"},
                                      context={"score_range": (1, 5)})
    assert (judge.score, len(judge.reason), judge.confident) == (4, 500, True)
    with pytest.raises(ValueError, match="between 0 and 1"):
        JudgeReply.model_validate({"score": 3}, context={"score_range": (0, 1)})


def test_a_runs_counters_show_repaired_and_malformed_replies(engine, demo_task, scripted):
    with Session(engine) as session:
        first, second = (s.query for s in queries.samples(session, demo_task.id, "train", limit=2))

    def advantage(messages):
        content = messages[-1]["content"]
        if first in content:
            return GOOD[:-2]  # cut off: repaired
        return "no JSON here" if second in content else GOOD  # malformed twice: that group fails

    _model, gateway = scripted(engine, rollout=mixed_rollouts(), advantage=advantage)
    settings = RunSettings(epochs=1, batch_size=2, group_size=2, limit=2, concurrency=2, gate="off")
    run = execute_run(engine, create_run(engine, DEMO_TASK, settings), gateway=gateway)
    assert run.status == "completed", run.error
    with Session(engine) as session:
        counters = run_counters(session, session.get(Run, run.id))
        totals = queries.call_totals(session, run_id=run.id)
    assert (counters["replies_repaired"], counters["replies_malformed"]) == (1, 2)
    assert (totals["repaired"], totals["malformed"]) == (1, 2)
    assert run.progress["replies_repaired"] == 1
    assert statuses(engine).count("parsed") == 1  # the update call; rollouts and summaries ask no JSON
