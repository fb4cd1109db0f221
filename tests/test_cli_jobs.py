"""Every job can be stopped from the command line (issue 37): `run N --pause|--resume|--cancel`, `eval --cancel
ID` and `attribute --cancel RUN` go through core.jobs.run_control (audited as `cli`), print the status the job has
now, and a status the rules do not allow is refused with core's message and exit code 2."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from core.grpo.evaluation import create_evaluation
from core.grpo.training import RunSettings, create_run
from core.records.tasks.demos import DEMO_TASK
from storage.tables import AuditEvent, Evaluation, Run
from tests.test_cli_review import in_process

MODEL = "openai/stub"
SETTINGS = RunSettings(epochs=1, batch_size=2, group_size=2, limit=2, policy_model=MODEL, learner_model=MODEL)


@pytest.fixture
def cli(database_url, demo_task, capsys):
    return in_process(database_url, capsys)


@pytest.fixture(autouse=True)
def any_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")


def status_of(engine, table, job_id: int) -> str:
    with Session(engine) as session:
        return session.get(table, job_id).status


def actors(engine, action: str) -> list[tuple[str, int]]:
    with Session(engine) as session:
        return [(e.actor, e.object_id) for e in session.exec(select(AuditEvent).where(AuditEvent.action == action))]


def test_a_run_is_paused_resumed_and_cancelled_and_run_says_how_to_go_on(engine, cli):
    run_id = create_run(engine, DEMO_TASK, SETTINGS)
    code, out, _ = cli("run", str(run_id), "--pause")
    assert code == 0 and out == (f"run {run_id}: paused; a worker executing it stops at its next progress tick; "
                                 f"resume it with python -m core run {run_id} --resume\n")
    assert status_of(engine, Run, run_id) == "paused" and actors(engine, "run.paused") == [("cli", run_id)]
    code, out, _ = cli("run", str(run_id))
    assert out.splitlines()[-1] == (f"paused: resume it with python -m core run {run_id} --resume (a worker continues "
                                    f"it) or python -m core train --resume {run_id} (here)")

    code, out, _ = cli("run", str(run_id), "--resume")
    assert code == 0 and out == (f"run {run_id}: queued; a worker continues it (python -m core worker), or python -m "
                                 f"core train --resume {run_id} here\n")
    assert status_of(engine, Run, run_id) == "queued" and actors(engine, "run.resumed") == [("cli", run_id)]

    code, out, _ = cli("run", str(run_id), "--cancel")
    assert code == 0 and out == f"run {run_id}: cancelled; the versions it created stay\n"
    assert status_of(engine, Run, run_id) == "cancelled" and actors(engine, "run.cancelled") == [("cli", run_id)]

    code, out, err = cli("run", str(run_id), "--pause")  # not allowed in this status: core's message, exit 2
    assert (code, out) == (2, "")
    assert err == f"error: run {run_id} is cancelled; only queued, running, stalled can be paused\n"
    assert status_of(engine, Run, run_id) == "cancelled"
    code, _, err = cli("run", str(run_id), "--pause", "--cancel")
    assert code == 2 and "not allowed with argument" in err
    code, _, err = cli("run", "9999", "--cancel")
    assert code == 2 and err == "error: no run 9999\n"


def test_an_evaluation_is_cancelled_once_and_a_gate_evaluation_is_not(engine, cli):
    eval_id = create_evaluation(engine, DEMO_TASK, "empty", k=1, limit=2, model=MODEL)
    code, out, _ = cli("eval", "--cancel", str(eval_id))
    assert code == 0 and out == (f"evaluation {eval_id}: cancelled; a worker executing it stops within seconds; its "
                                 f"answered rollouts stay, and python -m core eval --retry {eval_id} continues it\n")
    assert status_of(engine, Evaluation, eval_id) == "cancelled"
    assert actors(engine, "evaluation.cancelled") == [("cli", eval_id)]

    code, _, err = cli("eval", "--cancel", str(eval_id))
    assert code == 2 and err.startswith(f"error: evaluation {eval_id} is cancelled; only queued, running")
    code, _, err = cli("eval", "--cancel", str(eval_id), "--retry", str(eval_id))
    assert code == 2 and "not allowed with argument" in err

    with Session(engine) as session:  # a gate's evaluation stops with its run, never alone
        gate = session.get(Evaluation, create_evaluation(engine, DEMO_TASK, "empty", k=1, limit=2, model=MODEL))
        gate.purpose, gate.run_id = "gate", 7
        session.add(gate)
        session.commit()
        gate_id = gate.id
    code, _, err = cli("eval", "--cancel", str(gate_id))
    assert code == 2 and err.startswith(f"error: evaluation {gate_id} is run 7's gate evaluation")
    assert status_of(engine, Evaluation, gate_id) == "queued"


def test_a_measurement_is_cancelled_and_a_training_run_is_not_one(engine, cli):
    from core.grpo.attribution import create_attribution
    from core.records.library.versions import import_library

    version = import_library(engine, DEMO_TASK, "- Re-read the question.\n- Check the units.", "lib.md", actor="bob")
    run_id = create_attribution(engine, DEMO_TASK, str(version.number), k=1, limit=2)
    code, out, _ = cli("attribute", "--cancel", str(run_id))
    assert code == 0 and out == (f"measurement run {run_id}: cancelled; a worker executing it stops within seconds; "
                                 "finished variants and answered rollouts stay\n")
    assert status_of(engine, Run, run_id) == "cancelled" and actors(engine, "run.cancelled") == [("cli", run_id)]

    train_id = create_run(engine, DEMO_TASK, SETTINGS)
    code, _, err = cli("attribute", "--cancel", str(train_id))
    assert code == 2 and err.startswith(f"error: run {train_id} is a train run, not a measurement of experiences")
    assert status_of(engine, Run, train_id) == "queued"
