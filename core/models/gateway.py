"""The one door to every model: litellm `acompletion` with bounded concurrency, retries,
a response cache and a ledger row per call.

The cache is the ledger itself: a successful call is stored with a key made of the model, the
messages, the parameters and the sample index, so repeating it (a resumed run, a re-run
evaluation) is answered from the database at no cost.

A structured reply (`complete_json`) is read with its core.domain.replies model; broken JSON is repaired
with json-repair as the last resort, and the ledger row says how the reply was read
(`reply_status`: parsed, repaired or malformed).
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import hashlib
import json
import logging
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import json_repair
from pydantic import ValidationError
from sqlalchemy import bindparam, insert, or_
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from core.domain.replies import Reply
from core.domain.replies import clean_text as clean_text  # re-exported for the gateway's callers
from core.errors import (
    InvalidInput,
    ModelCallError,
    ModelUnreachable,
    StructuredOutputError,
    describe_validation,
)
from core.models import model_server, openai_http
from core.models.connections import Endpoint
from core.models.connections import resolve as resolve_connection
from core.models.model_server import LOCAL_PREFIX, local_name
from core.models.prices import price_per_token, token_cost
from core.secrets import API_BASE_ENV, mask_url, resolve_api_base
from core.settings import get_settings, secret, secrets_in_environment
from storage.fencing import raise_if_lost
from storage.group_commit import committed, looked_up
from storage.tables import AuditEvent, LLMCall
from storage.writes import update_by_id

R = TypeVar("R", bound=Reply)
log = logging.getLogger(__name__)


@functools.cache
def providers():
    """litellm, set up for the gateway (no dropped-parameter errors, no debug banner, `local/` models registered),
    imported at the first call instead of with this module: it takes seconds, and pages, the API and most
    commands import the gateway's module without ever calling a model."""
    import litellm

    from core.models import local_provider

    litellm.drop_params = True
    litellm.suppress_debug_info = True
    local_provider.register()
    return litellm


def transient_errors() -> tuple[type[Exception], ...]:
    """The errors a call is retried on: a provider's rate limit, timeout or outage, or the model server's. An
    address where nothing answers (refused, unknown host: openai_http.unreachable_reason) is not retried, though
    litellm calls it a connection or server error: retrying would spend minutes meeting the same refusal.
    Before any call went through litellm none of its errors can be in flight, so it is not imported here: a
    worker cancelling a model server's call on SIGTERM spent its grace period importing litellm (issue 41)."""
    if "litellm" not in sys.modules:
        return (openai_http.TransientHTTPError,)
    return _transient_errors_with_litellm()


@functools.cache
def _transient_errors_with_litellm() -> tuple[type[Exception], ...]:
    litellm = providers()
    return (openai_http.TransientHTTPError, litellm.RateLimitError, litellm.APIConnectionError, litellm.Timeout,
            litellm.InternalServerError, litellm.ServiceUnavailableError, litellm.BadGatewayError)


Mock = Callable[[str, list[dict]], "str | Exception"]

LEDGER = LLMCall.__table__
LEDGER_INSERT = insert(LEDGER)  # compiled once: the ledger gets a row per call
# A ledger row's columns with their model defaults (default, or a factory such as created_at's clock), so a row is
# written from a dict without building an LLMCall object for it.
LEDGER_DEFAULTS = [(column.name, LLMCall.model_fields[column.name]) for column in LEDGER.columns
                   if not column.primary_key]

# After a call found its address unreachable, the gateway's further calls there fail at once for this long,
# without a request: a job's hundred calls end in milliseconds, not one connection attempt (or DNS lookup) each.
UNREACHABLE_HOLD_S = 30.0

# How a structured reply was read, on its ledger row (LLMCall.reply_status).
PARSED, REPAIRED, MALFORMED = "parsed", "repaired", "malformed"


@dataclass
class CallResult:
    text: str
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0
    cache_hit: bool = False
    call_id: int | None = None
    reply_status: str | None = None


@dataclass
class Scope:
    """What a call belongs to, for the ledger."""

    run_id: int | None = None
    evaluation_id: int | None = None
    trace_id: int | None = None  # a production trace the judge scores (core/grpo/production_scoring.py)


def redact(text: str) -> str:
    """Remove any secret from the environment that a provider echoed into an error message."""
    for name, value in secrets_in_environment().items():
        if len(value) >= 8:
            text = text.replace(value, f"<{name}>")
    return text


