"""A failed model call is not a wrong answer: evaluations, comparisons, the gate and training's group filter
count answered rollouts only, say how many failed, and retry exactly those."""

from __future__ import annotations

import json
import math

import pytest
from sqlmodel import Session, select

import core.grpo.evaluation as evaluation_module
from bench.stub_server import StubServer
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.grpo.gate import check_validation_size, passes
from core.grpo.training import create_run, execute_run
from core.jobs.run_control import resume_evaluation
from core.models.gateway import Gateway
from core.records.evaluation.comparison import compare_evaluations, paired
from core.records.runs.settings import RunSettings
from core.records.tasks.demos import DEMO_TASK
from core.settings import get_settings
from storage.db import session_scope, url_with_password
from storage.tables import Evaluation, LLMCall, Operation, Rollout, Step

MODEL = "openai/stub"


@pytest.fixture(autouse=True)
def any_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")


def stub_gateway(engine, stub: StubServer) -> Gateway:
    """The real HTTP path to the stub, one call at a time (the script's faults land in a fixed order), no retries."""
    return Gateway(engine, api_base=stub.url, concurrency=1, max_retries=0, backoff_s=0.001)


def rollouts(engine, evaluation_id: int) -> list[Rollout]:
    with Session(engine) as session:
        return list(session.exec(select(Rollout).where(Rollout.evaluation_id == evaluation_id)))


def test_an_evaluation_with_failed_calls_is_incomplete_and_counts_answered_rollouts_only(engine, demo_task):
    eval_id = create_evaluation(engine, DEMO_TASK, "empty", k=2, limit=3, model=MODEL)
    with StubServer(script=["ok", "ok", "500", "ok", "500", "ok"]) as stub:
        ev = execute_evaluation(engine, eval_id, gateway=stub_gateway(engine, stub))
        assert len(stub.requests()) == 6
    rows = rollouts(engine, eval_id)
    failed = [r for r in rows if r.error]
    assert ev.status == "incomplete" and len(failed) == 2
    assert all(r.reward is None for r in failed)
    answered = [r for r in rows if not r.error]
    by_query: dict[int, list[float]] = {}
    for r in answered:
        by_query.setdefault(r.sample_id, []).append(r.reward)
    assert ev.mean_at_k == pytest.approx(sum(sum(v) / len(v) for v in by_query.values()) / len(by_query))
    assert ev.metrics["errors"] == 2 and ev.metrics["answered"] == 4 and ev.metrics["rollouts"] == 6
    assert "2 of 6 rollouts have no reward" in ev.error and "--retry" in ev.error

    with StubServer() as stub:  # the retry pays for the two failed rollouts and nothing else
        assert resume_evaluation(engine, eval_id, "cli") == "queued"
        ev = execute_evaluation(engine, eval_id, gateway=stub_gateway(engine, stub))
        assert len(stub.requests()) == 2
    assert ev.status == "completed" and ev.error is None
    assert ev.metrics["errors"] == 0 and ev.metrics["answered"] == 6
    assert {r.id for r in answered} <= {r.id for r in rollouts(engine, eval_id)}  # answered rows were kept


def test_a_judge_whose_call_failed_gives_no_reward_to_count(engine, demo_task):
    """A reward of source `error` (the judge's or the scorer's failure) counts as an error, not as a 0."""
    eval_id = create_evaluation(engine, DEMO_TASK, "empty", k=1, limit=2, model=MODEL)
    with StubServer() as stub:
        execute_evaluation(engine, eval_id, gateway=stub_gateway(engine, stub))
    with session_scope(engine) as session:
        row = session.exec(select(Rollout).where(Rollout.evaluation_id == eval_id)).first()
        row.reward, row.reward_source, row.reward_detail = 0.0, "error", "judge call failed"
        session.add(row)
    metrics = evaluation_module.evaluation_metrics(rollouts(engine, eval_id))
    assert metrics["errors"] == 1 and metrics["answered"] == 1 and metrics["n"] == 1


