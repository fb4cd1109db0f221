"""Traces: checked at the call, sent by a background thread, never lost quietly.

`log_trace` must cost the agent nothing when the studio is slow or down, so it only validates and queues;
one daemon thread sends batches in order and retries what failed (backing off, honouring Retry-After). The
studio stores each client-side id once, which is what makes every retry, and a resend after a crash, safe.
What cannot be delivered by exit is spooled to a file (when one is configured) for the next start, or
counted in a warning: never dropped without a log line.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import threading
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .transport import Transport, Unreachable

log = logging.getLogger("tfgrpo_client")

MAX_BATCH = 100  # the studio takes at most 100 traces a request
REFUSED_STATUSES = frozenset({400, 413, 422})  # the server refused this content: split, then drop the bad one
ROLES = ("user", "agent")


def make_trace(*, id: str | None, task: str, input: str, output: str | None, turns: list[dict] | None,
               score: float | None, thumbs: str | None, comment: str | None, segment: str | None,
               user_id: str | None, metadata: dict | None, library: str, version_id: int | None,
               label: str | None) -> dict[str, Any]:
    """The trace as the studio takes it, or ValueError naming the bad field: a developer's bug is loud at
    the call site rather than a batch the server refuses later in the background."""
    if id is None:
        id = uuid.uuid4().hex
    _check(isinstance(id, str) and bool(id), "id must be a non-empty string")
    _check(isinstance(task, str) and bool(task), "task must be a non-empty string")
    _check(isinstance(library, str) and bool(library), "library must be a non-empty string")
    _check(isinstance(input, str), "input must be a string")
    _check(output is None or isinstance(output, str), "output must be a string or None")
    if score is not None:
        _check(isinstance(score, (int, float)) and not isinstance(score, bool), "score must be a number")
        _check(math.isfinite(score) and 0.0 <= score <= 1.0, f"score must be in [0, 1], not {score!r}")
        score = float(score)
    _check(thumbs in (None, "up", "down"), f'thumbs must be "up", "down" or None, not {thumbs!r}')
    for name, value in (("comment", comment), ("segment", segment), ("user_id", user_id), ("label", label)):
        _check(value is None or isinstance(value, str), f"{name} must be a string or None")
    _check(version_id is None or (isinstance(version_id, int) and not isinstance(version_id, bool)),
           "version_id must be an int or None")
    _check(version_id is None or label is None, "give the version the agent used as version_id or label, not both")
    _check(version_id is not None or label is not None,
           "give the version the agent used: version_id=lib.version_id (or the label it fetched); a reply made "
           "from the fallback text has no version, and the studio refuses a trace without one")
    if turns is not None:
        _check(isinstance(turns, (list, tuple)), "turns must be a list of {'role', 'text'} or None")
        for turn in turns:
            _check(isinstance(turn, dict) and turn.get("role") in ROLES and isinstance(turn.get("text"), str),
                   f"each turn must be {{'role': 'user'|'agent', 'text': str}}, not {turn!r}")
        turns = [{"role": turn["role"], "text": turn["text"]} for turn in turns]
    if metadata is None:
        metadata = {}
    _check(isinstance(metadata, dict), "metadata must be a dict")
    try:  # a snapshot: the caller may change its dict after the call, the sender serialises it later
        metadata = json.loads(json.dumps(metadata, ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise ValueError(f"metadata must be JSON-serialisable: {error}") from None
    trace: dict[str, Any] = {"id": id, "task": task, "library": library}
    if version_id is not None:
        trace["version_id"] = version_id
    if label is not None:
        trace["label"] = label
    trace.update(input=input, output=output, turns=turns, score=score, thumbs=thumbs, comment=comment,
                 segment=segment, user_id=user_id, metadata=metadata,
                 created_at=datetime.now(timezone.utc).isoformat(timespec="milliseconds"))
    return trace


UNSET: Any = object()  # a field update_trace leaves as it is (None clears it)


def make_update(*, score: Any, thumbs: Any, comment: Any) -> dict[str, Any]:
    """The fields an update sets, checked as make_trace checks them; ValueError when none is given."""
    update = {name: value for name, value in (("score", score), ("thumbs", thumbs), ("comment", comment))
              if value is not UNSET}
    _check(bool(update), "give at least one of score, thumbs or comment to update")
    if update.get("score") is not None:
        value = update["score"]
        _check(isinstance(value, (int, float)) and not isinstance(value, bool), "score must be a number")
        _check(math.isfinite(value) and 0.0 <= value <= 1.0, f"score must be in [0, 1], not {value!r}")
        update["score"] = float(value)
    _check(update.get("thumbs") in (None, "up", "down"), f'thumbs must be "up", "down" or None, not {thumbs!r}')
    _check(update.get("comment") is None or isinstance(update["comment"], str), "comment must be a string or None")
    return update


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class FlushResult:
    """What flush() saw: true only when nothing is left queued and no trace was lost since the previous
    flush. Lost traces are named by id: refused by the studio as invalid, dropped from a full queue, or
    given up after the retries (spooled when a spool_path is set)."""

    pending: int = 0
    refused: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    given_up: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.pending == 0 and not (self.refused or self.dropped or self.given_up)


class TraceSender:
    """A bounded queue and the daemon thread that empties it into `POST /v1/traces`.

    Order is kept: a batch that fails stays at the head (`_inflight`) and is retried before anything newer.
    A batch the server refuses as invalid (422, 413, 400) is halved until the bad trace is alone, and that
    one is dropped with an error naming its id, so one bad trace never blocks the rest. A rejected key
    (401/403) keeps everything queued: the key may be fixed on the server. When the queue is full the oldest
    trace is dropped and counted."""

    def __init__(self, transport: Transport, *, batch_size: int, flush_interval_s: float, max_queue: int,
                 max_retries: int | None, max_backoff_s: float, spool_path: str | os.PathLike | None) -> None:
        if not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size must be between 1 and {MAX_BATCH} (the studio's limit)")
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        self._transport = transport
        self.batch_size = batch_size
        self.flush_interval_s = max(0.01, flush_interval_s)
        self.max_queue = max_queue
        self.max_retries = max_retries
        self.max_backoff_s = max_backoff_s
        self.spool_path = os.fspath(spool_path) if spool_path is not None else None
        self._cond = threading.Condition()
        self._spool_lock = threading.Lock()  # the sender (giving up) and close() may both append
        self._queue: deque[dict] = deque()
        self._inflight: list[dict] = []  # the head batch, being sent or waiting for a retry
        self._thread: threading.Thread | None = None
        self._closed = False
        self._flushing = 0  # flush() calls waiting: the sender sends partial batches at once meanwhile
        self._wakes = 0  # bumped by each flush() call, to cut one backoff short
        self._seen_wakes = 0
        self.sent = 0
        self.dropped = 0  # oldest traces dropped because the queue was full
        self.refused = 0  # traces the server refused as invalid
        self.given_up = 0  # traces abandoned after max_retries
        self._lost: dict[str, list[str]] = {"refused": [], "dropped": [], "given_up": []}  # ids, until a flush
        self._last_drop_log = -math.inf
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _after_fork(ref))
        if self.spool_path:
            self._load_spool()

    # --- the caller's side -------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + len(self._inflight)

    def put(self, trace: dict) -> None:
        with self._cond:
            closed = self._closed
            if not closed:
                self._append(trace)
                if len(self._queue) >= self.batch_size:
                    self._cond.notify_all()
        if closed:  # e.g. logged by another atexit hook after ours: keep it if we can, never raise
            self._spool_or_warn([trace], "after the client was closed")
            return
        self._ensure_thread()

    def amend(self, trace_id: str, task: str, update: dict[str, Any]) -> bool:
        """Apply an update to a trace still waiting in the queue (it then goes with the trace); False when
        it is not there (sent, or being sent)."""
        with self._cond:
            for trace in self._queue:
                if trace.get("id") == trace_id and trace.get("task") == task:
                    trace.update(update)
                    return True
        return False

    def flush(self, timeout_s: float = 10.0) -> FlushResult:
        """Wait until every queued trace is delivered, refused or given up, or `timeout_s` passes; the result
        is true when all were delivered and names the traces lost since the previous flush."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if not self._queue and not self._inflight:
                return self._result()
            self._wakes += 1
            self._flushing += 1
            self._cond.notify_all()
        try:
            self._ensure_thread()
            with self._cond:
                while self._queue or self._inflight:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._closed:
                        break
                    self._cond.wait(remaining)
                return self._result()
        finally:
            with self._cond:
                self._flushing -= 1

    def _result(self) -> FlushResult:
        """(Under the lock.) What is pending, and the traces lost since the last call, forgotten after it."""
        lost = {kind: tuple(ids) for kind, ids in self._lost.items()}
        for ids in self._lost.values():
            ids.clear()
        return FlushResult(pending=len(self._queue) + len(self._inflight), **lost)

    def close(self, timeout_s: float, *, when: str = "at close") -> bool:
        """Flush for at most `timeout_s`, stop the thread, then spool (or count in a warning) what is left.
        True when nothing was left undelivered."""
        delivered = bool(self.flush(timeout_s))
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=min(self._transport.timeout_s, 5.0) + 0.5)  # let a request under way end
        with self._cond:
            left = list(self._inflight) + list(self._queue)
            self._inflight, self._queue = [], deque()
        if left:
            # A request still under way may yet deliver some of these; the studio stores an id once, so
            # sending them again from the spool is harmless.
            self._spool_or_warn(left, when)
        return delivered and not left

    # --- the sender thread ---------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive():
            return
        with self._cond:
            if self._closed or (self._thread is not None and self._thread.is_alive()):
                return
            thread = threading.Thread(target=self._run, name="tfgrpo-client-traces", daemon=True)
            try:
                thread.start()
            except RuntimeError as error:  # e.g. at interpreter shutdown; close() spools what is left
                log.error("could not start the trace sender: %s", error)
                return
            self._thread = thread

    def _wait_for_batch(self) -> None:
        """Wait (holding the lock) up to the flush interval, or until close(), a full batch, or while a
        flush() is waiting for a queue that is not empty."""
        self._cond.wait_for(lambda: self._closed or len(self._queue) >= self.batch_size
                            or (self._flushing > 0 and len(self._queue) > 0), timeout=self.flush_interval_s)

    def _back_off(self, delay_s: float, *, cut_by_flush: bool) -> None:
        """Wait (holding the lock) `delay_s`, or until close(), or, when `cut_by_flush`, until a flush()
        call made since the last backoff (even during the failed request): each call cuts one backoff short."""
        self._cond.wait_for(lambda: self._closed or (cut_by_flush and self._wakes != self._seen_wakes),
                            timeout=delay_s)
        self._seen_wakes = self._wakes

    def _run(self) -> None:
        failures = 0
        problem_logged = None
        while True:
            with self._cond:
                if not self._inflight:
                    self._wait_for_batch()
                    if self._closed:
                        return
                    count = min(self.batch_size, len(self._queue))
                    self._inflight = [self._queue.popleft() for _ in range(count)]
                if self._closed:
                    return
                if not self._inflight:
                    continue
            try:
                self._deliver()
            except _Retry as retry:
                failures += 1
                if self.max_retries is not None and failures > self.max_retries:
                    self._give_up(retry)
                    failures = 0
                    continue
                if retry.kind != problem_logged:  # once per kind of problem, not once per attempt
                    level = logging.ERROR if retry.fatal else logging.WARNING
                    log.log(level, "could not send %d trace(s) to the studio (%s); %d queued, retrying",
                            len(self._inflight), retry.message, self.pending)
                    problem_logged = retry.kind
                delay = retry.retry_after
                if delay is None:
                    base = min(max(self.flush_interval_s, 0.05), self.max_backoff_s)
                    delay = min(self.max_backoff_s, base * 2 ** min(failures - 1, 30)) * random.uniform(0.75, 1.0)
                with self._cond:  # a flush() cuts a backoff short, not the server's own Retry-After
                    self._back_off(delay, cut_by_flush=retry.retry_after is None)
                continue
            except Exception:  # a bug here must not kill the thread and strand the queue
                log.exception("unexpected error in the trace sender; retrying")
                failures += 1
                time.sleep(min(self.max_backoff_s, 1.0))
                continue
            if problem_logged is not None:
                log.info("the studio takes traces again (after %d failed attempt(s))", failures)
            failures, problem_logged = 0, None

    def _deliver(self) -> None:
        """Send `_inflight` front to back in chunks; raises _Retry on a failure that must be retried."""
        chunk_size = len(self._inflight)
        while self._inflight:
            chunk = self._inflight[:chunk_size]
            try:
                response = self._transport.request("POST", "/v1/traces", body={"traces": chunk})
            except Unreachable as error:
                raise _Retry(str(error), kind="unreachable") from None
            if response.ok:
                self._done(len(chunk), delivered=True)
                continue
            if response.status in REFUSED_STATUSES:
                if len(chunk) > 1:
                    chunk_size = (len(chunk) + 1) // 2  # halve until the refused trace is alone
                    continue
                log.error("the studio refused trace %s (%s); dropped it", chunk[0].get("id"), response.message)
                self._done(1, delivered=False)
                continue
            if response.transient:
                raise _Retry(response.message, kind=str(response.status), retry_after=response.retry_after)
            hint = {401: " (check TFGRPO_API_KEY: missing, unknown or revoked)",
                    403: " (the key's role may not send traces)"}.get(response.status, "")
            raise _Retry(response.message + hint, kind=str(response.status), fatal=True)

    def _done(self, count: int, *, delivered: bool) -> None:
        with self._cond:
            if delivered:
                self.sent += count
            else:
                self.refused += count
                self._lost["refused"] += [trace.get("id") for trace in self._inflight[:count]]
            del self._inflight[:count]
            self._cond.notify_all()

    def _give_up(self, retry: _Retry) -> None:
        # Spooled before they leave the queue: a flush() (the one at exit) must not see an empty queue and
        # end the process while they are still being written.
        with self._cond:
            batch = list(self._inflight)
        log.error("gave up on %d trace(s) after %d attempts (%s)", len(batch), (self.max_retries or 0) + 1,
                  retry.message)
        self._spool_or_warn(batch, "after the retries")
        with self._cond:
            self._inflight = []
            self.given_up += len(batch)
            self._lost["given_up"] += [trace.get("id") for trace in batch]
            self._cond.notify_all()

    # --- the queue and the spool ---------------------------------------------------------------------

    def _append(self, trace: dict) -> None:
        """Queue one trace (under the lock), dropping the oldest when the queue is full."""
        if len(self._queue) >= self.max_queue:
            self._lost["dropped"].append(self._queue.popleft().get("id"))
            self.dropped += 1
            now = time.monotonic()
            if now - self._last_drop_log >= 5.0:
                log.warning("the trace queue is full (%d); dropped the oldest trace (%d dropped so far)",
                            self.max_queue, self.dropped)
                self._last_drop_log = now
        self._queue.append(trace)

    def _spool_or_warn(self, traces: list[dict], when: str) -> None:
        if self.spool_path:
            try:
                with self._spool_lock, open(self.spool_path, "a", encoding="utf-8") as spool:
                    for trace in traces:
                        spool.write(json.dumps(trace, ensure_ascii=False) + "\n")
                    spool.flush()
                    os.fsync(spool.fileno())
            except OSError as error:
                log.error("could not spool %d undelivered trace(s) to %s: %s; they are lost", len(traces),
                          self.spool_path, error)
                return
            log.warning("spooled %d undelivered trace(s) %s to %s; a client started with this spool_path "
                        "sends them", len(traces), when, self.spool_path)
        else:
            log.warning("%d trace(s) could not be delivered %s and are lost (set spool_path to keep them)",
                        len(traces), when)

    def _load_spool(self) -> None:
        """Queue what an earlier process spooled (ahead of anything new), then empty the file."""
        try:
            with open(self.spool_path, encoding="utf-8") as spool:  # type: ignore[arg-type]
                lines = spool.readlines()
        except FileNotFoundError:
            return
        except OSError as error:
            log.error("could not read the spool %s: %s", self.spool_path, error)
            return
        traces = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                trace = json.loads(line)
            except ValueError:
                log.warning("skipped line %d of the spool %s: not JSON", number, self.spool_path)
                continue
            if isinstance(trace, dict) and isinstance(trace.get("id"), str):
                traces.append(trace)
        try:
            open(self.spool_path, "w").close()  # type: ignore[arg-type]
        except OSError as error:
            log.error("could not empty the spool %s: %s (its traces will be sent again: harmless)",
                      self.spool_path, error)
        if not traces:
            return
        with self._cond:
            for trace in traces:
                self._append(trace)
        log.info("queued %d trace(s) from the spool %s", len(traces), self.spool_path)
        self._ensure_thread()


class _Retry(Exception):
    """A delivery that failed in a way worth retrying: the server was unreachable or busy (`retry_after` its
    hint), or refused the key (`fatal`: logged as an error, still retried). `kind` ("unreachable" or the
    status) decides when a new log line is worth writing."""

    def __init__(self, message: str, *, kind: str, retry_after: float | None = None, fatal: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.retry_after = retry_after
        self.fatal = fatal


def _after_fork(ref: weakref.ref) -> None:
    """In a forked child the parent's lock may be held and its thread is gone: start both afresh (the
    copied queue is sent again by the child; the studio keeps each id once)."""
    sender = ref()
    if sender is not None:
        sender._cond = threading.Condition()
        sender._spool_lock = threading.Lock()
        sender._thread = None
