"""Every job can be stopped: a person cancels an evaluation (queued or running) or a measurement of experiences,
the worker stops within seconds and takes the next job, nothing answered is lost, a cancelled evaluation
resumes paying only for what was not answered, and the audit log names who stopped it."""

from __future__ import annotations

import threading
import time

import pytest
from sqlmodel import Session, select

from bench.stub_server import StubServer
from core.errors import Conflict
from core.grpo.attribution import create_attribution
from core.grpo.evaluation import create_evaluation
from core.grpo.training import RunSettings, create_run, execute_run
from core.jobs.run_control import cancel_attribution, cancel_evaluation, resume_evaluation
from core.jobs.worker import claim_next, serve
from core.models.gateway import Gateway
from core.records.library.versions import import_library
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.tables import AuditEvent, Evaluation, Rollout, Run
from tests.ui_support import run_app, scripted_gateway

MODEL = "openai/stub"


@pytest.fixture(autouse=True)
def any_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")


def evaluation(engine, evaluation_id: int) -> Evaluation:
    with Session(engine) as session:
        return session.get(Evaluation, evaluation_id)


def stored(engine, evaluation_id: int) -> list[Rollout]:
    with Session(engine) as session:
        return queries.evaluation_rollouts(session, evaluation_id)


def audit(engine, action: str) -> list[AuditEvent]:
    with Session(engine) as session:
        return list(session.exec(select(AuditEvent).where(AuditEvent.action == action)))


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_queued_evaluation_cancelled_is_never_claimed_and_resumes_like_an_incomplete_one(engine, demo_task):
    eval_id = create_evaluation(engine, DEMO_TASK, "empty", k=1, limit=2, model=MODEL)
    assert cancel_evaluation(engine, eval_id, "ann") == "cancelled"
    assert claim_next(engine, "w1") is None
    (event,) = audit(engine, "evaluation.cancelled")
    assert (event.actor, event.object_id, event.before, event.after) == (
        "ann", eval_id, {"status": "queued"}, {"status": "cancelled"})
    with pytest.raises(Conflict, match="cancelled"):
        cancel_evaluation(engine, eval_id, "ann")  # once is enough

    assert resume_evaluation(engine, eval_id, "bob") == "queued"
    assert audit(engine, "evaluation.resumed")[0].actor == "bob"
    _model, gateway = scripted_gateway(engine)
    assert serve(engine, once=True, owner="w1", gateway=gateway) == 1
    assert evaluation(engine, eval_id).status == "completed"


def test_a_running_evaluation_stops_within_seconds_keeps_its_answers_and_the_worker_takes_the_next_job(
        engine, demo_task):
    """The model server answers two rollouts, then holds the next two requests open (a call that would take a
    minute): Cancel ends the evaluation within seconds with its two answers stored, the worker goes on to the
    next queued evaluation, and a resume asks the server only for the four rollouts without an answer."""
    running = create_evaluation(engine, DEMO_TASK, "empty", k=2, limit=3, model=MODEL)
    following = create_evaluation(engine, DEMO_TASK, "empty", k=1, limit=1, model=MODEL)
    with StubServer(script=["ok", "ok", "timeout", "timeout"], hang_s=120) as stub:
        gateway = Gateway(engine, api_base=stub.url, concurrency=2, max_retries=0)
        done: dict[str, int] = {}
        worker = threading.Thread(target=lambda: done.update(jobs=serve(engine, once=True, owner="w1",
                                                                         gateway=gateway, poll=0.05)))
        worker.start()
        wait_for(lambda: len(stub.requests()) == 4 and len(stored(engine, running)) == 2)
        assert evaluation(engine, running).status == "running"

        asked = time.monotonic()
        assert cancel_evaluation(engine, running, "ann") == "cancelled"
        worker.join(timeout=15)
        assert not worker.is_alive()
        assert time.monotonic() - asked < 5  # the hanging calls were abandoned, not waited for
        assert done["jobs"] == 2  # and the worker took the next job

        ev = evaluation(engine, running)
        assert ev.status == "cancelled" and ev.mean_at_k is None
        assert ev.progress == {"rollouts_done": 2, "rollouts_total": 6}
        answered = {r.id for r in stored(engine, running)}
        assert len(answered) == 2 and all(r.error is None for r in stored(engine, running))
        assert evaluation(engine, following).status == "completed"
        assert audit(engine, "evaluation.cancelled")[0].actor == "ann"

        before = len(stub.requests())
        assert resume_evaluation(engine, running, "ann") == "queued"
        assert serve(engine, once=True, owner="w2", gateway=gateway) == 1
        ev = evaluation(engine, running)
        assert ev.status == "completed" and ev.metrics["answered"] == 6
        assert answered <= {r.id for r in stored(engine, running)}  # the answered rows were kept
        assert len(stub.requests()) - before <= 4  # only the unanswered rollouts were asked again