def cache_key(model: str, messages: list[dict], params: dict[str, Any], sample_index: int,
              api_base: str | None = None) -> str:
    """The response cache's key; a reply from one endpoint never answers the same model name on another
    (the endpoint enters masked, so the key holds no credentials)."""
    call = {"model": model, "messages": messages, "params": params, "sample": sample_index}
    if api_base:
        call["api_base"] = mask_url(api_base)
    payload = json.dumps(call, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def _seed(key: str) -> int:
    return int(key[:8], 16) % (2**31 - 1)


def retry_after(error: BaseException) -> float | None:
    """The seconds a provider asked us to wait (a `Retry-After` header in seconds or as an HTTP date)."""
    headers = (getattr(error, "headers", None) or getattr(getattr(error, "response", None), "headers", None)
               or getattr(error, "litellm_response_headers", None) or {})
    try:
        value = headers.get("retry-after") or headers.get("Retry-After")
    except AttributeError:
        return None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(str(value))
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - time.time())


def reusable_calls() -> tuple:
    """The ledger rows a request with the same cache key may be answered from: successful and paid (not
    themselves cache hits), and never a reply that failed validation."""
    return (LLMCall.error.is_(None), LLMCall.cache_hit.is_(False),
            or_(col(LLMCall.reply_status).is_(None), LLMCall.reply_status != MALFORMED))


# Built once: every call asks it first, and building the statement anew cost five times its execution.
CACHED = (select(LLMCall.id, LLMCall.response, LLMCall.cache_key)
          .where(LLMCall.cache_key.in_(bindparam("keys", expanding=True)), *reusable_calls()).order_by(LLMCall.id))
_KEYS_A_QUERY = 500


def reusable_rows(connection: Any, keys: list[str]) -> dict[str, Any]:
    """The first reusable ledger row of each of `keys` that has one, as (id, response, cache_key), by key."""
    found: dict[str, Any] = {}
    for start in range(0, len(keys), _KEYS_A_QUERY):
        for row in connection.execute(CACHED, {"keys": keys[start:start + _KEYS_A_QUERY]}):
            found.setdefault(row.cache_key, row)
    return found


def ledger_values(**given: Any) -> dict[str, Any]:
    """A ledger row's values: `given`, and every other column's model default."""
    values = {}
    for name, info in LEDGER_DEFAULTS:
        if name in given:
            values[name] = given[name]
        else:
            values[name] = info.default_factory() if info.default_factory is not None else info.default
    return values


