"""Model connections (core/records/models/connections.py, core/models/connections.py, `python -m core models`):
a model served anywhere is named once and then picked as `<connection>/<model>`; its key stays in the
environment; every call's ledger row names the connection; a failure names the masked address."""

from __future__ import annotations

import asyncio
import socket

import pytest
from sqlmodel import Session, select

from bench.stub_server import StubServer
from core.cli import main
from core.errors import InvalidInput, PermissionDenied
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.models.gateway import Gateway
from core.models.model_choice import check_model
from core.records.models.connections import add_connection, remove_connection, try_connection
from core.records.tasks.demos import DEMO_TASK
from storage.db import url_with_password
from storage.tables import AuditEvent, LLMCall, ModelConnection


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cli(capsys, engine, *argv) -> tuple[int, str, str]:
    code = main(["--db", url_with_password(engine), *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("fields", "words"), [
    ({"name": "Bad Name", "kind": "openai", "base_url": "http://h/v1"}, "lower-case"),
    ({"name": "openai", "kind": "openai", "base_url": "http://h/v1"}, "a provider's name"),
    ({"name": "vllm1", "kind": "openai", "base_url": "ftp://h"}, "give the server's address"),
    ({"name": "vllm1", "kind": "openai", "base_url": "https://bob:pw@h/v1"}, "carries credentials"),
    ({"name": "vllm1", "kind": "litellm", "provider": "nosuch"}, "not one litellm knows"),
    ({"name": "vllm1", "kind": "openai", "base_url": "http://h/v1", "key_env": "sk-abc123"}, "the NAME of"),
    ({"name": "vllm1", "kind": "openai", "base_url": "http://h/v1", "params": {"colour": 1}}, "default parameters"),
])
def test_a_connection_that_cannot_be_used_is_refused_by_its_field(engine, fields, words):
    with pytest.raises(InvalidInput, match=words):
        add_connection(engine, actor="cli", **fields)
    with Session(engine) as session:
        assert session.exec(select(ModelConnection)).all() == []


def test_only_an_admin_manages_connections(engine):
    from core.records.people.users import add_user

    add_user(engine, "ada", "admin", "pw-ada-123456", actor="cli")
    add_user(engine, "rita", "reviewer", "pw-rita-123456", actor="cli")
    with pytest.raises(PermissionDenied):
        add_connection(engine, "vllm1", "openai", base_url="http://127.0.0.1:8000/v1", actor="rita")
    add_connection(engine, "vllm1", "openai", base_url="http://127.0.0.1:8000/v1", actor="ada")
    with pytest.raises(PermissionDenied):
        remove_connection(engine, "vllm1", "rita")
    remove_connection(engine, "vllm1", "ada")
    with Session(engine) as session:
        actions = [e.action for e in session.exec(select(AuditEvent).where(AuditEvent.object_type == "connection"))]
    assert actions == ["connection.add", "connection.remove"]


def test_models_add_list_test_and_remove_from_the_command_line(engine, capsys, monkeypatch):
    monkeypatch.setenv("STUB_SERVER_KEY", "sk-stub-secret-123")
    with StubServer() as stub:
        code, out, _ = cli(capsys, engine, "models", "add", "stubby", "--base-url", stub.url, "--key-env",
                           "STUB_SERVER_KEY", "--params", '{"temperature": 0.1}')
        assert code == 0 and "models are stubby/<model>" in out
        code, out, _ = cli(capsys, engine, "models", "list")
        assert code == 0 and "stubby" in out and "STUB_SERVER_KEY (set)" in out and "sk-stub" not in out
        code, out, _ = cli(capsys, engine, "models", "test", "stubby", "--model", "stub")
        assert code == 0 and f"stubby/stub at {stub.url} answered in" in out, out
        sent = stub.requests()[-1]
    assert sent["model"] == "stub"
    with Session(engine) as session:
        (row,) = session.exec(select(LLMCall).where(LLMCall.stage == "connection_test")).all()
    assert row.connection == "stubby" and row.model == "stubby/stub" and row.error is None
    code, out, _ = cli(capsys, engine, "models", "remove", "stubby")
    assert code == 0 and cli(capsys, engine, "models", "list")[1].startswith("no model connections")


def test_a_test_against_a_closed_port_names_the_masked_address(engine, capsys):
    port = closed_port()
    add_connection(engine, "down", "openai", base_url=f"http://127.0.0.1:{port}/v1", actor="cli")
    code, out, _ = cli(capsys, engine, "models", "test", "down", "--model", "m", "--timeout", "5")
    assert code == 1 and f"down/m at http://127.0.0.1:{port}/v1 failed after" in out, out
    assert "Connect" in out or "refused" in out.lower(), out
    result = try_connection(engine, "down", "m", timeout_s=5)
    assert not result.ok and f"127.0.0.1:{port}" in result.error


def test_an_evaluation_through_a_connection_calls_it_and_the_ledger_names_it(engine, demo_task, monkeypatch):
    monkeypatch.delenv("NEEDED_KEY", raising=False)
    with StubServer() as stub:
        add_connection(engine, "stubby", "openai", base_url=stub.url, key_env="NEEDED_KEY", actor="cli")
        with pytest.raises(InvalidInput, match="NEEDED_KEY is not set"):
            check_model("stubby/stub", engine=engine)
        monkeypatch.setenv("NEEDED_KEY", "k-123456789")
        check_model("stubby/stub", engine=engine)
        evaluation_id = create_evaluation(engine, DEMO_TASK, "empty", limit=2, model="stubby/stub")
        evaluation = execute_evaluation(engine, evaluation_id)
        assert evaluation.status == "completed", evaluation.error
        assert stub.requests()
    with Session(engine) as session:
        rows = session.exec(select(LLMCall).where(LLMCall.evaluation_id == evaluation_id)).all()
    assert rows and {row.connection for row in rows} == {"stubby"} and all(row.error is None for row in rows)


def test_a_connections_changed_default_parameters_are_not_answered_from_the_cache(engine, demo_task):
    """The connection's defaults are part of what is sent, so a call under new defaults is a new call."""
    async def ask() -> bool:
        gateway = Gateway(engine)
        result = await gateway.complete(stage="rollout", model="stubby/stub",
                                        messages=[{"role": "user", "content": "2+2?"}], temperature=0.0,
                                        max_tokens=8)
        return result.cache_hit

    with StubServer() as stub:
        add_connection(engine, "stubby", "openai", base_url=stub.url, params={"top_p": 0.5}, actor="cli")
        assert asyncio.run(ask()) is False
        assert asyncio.run(ask()) is True  # the same defaults: the cache answers
        remove_connection(engine, "stubby", actor="cli")
        add_connection(engine, "stubby", "openai", base_url=stub.url, params={"top_p": 0.9}, actor="cli")
        assert asyncio.run(ask()) is False
        assert len(stub.requests()) == 2
