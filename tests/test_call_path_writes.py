"""The per-call writes made without a Session (issue 52, item 6) keep the Session's guarantees: a rollout and a
ledger mark land only under the held lease, a second writer's rollout is the one kept, a stored rollout is
found whether it belongs to a step or an evaluation (NULL keys), and a ledger row carries its model defaults."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from sqlmodel import Session, select

from core.grpo.agent import agent_settings
from core.grpo.rollouts import stored_rollout
from core.grpo.training import RunSettings, _save_advantage, create_run
from core.jobs.worker import claim
from core.models.gateway import Gateway, Scope
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.fencing import Lease, LeaseLost, holding
from storage.tables import Advantage, Evaluation, LLMCall, Rollout, Step, Task
from storage.writes import update_by_id, written_or_stored

SETTINGS = RunSettings(epochs=1, batch_size=2, group_size=2, limit=2, concurrency=2, gate="off")


def _step_and_sample(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    with Session(engine) as session:
        step = Step(run_id=run_id, epoch=0, batch_index=0)
        session.add(step)
        session.commit()
        session.refresh(step)
        sample = queries.samples(session, demo_task.id, "train", limit=1)[0]
    return run_id, step, sample


def test_a_rollout_written_through_a_connection_is_fenced_and_a_second_writer_keeps_the_first(engine, demo_task):
    run_id, step, sample = _step_and_sample(engine, demo_task)
    lease = claim(engine, "run", run_id, "A")
    key = {"step_id": step.id, "evaluation_id": None, "sample_id": sample.id, "group_index": 0}
    with holding(Lease("run", run_id, "A", lease.generation + 1)), pytest.raises(LeaseLost):
        written_or_stored(engine, Rollout(**key, response="from a worker that lost the run"), **key)
    with holding(lease):
        first = written_or_stored(engine, Rollout(**key, response="first"), **key)
        second = written_or_stored(engine, Rollout(**key, response="second"), **key)
    assert first.id is not None and (second.id, second.response) == (first.id, "first")
    with Session(engine) as session:
        assert [r.response for r in session.exec(select(Rollout))] == ["first"]


def test_a_column_set_by_id_is_fenced_and_leaves_the_rest_of_the_row(engine, demo_task):
    run_id, step, sample = _step_and_sample(engine, demo_task)
    lease = claim(engine, "run", run_id, "A")
    key = {"step_id": step.id, "evaluation_id": None, "sample_id": sample.id, "group_index": 0}
    with holding(lease):
        row = written_or_stored(engine, Rollout(**key, response="an answer", messages=[{"role": "user",
                                                                                      "content": "q"}]), **key)
    with holding(Lease("run", run_id, "A", lease.generation + 1)), pytest.raises(LeaseLost):
        update_by_id(engine, Rollout, row.id, summary="from a worker that lost the run")
    with holding(lease):
        update_by_id(engine, Rollout, row.id, summary="the attempt boxed 3")
    with Session(engine) as session:
        stored = session.get(Rollout, row.id)
        assert (stored.summary, stored.response, stored.messages) == ("the attempt boxed 3", "an answer",
                                                                      [{"role": "user", "content": "q"}])


def test_a_ledger_mark_from_a_worker_that_lost_its_run_lands_nowhere(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    lease = claim(engine, "run", run_id, "A")
    gateway = Gateway(engine, mock=lambda stage, messages: "a reply")
    with holding(lease):
        call = asyncio.run(gateway.complete(stage="summary", model="openai/stub", messages=[
            {"role": "user", "content": "hi"}], scope=Scope(run_id=run_id)))
    with holding(Lease("run", run_id, "A", lease.generation + 1)), pytest.raises(LeaseLost):
        gateway._mark(call.call_id, "malformed")
    with holding(lease):
        gateway._mark(call.call_id, "parsed")
    with Session(engine) as session:
        row = session.get(LLMCall, call.call_id)
    assert (row.reply_status, row.run_id, row.stage, row.response) == ("parsed", run_id, "summary", "a reply")
    # the columns the call did not give hold the model's defaults
    assert (row.cache_hit, row.attempts, row.error, row.trace_id, row.connection) == (False, 1, None, None, None)
    assert row.created_at is not None


@pytest.mark.parametrize("owner", ["step", "evaluation"])
def test_a_stored_rollout_is_reused_and_a_failed_one_replaced_for_a_step_and_an_evaluation(engine, demo_task,
                                                                                            owner):
    _run_id, step, sample = _step_and_sample(engine, demo_task)
    with Session(engine, expire_on_commit=False) as session:
        task = session.get(Task, demo_task.id)
        evaluation = Evaluation(task_id=task.id, split="train", model="openai/stub")
        session.add(evaluation)
        session.commit()
        session.refresh(evaluation)
    replies = [RuntimeError("the provider is down"), "so the answer is \\boxed{3}"]
    calls: list[str] = []

    def model(stage, messages):
        calls.append(stage)
        return replies.pop(0) if len(replies) > 1 else replies[0]

    gateway = Gateway(engine, mock=model, max_retries=0)
    agent = agent_settings(task, model="openai/stub", temperature=0.7)
    where = {"step_id": step.id} if owner == "step" else {"evaluation_id": evaluation.id}
    other = {"evaluation_id": evaluation.id} if owner == "step" else {"step_id": step.id}

    def roll(**key):
        return asyncio.run(stored_rollout(engine, gateway, agent, task, sample, group_index=0, sample_index=0,
                                          experiences=[], scope=Scope(), people=False, **key))

    failed = roll(**where)
    assert failed.error is not None
    done = roll(**where)  # the failed one is replaced
    assert done.error is None and done.response.endswith("\\boxed{3}")
    assert roll(**where).id == done.id  # and the good one reused, without a call
    assert len(calls) == 2
    assert roll(**other).id != done.id  # the same sample and group of the other owner is another rollout
    with Session(engine) as session:
        keys = [(r.step_id, r.evaluation_id) for r in session.exec(select(Rollout))]
    assert sorted(keys, key=str) == sorted([(step.id, None) if owner == "step" else (None, evaluation.id),
                                            (None, evaluation.id) if owner == "step" else (step.id, None)], key=str)


def test_a_groups_advantage_is_fenced_and_a_stored_one_is_updated_in_place(engine, demo_task):
    run_id, step, sample = _step_and_sample(engine, demo_task)
    lease = claim(engine, "run", run_id, "A")
    ctx = SimpleNamespace(engine=engine)
    with holding(Lease("run", run_id, "A", lease.generation + 1)), pytest.raises(LeaseLost):
        _save_advantage(ctx, step, sample, None, status="ok", text="from a worker that lost the run")
    with holding(lease):
        failed = _save_advantage(ctx, step, sample, None, status="failed", error="the learner's reply was not JSON",
                                 raw="{oops")
        retried = _save_advantage(ctx, step, sample, failed, status="ok", text="lesson", proposals=["P1"])
        # a row another writer stored meanwhile (no `existing` known here) is updated, not duplicated
        again = _save_advantage(ctx, step, sample, None, status="skipped", text="all rewards equal")
    with holding(Lease("run", run_id, "A", lease.generation + 1)), pytest.raises(LeaseLost):
        _save_advantage(ctx, step, sample, again, status="ok", text="from a worker that lost the run")
    assert failed.id is not None and retried.id == failed.id == again.id
    assert (retried.status, retried.text, retried.proposals, retried.error) == ("ok", "lesson", ["P1"], None)
    with Session(engine) as session:
        rows = session.exec(select(Advantage)).all()
    assert [(r.id, r.status, r.text, r.proposals, r.raw_response, r.error) for r in rows] == [
        (failed.id, "skipped", "all rewards equal", [], None, None)]