@dataclass
class Gateway:
    """Owns the per-model semaphores and the calls in flight; one per process (or per run) is enough.

    It is the only retry layer: litellm's and the OpenAI SDK's own retries are off, so the ledger's
    `attempts` counts the HTTP requests really made. Each attempt holds a concurrency slot only while its
    request is out (a backing-off call frees its slot), waits `timeout_s` at most, honours a provider's
    Retry-After, and the whole call gives up at `deadline_s`, counted from when it first holds a slot (time
    spent waiting for one is our own queue, not the model's slowness).

    An address where nothing answers (the connection refused, the host unknown) fails the call at once with
    ModelUnreachable, and the gateway's next calls to it for `unreachable_hold_s` fail the same way without a
    request (the embedded model's server excepted: its supervisor restarts it, so its refusals are retried)."""

    engine: Engine
    concurrency: int = field(default_factory=lambda: get_settings().concurrency)
    max_retries: int = field(default_factory=lambda: get_settings().max_retries)
    backoff_s: float = 1.0
    timeout_s: float = field(default_factory=lambda: get_settings().call_timeout_s)
    deadline_s: float = field(default_factory=lambda: get_settings().call_deadline_s)
    api_base: str | None = None
    mock: Mock | None = None
    unreachable_hold_s: float = UNREACHABLE_HOLD_S
    _semaphores: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Semaphore]] = field(default_factory=dict,
                                                                                         init=False, repr=False)
    _in_flight: dict[str, asyncio.Future] = field(default_factory=dict, init=False, repr=False)
    _connections: dict[str, Endpoint | None] = field(default_factory=dict, init=False, repr=False)
    _unreachable: dict[str, tuple[float, str]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.api_base = resolve_api_base(self.api_base, secret(API_BASE_ENV))

    def _endpoint(self, model: str) -> str | None:
        """The api_base this model is called on: its connection's, else the run's (the embedded model has
        none). It is part of the response cache's key, so a reply never answers for another server."""
        if model.startswith(LOCAL_PREFIX):
            return None
        connection = self._connection(model)
        return connection.base_url if connection is not None else self.api_base

    def _connection(self, model: str) -> Endpoint | None:
        """The model connection a `<connection>/<model>` string names (looked up once per gateway), else None."""
        if model.startswith(LOCAL_PREFIX):
            return None
        if model not in self._connections:
            self._connections[model] = resolve_connection(self.engine, model)
        return self._connections[model]

    def _address(self, model: str) -> str:
        """What an unreachable finding is held for: the model's endpoint, else (a provider's default) the model."""
        return self._endpoint(model) or model

    def unreachable(self) -> str | None:
        """Why a call of this gateway found nothing answering at its address ("... connection refused ..."), the
        first such finding; None when every address answered. A job that ended with failed calls says this."""
        return next(iter(self._unreachable.values()), (0.0, None))[1]

    def _raise_if_held(self, model: str, stage: str) -> None:
        """Fail a call at once, without a request, while its address is held as unreachable."""
        found = self._unreachable.get(self._address(model))
        if found is None or self._served_locally(model):
            return
        age = time.monotonic() - found[0]
        if age < self.unreachable_hold_s:
            raise ModelUnreachable(f"{found[1]} (found {age:.1f} s ago; {model} ({stage}) was not sent)")

    def _attempt_timeout(self, served: bool, deadline: float) -> float:
        """Seconds one attempt may take: timeout_s, within the call's deadline. The embedded model's server gets
        the whole deadline: a slow attempt there is working, not lost (its supervisor restarts a server that
        makes no progress, which fails the attempt), and a retry with the same seed would only redo the work."""
        left = deadline - time.monotonic()
        return left if served else min(self.timeout_s, left)

    def _sent_params(self, model: str, params: dict[str, Any]) -> dict[str, Any]:
        """The parameters a call is made with: its connection's defaults under the call's own. They are part of
        the cache key, so a connection's changed default (top_p, a penalty) is never answered from the cache."""
        connection = self._connection(model)
        return {**connection.params, **params} if connection is not None else params

    @staticmethod
    def _served_locally(model: str) -> bool:
        """An embedded model goes to its model server (core.models.model_server) unless the in-process
        provider is chosen (TFGRPO_LOCAL_IN_PROCESS, kept for one release)."""
        return model.startswith(LOCAL_PREFIX) and not get_settings().local_in_process

    def _note_restart(self, scope: Scope, model: str, restarts_before: int) -> None:
        """A failed attempt during which the model server was restarted: the run's (or evaluation's) events
        say so, with the supervisor's reason ("embedded model restarted after 94 s without progress")."""
        record = model_server.read_record(local_name(model))
        if record is None or len(record.restarts) <= restarts_before:
            return
        owner = ("run", scope.run_id) if scope.run_id else ("evaluation", scope.evaluation_id)
        if owner[1] is None:
            return
        with Session(self.engine) as session:
            for restart in record.restarts[restarts_before:]:
                session.add(AuditEvent(actor="system", action="model.restart", object_type=owner[0],
                                       object_id=owner[1], after={"model": model, **restart}))
            session.commit()

    def _semaphore(self, model: str) -> asyncio.Semaphore:
        """Calls in flight per model and event loop (a gateway outlives the loop of one run when the CLI runs
        jobs one after another); for the embedded model's server, as many as it has slots, so a call waits
        here, untimed, rather than in the server's queue against its per-attempt deadline."""
        loop = asyncio.get_running_loop()
        held = self._semaphores.get(model)
        if held is None or held[0] is not loop:
            served = self.mock is None and self._served_locally(model)
            size = get_settings().local_slots if served else self.concurrency
            held = self._semaphores[model] = (loop, asyncio.Semaphore(max(1, size)))
        return held[1]

    async def _cached(self, key: str):
        """The reusable ledger row for `key` as (id, response, key), or None. Read without the ORM (loading the whole
        row cost a paper-scale run 0.5 s of the engine's CPU), and every call asks this first, so the keys asked for
        together are one query on one connection (storage.group_commit.looked_up): a level's calls are asked
        together."""
        return await looked_up(self.engine, reusable_rows, key)

    async def _record(self, **given: Any) -> int | None:
        """Write a ledger row of these columns (ledger_values) and return its id once committed. One compiled INSERT
        through a connection, in a transaction shared with the writes the loop's other tasks ask for meanwhile and
        fenced by the job's lease (storage.group_commit): every call writes one, the replies of a level arrive
        together, and a transaction of its own cost each row four times the CPU (0.23 against 0.06 ms on SQLite)."""
        values = ledger_values(**given)
        return await committed(self.engine, lambda connection: connection.execute(
            LEDGER_INSERT, values).inserted_primary_key[0])

    def _mark(self, call_id: int | None, status: str) -> None:
        """Note on a ledger row how its structured reply was read: one fenced UPDATE, as the ledger's insert."""
        if call_id is not None:
            update_by_id(self.engine, LLMCall, call_id, reply_status=status)

    async def complete(
        self,
        *,
        stage: str,
        model: str,
        messages: list[dict],
        scope: Scope | None = None,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        sample_index: int = 0,
        response_format: dict | None = None,
        seed_key: str | None = None,
        stop: tuple[str, ...] | list[str] | None = None,
    ) -> CallResult:
        """One chat completion, from the cache if this exact call succeeded before, or from the same call
        still in flight (identical concurrent calls share one request).

        `stop` sequences end generation where they would start (the python agent mode stops at "```output",
        core.domain.code_runs); they are part of the request's parameters and so of its cache key, and go to
        every path: litellm (which drops them for a provider that takes none: the caller cuts the text
        itself), the direct OpenAI-compatible request and the embedded model.

        The sampling seed comes from `seed_key` when given (the agent passes its query and sample index, so
        two library versions draw the same random numbers for the same query and sample: common random
        numbers, which make their paired comparison sharper), else from the whole call.
        """
        scope = scope or Scope()
        params: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens}
        if response_format:
            params["response_format"] = response_format
        if stop:
            params["stop"] = list(stop)
        key = cache_key(model, messages, self._sent_params(model, params), sample_index, self._endpoint(model))
        hit = await self._cached(key)
        if hit is not None:
            return await self._reuse(scope, stage, model, key, hit.id, hit.response or "")
        self._raise_if_held(model, stage)
        pending = self._in_flight.get(key)
        if pending is not None:
            first: CallResult = await asyncio.shield(pending)
            return await self._reuse(scope, stage, model, key, first.call_id, first.text)
        future = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        try:
            result = await self._call(stage=stage, model=model, messages=messages, scope=scope, params=params,
                                      key=key, sample_index=sample_index, seed_key=seed_key)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a call nobody else waited for must not warn
            raise
        else:
            future.set_result(result)
            return result
        finally:
            self._in_flight.pop(key, None)

    async def _reuse(self, scope: Scope, stage: str, model: str, key: str, source_id: int | None,
                     text: str) -> CallResult:
        call_id = await self._record(run_id=scope.run_id, evaluation_id=scope.evaluation_id, stage=stage, model=model,
                               cache_key=key, request={"cached_from": source_id}, response=text, cache_hit=True,
                               trace_id=scope.trace_id)
        return CallResult(text=text, cache_hit=True, call_id=call_id)

    async def _call(self, *, stage: str, model: str, messages: list[dict], scope: Scope, params: dict, key: str,
                    sample_index: int, seed_key: str | None) -> CallResult:
        """The requests of one call: retried on transient errors within the deadline, each attempt in a slot."""
        request = {"messages": messages, "params": params, "sample_index": sample_index}
        kwargs: dict[str, Any] = {"model": model, "messages": messages, "max_retries": 0, "num_retries": 0, **params}
        if seed_key is not None:
            kwargs["seed"] = _seed(hashlib.sha256(seed_key.encode()).hexdigest())
        elif model.startswith(LOCAL_PREFIX):
            kwargs["seed"] = _seed(key)
        endpoint = self._endpoint(model)
        if endpoint:
            kwargs["api_base"] = endpoint
        connection = self._connection(model)
        api_key = None  # None: OPENAI_API_KEY, if set, as before connections
        if connection is not None:  # `<connection>/<model>`: its address, its key, its default parameters
            params = self._sent_params(model, params)
            kwargs.update(params, model=connection.model if connection.kind == "litellm" else f"openai/{connection.model}")
            api_key = secret(connection.key_env) if connection.key_env else ""
            if api_key:
                kwargs["api_key"] = api_key
        served = self.mock is None and self._served_locally(model)
        direct = served or (self.mock is None and endpoint is not None
                            and (model.startswith("openai/") or (connection is not None and connection.kind == "openai")))
        payload = {"model": connection.model if connection is not None else model.split("/", 1)[-1],
                   "messages": messages, **params, **({"seed": kwargs["seed"]} if "seed" in kwargs else {})}
        where = f" at {connection.where}" if connection is not None else f" at {mask_url(endpoint)}" if endpoint else ""
        named = connection.connection if connection is not None else None
        attempts = 0
        started = time.perf_counter()
        queued = 0.0  # seconds spent waiting for a slot: the ledger's latency is the call's own time, not the queue's
        deadline = None  # set when the call first holds a slot: waiting in our own queue is not the model's time
        while True:
            raise_if_lost()  # a worker whose job was taken over spends nothing more
            attempts += 1
            transient, unreachable = False, None
            waiting = time.perf_counter()
            async with self._semaphore(model):
                queued += time.perf_counter() - waiting
                self._raise_if_held(model, stage)  # found unreachable while this call waited for its slot
                deadline = deadline or time.monotonic() + self.deadline_s
                try:
                    timeout = max(0.001, self._attempt_timeout(served, deadline))
                    if served:  # the embedded model's server, found (or started) anew each attempt
                        restarts = model_server.restart_count(local_name(model))
                        endpoint = await asyncio.to_thread(model_server.address, local_name(model)) + "/v1"
                    if direct:  # an OpenAI-compatible server: our own request, no translation layer
                        reply = await openai_http.chat(endpoint, payload, timeout, api_key=api_key, cut_loops=served)
                        break
                    if self.mock is not None:
                        kwargs["mock_response"] = self.mock(stage, messages)
                    response = await providers().acompletion(**kwargs, timeout=timeout)
                    reply = openai_http.Reply(text=response.choices[0].message.content or "",
                                              tokens_in=int(getattr(response.usage, "prompt_tokens", 0) or 0)
                                              if getattr(response, "usage", None) else 0,
                                              tokens_out=int(getattr(response.usage, "completion_tokens", 0) or 0)
                                              if getattr(response, "usage", None) else 0)
                    break
                except Exception as exc:  # noqa: BLE001  (every provider failure is recorded, not raised raw)
                    error = exc
                    unreachable = None if served else openai_http.unreachable_reason(exc)
                    transient = unreachable is None and isinstance(exc, transient_errors())
                    if transient and served:
                        self._note_restart(scope, model, restarts)
            if transient and attempts <= self.max_retries:
                delay = retry_after(error)
                if delay is None:
                    delay = self.backoff_s * 2 ** (attempts - 1) * (0.5 + random.random())
                if time.monotonic() + delay < deadline:
                    log.warning("%s on %s, retry %d in %.1fs", type(error).__name__, model, attempts, delay)
                    await asyncio.sleep(delay)  # outside the slot: other calls use it meanwhile
                    continue
            latency = (time.perf_counter() - started - queued) * 1000
            message = redact(f"{type(error).__name__}: {error}")[:2000]
            if transient:
                message = f"gave up after {attempts} attempts in {latency / 1000:.1f} s: {message}"[:2000]
            if unreachable:
                message = f"{unreachable}, not retried: {message}"[:2000]
            await self._record(run_id=scope.run_id, evaluation_id=scope.evaluation_id, stage=stage, model=model,
                               cache_key=key, request=request, latency_ms=latency, attempts=attempts, error=message,
                               connection=named, trace_id=scope.trace_id)
            said = f"{model} ({stage}){where}: {message}"
            if unreachable:
                first = self._unreachable.get(self._address(model), (0.0, said))[1]  # the first finding says it
                self._unreachable[self._address(model)] = (time.monotonic(), first)
                raise ModelUnreachable(said) from error
            raise ModelCallError(said) from error
        latency = (time.perf_counter() - started - queued) * 1000
        text, tokens_in, tokens_out = reply.text, reply.tokens_in, reply.tokens_out
        if reply.cut:  # the ledger says why the reply ends before its token limit without a stop
            request = {**request, "cut": "the reply fell into a loop: kept up to the loop's first copy"}
        cost = token_cost(model, tokens_in, tokens_out) if direct else _cost(response, model)
        call_id = await self._record(run_id=scope.run_id, evaluation_id=scope.evaluation_id, stage=stage,
                                     model=model, cache_key=key, request=request, response=text,
                                     tokens_in=tokens_in, tokens_out=tokens_out, cost=cost, latency_ms=latency,
                                     attempts=attempts, connection=named, trace_id=scope.trace_id)
        return CallResult(text=text, tokens_in=tokens_in, tokens_out=tokens_out, cost=cost, latency_ms=latency,
                          call_id=call_id)

    async def complete_json(
        self,
        *,
        stage: str,
        model: str,
        messages: list[dict],
        reply: type[R],
        context: dict | None = None,
        scope: Scope | None = None,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        sample_index: int = 0,
        attempts: int = 2,
        schema: dict | None = None,
    ) -> tuple[R, CallResult]:
        """A call whose reply must be the JSON of the `reply` model, whose schema the request sends.
        `context` is passed to the model's validators (the judge's scale, for one); `schema` replaces the
        reply model's schema when the shape depends on data (a rubric's criteria, core.domain.rubric.verdict_schema).

        A malformed reply (even after repair) is asked again (a different sample, so not from the cache),
        then raised as StructuredOutputError carrying the raw text.
        """
        schema = schema or reply.prompt_schema(local=model.startswith(LOCAL_PREFIX))
        response_format = {"type": "json_schema", "json_schema": {"name": stage, "schema": schema, "strict": True}}
        last_error = ""
        result = CallResult(text="")
        for attempt in range(attempts):
            result = await self.complete(stage=stage, model=model, messages=messages, scope=scope,
                                         temperature=temperature if attempt == 0 else max(temperature, 0.3),
                                         max_tokens=max_tokens, sample_index=sample_index * 100 + attempt,
                                         response_format=response_format)
            try:
                value, result.reply_status = parse_reply(result.text, reply, context)
            except ValueError as exc:
                last_error, result.reply_status = str(exc), MALFORMED
            self._mark(result.call_id, result.reply_status)
            if result.reply_status != MALFORMED:
                return value, result
        raise StructuredOutputError(f"{stage}: the reply is not the JSON asked for ({last_error})", result.text)


