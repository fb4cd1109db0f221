"""Production traces scored by the task's own judge in the worker (issue 50, item 3), on litellm mock
responses through the gateway: the score lands marked as the judge's, an unsure verdict waits for a person,
each trace is scored once however often the pass runs, and every call is in the ledger with its trace."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from sqlmodel import Session, select

from core.errors import InvalidInput
from core.grpo.production_scoring import score_production
from core.jobs.worker import serve
from core.models.gateway import Gateway
from core.records.library.versions import PRODUCTION, import_library, set_label
from core.records.production.ab_experiments import CANDIDATE, open_experiment, served_arm
from core.records.production.ab_verdict import experiment_scores
from core.records.production.scores import score_source, trace_score
from core.records.production.scoring import STAGE, judge_summary
from core.records.production.serving import set_ab_split
from core.records.production.traces import TraceIn, ingest_traces, set_rules, trace_rows
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.db import session_scope
from storage.tables import LLMCall, Task, Trace, utcnow
from tests.conftest import ScriptedModel

LATER = timedelta(minutes=5)  # past the minute a trace is left for its user's feedback


def verdict(score: int, confident: bool = True) -> str:
    return json.dumps({"reason": f"the answer {'meets' if score else 'misses'} the criteria", "score": score,
                       "confident": confident})


@pytest.fixture
def judged(engine, demo_task):
    """The demo task with a judge reward on an outside model, and a production version."""
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        task.reward_method, task.reward_settings = "judge", {"scale": "binary", "criteria": "The total is right."}
        task.judge_model = "openai/gpt-4o-mini"
        session.add(task)
    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(version.number), "production", "system")
    return version


def post(engine, version_id: int, count: int, **extra) -> None:
    ingest_traces(engine, [TraceIn(id=f"t{i}", task=DEMO_TASK, version_id=version_id, input=f"What is {i} + {i}?",
                                   output=f"{2 * i}", **extra) for i in range(count)])


def traces(engine) -> list[Trace]:
    with Session(engine) as session:
        return list(session.exec(select(Trace).order_by(Trace.id)))


def gateway_for(engine, replies) -> tuple[ScriptedModel, Gateway]:
    model = ScriptedModel({STAGE: replies})
    return model, Gateway(engine, mock=model, backoff_s=0.001, max_retries=0)


def test_judge_scores_land_on_production_traces_marked_as_the_judges_and_the_ledger_has_each_call(engine, judged):
    set_rules(engine, DEMO_TASK, {"judge_share": 1.0}, "cli")
    post(engine, judged.id, 3)
    post_feedback = TraceIn(id="sent", task=DEMO_TASK, version_id=judged.id, input="What is 9 + 9?", output="18",
                            thumbs="down")
    ingest_traces(engine, [post_feedback])
    model, gateway = gateway_for(engine, [verdict(1), verdict(0), verdict(1), verdict(1)])

    assert score_production(engine, "w1", gateway=gateway) == 0  # the first minute is left for feedback
    assert score_production(engine, "w1", gateway=gateway, now=utcnow() + LATER) == 3  # not the one with thumbs
    rows = {row.client_id: row for row in traces(engine)}
    assert sorted(trace_score(row) for row in rows.values() if row.client_id != "sent") == [0.0, 1.0, 1.0]
    assert {score_source(rows[f"t{i}"]) for i in range(3)} == {"judge"}
    assert rows["sent"].judge_status == "skipped" and score_source(rows["sent"]) == "user"  # the user's thumbs count:
    # the judge is not paid for a trace whose score it could never be (issue 62)
    assert trace_score(rows["sent"]) == 0.0
    with Session(engine) as session:
        listed = trace_rows(list(rows.values()), queries.trace_versions(session, rows["sent"].task_id))
        calls = list(session.exec(select(LLMCall).where(LLMCall.stage == STAGE)))
        summary = judge_summary(session, rows["sent"].task_id)
    assert {row["sender id"]: row["score by"] for row in listed} == {"t0": "judge", "t1": "judge", "t2": "judge",
                                                                      "sent": "user"}
    assert sorted(call.trace_id for call in calls) == sorted(row.id for row in rows.values() if row.client_id != "sent")
    assert all(call.error is None and call.tokens_in > 0 for call in calls)
    assert (summary.scored, summary.unsure, summary.calls) == (3, 0, 3)
    assert summary.cost == pytest.approx(sum(call.cost for call in calls))
    assert "What is 1 + 1?" in str(model.calls) and "The total is right." in str(model.calls)


def test_an_unsure_verdict_goes_to_the_labelling_queue_with_the_judges_value_only_a_suggestion(engine, judged):
    set_rules(engine, DEMO_TASK, {"judge_share": 1.0}, "cli")
    post(engine, judged.id, 1)
    _model, gateway = gateway_for(engine, verdict(1, confident=False))
    assert score_production(engine, "w1", gateway=gateway, now=utcnow() + LATER) == 1
    [row] = traces(engine)
    assert (row.judge_status, row.judge_score, row.label_status) == ("unsure", 1.0, "needed")
    assert trace_score(row) is None and score_source(row) is None  # a person decides


def test_a_trace_is_scored_once_however_often_and_however_many_passes_run(engine, judged):
    set_rules(engine, DEMO_TASK, {"judge_share": 1.0}, "cli")
    post(engine, judged.id, 4)
    model, gateway = gateway_for(engine, verdict(1))
    later = utcnow() + LATER
    passes = [threading.Thread(target=score_production, args=(engine, f"w{n}"), kwargs={"gateway": gateway,
                                                                                         "now": later})
              for n in range(3)]
    for thread in passes:
        thread.start()
    for thread in passes:
        thread.join(timeout=60)
    assert score_production(engine, "w9", gateway=gateway, now=later) == 0  # and once more: nothing left
    assert model.count(STAGE) == 4
    with Session(engine) as session:
        assert len(list(session.exec(select(LLMCall).where(LLMCall.stage == STAGE)))) == 4
    assert {row.judge_status for row in traces(engine)} == {"scored"}


def test_the_worker_scores_between_jobs_and_a_split_scores_its_arms_traces_without_feedback(engine, judged):
    """`judge_ab`: every trace that counts in the running A/B experiment and came without the user's feedback, and
    no other (one with thumbs, one served by a version its user's arm does not serve, one without a user)."""
    candidate = import_library(engine, DEMO_TASK, "- Check the units.", "b.md", actor="system")
    set_label(engine, DEMO_TASK, str(candidate.number), "candidate", "system")
    set_ab_split(engine, DEMO_TASK, "default", "candidate", 0.5, "system")
    set_rules(engine, DEMO_TASK, {"judge_ab": True}, "cli")
    library_id = judged.library_id
    users = {arm: next(f"user-{n}" for n in range(100) if served_arm(library_id, 0.5, f"user-{n}") == arm)
             for arm in (PRODUCTION, CANDIDATE)}
    serves = {PRODUCTION: judged.id, CANDIDATE: candidate.id}
    ingest_traces(engine, [
        TraceIn(id="prod", task=DEMO_TASK, version_id=serves[PRODUCTION], user_id=users[PRODUCTION], input="q1"),
        TraceIn(id="cand", task=DEMO_TASK, version_id=serves[CANDIDATE], user_id=users[CANDIDATE], input="q2"),
        TraceIn(id="thumbs", task=DEMO_TASK, version_id=serves[CANDIDATE], user_id=users[CANDIDATE], input="q3",
                thumbs="up"),
        TraceIn(id="other arm", task=DEMO_TASK, version_id=serves[CANDIDATE], user_id=users[PRODUCTION], input="q4"),
        TraceIn(id="no user", task=DEMO_TASK, version_id=serves[PRODUCTION], input="q5")])
    with session_scope(engine) as session:  # received a while ago (after judging began): past the minute
        for row in session.exec(select(Trace)):
            row.received_at = utcnow() - LATER
            session.add(row)
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        task.production_rules = {**task.production_rules, "judge_since": (utcnow() - 2 * LATER).isoformat()}
        session.add(task)
    model, gateway = gateway_for(engine, verdict(1))
    serve(engine, once=True, owner="worker-1", gateway=gateway)
    rows = {row.client_id: row for row in traces(engine)}
    assert {name: row.judge_status for name, row in rows.items()} == {
        "prod": "scored", "cand": "scored", "thumbs": "skipped", "other arm": "skipped", "no user": "skipped"}
    assert model.count(STAGE) == 2
    with Session(engine) as session:  # the experiment's verdict reads the judge's scores beside the user's thumbs
        experiment = open_experiment(session, library_id)
        scores = experiment_scores(session, experiment).by_user
    assert ([s for user in scores[PRODUCTION].values() for s in user],
            sorted(s for user in scores[CANDIDATE].values() for s in user)) == ([1.0], [1.0, 1.0])


def test_turning_judging_on_bills_no_backlog_and_a_reward_that_cannot_score_is_refused(engine, judged):
    post(engine, judged.id, 2)
    with session_scope(engine) as session:
        for row in session.exec(select(Trace)):
            row.received_at = utcnow() - timedelta(days=1)
            session.add(row)
    rules = set_rules(engine, DEMO_TASK, {"judge_share": 1.0, "below": 0.2}, "cli")
    assert rules["judge_share"] == 1.0 and rules["judge_since"]
    assert set_rules(engine, DEMO_TASK, {"judge_share": 0.5}, "cli")["judge_since"] == rules["judge_since"]
    model, gateway = gateway_for(engine, verdict(1))
    assert score_production(engine, "w1", gateway=gateway, now=utcnow() + LATER) == 0
    assert model.calls == []
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        task.reward_method = "exact"
        session.add(task)
    with pytest.raises(InvalidInput, match="reference answer"):
        set_rules(engine, DEMO_TASK, {"judge_ab": True}, "cli")
    with pytest.raises(InvalidInput, match="judge_share"):
        set_rules(engine, DEMO_TASK, {"judge_share": 2}, "cli")


def test_the_cli_sets_the_judge_rules_and_traces_and_the_api_say_whose_score_each_is(engine, judged, database_url,
                                                                                      capsys):
    from fastapi.testclient import TestClient

    from api.app import create_app
    from core.records.keys.api_keys import create_key
    from tests.test_cli import run

    code, out, _ = run(capsys, "--db", database_url, "production-rules", "--task", DEMO_TASK, "--judge-share", "1",
                       "--judge-ab")
    assert code == 0 and "The task's judge scores 100% of traces and every A/B arm's trace without feedback" in out
    post(engine, judged.id, 2)
    ingest_traces(engine, [TraceIn(id="sent", task=DEMO_TASK, version_id=judged.id, input="q", output="a",
                                   score=0.5)])
    _model, gateway = gateway_for(engine, verdict(0))
    assert score_production(engine, "w1", gateway=gateway, now=utcnow() + LATER) == 2  # not the one with a score
    code, out, _ = run(capsys, "--db", database_url, "traces", "--task", DEMO_TASK)
    assert code == 0 and "score by: user 1, judge 2" in out and "0.00 by judge" in out
    assert "2 judge call(s) in the ledger (stage production_judge)" in out

    secret = create_key(engine, "agent", "ingest", "cli", any_task=True).secret
    client = TestClient(create_app(engine), headers={"Authorization": f"Bearer {secret}"})
    body = client.get("/v1/traces/t0", params={"task": DEMO_TASK}).json()
    assert (body["score"], body["score_by"], body["judge"]["status"]) == (0.0, "judge", "scored")
    assert client.get("/v1/traces/sent", params={"task": DEMO_TASK}).json()["score_by"] == "user"
    assert client.get("/v1/traces/nope", params={"task": DEMO_TASK}).status_code == 404


def test_a_production_conversation_is_scored_by_the_tasks_rubric_judge(engine, demo_task):
    """A conversation task's reward is its rubric judge: the trace's turns are the transcript it reads."""
    from core.records.tasks.demos import CONVERSATION_TASK, ensure_demo_tasks
    from tests.test_conversation_engine import rubric_reply

    ensure_demo_tasks(engine)
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == CONVERSATION_TASK)).one()
        task.judge_model, task.reward_settings = "openai/gpt-4o-mini", {**task.reward_settings, "rules": []}
        session.add(task)
    version = import_library(engine, CONVERSATION_TASK, "- Ask for the order number first.", "a.md", actor="system")
    set_rules(engine, CONVERSATION_TASK, {"judge_share": 1.0}, "cli")
    turns = [{"role": "user", "text": "My parcel never came."},
             {"role": "agent", "text": "I am sorry. What is your order number?"},
             {"role": "user", "text": "NW-48213."}, {"role": "agent", "text": "A new one ships today."}]
    ingest_traces(engine, [TraceIn(id="c1", task=CONVERSATION_TASK, version_id=version.id, input=turns[0]["text"],
                                   turns=turns)])
    model, gateway = gateway_for(engine, rubric_reply(empathy=5, discovery=5, resolution=5))
    assert score_production(engine, "w1", gateway=gateway, now=utcnow() + LATER) == 1
    [row] = traces(engine)
    assert (row.judge_status, row.judge_score, score_source(row)) == ("scored", 1.0, "judge"), row.judge_detail
    transcript = model.calls[-1][1][1]["content"]
    assert "NW-48213." in transcript and "A new one ships today." in transcript


