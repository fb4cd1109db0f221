"""The writes a level's calls make together land in one transaction (storage.group_commit, issue 52 item 6) and keep
every guarantee of a transaction each: a worker that lost its job writes none of them, and a bad row fails only its
own writer."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import event, insert
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from core.grpo.training import RunSettings, create_run
from core.jobs.worker import claim
from core.models.gateway import Gateway, Scope
from core.records.tasks.demos import DEMO_TASK
from storage.fencing import Lease, LeaseLost, holding
from storage.group_commit import committed
from storage.tables import LLMCall

SETTINGS = RunSettings(epochs=1, batch_size=2, group_size=2, limit=2, concurrency=2, gate="off")
CALLS = 20


def _commits(engine) -> list[int]:
    commits: list[int] = []
    event.listen(engine, "commit", lambda _connection: commits.append(1))
    return commits


async def _calls(gateway: Gateway, run_id: int) -> list:
    return await asyncio.gather(*(gateway.complete(stage="summary", model="openai/stub", scope=Scope(run_id=run_id),
                                                   messages=[{"role": "user", "content": f"question {i}"}])
                                  for i in range(CALLS)), return_exceptions=True)


def test_the_ledger_rows_of_calls_answered_together_share_one_transaction(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    lease = claim(engine, "run", run_id, "A")
    gateway = Gateway(engine, mock=lambda stage, messages: f"reply to {messages[-1]['content']}")
    commits = _commits(engine)
    with holding(lease):
        results = asyncio.run(_calls(gateway, run_id))
    assert len(commits) < CALLS  # a transaction each was CALLS commits; the mock answers over a few passes
    with Session(engine) as session:
        rows = {row.id: row.response for row in session.exec(select(LLMCall).where(LLMCall.run_id == run_id))}
    assert {result.call_id: result.text for result in results} == rows and len(rows) == CALLS


def test_writes_asked_for_in_one_pass_of_the_loop_are_one_transaction(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    lease = claim(engine, "run", run_id, "A")
    gateway = Gateway(engine)
    commits = _commits(engine)

    async def records():
        return await asyncio.gather(*(gateway._record(run_id=run_id, stage="summary", model="openai/stub",
                                                      cache_key=f"k{i}", request={}, response=f"r{i}")
                                      for i in range(CALLS)))

    with holding(lease):
        ids = asyncio.run(records())
    assert len(commits) == 1
    with Session(engine) as session:
        assert {session.get(LLMCall, i).response for i in ids} == {f"r{i}" for i in range(CALLS)}


def test_a_worker_that_lost_its_run_writes_none_of_the_rows_of_a_shared_transaction(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    lease = claim(engine, "run", run_id, "A")
    gateway = Gateway(engine, mock=lambda stage, messages: "a reply")
    with holding(Lease("run", run_id, "A", lease.generation + 1)):
        results = asyncio.run(_calls(gateway, run_id))
    assert len(results) == CALLS and all(isinstance(result, LeaseLost) for result in results)
    with Session(engine) as session:
        assert session.exec(select(LLMCall).where(LLMCall.run_id == run_id)).all() == []


def test_a_bad_row_in_a_shared_transaction_fails_only_its_own_writer(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    lease = claim(engine, "run", run_id, "A")
    table = LLMCall.__table__

    def row(call_id: int):
        values = {"id": call_id, "run_id": run_id, "stage": "summary", "model": "openai/stub", "cache_key": "k",
                  "request": {}, "cache_hit": False, "attempts": 1}
        return lambda connection: connection.execute(insert(table).values(**values)).inserted_primary_key[0]

    async def writes():
        return await asyncio.gather(committed(engine, row(101)), committed(engine, row(101)),
                                    committed(engine, row(102)), return_exceptions=True)

    with holding(lease):
        first, duplicate, other = asyncio.run(writes())
    assert (first, other) == (101, 102) and isinstance(duplicate, IntegrityError)
    with Session(engine) as session:
        assert sorted(session.exec(select(LLMCall.id).where(LLMCall.run_id == run_id))) == [101, 102]


def test_a_write_asked_for_is_made_when_its_task_is_cancelled(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    lease = claim(engine, "run", run_id, "A")
    gateway = Gateway(engine, mock=lambda stage, messages: "a reply")

    async def cancelled_after_asking():
        task = asyncio.ensure_future(gateway._record(run_id=run_id, stage="summary", model="openai/stub",
                                                     cache_key="k", request={}, response="paid"))
        await asyncio.sleep(0)  # the record is asked for, not yet written
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with holding(lease):
        asyncio.run(cancelled_after_asking())
    with Session(engine) as session:
        assert [r.response for r in session.exec(select(LLMCall).where(LLMCall.run_id == run_id))] == ["paid"]


def test_the_cache_lookups_of_calls_asked_together_are_one_query(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    lease = claim(engine, "run", run_id, "A")
    gateway = Gateway(engine, mock=lambda stage, messages: f"reply to {messages[-1]['content']}")
    with holding(lease):
        first = asyncio.run(_calls(gateway, run_id))
        lookups: list[str] = []
        event.listen(engine, "before_cursor_execute", lambda _c, _cursor, statement, *_: lookups.append(statement)
                     if "cache_key" in statement and statement.lstrip().upper().startswith("SELECT") else None)
        again = asyncio.run(_calls(gateway, run_id))
    assert len(lookups) == 1  # a lookup each was CALLS queries
    assert [result.text for result in again] == [result.text for result in first]
    assert all(result.cache_hit for result in again) and not any(result.cache_hit for result in first)
