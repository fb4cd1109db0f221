"""`Client`: one studio, one API key, one library cache and one trace sender.

Most agents use the module-level functions (`get_library`, `log_trace`, `flush`) over a default client made
from the environment; a `Client` of one's own is for several studios or keys, and for tests.
"""

from __future__ import annotations

import atexit
import logging
import os
from typing import Any
from urllib.parse import quote

from .library import Fallback, Library, LibraryCache
from .traces import UNSET, FlushResult, TraceSender, make_trace, make_update
from .transport import Transport, Unreachable

log = logging.getLogger("tfgrpo_client")

DEFAULT_URL = "http://127.0.0.1:8502"
URL_ENV = "TFGRPO_URL"
KEY_ENV = "TFGRPO_API_KEY"


class Client:
    """Fetches libraries and sends traces for one studio.

    `base_url` and `api_key` default to the TFGRPO_URL and TFGRPO_API_KEY environment variables. `ttl_s`:
    how long a fetched library is served without asking the studio. `timeout_s`: of each request.
    Traces go in batches of `batch_size` (at most 100) every `flush_interval_s`, from a queue of at most
    `max_queue` (the oldest dropped beyond), retried `max_retries` times (None: for as long as the process
    runs) with backoff up to `max_backoff_s`. At exit the queue is flushed for up to `exit_timeout_s`; what
    is left goes to `spool_path` (JSON lines) when set, and a client started with that path sends it."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, ttl_s: float = 60.0,
                 timeout_s: float = 3.0, batch_size: int = 100, flush_interval_s: float = 2.0,
                 max_queue: int = 10000, max_retries: int | None = None,
                 spool_path: str | os.PathLike | None = None, exit_timeout_s: float = 5.0,
                 max_backoff_s: float = 60.0) -> None:
        base_url = base_url or os.environ.get(URL_ENV) or DEFAULT_URL
        if api_key is None:
            api_key = os.environ.get(KEY_ENV) or None
        if not api_key:
            log.warning("no API key: set %s (or pass api_key=); the studio will refuse every request", KEY_ENV)
        self.base_url = base_url.rstrip("/")
        self.exit_timeout_s = exit_timeout_s
        self._transport = Transport(base_url, api_key, timeout_s)
        self._libraries = LibraryCache(self._transport, ttl_s)
        self._selections = LibraryCache(self._transport, ttl_s)  # apart, so many queries never evict libraries
        self._traces = TraceSender(self._transport, batch_size=batch_size, flush_interval_s=flush_interval_s,
                                   max_queue=max_queue, max_retries=max_retries, max_backoff_s=max_backoff_s,
                                   spool_path=spool_path)
        self._closed = False
        atexit.register(self._at_exit)

    def __repr__(self) -> str:  # never the key
        return f"Client(base_url={self.base_url!r}, pending={self.pending})"

    def get_library(self, task: str, library: str = "default", label: str | None = "production", *,
                    user_id: str | None = None, fallback: Fallback = None) -> Library:
        """The library version `label` points at, for the system prompt; see `Library.source` for where this
        copy came from. Never raises because the studio is down or slow: it serves the last good copy, else
        `fallback` (a prompt string, a list of experiences or a Library), else an empty library. Raises
        ClientError for a refused key or an unknown task/library when there is nothing else to serve."""
        return self._libraries.get(task, library, label, user_id=user_id, fallback=fallback)

    def get_entries(self, task: str, query: str, library: str = "default", label: str | None = "production", *,
                    user_id: str | None = None, fallback: Fallback = None) -> Library:
        """The entries the library's selection shows for `query` (the k most similar under `top_k`, every
        entry under `all`), chosen by the studio exactly as for the rollouts it evaluated; `prompt` is the
        block built from them and `entry_ids` says which they are. Cached per query like `get_library` (TTL,
        ETag revalidation); when the studio cannot be asked it serves the last good copy for this query, else
        `fallback`, else an empty library, and never raises for an unreachable studio."""
        return self._selections.get(task, library, label, user_id=user_id, fallback=fallback, query=query)

    def log_trace(self, *, id: str | None = None, task: str, input: str, output: str | None = None,
                  turns: list[dict] | None = None, score: float | None = None, thumbs: str | None = None,
                  comment: str | None = None, segment: str | None = None, user_id: str | None = None,
                  metadata: dict | None = None, library: str = "default", version_id: int | None = None,
                  label: str | None = None) -> str:
        """Queue one production interaction for the studio and return its id (a new uuid4 hex unless given).
        Never waits on the network; raises ValueError at once for an invalid field (a score outside [0, 1],
        thumbs other than "up"/"down", both version_id and label, metadata that is not JSON)."""
        trace = make_trace(id=id, task=task, input=input, output=output, turns=turns, score=score,
                           thumbs=thumbs, comment=comment, segment=segment, user_id=user_id, metadata=metadata,
                           library=library, version_id=version_id, label=label)
        self._traces.put(trace)
        return trace["id"]

    def update_trace(self, id: str, *, task: str, score: float | None = UNSET, thumbs: str | None = UNSET,
                     comment: str | None = UNSET) -> bool:
        """Feedback that came after the trace (a thumbs-down a minute later): set score, thumbs or comment of
        trace `id` (None clears one; a field left out stays). A trace still queued here takes the update
        before it is sent; otherwise the studio is asked (`PATCH /v1/traces/{id}`, idempotent) once the
        traces queued before it are delivered. True when the studio has it; False, with a logged reason, when
        it could not be delivered (never raises for the studio being down). ValueError for an invalid field."""
        update = make_update(score=score, thumbs=thumbs, comment=comment)
        if self._traces.amend(id, task, update):
            return True
        self._traces.flush(self._transport.timeout_s)  # a post of this trace under way lands first
        try:
            response = self._transport.request("PATCH", f"/v1/traces/{quote(id, safe='')}",
                                               body={"task": task, **update})
        except Unreachable as error:
            log.warning("could not update trace %s: %s", id, error)
            return False
        if not response.ok:
            log.error("the studio refused the update of trace %s (%s)", id, response.message)
            return False
        return True

    def flush(self, timeout_s: float = 10.0) -> FlushResult:
        """Block until every queued trace is delivered or lost, or `timeout_s` passes. The result is true
        when all were delivered; `.refused`, `.dropped` and `.given_up` name by id the traces lost since the
        previous flush, and `.pending` counts what is still queued."""
        return self._traces.flush(timeout_s)

    def close(self, timeout_s: float | None = None) -> bool:
        """Flush (for at most `timeout_s`, default `exit_timeout_s`), stop the sender, spool or count what
        is left. True when every trace was delivered. Idempotent."""
        if self._closed:
            return self._traces.pending == 0
        self._closed = True
        atexit.unregister(self._at_exit)
        return self._traces.close(self.exit_timeout_s if timeout_s is None else timeout_s)

    @property
    def pending(self) -> int:
        """Traces queued or being sent."""
        return self._traces.pending

    def stats(self) -> dict[str, Any]:
        """Counters for a health endpoint or a test: sent, pending, dropped (queue full), refused (invalid),
        given_up (after max_retries)."""
        sender = self._traces
        return {"sent": sender.sent, "pending": sender.pending, "dropped": sender.dropped,
                "refused": sender.refused, "given_up": sender.given_up}

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _at_exit(self) -> None:
        if not self._closed:
            self._closed = True
            self._traces.close(self.exit_timeout_s, when="at exit")
