"""Model connections people manage: add, list, try and remove (an admin's; the Models page and
`python -m core models add|list|test|remove` call these). The gateway reads them (core/models/connections.py).

A connection names where a model is served: an OpenAI-compatible server's base URL, or a litellm provider,
with the name of the environment variable that holds its key (never the key) and optional default request
parameters. A model is then written `<connection>/<model>` wherever a model is chosen.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from core.errors import InvalidInput, ModelCallError, NotFound
from core.models.connections import KINDS, endpoint_of, split_model
from core.models.gateway import Gateway
from core.models.model_server import LOCAL_PREFIX
from core.records.people.roles import require_role
from core.secrets import has_credentials, mask_url
from core.settings import secret
from storage.db import session_scope
from storage.tables import AuditEvent, LLMCall, ModelConnection

NAME = re.compile(r"^[a-z][a-z0-9_-]{0,59}$")
KEY_ENV = re.compile(r"^[A-Z_][A-Z0-9_]{0,99}$")
PARAMS = {"temperature", "top_p", "max_tokens", "seed", "stop", "presence_penalty", "frequency_penalty"}
TEST_PROMPT = [{"role": "user", "content": "Reply with the single word OK."}]
TEST_STAGE = "connection_test"  # a Test's ledger stage: the last one says whether the connection answered


def check_connection(name: str, kind: str, base_url: str | None, provider: str | None, key_env: str | None,
                     params: dict | None) -> dict:
    """The connection's fields as stored, or InvalidInput saying which one cannot be used and why."""
    import litellm  # not at the top, where it ran before core.models set LITELLM_LOCAL_MODEL_COST_MAP

    if not NAME.match(name or ""):
        raise InvalidInput(f"connection name {name!r}: lower-case letters, digits, - and _, starting with a letter")
    reserved = {LOCAL_PREFIX.rstrip("/"), *litellm.provider_list}
    if name in reserved:
        raise InvalidInput(f"connection name {name!r} is a provider's name (models {name}/... mean that provider); "
                           "choose another, e.g. my-vllm")
    if kind not in KINDS:
        raise InvalidInput(f"kind {kind!r}: openai (an OpenAI-compatible server) or litellm (a provider)")
    if kind == "openai":
        parts = urlsplit(base_url or "")
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InvalidInput(f"base URL {base_url!r}: give the server's address, e.g. http://127.0.0.1:8000/v1")
        if has_credentials(base_url):
            raise InvalidInput(f"base URL {mask_url(base_url)} carries credentials; put the key in an environment "
                               "variable and name it as the key variable")
        provider = None
    else:
        if provider not in litellm.provider_list:
            raise InvalidInput(f"provider {provider!r} is not one litellm knows (e.g. openai, anthropic, deepseek)")
        base_url = base_url or None
    if key_env and not KEY_ENV.match(key_env):
        raise InvalidInput(f"key variable {key_env!r}: the NAME of an environment variable, e.g. VLLM_API_KEY "
                           "(the key itself is never stored)")
    params = params or {}
    if not isinstance(params, dict) or set(params) - PARAMS:
        raise InvalidInput(f"default parameters: a JSON object of {', '.join(sorted(PARAMS))}")
    return {"name": name, "kind": kind, "base_url": (base_url or "").rstrip("/") or None, "provider": provider,
            "key_env": key_env or None, "params": params}


def add_connection(engine: Engine, name: str, kind: str, *, actor: str, base_url: str | None = None,
                   provider: str | None = None, key_env: str | None = None, params: dict | None = None) -> int:
    """Store a new connection (an admin's); its id."""
    fields = check_connection(name, kind, base_url, provider, key_env, params)
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "adding a model connection")
        if session.exec(select(ModelConnection).where(ModelConnection.name == name)).first() is not None:
            raise InvalidInput(f"there is already a connection named {name!r}; remove it first or choose another")
        row = ModelConnection(**fields, created_by=actor)
        session.add(row)
        session.flush()
        session.add(AuditEvent(actor=actor, action="connection.add", object_type="connection", object_id=row.id,
                               after={k: v for k, v in fields.items()}))
        return row.id


