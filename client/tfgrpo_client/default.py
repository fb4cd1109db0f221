"""The module-level calls: one default client per process, made from the environment on first use.

`configure(...)` replaces it (closing the previous one, so its queued traces are flushed or spooled rather
than stranded); `get_library`, `get_entries`, `log_trace` and `flush` use whichever is current.
"""

from __future__ import annotations

import threading
from typing import Any

from .client import Client
from .library import Fallback, Library
from .traces import UNSET, FlushResult

_lock = threading.Lock()
_default: Client | None = None


def configure(**kwargs: Any) -> Client:
    """Make the default client with these `Client` arguments (base_url, api_key, ttl_s, spool_path, ...)."""
    global _default
    client = Client(**kwargs)
    with _lock:
        previous, _default = _default, client
    if previous is not None:
        previous.close()
    return client


def default_client() -> Client:
    """The default client, made from TFGRPO_URL / TFGRPO_API_KEY if `configure` was not called."""
    global _default
    with _lock:
        if _default is None:
            _default = Client()
        return _default


def get_library(task: str, library: str = "default", label: str | None = "production", *,
                user_id: str | None = None, fallback: Fallback = None) -> Library:
    """`Client.get_library` on the default client."""
    return default_client().get_library(task, library, label, user_id=user_id, fallback=fallback)


def get_entries(task: str, query: str, library: str = "default", label: str | None = "production", *,
                user_id: str | None = None, fallback: Fallback = None) -> Library:
    """`Client.get_entries` on the default client."""
    return default_client().get_entries(task, query, library, label, user_id=user_id, fallback=fallback)


def log_trace(*, id: str | None = None, task: str, input: str, output: str | None = None,
              turns: list[dict] | None = None, score: float | None = None, thumbs: str | None = None,
              comment: str | None = None, segment: str | None = None, user_id: str | None = None,
              metadata: dict | None = None, library: str = "default", version_id: int | None = None,
              label: str | None = None) -> str:
    """`Client.log_trace` on the default client."""
    return default_client().log_trace(id=id, task=task, input=input, output=output, turns=turns, score=score,
                                      thumbs=thumbs, comment=comment, segment=segment, user_id=user_id,
                                      metadata=metadata, library=library, version_id=version_id, label=label)


def update_trace(id: str, *, task: str, score: float | None = UNSET, thumbs: str | None = UNSET,
                 comment: str | None = UNSET) -> bool:
    """`Client.update_trace` on the default client."""
    return default_client().update_trace(id, task=task, score=score, thumbs=thumbs, comment=comment)


def flush(timeout_s: float = 10.0) -> FlushResult:
    """`Client.flush` on the default client."""
    return default_client().flush(timeout_s)
