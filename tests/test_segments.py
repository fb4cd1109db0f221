"""Results per segment and criterion, a library per segment, and the segment-routed evaluation."""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session

from core import cli
from core.cli.jobs import breakdown_lines
from core.errors import InvalidInput
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.records.library.segments import bind_library, paired_by_segment
from core.records.library.versions import import_library
from core.records.tasks.demos import CONVERSATION_TASK, ensure_conversation_task
from core.records.tasks.lookup import get_task
from core.records.tasks.scenarios import personas_by_name, segment_of, split_by_persona
from storage import queries
from storage.db import url_with_password
from storage.statuses import JobStatus
from tests.test_conversation_engine import conversation_replies, rubric_reply, rule_answer

AT_RISK_LESSON = "Offer a human colleague as soon as the customer sounds hopeless."
DEFAULT_LESSON = "Ask one question at a time."


@pytest.fixture
def conversation_task(engine):
    task = ensure_conversation_task(engine)
    with Session(engine) as session:  # no spot checks: evaluations finish without people
        row = get_task(session, CONVERSATION_TASK)
        row.reward_settings = {**row.reward_settings, "spot_check_share": 0.0}
        session.add(row)
        session.commit()
    return task


def segment_judge(messages):
    """An at-risk conversation scores low unless the agent was told to offer a colleague (the lesson)."""
    if "You check one rule" in messages[0]["content"]:
        return rule_answer(messages)
    transcript = messages[1]["content"]
    return rubric_reply(resolution=5 if "colleague" in transcript.split("Transcript, one JSON object a turn:")[1]
                        else 1, empathy=3)


def agent_following_lessons(messages):
    return ("I am so sorry. Let me connect you with a human colleague now." if AT_RISK_LESSON in messages[0]["content"]
            else "Could you tell me your order number?")


def test_evaluation_reports_segments_personas_and_criteria(engine, conversation_task, scripted):
    _, gateway = scripted(engine, **conversation_replies(judge=segment_judge))
    ev = execute_evaluation(engine, create_evaluation(engine, CONVERSATION_TASK, "empty", split="test",
                                                      created_by="system"), gateway=gateway)
    assert ev.status == JobStatus.COMPLETED, ev.error
    segments, personas, criteria = ev.metrics["segments"], ev.metrics["personas"], ev.metrics["criteria"]
    assert sum(row["n"] for row in segments.values()) == ev.n
    assert set(segments) == {p["segment"] for p in personas.values()}
    assert set(criteria) == {"empathy", "discovery", "resolution"}
    assert criteria["empathy"]["mean"] == pytest.approx(0.5)  # 3 on 1-5 everywhere
    assert all(0 <= row["mean_at_k_ci"][0] <= row["mean_at_k"] <= row["mean_at_k_ci"][1] <= 1
               for row in segments.values())


def test_segment_routed_evaluation_uses_each_segments_library(engine, conversation_task, scripted):
    import_library(engine, CONVERSATION_TASK, json.dumps([DEFAULT_LESSON]), "d.json", actor="system")
    bind_library(engine, CONVERSATION_TASK, "at risk", "at_risk", actor="system")
    import_library(engine, CONVERSATION_TASK, json.dumps([AT_RISK_LESSON]), "r.json", library_name="at risk",
                   actor="system")
    model, gateway = scripted(engine, **conversation_replies(judge=segment_judge, rollout=agent_following_lessons))
    one = execute_evaluation(engine, create_evaluation(engine, CONVERSATION_TASK, "latest", split="test",
                                                       created_by="system"), gateway=gateway)
    routed = execute_evaluation(engine, create_evaluation(engine, CONVERSATION_TASK, "latest", split="test",
                                                          route_segments=True, created_by="system"), gateway=gateway)
    assert routed.status == JobStatus.COMPLETED and routed.routes and "at_risk" in routed.routes
    with Session(engine) as session:
        task = get_task(session, CONVERSATION_TASK)
        personas = personas_by_name(session, task)
        samples = {s.id: s for s in queries.samples(session, task.id, "test")}
        for rollout in queries.evaluation_rollouts(session, routed.id):
            system = rollout.messages[0]["content"]
            at_risk = segment_of(samples[rollout.sample_id], personas) == "at_risk"
            assert (AT_RISK_LESSON in system) == at_risk and (DEFAULT_LESSON in system) != at_risk
    assert routed.metrics["segments"]["at_risk"]["mean_at_k"] > one.metrics["segments"]["at_risk"]["mean_at_k"]
    by_segment = paired_by_segment(engine, one.id, routed.id)
    assert by_segment["at_risk"].delta > 0 and by_segment["at_risk"].n == one.metrics["segments"]["at_risk"]["n"]
    assert by_segment["resistant"].delta == 0  # the same default library there


