"""The promoted experience library, fetched once and then served from memory.

An agent asks for its library on every conversation, so the copy is kept in process: within `ttl_s` of the
last check no request is made at all; after it, one cheap revalidation (`If-None-Match`, answered `304` when
nothing changed). When the studio cannot be reached the agent gets the last good copy, else the fallback it
passed, else an empty library: a studio outage degrades the prompt, it never fails the agent.

A library whose selection is `top_k` shows each query only the entries most similar to it; the entries for
one query come from the studio's selection route (the studio chooses, so a live agent gets exactly what the
studio evaluated) and are cached the same way, per query.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional, Union

from .transport import ClientError, Response, Transport, Unreachable

log = logging.getLogger("tfgrpo_client")

SOURCES = ("server", "cache", "stale", "fallback")

# The studio renders a library into a prompt block this way (core.domain.prompts / library_io.to_prompt_block), under
# the task's header; repeated here, with the studio's default header, so that a fallback given as a list of
# experiences reads like a served prompt (a task with its own header serves that: prefer a fallback prompt string).
EXPERIENCE_HEADER = ("Before you answer, read these experiences carefully; they were learned from earlier tasks like "
                     "this one:")


@dataclass(frozen=True)
class Library:
    """One copy of a library version: what goes into the system prompt (`prompt`, or the `experiences` one
    by one), the version it is (`version_id`, `number`, for `log_trace`), and `source`: "server" (fetched
    now), "cache" (in-process copy, checked within the TTL), "stale" (last good copy; the studio could not
    be asked) or "fallback" (the caller's own default, or empty)."""

    version_id: int | None
    number: int | None
    label: str | None
    experiences: tuple[str, ...]
    prompt: str
    arm: str | None = None
    source: str = "server"
    task: str | None = None
    library: str | None = None
    # How the studio chooses each prompt's entries ({"mode": "all" | "top_k", "k": n}); None from an older
    # studio. For entries chosen for a query (`get_entries`): that query and the chosen entries' ids.
    selection: dict | None = None
    query: str | None = None
    entry_ids: tuple[str, ...] = ()


Fallback = Union[str, Sequence[str], Library, None]
# (task, library, label, user id, query): a query for the entries chosen for it, None for the whole library.
Key = tuple[str, str, Optional[str], Optional[str], Optional[str]]


def render_prompt(experiences: Sequence[str]) -> str:
    """The prompt block the studio would serve for these experiences ("" for none): one a line by id, the ids
    E1, E2, ... by position (texts carry none; a new library numbers its entries so)."""
    if not experiences:
        return ""
    lines = "\n".join(f"[E{i}] {' '.join(str(text).split())}" for i, text in enumerate(experiences, start=1))
    return f"{EXPERIENCE_HEADER}\n{lines}\n"


def fallback_library(fallback: Fallback, *, task: str, library: str, label: str | None) -> Library:
    """The caller's fallback as a Library with source "fallback": a prompt string, a list of experience
    texts, or a Library. Anything else is the caller's bug and raises TypeError at the call."""
    if isinstance(fallback, Library):
        return replace(fallback, source="fallback")
    if fallback is None:
        return Library(None, None, label, (), "", source="fallback", task=task, library=library)
    if isinstance(fallback, str):
        return Library(None, None, label, (), fallback, source="fallback", task=task, library=library)
    if isinstance(fallback, (list, tuple)) and all(isinstance(text, str) for text in fallback):
        return Library(None, None, label, tuple(fallback), render_prompt(fallback), source="fallback",
                       task=task, library=library)
    raise TypeError("fallback must be a prompt string, a list of experience strings or a Library, "
                    f"not {type(fallback).__name__}")


@dataclass
class _Entry:
    """The last good copy of one key (None while the studio has never answered) and when to ask again."""

    library: Library | None
    etag: str | None
    fresh_until: float
    ok: bool  # False: the last check failed and `library` is served as "stale"


class LibraryCache:
    """Fetch + in-process cache, keyed by (task, library, label, user id): the studio may pick an A/B arm
    from the user id, so each user's copy is kept apart (at most `max_entries` keys, least recently used
    dropped). Thread-safe; one request per key at a time, and while one thread revalidates the others are
    served the copy they already have instead of waiting on the network."""

    def __init__(self, transport: Transport, ttl_s: float, *, max_entries: int = 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._transport = transport
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self._fetching: dict[Key, threading.Lock] = {}

    def get(self, task: str, library: str = "default", label: str | None = "production", *,
            user_id: str | None = None, fallback: Fallback = None, query: str | None = None) -> Library:
        if not isinstance(task, str) or not task or not isinstance(library, str) or not library:
            raise ValueError("task and library must be non-empty strings")
        if query is not None and (not isinstance(query, str) or not query.strip()):
            raise ValueError("query must be a non-empty string")
        fallback_copy = None if fallback is None else fallback_library(fallback, task=task, library=library,
                                                                         label=label)
        if fallback_copy is not None and query is not None:
            fallback_copy = replace(fallback_copy, query=query)
        key: Key = (task, library, label, user_id, query)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            fetch_lock = self._fetching.setdefault(key, threading.Lock())
        if entry is not None and self._clock() < entry.fresh_until:
            return self._served(entry, key, fallback_copy)
        if not fetch_lock.acquire(blocking=entry is None or entry.library is None):
            return self._served(entry, key, fallback_copy)  # another thread is revalidating it
        try:
            with self._lock:
                entry = self._entries.get(key)
            if entry is not None and self._clock() < entry.fresh_until:  # refreshed while we waited
                return self._served(entry, key, fallback_copy)
            return self._fetch(key, entry, fallback_copy)
        finally:
            fetch_lock.release()

    def _served(self, entry: _Entry, key: Key, fallback_copy: Library | None) -> Library:
        """What to serve without asking: the copy in memory, or, after a failed first fetch (the studio is
        not asked again before the TTL), what `_unreachable` served, quietly."""
        if entry.library is not None:
            return replace(entry.library, source="cache" if entry.ok else "stale")
        last_good = self._last_good(key, entry)
        if last_good is not None:
            return replace(last_good, source="stale")
        return self._without_copy(key, fallback_copy, None, quiet=True)

    def _fetch(self, key: Key, entry: _Entry | None, fallback_copy: Library | None) -> Library:
        task, library, label, user_id, for_query = key
        path = f"/v1/tasks/{urllib.parse.quote(task, safe='')}/libraries/{urllib.parse.quote(library, safe='')}"
        query = {}
        if for_query is not None:
            path += "/select"
            query["query"] = for_query
        if label is not None:
            query["label"] = label
        if user_id is not None:
            query["user"] = str(user_id)
        etag = entry.etag if entry is not None and entry.library is not None else None
        what = (("entries for a query of " if for_query is not None else "")
                + f"library {library!r} of task {task!r}" + (f" (label {label!r})" if label else ""))
        try:
            response = self._transport.request("GET", path, query=query,
                                               headers={"If-None-Match": etag} if etag else None)
            if response.status == 304 and entry is not None and entry.library is not None:
                self._store(key, entry.library, etag, ok=True)
                return replace(entry.library, source="cache")
            if response.ok:
                fetched = _parse(response, task=task, library=library, label=label)
                self._store(key, fetched, response.header("ETag"), ok=True)
                return fetched
            if response.transient:
                raise Unreachable(f"the studio answered {response.message}", response.retry_after)
            refusal = ClientError(f"the studio refused {what}: {response.message}", response.status)
        except Unreachable as problem:
            return self._unreachable(key, entry, fallback_copy, what, problem)
        # 401 / 403 / 404 / other 4xx: a configuration mistake. Loud when there is nothing else to serve.
        last_good = self._last_good(key, entry)
        if last_good is None and fallback_copy is None:
            raise refusal
        if entry is not None and entry.library is not None:  # back off; without a copy, ask again next call
            self._store(key, entry.library, entry.etag, ok=False)
        log.error("%s; serving the %s copy", refusal, "last good" if last_good else "fallback")
        return replace(last_good, source="stale") if last_good else fallback_copy

    def _unreachable(self, key: Key, entry: _Entry | None, fallback_copy: Library | None, what: str,
                     problem: Unreachable) -> Library:
        self._store(key, entry.library if entry else None, entry.etag if entry else None, ok=False,
                    wait_s=problem.retry_after)
        last_good = self._last_good(key, entry)
        if last_good is not None:
            log.warning("could not check %s (%s); serving the last good copy (%s)", what, problem,
                        f"version #{last_good.number}" if last_good.number is not None
                        else f"version id {last_good.version_id}")
            return replace(last_good, source="stale")
        return self._without_copy(key, fallback_copy, f"could not fetch {what} ({problem})", quiet=False)

    def _without_copy(self, key: Key, fallback_copy: Library | None, problem: str | None, *,
                      quiet: bool) -> Library:
        if fallback_copy is not None:
            if not quiet:
                log.warning("%s; serving the caller's fallback", problem)
            return fallback_copy
        if not quiet:
            log.warning("%s and no fallback was given; serving an EMPTY library (no experiences in the prompt)",
                        problem)
        task, library, label, _user, query = key
        return replace(fallback_library(None, task=task, library=library, label=label), query=query)

    def _last_good(self, key: Key, entry: _Entry | None) -> Library | None:
        """This key's last good copy, else the most recent one of the same library, label (and query) fetched
        for another user: an A/B arm that may not be this user's is better than no library during an outage.
        Entries chosen for another query are never served for this one: they were chosen for that query."""
        if entry is not None and entry.library is not None:
            return entry.library
        with self._lock:
            for other_key, other in reversed(self._entries.items()):
                if other_key[:3] == key[:3] and other_key[4] == key[4] and other.library is not None:
                    return other.library
        return None

    def _store(self, key: Key, library: Library | None, etag: str | None, *, ok: bool,
               wait_s: float | None = None) -> None:
        # A failed check is not retried before the TTL either (nor before the server's Retry-After), so an
        # outage costs one timeout per key and TTL, not one per call.
        delay = self._ttl_s if wait_s is None else max(self._ttl_s, wait_s)
        with self._lock:
            self._entries[key] = _Entry(library, etag, self._clock() + delay, ok)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                old_key, _old = self._entries.popitem(last=False)
                self._fetching.pop(old_key, None)


def _parse(response: Response, *, task: str, library: str, label: str | None) -> Library:
    """The studio's JSON as a Library; an answer of another shape (a proxy's page, an old studio) counts as
    no answer, so the agent keeps its last good copy."""
    body: Any = response.body
    try:
        experiences = body["experiences"]
        version_id = body["version_id"]
        prompt = body["prompt"]
        if not (isinstance(experiences, list) and all(isinstance(text, str) for text in experiences)
                and isinstance(version_id, int) and isinstance(prompt, str)):
            raise TypeError
        number = body.get("number")
        arm = body.get("arm")
        served_label = body.get("label", label)
        selection = body.get("selection")
        entries = body.get("entries") or []
        ids = tuple(str(item["id"]) for item in entries)
    except (KeyError, TypeError, AttributeError):
        raise Unreachable(f"the studio's answer (HTTP {response.status}) is not a library") from None
    query = body.get("query")
    return Library(version_id=version_id, number=number if isinstance(number, int) else None,
                   label=served_label if isinstance(served_label, str) else label, experiences=tuple(experiences),
                   prompt=prompt, arm=arm if isinstance(arm, str) else None, source="server",
                   task=body.get("task") if isinstance(body.get("task"), str) else task,
                   library=body.get("library") if isinstance(body.get("library"), str) else library,
                   selection=selection if isinstance(selection, dict) else None,
                   query=query if isinstance(query, str) else None, entry_ids=ids)