def parse_reply(text: str, reply: type[R], context: dict | None = None) -> tuple[R, str]:
    """The reply as its model, and how it was read: PARSED (JSON, perhaps in prose or a code fence) or
    REPAIRED (json-repair mended it: a trailing comma, a missing bracket, single quotes, a cut-off end).
    Raises InvalidInput saying what is wrong when neither gives a valid reply."""
    try:
        candidate = json_text(text)
    except InvalidInput as exc:
        problem = str(exc)
    else:
        try:
            return _validate_json(reply, candidate, context), PARSED
        except ValidationError as exc:
            problem = describe_validation(exc)
    try:
        repaired = json_repair.repair_json(text or "", return_objects=True)
    except Exception:  # noqa: BLE001  (whatever the repair makes of it, the reply stays malformed)
        raise InvalidInput(problem) from None
    options = [repaired]
    if isinstance(repaired, list):  # prose with brackets of its own ("use [E1]") gives a list of values
        options += [item for item in repaired if isinstance(item, dict)]
    for option in options:
        try:
            return reply.model_validate(option, context=context), REPAIRED
        except ValidationError:
            continue
    raise InvalidInput(problem)


def _validate_json(reply: type[R], candidate: str, context: dict | None) -> R:
    try:
        return reply.model_validate_json(candidate, context=context)
    except ValidationError as exc:
        if not any(error["type"] == "json_invalid" for error in exc.errors()):
            raise
    # JSON that only Python's lenient decoder reads (a raw control character or line break in a string)
    return reply.model_validate(json.loads(candidate, strict=False), context=context)


