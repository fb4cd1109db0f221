"""Model connections as the gateway reads them: `<connection>/<model>` names a model served where a
connection says (core/records/models/connections.py creates, tests and removes them).

A connection of kind `openai` is an OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp's server,
LM Studio, a company gateway) at its base URL, called on the gateway's own HTTP path; one of kind `litellm`
is a provider litellm knows. The API key is read from the environment variable the connection names, at
the call, and never stored.

`served_models` reads the models a connection's server offers (its `/models`, as OpenAI-compatible servers
answer it), kept per connection for LIST_TTL_S (LIST_RETRY_S after a failure, so an unreachable server does
not slow every page) and read again on request (a Refresh button).
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from core.domain.webhooks import METADATA_ADDRESSES, canonical_address
from core.secrets import mask_url
from core.settings import secret
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


LIST_TTL_S = 300.0  # how long a connection's listed models are offered before its server is asked again
LIST_RETRY_S = 30.0  # ... and after a failed listing
LIST_TIMEOUT_S = 2.0  # a page waits at most this long for a server's list


@dataclass(frozen=True)
class ServedModels:
    """The models one connection offers, as its server listed them, when, or why it could not say."""

    connection: str
    models: tuple[str, ...] = ()
    listed_at: float = 0.0  # time.time() of the listing
    error: str = ""

    def age_s(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.listed_at)

    def fresh(self, now: float | None = None) -> bool:
        return self.age_s(now) < (LIST_RETRY_S if self.error else LIST_TTL_S)

    def words(self, now: float | None = None) -> str:
        """The listing in a line: "lab: qwen-7b, llama-8b (listed 2 min ago)", or why there is none."""
        age = self.age_s(now)
        when = "just now" if age < 5 else f"{age:.0f} s ago" if age < 120 else f"{age / 60:.0f} min ago"
        listed = ", ".join(self.models) if self.models else "no models"
        if not self.error:
            return f"{self.connection}: {listed} (listed {when})"
        if not self.models:
            return f"{self.connection}: {self.error}"
        return f"{self.connection}: {listed} (as listed before; {self.error})"


class _Refuse(urllib.request.HTTPRedirectHandler):
    """A redirect is not followed: urllib would send the connection's Authorization header on to the new host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201  (urllib's signature)
        return None


_NO_REDIRECTS = urllib.request.build_opener(_Refuse)


def metadata_address(url: str) -> str | None:
    """Why the URL's host may not be asked for models: it is (or resolves to) a cloud metadata address, in any
    IPv6 form. Loopback and private addresses are a self-hosted model server's, and allowed."""
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        return None  # the request says it does not resolve
    for address in addresses:
        if ipaddress.ip_address(canonical_address(address)) in METADATA_ADDRESSES:
            return f"{host} is a cloud metadata address: never a model server"
    return None


_listed: dict[tuple, ServedModels] = {}
_listed_lock = threading.Lock()


def fetch_models(base_url: str, key_env: str | None = None, timeout_s: float = LIST_TIMEOUT_S) -> list[str]:
    """The model ids an OpenAI-compatible server lists at `<base_url>/models` (`{"data": [{"id": ...}]}`);
    raises OSError or ValueError saying why not."""
    url = base_url.rstrip("/") + "/models"
    if reason := metadata_address(url):
        raise OSError(reason)
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    key = secret(key_env) if key_env else ""
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with _NO_REDIRECTS.open(request, timeout=timeout_s) as response:  # an admin's http(s) URL
            body = json.loads(response.read(2_000_000))
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            raise OSError(f"HTTP {exc.code}: redirected to {exc.headers.get('Location') or 'nowhere'}; not followed "
                          "(the key is never sent on): configure the final URL") from None
        raise OSError(f"HTTP {exc.code} {exc.reason}") from None
    entries = body.get("data") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        raise ValueError("the answer is not a model list (no `data` array)")
    ids = [str(entry.get("id")) for entry in entries if isinstance(entry, dict) and entry.get("id")]
    return list(dict.fromkeys(ids))


def served_models(connection: ModelConnection, *, refresh: bool = False,
                  timeout_s: float = LIST_TIMEOUT_S) -> ServedModels:
    """The models `connection` offers: kept from the last listing while it is fresh, else asked of its server
    (`refresh` asks now). A litellm provider's connection lists none: its models are typed as `<name>/<model>`."""
    if connection.kind != "openai" or not connection.base_url:
        return ServedModels(connection.name, error="a litellm provider lists no models here: type "
                                                   f"{connection.name}/<model>")
    cache_key = (connection.name, connection.base_url, connection.key_env)
    with _listed_lock:
        held = _listed.get(cache_key)
    if held is not None and held.fresh() and not refresh:
        return held
    try:
        listed = ServedModels(connection.name, tuple(fetch_models(connection.base_url, connection.key_env, timeout_s)),
                              time.time())
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        listed = ServedModels(connection.name, held.models if held else (), time.time(),
                              error=f"{mask_url(connection.base_url)}/models did not answer a list: {reason}")
    with _listed_lock:
        _listed[cache_key] = listed
    return listed


def forget_served_models() -> None:
    """Drop every kept listing (tests; a Refresh asks one connection again through `served_models`)."""
    with _listed_lock:
        _listed.clear()