def test_a_claim_is_taken_over_only_from_a_worker_no_longer_alive(engine, judged):
    """A worker killed mid-call leaves its trace `judging`: another worker scores it. A live worker's claim stays
    its own however long its judge takes (a second call would pay twice)."""
    from core.jobs.worker import register

    set_rules(engine, DEMO_TASK, {"judge_share": 1.0}, "cli")
    post(engine, judged.id, 2)
    register(engine, "alive-worker")
    with session_scope(engine) as session:
        rows = list(session.exec(select(Trace).order_by(Trace.id)))
        for row, owner in zip(rows, ("killed-worker", "alive-worker"), strict=True):
            row.judge_status, row.judge_claim, row.judged_at = "judging", owner, utcnow() - timedelta(minutes=5)
            session.add(row)
    model, gateway = gateway_for(engine, verdict(1))
    assert score_production(engine, "w2", gateway=gateway, now=utcnow() + LATER) == 1
    orphaned, held = traces(engine)
    assert (orphaned.judge_status, orphaned.judge_claim) == ("scored", "w2")
    assert (held.judge_status, held.judge_claim) == ("judging", "alive-worker") and model.count(STAGE) == 1


def test_a_failed_judge_call_is_retried_after_a_back_off_and_never_queued_for_a_person(engine, judged):
    """Issue 60, item 4: a provider error was an unsure verdict with no value, label status `needed`, never judged
    again; an outage sent every trace of it to people. Now it waits for a later pass and says the judge is down."""
    import litellm

    set_rules(engine, DEMO_TASK, {"judge_share": 1.0}, "cli")
    post(engine, judged.id, 1)
    down = litellm.ServiceUnavailableError("the provider is down", model="gpt-4o-mini", llm_provider="openai")
    model, gateway = gateway_for(engine, [down, down, verdict(1)])
    start = utcnow() + LATER
    assert score_production(engine, "w1", gateway=gateway, now=start) == 1
    [row] = traces(engine)
    assert (row.judge_status, row.judge_attempts, row.label_status) == ("retry", 1, None)
    assert trace_score(row) is None and "judge call failed" in row.judge_detail
    with Session(engine) as session:
        summary = judge_summary(session, row.task_id)
    assert summary.retrying == 1 and summary.unsure == 0 and summary.unavailable.startswith("Judge unavailable since")
    assert score_production(engine, "w1", gateway=gateway, now=start + timedelta(seconds=30)) == 0  # backing off
    assert model.count(STAGE) == 1
    assert score_production(engine, "w1", gateway=gateway, now=start + timedelta(seconds=61)) == 1
    [row] = traces(engine)
    assert (row.judge_status, row.judge_attempts, row.label_status) == ("retry", 2, None)
    assert score_production(engine, "w1", gateway=gateway, now=start + timedelta(seconds=61 + 100)) == 0  # 120 s now
    assert score_production(engine, "w1", gateway=gateway, now=start + timedelta(seconds=61 + 121)) == 1
    [row] = traces(engine)
    assert (row.judge_status, row.judge_score, row.judge_attempts, row.label_status) == ("scored", 1.0, 0, None)
    assert model.count(STAGE) == 3
    with Session(engine) as session:
        assert judge_summary(session, row.task_id).unavailable is None


def test_a_labeller_of_an_ab_trace_does_not_see_the_judges_suggestion_first():
    """An A/B trace's label is the experiment's evidence: the unsure judge's figure shown first would anchor it."""
    from core.records.production.scoring import judge_suggestion_shown

    plain = Trace(task_id=1, client_id="a", input="q", judge_status="unsure", judge_score=1.0)
    counted = Trace(task_id=1, client_id="b", input="q", judge_status="unsure", judge_score=1.0, ab_experiment_id=1,
                    ab_arm=CANDIDATE)
    left_out = Trace(task_id=1, client_id="c", input="q", judge_status="unsure", ab_experiment_id=1, ab_arm=CANDIDATE,
                     ab_excluded="before the experiment started")
    assert judge_suggestion_shown(plain) and judge_suggestion_shown(left_out)
    assert not judge_suggestion_shown(counted)
    assert not judge_suggestion_shown(Trace(task_id=1, client_id="d", input="q", judge_status="scored"))