def remove_connection(engine: Engine, name: str, actor: str) -> None:
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "removing a model connection")
        row = session.exec(select(ModelConnection).where(ModelConnection.name == name)).first()
        if row is None:
            raise NotFound(f"there is no model connection {name!r}")
        session.add(AuditEvent(actor=actor, action="connection.remove", object_type="connection", object_id=row.id,
                               before={"name": row.name, "kind": row.kind, "base_url": row.base_url}))
        session.delete(row)


def list_connections(session: Session) -> list[ModelConnection]:
    return list(session.exec(select(ModelConnection).order_by(ModelConnection.name)))


def describe(connection: ModelConnection) -> dict:
    """A connection as pages and the CLI show it: the key variable's name and whether it is set, never its value."""
    where = connection.base_url if connection.kind == "openai" else f"litellm provider {connection.provider}"
    return {"name": connection.name, "kind": connection.kind, "where": where,
            "key variable": connection.key_env or "(none)",
            "key set here": (bool(secret(connection.key_env)) if connection.key_env else None),
            "defaults": connection.params or {}, "models as": f"{connection.name}/<model>"}


@dataclass(frozen=True)
class ConnectionTest:
    """What one short call through a connection gave: the reply or the exact error, and how long it took."""

    ok: bool
    model: str
    where: str
    latency_ms: float
    reply: str = ""
    error: str = ""

    def words(self) -> str:
        if self.ok:
            return f"{self.model} at {self.where} answered in {self.latency_ms:.0f} ms: {self.reply!r}"
        return f"{self.model} at {self.where} failed after {self.latency_ms:.0f} ms: {self.error}"


def try_connection(engine: Engine, name: str, model: str, *, timeout_s: float = 30.0) -> ConnectionTest:
    """One short call to `<name>/<model>` through the gateway (so its ledger row names the connection), with
    one attempt and no cache."""
    with Session(engine) as session:
        row = session.exec(select(ModelConnection).where(ModelConnection.name == name)).first()
    if row is None:
        raise NotFound(f"there is no model connection {name!r}")
    if not model:
        raise InvalidInput("name the model to try, e.g. qwen2.5-7b-instruct")
    endpoint = endpoint_of(row, model)
    gateway = Gateway(engine, max_retries=0, timeout_s=timeout_s, deadline_s=timeout_s)
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # litellm prints provider lists on some failures
            result = asyncio.run(gateway.complete(stage=TEST_STAGE, model=f"{name}/{model}",
                                                  messages=TEST_PROMPT, max_tokens=8,
                                                  sample_index=time.time_ns() % 1_000_000_007))  # never cached
    except ModelCallError as exc:
        return ConnectionTest(False, f"{name}/{model}", endpoint.where, (time.perf_counter() - started) * 1000,
                              error=str(exc))
    return ConnectionTest(True, f"{name}/{model}", endpoint.where, result.latency_ms, reply=result.text.strip())


def failed_test_warning(session: Session, model: str) -> str | None:
    """A warning for a form about to queue a job on `model` (`<connection>/<model>`): its connection's last Test
    failed, with when and why, and no call through the connection has answered since. None otherwise (another
    model, no Test yet, a Test that answered, or an answer since: the server is back)."""
    parts = split_model(model or "")
    connection = parts and session.exec(select(ModelConnection).where(ModelConnection.name == parts[0])).first()
    if not connection:
        return None
    test = session.exec(select(LLMCall).where(LLMCall.stage == TEST_STAGE, LLMCall.connection == connection.name,
                                              LLMCall.created_at >= connection.created_at)
                        .order_by(col(LLMCall.id).desc())).first()
    if test is None or test.error is None:
        return None
    if session.exec(select(LLMCall.id).where(col(LLMCall.id) > test.id, LLMCall.connection == connection.name,
                                             col(LLMCall.error).is_(None))).first() is not None:
        return None
    error = test.error if len(test.error) <= 300 else test.error[:300] + "…"
    return (f"The last Test of connection {connection.name} ({test.model}, {test.created_at:%Y-%m-%d %H:%M} UTC) "
            f"failed: {error}. A job on {model} may fail the same way: Test it again on the Models page (or "
            f"`python -m core models test {connection.name}`) once its server should answer.")
