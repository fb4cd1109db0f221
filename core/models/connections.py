"""Model connections as the gateway reads them: `<connection>/<model>` names a model served where a
connection says (core/records/connections.py creates, tests and removes them).

A connection of kind `openai` is an OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp's server,
LM Studio, a company gateway) at its base URL, called on the gateway's own HTTP path; one of kind `litellm`
is a provider litellm knows. The API key is read from the environment variable the connection names, at
the call, and never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from core.secrets import mask_url
from storage.tables import ModelConnection

KINDS = ("openai", "litellm")


@dataclass(frozen=True)
class Endpoint:
    """Where one call goes: the connection's name, kind and address, and the model name to send."""

    connection: str
    kind: str
    model: str  # as the server or litellm takes it: `<model>` (openai) or `<provider>/<model>` (litellm)
    base_url: str | None = None
    key_env: str | None = None
    params: dict = field(default_factory=dict)

    @property
    def where(self) -> str:
        """The address as errors and pages show it (credentials masked)."""
        return mask_url(self.base_url) if self.base_url else f"litellm provider {self.model.split('/', 1)[0]}"


def split_model(model: str) -> tuple[str, str] | None:
    """(connection name, model) of `<connection>/<model>`, or None for a model string without a slash."""
    if "/" not in model:
        return None
    name, rest = model.split("/", 1)
    return (name, rest) if name and rest else None


def endpoint_of(connection: ModelConnection, model: str) -> Endpoint:
    sent = model if connection.kind == "openai" else f"{connection.provider}/{model}"
    return Endpoint(connection=connection.name, kind=connection.kind, model=sent, base_url=connection.base_url,
                    key_env=connection.key_env, params=dict(connection.params or {}))


def resolve(engine: Engine, model: str) -> Endpoint | None:
    """The endpoint of a `<connection>/<model>` string, or None when its prefix names no connection (a
    litellm provider or the embedded `local/`)."""
    parts = split_model(model)
    if parts is None:
        return None
    with Session(engine) as session:
        connection = session.exec(select(ModelConnection).where(ModelConnection.name == parts[0])).first()
    return endpoint_of(connection, parts[1]) if connection is not None else None
