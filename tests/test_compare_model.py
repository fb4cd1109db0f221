"""`python -m core compare A B` on the model a person chose (core/grpo/comparison_pair.py, core.records.models.options
.chosen_model): it reuses the newest finished pair of evaluations made on one model and says which; where none
exists it evaluates on the model of the task's newest evaluation or run a person chose, never on the embedded
model after a team's work on a connection (here the embedded model cannot even start: loading it raises)."""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session

from bench.stub_server import StubServer
from core.cli import main
from core.domain.library import ProposedOp
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.models import local_model, model_server
from core.records.library.versions import edit_library
from core.records.models.connections import add_connection
from core.records.models.options import chosen_model
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.lookup import get_task
from storage import queries
from storage.db import session_scope, url_with_password
from storage.tables import Evaluation, Run

MODEL = "stubby/stub"


@pytest.fixture
def no_embedded_model(monkeypatch):
    """Starting or loading the embedded model fails the test at once."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("the embedded model was started")

    monkeypatch.setattr(model_server, "address", refuse)
    monkeypatch.setattr(local_model, "get_server", refuse)


def cli(capsys, engine, *argv) -> tuple[int, str, str]:
    code = main(["--db", url_with_password(engine), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def evaluated(engine, version: str, model: str) -> int:
    evaluation_id = create_evaluation(engine, DEMO_TASK, version, limit=2, model=model)
    execute_evaluation(engine, evaluation_id)
    return evaluation_id


def test_compare_reuses_a_connections_evaluations_and_never_starts_the_embedded_model(engine, demo_task, capsys,
                                                                                      no_embedded_model):
    with Session(engine) as session:
        assert get_task(session, DEMO_TASK).policy_model.startswith("local/")  # the task's own model is embedded
    edit_library(engine, DEMO_TASK, [ProposedOp("ADD", [], "Check the units of every quantity.", "")], "cli")
    with StubServer() as stub:
        add_connection(engine, "stubby", "openai", base_url=stub.url, actor="cli")
        first, second = evaluated(engine, "1", MODEL), evaluated(engine, "2", MODEL)
        asked = len(stub.requests())
        code, out, err = cli(capsys, engine, "compare", "--task", DEMO_TASK, "1", "2", "--limit", "2", "--json")
        assert code == 0, err
        result = json.loads(out)
        assert (result["evaluation_a"], result["evaluation_b"], result["model"]) == (first, second, MODEL)
        assert f"reusing evaluations {first} (A) and {second} (B), both finished on model {MODEL}" in err
        assert len(stub.requests()) == asked  # nothing evaluated again

        # version #3 has no evaluation: it is evaluated on the model of the newest evaluation a person chose
        edit_library(engine, DEMO_TASK, [ProposedOp("ADD", [], "Re-read the question.", "")], "cli")
        code, out, err = cli(capsys, engine, "compare", "--task", DEMO_TASK, "2", "3", "--limit", "2")
        assert code == 0, err
        assert f"evaluating on {MODEL} (the model of evaluation {second}, the task's newest work a person chose)" in err
        assert len(stub.requests()) > asked
    with Session(engine) as session:
        newest = queries.evaluations(session)[0]
    assert newest.model == MODEL and newest.id not in (first, second)


def test_compare_takes_the_model_to_compare_on(engine, demo_task, capsys, no_embedded_model):
    edit_library(engine, DEMO_TASK, [ProposedOp("ADD", [], "Check the units of every quantity.", "")], "cli")
    with StubServer() as stub:
        add_connection(engine, "stubby", "openai", base_url=stub.url, actor="cli")
        on_stub = (evaluated(engine, "1", MODEL), evaluated(engine, "2", MODEL))
        on_large = (evaluated(engine, "1", "stubby/stub-large"), evaluated(engine, "2", "stubby/stub-large"))
        code, out, _ = cli(capsys, engine, "compare", "--task", DEMO_TASK, "1", "2", "--limit", "2", "--json")
        assert (json.loads(out)["evaluation_a"], json.loads(out)["evaluation_b"]) == on_large  # the newest pair
        code, out, err = cli(capsys, engine, "compare", "--task", DEMO_TASK, "1", "2", "--limit", "2", "--json",
                             "--model", MODEL)
    assert code == 0, err
    assert (json.loads(out)["evaluation_a"], json.loads(out)["evaluation_b"], json.loads(out)["model"]) == (*on_stub,
                                                                                                            MODEL)


def test_the_chosen_model_is_the_newest_runs_or_evaluations(engine, demo_task):
    with Session(engine) as session:
        task = get_task(session, DEMO_TASK)
        assert chosen_model(session, task).model == task.policy_model  # no work yet: the task's own
    with session_scope(engine) as session:
        session.add(Evaluation(task_id=task.id, split="test", k=1, model="lab/old", status="completed",
                               mean_at_k=0.5, metrics={"answered": 2}))
    with session_scope(engine) as session:
        library = queries.library_by_name(session, task.id, "default")
        session.add(Run(task_id=task.id, library_id=library.id, settings={"policy_model": "lab/run-model"},
                        status="completed", created_by="ann"))
        session.add(Run(task_id=task.id, library_id=library.id, settings={"policy_model": "lab/failed"},
                        status="failed", created_by="ann"))
    with Session(engine) as session:
        start = chosen_model(session, task)
    assert start.model == "lab/run-model" and "run" in start.reason
