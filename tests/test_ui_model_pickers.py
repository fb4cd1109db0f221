"""Model pickers (AppTest, issue 37): Train's Policy and Learner, the Quick trial, Evaluate and Tasks offer a model
connection's models as its server lists them at /v1/models (the stub server), beside the task's and the default;
a preset or a finished evaluation never replaces the model a person or the task chose, and a page switch keeps it."""

from __future__ import annotations

import pytest
from sqlmodel import Session

from bench.stub_server import StubServer
from core.grpo.evaluation import execute_evaluation
from core.models.connections import forget_served_models
from core.records.models.connections import add_connection
from core.records.tasks.demos import DEMO_TASK
from storage import db, queries
from tests.ui_support import click, run_app, scripted_gateway, switch

TRAIN, EVALUATE, TASKS = "pages/train.py", "pages/evaluate.py", "pages/tasks.py"
SERVED = ("stub", "stub-large")


@pytest.fixture(scope="module")
def stub():
    with StubServer(models=SERVED) as server:
        yield server


@pytest.fixture
def engine(app_engine, stub):
    """The app's database with a connection `stubby` to the stub server; listings are asked afresh."""
    forget_served_models()
    add_connection(app_engine, "stubby", "openai", actor="cli", base_url=stub.url)
    yield app_engine
    forget_served_models()


def set_task_models(engine, **models) -> None:
    with db.session_scope(engine) as session:
        task = queries.task_by_name(session, DEMO_TASK)
        for field, model in models.items():
            setattr(task, field, model)
        session.add(task)


def models_shown(at) -> tuple[str, str]:
    return at.selectbox(key="train_policy_model").value, at.selectbox(key="train_learner_model").value


def test_train_offers_a_connections_models_and_a_preset_keeps_the_tasks_connection_model(engine):
    set_task_models(engine, policy_model="stubby/stub-large", learner_model="stubby/stub-large")
    at = run_app(page=TRAIN, session_state={"ctx_reviewer": "alice"})
    for key in ("train_policy_model", "train_learner_model"):
        options = at.selectbox(key=key).options
        assert options[:3] == ["stubby/stub-large", "local/qwen2.5-coder-0.5b", "stubby/stub"], options
    assert any("Connections' models: stubby: stub, stub-large (listed just now)" in c.value.replace("\\", "")
               for c in at.caption)
    assert models_shown(at) == ("stubby/stub-large", "stubby/stub-large")  # the task's

    click(at, "train_preset_quick")
    assert "The settings below are the quick trial." in [c.value for c in at.caption]
    assert models_shown(at) == ("stubby/stub-large", "stubby/stub-large")  # not the default model

    at.selectbox(key="train_learner_model").set_value("stubby/stub").run()
    click(at, "train_preset_full")
    click(at, "train_preset_quick")
    assert models_shown(at) == ("stubby/stub-large", "stubby/stub")  # the person's choice stays too

    switch(at, "pages/review.py")  # Streamlit drops a widget's state when its page is left: the choice is kept
    switch(at, TRAIN)
    assert models_shown(at) == ("stubby/stub-large", "stubby/stub")
    click(at, "train_submit")
    with Session(engine) as session:
        [run] = queries.runs(session)
    assert (run.settings["policy_model"], run.settings["learner_model"]) == ("stubby/stub-large", "stubby/stub")


def test_the_overviews_quick_trial_keeps_the_models_the_task_names(engine):
    from core.records.tasks.demos import POLICY_TASK

    with db.session_scope(engine) as session:
        task = queries.task_by_name(session, POLICY_TASK)
        task.policy_model = task.learner_model = "stubby/stub"
        session.add(task)
    at = run_app()
    click(at, "overview_step_quick")
    assert [t.value for t in at.title] == ["Train"] and at.session_state["task"] == POLICY_TASK
    assert models_shown(at) == ("stubby/stub", "stubby/stub")


def test_a_refresh_asks_the_server_again(engine, monkeypatch):
    from core.models import connections

    asked = []
    real = connections.fetch_models
    monkeypatch.setattr(connections, "fetch_models", lambda *a, **k: asked.append(a) or real(*a, **k))
    at = run_app(page=TRAIN)
    at.run()
    assert len(asked) == 1  # kept between redraws
    click(at, "train_refresh_models")
    assert len(asked) == 2


def test_evaluate_offers_a_connections_models_and_keeps_the_last_chosen_after_an_evaluation_ran(engine):
    at = run_app(page=EVALUATE, session_state={"ctx_reviewer": "alice"})
    [model] = [box for box in at.selectbox if box.label == "Model"]
    assert {"stubby/stub", "stubby/stub-large"} <= set(model.options)
    model.set_value("stubby/stub-large")
    at.button(key="eval_submit").click().run()
    assert not at.exception, [e.value for e in at.exception]
    with Session(engine) as session:
        [queued] = queries.evaluations(session)
    assert queued.model == "stubby/stub-large"
    _model, gateway = scripted_gateway(engine)
    execute_evaluation(engine, queued.id, gateway=gateway)  # the worker's part: it ends with figures
    at.run()  # the page redraws itself when an evaluation ends
    [model] = [box for box in at.selectbox if box.label == "Model"]
    assert model.value == "stubby/stub-large"
    switch(at, "pages/rollouts.py")  # another page and back: still what was chosen for this task
    switch(at, EVALUATE)
    [model] = [box for box in at.selectbox if box.label == "Model"]
    assert model.value == "stubby/stub-large"

    fresh = run_app(page=EVALUATE)  # a new session: the model the task's last evaluation used
    [model] = [box for box in fresh.selectbox if box.label == "Model"]
    assert model.value == "stubby/stub-large"


def test_tasks_offers_a_connections_models_for_each_role(engine):
    at = run_app(page=TASKS)
    with Session(engine) as session:
        task = queries.task_by_name(session, DEMO_TASK)
    prefix = f"task_{task.id}_"
    for role in ("policy_model", "learner_model", "judge_model"):
        box = at.selectbox(key=f"{prefix}{role}")
        assert box.value == getattr(task, role) and "stubby/stub-large" in box.options, box.options
    at.selectbox(key=f"{prefix}learner_model").set_value("stubby/stub-large")
    click(at, "tasks_save")
    with Session(engine) as session:
        assert queries.task_by_name(session, DEMO_TASK).learner_model == "stubby/stub-large"
    at = run_app(page=TASKS, session_state={f"{prefix}judge_model": "typed/any-name"})  # typed (AppTest cannot type)
    click(at, "tasks_save")
    with Session(engine) as session:
        assert queries.task_by_name(session, DEMO_TASK).judge_model == "typed/any-name"

