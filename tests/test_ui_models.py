"""The Models page (AppTest): an admin adds a connection with its key variable's name (never a key), tests
it against a real OpenAI-compatible stub (latency and reply) and a closed port (the exact error with the
address), and removes it; a reviewer sees them but cannot change them."""

from __future__ import annotations

import socket

import pytest
from sqlmodel import Session, select

from bench.stub_server import StubServer
from core.records.people.users import add_user
from storage.tables import LLMCall, ModelConnection
from tests.ui_support import run_app, table_with

PAGE = "pages/models.py"


@pytest.fixture
def engine(app_engine):
    return app_engine


def add(at, **fields) -> None:
    for name, value in fields.items():
        if name == "kind":
            at.radio(key="models_add_kind").set_value(value)
        else:
            at.text_input(key=f"models_add_{name}").set_value(value)
    at.button(key="FormSubmitter:models_add_form-Add connection").click().run()
    assert not at.exception, [e.value for e in at.exception]


def test_an_admin_adds_tests_and_removes_a_connection(engine, monkeypatch):
    monkeypatch.setenv("STUB_KEY", "sk-never-shown-123")
    at = run_app(page=PAGE)
    assert [t.value for t in at.title] == ["Models"]
    with StubServer() as stub:
        add(at, name="stubby", kind="openai", base_url=stub.url, key_env="STUB_KEY", params='{"temperature": 0.1}')
        listed = table_with(at, "key variable")
        assert listed["name"].tolist() == ["stubby"] and listed["key set here"].tolist() == ["yes"]
        served = [c.value.replace("\\", "") for c in at.caption if c.value.startswith("Models served")]
        assert served == ["Models served (every model picker offers them as stubby/<model>): stub, stub-large "
                          "(listed just now)"], served  # what the server's /v1/models lists
        assert "sk-never-shown" not in str(at)
        at.text_input(key="models_test_model_stubby").set_value("stub")
        at.button(key="models_test_stubby").click().run()
        said = " ".join(s.value for s in at.success)
        assert f"stubby/stub at {stub.url} answered in" in said, said
    with Session(engine) as session:
        assert session.exec(select(LLMCall.connection)).all() == ["stubby"]

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    add(at, name="down", kind="openai", base_url=f"http://127.0.0.1:{port}/v1", key_env="", params="")
    at.text_input(key="models_test_model_down").set_value("m")
    at.button(key="models_test_down").click().run()
    said = " ".join(e.value for e in at.error)
    assert f"down/m at http://127.0.0.1:{port}/v1 failed after" in said, said

    at.button(key="models_remove_down").click().run()
    with Session(engine) as session:
        assert session.exec(select(ModelConnection.name)).all() == ["stubby"]


def test_a_bad_connection_is_refused_with_its_reason_and_nothing_saved(engine):
    at = run_app(page=PAGE)
    add(at, name="gpu", kind="openai", base_url="https://bob:secret@gpu.example.com/v1")
    assert any("carries credentials" in e.value for e in at.error), [e.value for e in at.error] + [w.value for w in at.warning]
    with Session(engine) as session:
        assert session.exec(select(ModelConnection)).all() == []


def test_a_reviewer_sees_the_connections_but_cannot_change_them(engine):
    from core.records.models.connections import add_connection

    add_user(engine, "ada", "admin", "pw-ada-123456", actor="cli")
    add_user(engine, "rita", "reviewer", "pw-rita-123456", actor="cli")
    add_connection(engine, "gpu", "openai", base_url="http://127.0.0.1:8000/v1", actor="ada")
    at = run_app(page=PAGE, session_state={"auth_user": "rita"})
    assert table_with(at, "key variable")["name"].tolist() == ["gpu"]
    assert not [b for b in at.button if b.key == "models_remove_gpu"]
    assert any("admin" in element.value for element in [*at.info, *at.caption, *at.markdown])


def test_a_connection_without_a_key_variable_says_no_key_is_needed(engine):
    """Its key cell read `'-` (a dash made spreadsheet-safe): it says what it means instead."""
    from core.records.models.connections import add_connection

    add_connection(engine, "open-server", "openai", actor="cli", base_url="http://127.0.0.1:9/v1")
    at = run_app(page=PAGE)
    listed = table_with(at, "key variable")
    assert listed["key set here"].tolist() == ["not needed"]
    assert not [cell for row in listed.astype(str).values.tolist() for cell in row if cell.startswith("'")]
