"""The models every picker offers (core/records/models/options.py): the task's, the studio's default, each
connection's as its server lists them at /v1/models (kept for a while, asked again on refresh, the last list
kept with the reason when the server stops answering), then the embedded ones and those of providers with a
key; and the embedded learner's notice names connections as the way to a capable learner."""

from __future__ import annotations

import pytest
from sqlmodel import Session

from bench.stub_server import StubServer
from core.models import connections as served
from core.records.models.connections import add_connection
from core.records.models.learner_advice import learner_advice
from core.records.models.options import (
    connection_listings,
    last_evaluation_model,
    model_options,
    option_names,
)
from core.records.runs.settings import RunSettings
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.lookup import get_task
from core.settings import get_settings
from storage.db import session_scope
from storage.tables import Evaluation

pytestmark = pytest.mark.usefixtures("fresh_listings")


@pytest.fixture
def fresh_listings():
    served.forget_served_models()
    yield
    served.forget_served_models()


@pytest.fixture
def no_provider_keys(monkeypatch):
    from core.models.model_choice import PROVIDERS

    for variable, _models in PROVIDERS.values():
        monkeypatch.delenv(variable, raising=False)


def test_a_connections_served_models_are_offered_after_the_tasks_and_the_default(engine, demo_task, no_provider_keys,
                                                                                 monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    with StubServer(models=("qwen-7b", "llama-8b")) as stub:
        add_connection(engine, "lab", "openai", actor="cli", base_url=stub.url)
        with Session(engine) as session:
            task = get_task(session, DEMO_TASK)
            task.learner_model = "lab/qwen-7b"
            options = model_options(session, task)
    names = [option.name for option in options]
    sources = {option.name: option.source for option in options}
    default = get_settings().model
    assert names[:3] == [default, "lab/qwen-7b", "lab/llama-8b"], names
    assert sources[default].startswith("the task's policy model, the task's judge model")
    assert sources[default].endswith("the studio's default, embedded")
    assert sources["lab/qwen-7b"] == "the task's learner model, connection lab"
    assert sources["lab/llama-8b"] == "connection lab"
    assert sources["openai/gpt-4o-mini"] == "openai (OPENAI_API_KEY is set)"
    assert "local/smollm2-135m" in names
    assert option_names(options, "typed/by-hand")[:2] == ["typed/by-hand", default]


def test_a_listing_is_kept_for_a_while_refreshed_on_request_and_kept_with_the_reason_when_the_server_stops(
        engine, monkeypatch):
    asked = []
    real = served.fetch_models

    def counting(*args, **kwargs):
        asked.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(served, "fetch_models", counting)
    with StubServer(models=("m1",)) as stub:
        add_connection(engine, "lab", "openai", actor="cli", base_url=stub.url)
        with Session(engine) as session:
            assert [listing.models for listing in connection_listings(session)] == [("m1",)]
            assert [listing.models for listing in connection_listings(session)] == [("m1",)]
            assert len(asked) == 1  # kept: a page redraw does not ask the server again
            connection_listings(session, refresh=True)
            assert len(asked) == 2
    with Session(engine) as session:  # the server is gone: what it listed last stays offered, with why
        [listing] = connection_listings(session, refresh=True)
        assert listing.models == ("m1",)
        assert listing.error.startswith(f"{stub.url}/models did not answer a list: ")
        assert "lab/m1" in [option.name for option in model_options(session, None)]
        monkeypatch.setattr(served.time, "time", lambda: listing.listed_at + served.LIST_RETRY_S - 1)
        connection_listings(session)
        assert len(asked) == 3  # a failed listing is not asked again at once
        monkeypatch.setattr(served.time, "time", lambda: listing.listed_at + served.LIST_RETRY_S + 1)
        connection_listings(session)
        assert len(asked) == 4  # ... but sooner than a good one


def test_a_litellm_connection_lists_nothing_and_says_to_type(engine):
    add_connection(engine, "team", "litellm", actor="cli", provider="deepseek")
    with Session(engine) as session:
        [listing] = connection_listings(session)
    assert listing.models == () and "type team/<model>" in listing.error


def test_evaluate_offers_first_the_model_the_tasks_last_evaluation_used(engine, demo_task):
    with Session(engine) as session:
        task = get_task(session, DEMO_TASK)
        assert last_evaluation_model(session, task) is None
    with session_scope(engine) as session:
        for model in ("local/smollm2-135m", "lab/qwen-7b"):
            session.add(Evaluation(task_id=task.id, split="test", k=1, model=model, temperature=0.7,
                                   status="completed", mean_at_k=0.5, metrics={"answered": 4, "errors": 0}))
        session.add(Evaluation(task_id=task.id, split="validation", k=1, model="gate/only", temperature=0.7,
                               purpose="gate", status="completed", mean_at_k=0.5, metrics={"answered": 4}))
        # newer, but nothing answered: a server that refused every call, a failure, a cancel, a queued one
        session.add(Evaluation(task_id=task.id, split="test", k=1, model="down/m", temperature=0.7,
                               status="incomplete", metrics={"answered": 0, "errors": 4}))
        for status in ("failed", "cancelled", "queued"):
            session.add(Evaluation(task_id=task.id, split="test", k=1, model=f"{status}/m", status=status))
    with Session(engine) as session:
        assert last_evaluation_model(session, task) == "lab/qwen-7b"  # a person's newest that answered


def test_the_embedded_learners_notice_names_connections_as_the_way_to_a_capable_learner(engine, demo_task,
                                                                                         no_provider_keys):
    with Session(engine) as session:
        text = learner_advice(session, get_task(session, DEMO_TASK), RunSettings()).text
    assert "connect a capable model as a model connection" in text and "on the Models page" in text
    assert "set a provider's API key" in text  # still named, after the connection
    add_connection(engine, "lab", "openai", actor="cli", base_url="http://127.0.0.1:9/v1")
    with Session(engine) as session:
        text = learner_advice(session, get_task(session, DEMO_TASK), RunSettings()).text
    assert "choose a capable model of a model connection as the learner: this studio has lab" in text