def test_cli_eval_exits_non_zero_while_errors_remain_and_retry_runs_only_those(engine, demo_task, monkeypatch,
                                                                                 capsys):
    from core.cli import main

    url = url_with_password(engine)
    with StubServer(script=["500", "ok", "ok", "ok"]) as stub:
        monkeypatch.setattr(evaluation_module, "Gateway", lambda engine, **kw: stub_gateway(engine, stub))
        code = main(["--db", url, "eval", "--task", DEMO_TASK, "--version", "empty", "--k", "2", "--limit", "2",
                     "--model", MODEL, "--json"])
        out, err = capsys.readouterr()
        first = json.loads(out)
        assert code == 1, err
        assert first["status"] == "incomplete" and first["errors"] == 1 and first["answered"] == 3
        code = main(["--db", url, "eval", "--task", DEMO_TASK, "--version", "empty", "--k", "2", "--limit", "2",
                     "--model", MODEL])
        out, err = capsys.readouterr()
        assert code == 0, (out, err)  # a second evaluation replays the cache and retries the failed call: complete
        assert "rollout errors 0" in out
    with StubServer(script=["500"]) as stub:
        monkeypatch.setattr(evaluation_module, "Gateway", lambda engine, **kw: stub_gateway(engine, stub))
        eval_id = create_evaluation(engine, DEMO_TASK, "empty", k=2, limit=3, model=MODEL)
        code = main(["--db", url, "eval", "--retry", str(eval_id)])
        out, err = capsys.readouterr()
        assert code == 1 and "is incomplete" in err and f"eval --retry {eval_id}" in err
        assert "(of 5 answered rollouts)  rollout errors 1" in out
        before = len(stub.requests())
        code = main(["--db", url, "eval", "--retry", str(eval_id)])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert len(stub.requests()) - before == 1  # exactly the failed rollout


def scored_evaluation(engine, task, rewards: dict[int, list[float | None]], k: int) -> int:
    """An evaluation whose rollouts have these rewards per sample id (None: the model call failed)."""
    with session_scope(engine) as session:
        ev = Evaluation(task_id=task.id, split="test", k=k, model=MODEL, status="incomplete")
        session.add(ev)
        session.flush()
        for sample_id, values in rewards.items():
            for g, value in enumerate(values):
                session.add(Rollout(evaluation_id=ev.id, sample_id=sample_id, group_index=g, reward=value,
                                    reward_source=None if value is None else "verifier",
                                    error="ModelCallError: 503" if value is None else None))
        return ev.id


def test_compare_pairs_only_queries_answered_k_times_and_refuses_past_the_missing_share(engine, demo_task,
                                                                                       monkeypatch):
    with Session(engine) as session:
        from storage import queries

        ids = [s.id for s in queries.samples(session, demo_task.id, "test", limit=10)]
    a = {q: [0.0, 0.0] for q in ids}
    b = {q: [1.0, 1.0] for q in ids}
    b[ids[0]] = [1.0, None]  # one query lacks an answer under B: 10% of the queries
    a_id, b_id = scored_evaluation(engine, demo_task, a, 2), scored_evaluation(engine, demo_task, b, 2)
    result = compare_evaluations(engine, a_id, b_id)
    assert result.stats.n == 9 and result.missing == 1
    assert result.stats.decided and result.stats.verdict.startswith("B is better")
    assert "1 of the 10 queries both evaluated are left out" in result.note
    assert next(r for r in result.rows if r["sample_id"] == ids[0])["winner"] == "left out (errors)"

    b[ids[1]] = [None, None]  # now 20% are missing: past the 10% default
    b_id = scored_evaluation(engine, demo_task, b, 2)
    result = compare_evaluations(engine, a_id, b_id)
    assert not result.stats.decided and result.stats.verdict.startswith("cannot decide: 2 of the 10 queries")
    monkeypatch.setenv("TFGRPO_MAX_MISSING_SHARE", "0.5")
    get_settings.cache_clear()
    try:
        assert compare_evaluations(engine, a_id, b_id).stats.decided
    finally:
        monkeypatch.delenv("TFGRPO_MAX_MISSING_SHARE")
        get_settings.cache_clear()


