"""The embedded model as a litellm custom provider (`local/...`): OpenAI-shaped requests straight into the
in-process llama.cpp server of core/models/local_model.py, for TFGRPO_LOCAL_IN_PROCESS."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import litellm
from litellm import CustomLLM, ModelResponse

from core.models import local_model

_PASSTHROUGH = ("temperature", "max_tokens", "top_p", "seed", "stop", "response_format")


# One request at a time into the embedded server. Measured on this machine with xllamacpp 4 slots: two
# requests in flight (a JSON-schema judge call beside a rollout, and later two plain summaries) left both
# waiting forever with the server's queue idle; the same runs complete when requests go one by one.
# This gives up the batching of concurrent calls (about 28 against 18 tokens/s) for runs that finish.
_one_at_a_time = threading.Lock()


def _serially(call, *args):
    with _one_at_a_time:
        return call(*args)


class LocalProvider(CustomLLM):
    """litellm custom provider: OpenAI-shaped requests straight into the in-process server."""

    async def acompletion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> ModelResponse:
        optional = kwargs.get("optional_params") or {}
        body: dict[str, Any] = {"messages": messages}
        body.update({k: optional[k] for k in _PASSTHROUGH if optional.get(k) is not None})
        server = await asyncio.to_thread(local_model.get_server, model)
        started = time.perf_counter()
        try:
            reply = await asyncio.to_thread(_serially, server.handle_chat_completions, body)
        except ValueError as exc:
            raise litellm.BadRequestError(str(exc), model=model, llm_provider="local") from exc
        if "error" in reply:
            raise litellm.APIError(500, str(reply["error"]), llm_provider="local", model=model)
        reply.pop("timings", None)
        reply["model"] = f"local/{model}"
        response = ModelResponse(**reply)
        response._hidden_params["response_cost"] = 0.0
        response._hidden_params["local_latency_ms"] = (time.perf_counter() - started) * 1000
        return response


_provider = LocalProvider()


def register() -> None:
    """Make `local/<name>` model strings resolve to the embedded provider (idempotent)."""
    if not any(item.get("provider") == "local" for item in litellm.custom_provider_map):
        litellm.custom_provider_map.append({"provider": "local", "custom_handler": _provider})