def test_binding_rules(engine, conversation_task):
    with pytest.raises(InvalidInput, match="default library"):
        bind_library(engine, CONVERSATION_TASK, "default", "at_risk", actor="system")
    with pytest.raises(InvalidInput, match="no persona in segment"):
        bind_library(engine, CONVERSATION_TASK, "x", "pirates", actor="system")
    bind_library(engine, CONVERSATION_TASK, "a", "verbose", actor="system")
    with pytest.raises(InvalidInput, match="already serves"):
        bind_library(engine, CONVERSATION_TASK, "b", "verbose", actor="system")
    with pytest.raises(InvalidInput, match="no library bound"):
        bind_library(engine, CONVERSATION_TASK, "a", None, actor="system")
        create_evaluation(engine, CONVERSATION_TASK, "latest", route_segments=True, created_by="system")


def test_split_by_persona_holds_whole_personas_out(engine, conversation_task):
    with Session(engine) as session:
        task = get_task(session, CONVERSATION_TASK)
        name = next(iter(personas_by_name(session, task).values())).name
    counts = split_by_persona(engine, CONVERSATION_TASK, [name], actor="system")
    with Session(engine) as session:
        samples = queries.samples(session, task.id)
    assert counts == {"test": 3, "train": len(samples) - 3}
    assert {s.split for s in samples if s.meta["persona"] == name} == {"test"}
    with pytest.raises(InvalidInput, match="unknown persona"):
        split_by_persona(engine, CONVERSATION_TASK, ["Nobody"], actor="system")


def test_cli_eval_json_has_segments_and_criteria(engine, conversation_task, scripted, monkeypatch, capsys):
    _, gateway = scripted(engine, **conversation_replies(judge=segment_judge))
    # where `eval` looks it up: the command's module binds Gateway when it is first imported (core/cli/commands.py)
    monkeypatch.setattr("core.cli.jobs.Gateway", lambda engine, concurrency=None: gateway)
    code = cli.main(["--db", url_with_password(engine), "eval", "--task", CONVERSATION_TASK, "--version", "empty", "--limit", "6", "--json",
                     "--concurrency", "2"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["n"] == 6
    assert {"segments", "criteria", "personas"} <= set(out)
    assert all({"n", "mean_at_k", "mean_at_k_ci"} <= set(row) for row in out["segments"].values())
    assert set(out["criteria"]) == {"empathy", "discovery", "resolution"}


def test_cli_export_routes_each_segment_to_its_library(engine, conversation_task, monkeypatch, capsys):
    import_library(engine, CONVERSATION_TASK, json.dumps([DEFAULT_LESSON]), "d.json", actor="system")
    bind_library(engine, CONVERSATION_TASK, "at risk", "at_risk", actor="system")
    import_library(engine, CONVERSATION_TASK, json.dumps([AT_RISK_LESSON]), "r.json", library_name="at risk",
                   actor="system")
    code = cli.main(["--db", url_with_password(engine), "export", "--task", CONVERSATION_TASK, "--version", "latest", "--format", "prompt",
                     "--route-segments"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["route_by"] == "segment"
    assert out["default"]["experiences"] == [DEFAULT_LESSON] and DEFAULT_LESSON in out["default"]["text"]
    assert list(out["segments"]) == ["at_risk"] and out["segments"]["at_risk"]["experiences"] == [AT_RISK_LESSON]


def test_a_segments_breakdown_leaves_an_unscored_rollout_out_instead_of_counting_it_as_zero(engine,
                                                                                            conversation_task):
    """Issue 41: a rollout whose call failed or whose reward could not be given counted as 0.0 in its segment's
    Mean@k; it is no wrong answer, so it is left out of the figures and counted apart."""
    from core.records.library.segments import breakdown
    from storage.tables import Rollout

    with Session(engine) as session:
        task = get_task(session, CONVERSATION_TASK)
        personas = personas_by_name(session, task)
        sample = next(s for s in queries.samples(session, task.id, "test") if segment_of(s, personas))
        segment = segment_of(sample, personas)
        rollouts = [Rollout(sample_id=sample.id, group_index=0, reward=1.0, reward_source="judge"),
                    Rollout(sample_id=sample.id, group_index=1, reward=None, error="503 Service Unavailable"),
                    Rollout(sample_id=sample.id, group_index=2, reward=0.0, reward_source="error")]
        result = breakdown(session, task, rollouts, {sample.id: sample})
        only_failed = breakdown(session, task, rollouts[1:], {sample.id: sample})["segments"][segment]
    row = result["segments"][segment]
    assert (row["n"], row["mean_at_k"], row["pass_at_k"], row["unscored"]) == (1, 1.0, 1.0, 2)
    [persona] = result["personas"].values()
    assert (persona["mean_at_k"], persona["unscored"]) == (1.0, 2)
    assert "Mean@1 1.000" in breakdown_lines(result, 1)[0] and "2 unscored, left out" in breakdown_lines(result, 1)[0]
    assert (only_failed["n"], only_failed["mean_at_k"], only_failed["unscored"]) == (0, None, 2)
    assert "Mean@1 -" in breakdown_lines({"segments": {segment: only_failed}}, 1)[0]