def test_worse_needs_the_interval_and_the_sign_test_to_agree():
    """Six queries, five lose a little and one wins: the bootstrap interval excludes 0, the sign test
    (p = 0.22) does not; nothing is decided and the gate does not reject on the interval alone."""
    a = {q: [1.0] for q in range(6)}
    b = {q: [0.5] for q in range(5)} | {5: [1.0, ]}
    a[5] = [0.9]
    stats = paired(a, b, k=1)
    assert stats.ci_high < 0 and stats.p_value > 0.05
    assert not stats.decided and "the sign test does not agree" in stats.verdict
    assert not passes("no_worse", stats)  # the mean is lower: no_worse keeps its "mean not lower" half
    assert not passes("better", paired(b, a, k=1))  # and "better" needs both as well
    one = paired({1: [1.0]}, {1: [0.0]}, k=1)
    assert all(v is None or math.isfinite(v) for v in one.as_dict().values() if isinstance(v, float | None))
    assert one.as_dict()["ci_low"] is None


def test_a_validation_set_under_four_queries_is_refused():
    with pytest.raises(ValueError, match="at least 4 validation queries"):
        check_validation_size(3)
    check_validation_size(0)  # the gate off
    check_validation_size(4)


def test_a_gate_whose_validation_calls_failed_fails_an_auto_run_and_a_resume_measures_again(engine, demo_task,
                                                                                           scripted):
    """Auto review mode: the candidate's validation answers fail (an outage), so the gate cannot decide; the step's
    operations are neither approved nor rejected and nobody is waited for: the run fails and says why. Resumed once
    the model answers, the gate measures again (the failed calls only) and the run completes."""
    from tests.conftest import mixed_rollouts

    outage = True

    def gate(messages):
        if outage and "Re-read the question" in messages[0]["content"]:
            return RuntimeError("503 Service Unavailable")
        return "\\boxed{0}"

    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2,
                                                       review_mode="auto", validation_size=6), created_by="cli")
    model, gateway = scripted(engine, rollout=mixed_rollouts(), gate=gate)
    run = execute_run(engine, run_id, gateway=gateway)
    with Session(engine) as session:
        step = session.exec(select(Step).where(Step.run_id == run_id)).one()
        ops = list(session.exec(select(Operation).where(Operation.step_id == step.id)))
    assert run.status == "failed" and "the validation gate could not decide in auto review mode" in run.error
    assert "resume the run to retry it" in run.error
    assert step.gate["decision"] == "undecided" and step.gate["missing"] == 6
    assert "cannot decide: 6 of the 6 queries" in step.gate["line"]
    assert {o.status for o in ops} == {"pending"}  # neither rejected nor approved

    outage = False
    answered = model.count("gate")
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "completed", run.error
    # only the candidate's failed validation calls are asked again (6 queries x 2); the start's answers are reused
    assert model.count("gate") - answered == 12
    with Session(engine) as session:
        step = session.exec(select(Step).where(Step.run_id == run_id)).one()
        assert step.gate["decision"] in ("passed", "failed") and step.status == "completed"
        assert not [o for o in session.exec(select(Operation).where(Operation.step_id == step.id))
                    if o.status == "pending"]


def test_training_never_reads_a_failed_call_as_a_failed_answer(engine, demo_task, scripted):
    """A group of G=3 where one attempt's call failed and the two answered agree is skipped as 'equal
    rewards', not summarised as if the failure were a wrong answer."""
    seen: dict[str, int] = {}

    def rollout(messages):
        query = messages[1]["content"]
        seen[query] = seen.get(query, 0) + 1
        return RuntimeError("503 Service Unavailable") if seen[query] == 1 else "so \\boxed{-12345}"

    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=1, group_size=3, limit=1,
                                                       review_mode="auto", gate="off"), created_by="cli")
    model, gateway = scripted(engine, rollout=rollout)
    gateway.max_retries = 0  # the failed call stays failed
    execute_run(engine, run_id, gateway=gateway)
    assert model.count("summary") == 0
    with Session(engine) as session:
        from storage.tables import Advantage

        (adv,) = session.exec(select(Advantage).join(Step).where(Step.run_id == run_id)).all()
        calls = session.exec(select(LLMCall).where(LLMCall.run_id == run_id, LLMCall.error.is_not(None))).all()
    assert calls, "the failed call is in the ledger"
    assert adv.status == "skipped" and "1 failed calls left out" in adv.text
