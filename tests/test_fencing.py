"""Jobs fenced to their owner: a worker that lost its job writes nothing, idle workers take stalled jobs over,
natural keys refuse duplicates, and two library edits from one parent give one version."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest
from sqlalchemy import func
from sqlmodel import Session, select

from core.domain.library import ProposedOp
from core.errors import StaleVersion, TakenOver
from core.grpo.training import RunSettings, create_run
from core.jobs import worker as worker_module
from core.jobs.run_control import resume_run
from core.jobs.worker import claim, claim_next, execute_job, serve
from core.records.library.versions import edit_library, import_library
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.fencing import Lease, LeaseLost, holding
from storage.tables import Advantage, LibraryVersion, LLMCall, Operation, Rollout, Run, Step, utcnow
from storage.writes import insert_or_skip
from tests.conftest import mixed_rollouts

SETTINGS = RunSettings(epochs=1, batch_size=2, group_size=2, limit=2, concurrency=2, gate="off")
TABLES = (Rollout, Advantage, Operation, LLMCall, LibraryVersion, Step)


def counts(engine) -> dict[str, int]:
    with Session(engine) as session:
        return {t.__name__: session.exec(select(func.count()).select_from(t)).one() for t in TABLES}


def make_stale(engine, run_id: int) -> None:
    with Session(engine) as session:
        run = session.get(Run, run_id)
        run.heartbeat_at = utcnow() - timedelta(minutes=5)
        session.add(run)
        session.commit()


def test_a_worker_woken_after_its_run_was_taken_over_writes_nothing_and_stops(engine, demo_task, scripted,
                                                                             monkeypatch, caplog):
    """Worker A freezes inside a model call (a GC pause, a suspended laptop) with its heartbeat stopped; B takes
    the stalled run over and finishes it; when A wakes, its reply is not recorded and A stops saying why."""
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    frozen, wake = threading.Event(), threading.Event()
    replies = mixed_rollouts()

    def frozen_rollout(messages):
        frozen.set()
        wake.wait(30)
        return replies(messages)

    _model_a, gateway_a = scripted(engine, rollout=frozen_rollout)
    _model_b, gateway_b = scripted(engine, rollout=mixed_rollouts())
    real_beat = worker_module.beat
    monkeypatch.setattr(worker_module, "beat", lambda e, owner, lease: None if owner == "A" else real_beat(e, owner, lease))
    lease_a = claim(engine, "run", run_id, "A")
    outcome: dict[str, BaseException] = {}

    def worker_a() -> None:
        try:
            execute_job(engine, lease_a, gateway=gateway_a)
        except BaseException as exc:  # noqa: BLE001  (the test inspects it)
            outcome["a"] = exc

    thread = threading.Thread(target=worker_a)
    thread.start()
    assert frozen.wait(30)
    make_stale(engine, run_id)  # A's heartbeat stopped: the stall window passes

    lease_b = claim_next(engine, "B")
    assert (lease_b.job_id, lease_b.generation) == (run_id, 2)
    assert execute_job(engine, lease_b, gateway=gateway_b).status == "completed"
    finished = counts(engine)

    with caplog.at_level(logging.WARNING, logger="core.jobs.worker"):
        wake.set()
        thread.join(30)
    assert isinstance(outcome.get("a"), TakenOver), outcome
    assert f"run {run_id} (lease 1 of worker A) was taken over" in str(outcome["a"])
    assert any("was taken over" in r.getMessage() for r in caplog.records)
    assert counts(engine) == finished  # A wrote nothing: no ledger row, no rollout, no status
    with Session(engine) as session:
        run = session.get(Run, run_id)
        assert (run.status, run.worker_id, run.lease) == ("completed", "B", 2)
        rollouts = session.exec(select(Rollout)).all()
        keys = [(r.step_id, r.sample_id, r.group_index) for r in rollouts]
        assert len(keys) == len(set(keys)) == 4


def test_a_stalled_run_is_taken_over_by_an_idle_worker(engine, demo_task, scripted):
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    assert claim(engine, "run", run_id, "ghost-on-another-host:1:x")
    _model, gateway = scripted(engine, rollout=mixed_rollouts())
    assert claim_next(engine, "idle") is None  # its heartbeat is fresh: it is not stalled yet
    make_stale(engine, run_id)
    assert serve(engine, once=True, owner="idle", gateway=gateway) == 1
    with Session(engine) as session:
        run = session.get(Run, run_id)
        assert (run.status, run.worker_id, run.lease) == ("completed", "idle", 2)


def test_a_persons_resume_moves_the_lease_so_the_old_holder_cannot_write(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    lease = claim(engine, "run", run_id, "A")
    make_stale(engine, run_id)
    assert resume_run(engine, run_id, "ann") == "queued"
    with holding(lease), pytest.raises(LeaseLost, match="taken over"), Session(engine) as session:
        run = session.get(Run, run_id)
        run.progress = {"written": "by a worker that lost the run"}
        session.add(run)
        session.commit()
    assert lease.lost.is_set()
    with Session(engine) as session:
        run = session.get(Run, run_id)
        assert (run.status, run.worker_id, run.lease, run.progress.get("written")) == ("queued", None, 2, None)


def test_writes_under_a_held_lease_land(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    lease = claim(engine, "run", run_id, "A")
    with holding(lease), Session(engine) as session:
        run = session.get(Run, run_id)
        run.progress = {"written": True}
        session.add(run)
        session.commit()
    stranger = Lease("run", run_id, "A", lease.generation + 1)
    with holding(stranger), pytest.raises(LeaseLost), Session(engine) as session:
        session.add(Step(run_id=run_id, epoch=0, batch_index=0))
        session.commit()
    with Session(engine) as session:
        assert session.get(Run, run_id).progress == {"written": True}
        assert queries.steps(session, run_id) == []


def test_natural_keys_turn_a_second_insert_into_a_skip(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    with Session(engine) as session:
        sample = queries.samples(session, demo_task.id, "train", limit=1)[0]
        assert insert_or_skip(session, Step(run_id=run_id, epoch=0, batch_index=0))
        step = session.exec(select(Step)).one()
        assert insert_or_skip(session, Rollout(step_id=step.id, sample_id=sample.id, group_index=0, response="first"))
        assert not insert_or_skip(session, Rollout(step_id=step.id, sample_id=sample.id, group_index=0,
                                                   response="second"))
        assert insert_or_skip(session, Advantage(step_id=step.id, sample_id=sample.id))
        assert not insert_or_skip(session, Advantage(step_id=step.id, sample_id=sample.id))
        assert insert_or_skip(session, Operation(step_id=step.id, position=0, op="ADD"))
        assert not insert_or_skip(session, Operation(step_id=step.id, position=0, op="DELETE"))
        session.commit()
        assert [r.response for r in session.exec(select(Rollout))] == ["first"]
        assert [o.op for o in session.exec(select(Operation))] == ["ADD"]


def test_two_edits_from_one_parent_give_one_version_and_tell_the_other_who_won(engine, demo_task):
    parent = import_library(engine, DEMO_TASK, "- Write the units next to every number.\n", "seed.md")
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def edit(person: str, text: str) -> None:
        barrier.wait()
        try:
            results[person] = edit_library(engine, DEMO_TASK, [ProposedOp("ADD", text=text)], person,
                                           base_version_id=parent.id)
        except Exception as exc:  # noqa: BLE001  (the test inspects it)
            results[person] = exc

    threads = [threading.Thread(target=edit, args=(person, f"Experience written by {person}, checked twice."))
               for person in ("ann", "bob")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    won = [p for p, r in results.items() if isinstance(r, LibraryVersion)]
    lost = [p for p, r in results.items() if isinstance(r, StaleVersion)]
    assert len(won) == 1 and len(lost) == 1, results
    message = str(results[lost[0]])
    number = results[won[0]].number
    assert f"version #{number}" in message and f"was created by {won[0]} from the same parent" in message
    assert "your change was not applied; re-apply it on" in message
    with Session(engine) as session:
        versions = queries.versions(session, parent.library_id)
        assert [v.number for v in versions if v.parent_id == parent.id] == [number]


def test_an_evaluation_that_a_run_executes_is_never_taken_over_on_its_own(engine, demo_task):
    """A gate's or an attribution's evaluation is `running` while its run executes it; when the run dies it
    is the run that is taken over, never the evaluation by itself."""
    from core.grpo.evaluation import create_fixed_evaluation

    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    with Session(engine) as session:
        sample_ids = [s.id for s in queries.samples(session, demo_task.id, "train", limit=2)]
        create_fixed_evaluation(session, demo_task, purpose="gate", split="train", sample_ids=sample_ids,
                                experiences=[], k=1, model="m", temperature=0.0, run_id=run_id)
        session.commit()
    assert claim(engine, "run", run_id, "ghost-on-another-host:1:x")
    make_stale(engine, run_id)
    lease = claim_next(engine, "idle")
    assert (lease.table, lease.job_id) == ("run", run_id)
    assert claim_next(engine, "idle-2") is None