def test_a_measurement_cancelled_in_the_middle_of_a_variant_stops_there(engine, demo_task):
    """A measurement's variant is one evaluation of many rollouts: Cancel stops it within a second, not at the
    end of the variant, and the run ends cancelled (not failed) with the rollouts it had answered."""
    number = import_library(engine, DEMO_TASK, "- Re-read the question.\n- Check the units.", "lib.md").number
    run_id = create_attribution(engine, DEMO_TASK, str(number), k=2, limit=4, created_by="test")
    calls = {"n": 0}

    def slow_reply(messages):
        calls["n"] += 1
        if calls["n"] == 2:
            assert cancel_attribution(engine, run_id, "carol") == "cancelled"
        time.sleep(0.3)  # a model call that takes time: the stop check runs between them
        return "so \\boxed{0}"

    _model, gateway = scripted_gateway(engine, rollout=slow_reply)
    gateway.concurrency = 1
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "cancelled", run.error
    assert calls["n"] < 8  # the first variant alone has 4 queries x k=2 rollouts
    with Session(engine) as session:
        (variant,) = session.exec(select(Evaluation).where(Evaluation.run_id == run_id)).all()
    # the answer given before Cancel is kept; the second call's, answered after it, lands only when it came back
    # before the stop check did (a loaded machine: not always, measured under pytest-xdist beside the browser tests)
    assert variant.status == "cancelled" and len(stored(engine, variant.id)) >= 1
    (event,) = audit(engine, "run.cancelled")
    assert (event.actor, event.object_id) == ("carol", run_id)


def test_cancel_names_what_it_stops(engine, demo_task):
    """cancel_attribution stops measurements only; a gate's evaluation stops with its run."""
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2))
    with pytest.raises(Conflict, match="not a measurement"):
        cancel_attribution(engine, run_id, "ann")
    with Session(engine) as session:
        assert session.get(Run, run_id).status == "queued"
    from core.grpo.evaluation import create_fixed_evaluation
    from storage.db import session_scope
    from storage.tables import Task

    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        gate_id = create_fixed_evaluation(session, task, purpose="gate", split="train", sample_ids=[], experiences=[],
                                          k=1, model=MODEL, temperature=0.7, run_id=run_id).id
    with pytest.raises(Conflict, match=f"cancel or pause run {run_id}"):
        cancel_evaluation(engine, gate_id, "ann")


def test_the_evaluate_page_cancels_a_queued_evaluation_and_offers_to_resume_it(app_engine):
    eval_id = create_evaluation(app_engine, DEMO_TASK, "empty", k=1, limit=2, created_by="test")
    at = run_app(page="pages/evaluate.py", session_state={"ctx_reviewer": "alice"})
    at.button(key=f"eval_cancel_{eval_id}").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert evaluation(app_engine, eval_id).status == "cancelled"
    assert audit(app_engine, "evaluation.cancelled")[0].actor == "alice"
    assert not [b for b in at.button if b.key == f"eval_cancel_{eval_id}"]
    assert any(f"Evaluation {eval_id} was cancelled with 0 of" in c.value for c in at.caption)

    at.button(key=f"eval_resume_{eval_id}").click()
    at.run()
    assert evaluation(app_engine, eval_id).status == "queued"


def test_a_run_cancelled_while_its_gate_measures_stops_there_instead_of_running_the_gate_to_its_end(engine, demo_task):
    """Issue 41: Cancel on a run whose validation gate was measuring let the gate's two evaluations run on to
    their end (every validation query x gate_k, twice); the gate now checks the run's stop every second."""
    from core.jobs.run_control import cancel_run

    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2, gate_k=2,
                                                       validation_size=4, review_mode="manual"), created_by="test")
    calls = {"n": 0}

    def slow_gate(messages):
        calls["n"] += 1
        if calls["n"] == 2:
            assert cancel_run(engine, run_id, "carol") == "cancelled"
        time.sleep(0.3)  # a model call that takes time: the stop check runs between them
        return "so \\boxed{0}"

    _model, gateway = scripted_gateway(engine, gate=slow_gate)
    gateway.concurrency = 1
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "cancelled", run.error
    assert calls["n"] < 8  # the gate plans 4 queries x k=2 for each of its two libraries: 16 calls
    with Session(engine) as session:
        gates = session.exec(select(Evaluation).where(Evaluation.run_id == run_id,
                                                      Evaluation.purpose == "gate")).all()
        step = queries.steps(session, run_id)[0]
    assert gates and all(ev.status != "completed" for ev in gates)
    assert step.gate is None  # no verdict from a gate that was stopped