def extract_json(text: str) -> Any:
    """The JSON value in a reply, tolerating code fences and prose around it."""
    return json.loads(json_text(text), strict=False)


def json_text(text: str) -> str:
    """The JSON text in a reply, tolerating code fences and prose around it."""
    text = (text or "").strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    candidates = [text] + ([fenced.group(1)] if fenced else [])
    for start_char in "{[":
        start = text.find(start_char)
        end = text.rfind("}" if start_char == "{" else "]")
        if start != -1 and end > start:
            candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            json.loads(candidate, strict=False)
        except (json.JSONDecodeError, TypeError):
            continue
        return candidate
    raise InvalidInput(f"no JSON found in reply: {text[:120]!r}")


def _cost(response: Any, model: str) -> float:
    """The call's price: litellm's own figure for the response when it has one; a model litellm has no price
    for is free (core.models.prices remembers which, as asking costs ~2 ms a call)."""
    if price_per_token(model) in (None, (0.0, 0.0)):
        return 0.0
    hidden = getattr(response, "_hidden_params", {}) or {}
    if hidden.get("response_cost") is not None:
        return float(hidden["response_cost"])
    try:
        return float(providers().completion_cost(completion_response=response) or 0.0)
    except Exception:  # noqa: BLE001  (unknown prices are 0, not a failure)
        return 0.0
