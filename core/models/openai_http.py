"""A direct client for OpenAI-compatible chat endpoints (vLLM, llama.cpp server, most self-hosting).

litellm and the OpenAI SDK cost several milliseconds of CPU per call, as much as the model's answer at
high throughput. For `openai/<name>` with an api_base the gateway posts the request itself, through one
aiohttp session per event loop (closed when the loop ends), and classifies what comes back: a reply,
a transient failure worth retrying (with the provider's Retry-After), a permanent one, or an address where
nothing answers (the connection refused, the host name unknown: `unreachable_reason`, which reads litellm's
errors too). Retrying is the gateway's; this module makes exactly one HTTP request per call.
"""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

from core.domain.repeats import loop_cut
from core.settings import secret

TRANSIENT_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class HTTPCallError(Exception):
    """A request that got no usable reply; `headers` carries the response's headers (Retry-After)."""

    def __init__(self, message: str, headers: dict | None = None) -> None:
        super().__init__(message)
        self.headers = dict(headers or {})


class TransientHTTPError(HTTPCallError):
    """Worth retrying: a rate limit, a server error, a timeout, a dropped connection, a body that is not JSON."""


class PermanentHTTPError(HTTPCallError):
    """Retrying would give the same answer: a bad request, a missing key, an unknown model."""


class UnreachableHTTPError(HTTPCallError):
    """Nothing answers at the address: the connection was refused or the host name does not resolve. Retrying
    within seconds meets the same, so the gateway does not (`reason` says which, in words)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


REFUSED, UNRESOLVED = "connection refused", "host name not found"


def unreachable_reason(exc: BaseException) -> str | None:
    """REFUSED or UNRESOLVED when `exc`, or an error it was raised from (litellm and httpx wrap aiohttp's, which
    wraps the socket's), says that nothing answers at the address; None for any other failure."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, UnreachableHTTPError):
            return current.reason
        for error in (current, getattr(current, "os_error", None)):
            if isinstance(error, socket.gaierror) or isinstance(current, aiohttp.ClientConnectorDNSError):
                return UNRESOLVED
            if isinstance(error, ConnectionRefusedError) or (isinstance(error, OSError)
                                                             and error.errno == errno.ECONNREFUSED):
                return REFUSED
        current = current.__cause__ or current.__context__
    return None


@dataclass
class Reply:
    text: str
    tokens_in: int
    tokens_out: int
    cut: bool = False  # streamed and cut where it fell into a loop (core.domain.repeats)


_sessions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def _session_for_loop() -> AsyncIterator[aiohttp.ClientSession]:
    """Yields the loop's session once and closes it when the loop shuts its async generators down
    (asyncio.run does, at its end), so a job's session never outlives its loop."""
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300))
    try:
        yield session
    finally:
        await session.close()


async def _session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    held = _sessions.get(loop)
    if held is None or held[1].closed:
        holder = _session_for_loop()
        held = (holder, await holder.__anext__())
        _sessions[loop] = held
    return held[1]


def endpoint_url(api_base: str) -> str:
    return api_base.rstrip("/") + "/chat/completions"


async def chat(api_base: str, payload: dict, timeout_s: float, api_key: str | None = None, *,
               cut_loops: bool = False) -> Reply:
    """One POST of `payload` to the endpoint's chat completions; raises Transient- or PermanentHTTPError.
    `api_key` is sent as the bearer token ("" for none); None sends OPENAI_API_KEY when it is set.
    `cut_loops` streams the reply (llama.cpp's server: it stops generating when the request is closed) and
    closes it where the text falls into a loop, keeping the loop's first copy (core.domain.repeats)."""
    headers = {"Content-Type": "application/json"}
    key = secret("OPENAI_API_KEY") if api_key is None else api_key
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if cut_loops:  # llama.cpp's server ends the connection after a stream, so it is not kept for the next request
        payload = {**payload, "stream": True, "stream_options": {"include_usage": True}, "timings_per_token": True}
        headers["Connection"] = "close"
    session = await _session()
    try:
        async with session.post(endpoint_url(api_base), json=payload, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            if response.status != 200:
                body = (await response.text(errors="replace"))[:300]
                kind = TransientHTTPError if response.status in TRANSIENT_STATUS else PermanentHTTPError
                raise kind(f"HTTP {response.status}: {body}", dict(response.headers))
            if cut_loops:
                return await _streamed(response)
            try:
                data = await response.json(content_type=None)
                message = data["choices"][0]["message"]
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise TransientHTTPError(f"the reply is not a chat completion: {type(exc).__name__}") from None
    except TimeoutError:
        raise TransientHTTPError(f"no reply within {timeout_s:g} s") from None
    except aiohttp.ClientError as exc:
        if (reason := unreachable_reason(exc)) is not None:
            raise UnreachableHTTPError(str(exc), reason) from None
        raise TransientHTTPError(f"{type(exc).__name__}: {exc}") from None
    usage = data.get("usage") or {}
    return Reply(text=message.get("content") or "", tokens_in=int(usage.get("prompt_tokens") or 0),
                 tokens_out=int(usage.get("completion_tokens") or 0))


CHECK_EVERY = 4  # streamed chunks (a token each) between two looks for a loop


async def _streamed(response: aiohttp.ClientResponse) -> Reply:
    """The text of a streamed chat completion (server-sent events), closed early where it falls into a loop.
    The token counts come from the last event's usage, or, for a reply closed early, from llama.cpp's per-token
    timings (prompt tokens computed plus those reused from its cache; tokens predicted so far)."""
    parts: list[str] = []
    tokens_in = tokens_out = 0
    try:
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise TransientHTTPError(f"the stream ended with an error: {str(event['error'])[:300]}")
            if timings := event.get("timings"):
                tokens_in = int(timings.get("cache_n") or 0) + int(timings.get("prompt_n") or 0)
                tokens_out = int(timings.get("predicted_n") or 0)
            if usage := event.get("usage"):
                tokens_in, tokens_out = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
            for choice in event.get("choices") or ():
                if piece := (choice.get("delta") or {}).get("content"):
                    parts.append(piece)
            if parts and len(parts) % CHECK_EVERY == 0 and (cut := loop_cut(text := "".join(parts))) is not None:
                response.close()  # the server stops generating for a request whose connection is gone
                return Reply(text=text[:cut].rstrip(), tokens_in=tokens_in, tokens_out=tokens_out, cut=True)
    except (ValueError, TypeError, AttributeError) as exc:
        raise TransientHTTPError(f"the stream is not a chat completion: {type(exc).__name__}") from None
    return Reply(text="".join(parts), tokens_in=tokens_in, tokens_out=tokens_out)
