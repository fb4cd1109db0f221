"""Score a reward in a separate process that can be killed: a time limit and a memory limit per score.

Regular expressions and math-verify run patterns and parsers that a task's author or the model controls.
One costly input (`(a+)+$` on a long reply, `\\boxed{9^{9^{9^{9}}}}`) runs for minutes inside C code that
never lets go of the GIL: a thread running it cannot be stopped, and the worker's heartbeat thread stops
with it. So these scores run in a child interpreter instead; the calling thread only waits on a pipe
(the GIL stays free), and a score past its time limit ends with SIGKILL and a fresh child.

Why a subprocess speaking JSON lines, not `multiprocessing`: the parent is threaded (the heartbeat,
asyncio's thread pool, llama.cpp), so fork is out; spawn and forkserver re-import the parent's `__main__`
(a Streamlit script, `python -m core worker`, pytest) in every child and pickle what crosses. A
`python -I` child started with subprocess (no Python code runs between fork and exec, so safe from any
thread) gets a scrubbed environment, sets its own limits, imports math-verify once, then answers one
JSON request per line; only text crosses, and stopping it is one SIGKILL of one pid.

A few children (`PROCESSES`) serve every thread and asyncio task of the process; each caller borrows an
idle one, so concurrent scores never share a pipe. A child's memory is capped with RLIMIT_AS (a score
that runs out reads "ran out of memory"), its CPU per request with RLIMIT_CPU (so a child whose parent
died mid-score ends by itself). Texts longer than MAX_TEXT_CHARS are cut to their last MAX_TEXT_CHARS
characters (the final answer is at the end), and the detail says so.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import math
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.domain.sandbox import child_environment, signal_name
from core.errors import InvalidInput

__all__ = ["MAX_TEXT_CHARS", "MEMORY_LIMIT_MB", "PROCESSES", "TIME_LIMIT_S", "Limits", "configure", "limits",
           "score_in_child", "score_many_in_child", "shutdown", "start"]

TIME_LIMIT_S = 5.0  # wall-clock seconds per score; an ordinary math-verify score takes under 1 ms
MEMORY_LIMIT_MB = 512  # address space of a scoring process; a warm one uses about 80 MB
PROCESSES = 2  # scoring processes shared by every thread of this process
MAX_TEXT_CHARS = 20_000  # characters of the response a score reads (its end)

_START_TIMEOUT_S = 60.0  # a child imports math-verify and scores once before it counts as ready
_WARM_UP = "core.domain.rewards:warm_up"  # what a new child runs before its first timed score
_ROOT = str(Path(__file__).resolve().parents[2])
_BOOTSTRAP = "import sys; sys.path.insert(0, sys.argv[1]); from core.domain.scoring import _serve; _serve()"
_COSTLY = "the pattern or answer is too costly"

Outcome = tuple[float, str, str]  # (value, source, detail), as core.domain.rewards.RewardResult


@dataclass(frozen=True)
class Limits:
    """The limits every score of this process runs under (see `configure`)."""

    time_s: float = TIME_LIMIT_S
    memory_mb: int = MEMORY_LIMIT_MB
    processes: int = PROCESSES


class _ChildGone(Exception):
    """The child closed its pipe: it crashed, ran out of memory outside Python, or was killed."""


class _ChildStale(_ChildGone):
    """The child was gone before it got the request (it died while idle): a fresh one may take it."""


class _Child:
    """One scoring process and its two pipes; used by one thread at a time (the pool lends it out)."""

    def __init__(self, memory_mb: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", _BOOTSTRAP, _ROOT, str(memory_mb), _WARM_UP],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, env=child_environment(),
            start_new_session=True, close_fds=True)
        self._buffer = b""

    def wait_ready(self) -> None:
        """Block until the child has warmed up; it is killed if it cannot."""
        try:
            reply = self._read_line(time.monotonic() + _START_TIMEOUT_S)
        except _ChildGone:
            self.kill()
            raise
        if reply != {"ready": True}:
            self.kill()
            raise _ChildGone(f"it answered {reply!r}" if reply else f"it was not ready in {_START_TIMEOUT_S:g} s")

    def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """Send one request and wait up to `timeout_s` for the reply; None when the time is up."""
        line = json.dumps(payload, default=str).encode() + b"\n"
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except OSError as exc:
            raise _ChildStale(str(exc)) from None
        return self._read_line(time.monotonic() + timeout_s)

    def read_reply(self, timeout_s: float) -> dict[str, Any] | None:
        """The next reply to requests already sent, waiting up to `timeout_s`; None when the time is up."""
        return self._read_line(time.monotonic() + timeout_s)

    def _read_line(self, deadline: float) -> dict[str, Any] | None:
        """One JSON line from the child, waiting in poll (which releases the GIL) until `deadline`."""
        fd = self.proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(math.ceil(remaining * 1000)):
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                self.kill()
                raise _ChildGone(_ended(self.proc.returncode))
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def kill(self) -> None:
        """SIGKILL and reap; safe to call twice."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


def _ended(returncode: int) -> str:
    """How a child ended, for the reason a person reads: "exit code 1", "killed by SIGXCPU"."""
    return f"exit code {returncode}" if returncode >= 0 else f"killed by {signal_name(-returncode)}"


class _Pool:
    """Up to `limits.processes` children, started when first needed and replaced (in the background) when
    killed. A borrower takes an idle child, else waits for one being started, else starts one itself."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.processes)
        self._changed = threading.Condition()
        self._idle: list[_Child] = []
        self._busy: set[_Child] = set()
        self._starting = 0
        self._closed = False

    def run(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The child's reply to `payload`, else {"timeout": True}, {"gone": how it ended} (the child is
        replaced) or {"unstarted": why}. A child found dead before it read the request is replaced once."""
        with self._slots:
            for attempt in (1, 2):
                child = self._borrow()
                if isinstance(child, str):
                    return {"unstarted": child}
                healthy = False
                try:
                    reply = child.request(payload, self.limits.time_s)
                    healthy = reply is not None and "memory" not in reply
                    return reply if reply is not None else {"timeout": True}
                except _ChildStale as exc:
                    if attempt == 2:
                        return {"gone": str(exc)}
                except _ChildGone as exc:
                    return {"gone": str(exc)}
                finally:
                    self._give_back(child, healthy)
        raise AssertionError("unreachable")

    def run_many(self, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """run() for several requests sent to one child together, its replies read one by one, each within the time
        limit from the one before. From a reply past its limit ({"timeout": True}), one that ran out of memory, or
        a child that died, the child is replaced and the requests not answered are {"redo": True}: the caller runs
        them alone."""
        with self._slots:
            child = self._borrow()
            if isinstance(child, str):
                return [{"unstarted": child}] * len(payloads)
            replies: list[dict[str, Any]] = []
            try:
                reply = child.request({"many": payloads}, self.limits.time_s)
                while True:
                    replies.append({"timeout": True} if reply is None else reply)
                    if reply is None or "memory" in reply or len(replies) == len(payloads):
                        break
                    reply = child.read_reply(self.limits.time_s)
            except _ChildStale:
                replies = []  # dead before it read them: each is run alone, on a fresh child
            except _ChildGone as exc:
                replies.append({"gone": str(exc)})
            finally:
                healthy = len(replies) == len(payloads) and not any("memory" in r or "timeout" in r for r in replies)
                self._give_back(child, healthy)
        return replies + [{"redo": True}] * (len(payloads) - len(replies))

    def start(self) -> None:
        """Start every child now, so the first scores wait for no start-up."""
        with self._changed:
            missing = self.limits.processes - len(self._idle) - len(self._busy) - self._starting
        threads = [threading.Thread(target=self._add_idle, daemon=True) for _ in range(missing)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _borrow(self) -> _Child | str:
        """An idle child, else one being started, else a new one (the reason as text when none starts)."""
        with self._changed:
            while True:
                if self._closed:
                    return "scoring is shut down"
                while self._idle:
                    child = self._idle.pop()
                    if child.proc.poll() is None:
                        self._busy.add(child)
                        return child
                    child.kill()
                if not self._starting:
                    break
                self._changed.wait()
        child = self._new_child()
        if not isinstance(child, str):
            with self._changed:
                self._busy.add(child)
        return child

    def _new_child(self) -> _Child | str:
        """A started, warmed-up child; while it starts, borrowers wait for it rather than start their own."""
        with self._changed:
            self._starting += 1
        try:
            child = _Child(self.limits.memory_mb)
            child.wait_ready()
        except (OSError, _ChildGone) as exc:
            return str(exc)
        finally:
            with self._changed:
                self._starting -= 1
                self._changed.notify_all()
        return child

    def _add_idle(self) -> None:
        """Start a child and keep it idle (in the background after a kill, so the next score finds one warm)."""
        child = self._new_child()
        if not isinstance(child, str):  # else the next score starts one itself and reports why it cannot
            self._give_back(child, healthy=True)

    def _give_back(self, child: _Child, healthy: bool) -> None:
        with self._changed:
            self._busy.discard(child)
            room = len(self._idle) + len(self._busy) < self.limits.processes
            keep = healthy and not self._closed and room
            if keep:
                self._idle.append(child)
                self._changed.notify_all()
            replace = not healthy and not self._closed
        if not keep:
            child.kill()
        if replace:
            threading.Thread(target=self._add_idle, name="scoring-restart", daemon=True).start()

    def close(self, *, busy_too: bool) -> None:
        """Kill the idle children now; a busy one is killed when its score ends, or now with `busy_too`
        (its score then ends as "stopped")."""
        with self._changed:
            self._closed = True
            children = self._idle + (list(self._busy) if busy_too else [])
            self._idle = []
            self._changed.notify_all()
        for child in children:
            child.kill()


_pool_lock = threading.Lock()
_pool: _Pool | None = None


def _current_pool() -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = _Pool(Limits())
        return _pool


def limits() -> Limits:
    """The limits scores run under now."""
    return _current_pool().limits


def configure(*, time_limit_s: float | None = None, memory_limit_mb: int | None = None,
              processes: int | None = None) -> Limits:
    """Change the limits (None keeps one as it is); the current children are replaced when the limits change
    and kept when they do not (a child costs a new Python that imports math-verify and sympy, 1 to 1.5 s).
    For a worker's start-up and for tests; returns the limits before the change, so a test can put them back."""
    global _pool
    with _pool_lock:
        old = _pool.limits if _pool is not None else Limits()
        new = Limits(time_s=old.time_s if time_limit_s is None else float(time_limit_s),
                     memory_mb=old.memory_mb if memory_limit_mb is None else int(memory_limit_mb),
                     processes=old.processes if processes is None else int(processes))
        if new.time_s <= 0 or new.memory_mb < 128 or new.processes < 1:
            raise InvalidInput("scoring limits must be more than 0 s, at least 128 MB and at least 1 process")
        if _pool is not None and new == old:
            return old
        previous, _pool = _pool, _Pool(new)
    if previous is not None:
        previous.close(busy_too=False)
    return old


def start() -> None:
    """Start the scoring processes now rather than at the first score (a worker's start-up; tests)."""
    _current_pool().start()


def shutdown() -> None:
    """Kill the scoring processes (at exit; a later score starts new ones)."""
    global _pool
    with _pool_lock:
        previous, _pool = _pool, None
    if previous is not None:
        previous.close(busy_too=True)


atexit.register(shutdown)


def _function_name(scorer: Callable) -> str:
    """"module:qualname" of a module-level function, which the child can import by that name."""
    name = f"{scorer.__module__}:{scorer.__qualname__}"
    if "<" in name:
        raise TypeError(f"an isolated scorer must be a module-level function, not {name}")
    return name


def score_in_child(scorer: Callable, response: str, reference: str, settings: dict[str, Any]) -> Outcome:
    """`scorer(response, reference, settings)` in a scoring process, within the time and memory limits.

    A score past a limit, or a child that dies, is (0.0, "error", reason); an InvalidInput the scorer
    raises (a configuration mistake) is raised here again; only the response's last MAX_TEXT_CHARS
    characters are scored.
    """
    pool = _current_pool()
    return _clipped(_outcome(pool.run(_payload(_function_name(scorer), response, reference, settings, pool.limits)),
                             pool.limits), response)


def _payload(name: str, response: str, reference: str, settings: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """A scoring process's request: the scorer by name and its arguments, only the response's last MAX_TEXT_CHARS."""
    return {"fn": name, "args": [response[-MAX_TEXT_CHARS:], reference, settings], "cpu_s": math.ceil(limits.time_s) + 2}


def _clipped(outcome: Outcome, response: str) -> Outcome:
    """The outcome, its detail saying so when only the response's last MAX_TEXT_CHARS characters were scored."""
    if len(response) <= MAX_TEXT_CHARS:
        return outcome
    value, source, detail = outcome
    return value, source, f"{detail} (scored the last {MAX_TEXT_CHARS:,} of {len(response):,} characters)"


def score_many_in_child(scorer: Callable, items: list[tuple[str, str, dict[str, Any]]]) -> list[Outcome | InvalidInput]:
    """score_in_child for several (response, reference, settings) in one round trip to one scoring process: a
    level's hundreds of scores, each a round trip of its own, were most of their cost. Each item's outcome, or the
    InvalidInput score_in_child would raise for it; each reply is waited for within the time limit. Past it, or when
    the process dies, the items not yet answered are scored alone, so only a costly one ends in its limit's error."""
    if len(items) == 1:
        return [_outcome_or_invalid(lambda: score_in_child(scorer, *items[0]))]
    pool = _current_pool()
    name = _function_name(scorer)
    replies = pool.run_many([_payload(name, *item, pool.limits) for item in items])
    outcomes: list[Outcome | InvalidInput] = []
    for item, reply in zip(items, replies, strict=True):
        if "redo" in reply:  # after a costly one or a process that died: alone, within its own limits
            outcomes.append(_outcome_or_invalid(lambda item=item: score_in_child(scorer, *item)))
        else:
            outcomes.append(_outcome_or_invalid(lambda reply=reply, item=item: _clipped(_outcome(reply, pool.limits),
                                                                                         item[0])))
    return outcomes


def _outcome_or_invalid(score: Callable[[], Outcome]) -> Outcome | InvalidInput:
    try:
        return score()
    except InvalidInput as exc:
        return exc


def _outcome(reply: dict[str, Any], limits: Limits) -> Outcome:
    """The child's reply as (value, source, detail); InvalidInput for a scorer's configuration error."""
    if "ok" in reply:
        value, source, detail = reply["ok"]
        return float(value), str(source), str(detail)
    if "invalid" in reply:
        raise InvalidInput(str(reply["invalid"]))
    if "timeout" in reply:
        return 0.0, "error", f"scoring timed out after {limits.time_s:g} s: {_COSTLY}"
    if "memory" in reply:
        return 0.0, "error", f"scoring ran out of memory (limit {limits.memory_mb} MB): {_COSTLY}"
    if "gone" in reply:
        return 0.0, "error", (f"scoring process stopped during the score ({reply['gone']}; memory limit "
                              f"{limits.memory_mb} MB): {_COSTLY}")
    if "unstarted" in reply:
        return 0.0, "error", f"scoring process could not start: {str(reply['unstarted'])[:300]}"
    return 0.0, "error", f"scoring failed: {str(reply.get('failed', reply))[:300]}"


# ---- the child's side ------------------------------------------------------------------------------------


def _set_limit(which: int, soft: int, hard: int | None = None) -> None:
    """Set a resource limit of this (child) process, never above the hard limit it inherited."""
    infinity = resource.RLIM_INFINITY
    _, inherited = resource.getrlimit(which)
    if hard is None or (inherited != infinity and hard > inherited):
        hard = inherited
    if hard != infinity:
        soft = min(soft, hard)
    resource.setrlimit(which, (soft, hard))


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _resolve(name: str) -> Callable:
    module, _, qualname = name.partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    """Run one request; every failure becomes a reply, so the loop goes on."""
    # The CPU limit backs the parent's kill up: it ends a child stuck in a score after its parent died.
    _set_limit(resource.RLIMIT_CPU, math.ceil(_cpu_seconds() + float(request.get("cpu_s", TIME_LIMIT_S + 2))))
    try:
        result = _resolve(request["fn"])(*request["args"])
        return {"ok": [result.value, result.source, result.detail]}
    except MemoryError:
        return {"memory": True}
    except ValueError as exc:  # InvalidInput and the other configuration mistakes a scorer raises
        return {"invalid": str(exc)}
    except Exception as exc:  # a scorer bug: reported as the reason, never a crash of the run
        return {"failed": f"{type(exc).__name__}: {exc}"}


def _quiet_math_verify() -> None:
    """math-verify warns on every call that its own timeouts are off; here the parent's kill is the timeout."""

    class _DropTimeoutNotice(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not record.getMessage().startswith("Timeout is disabled")

    logging.basicConfig(level=logging.WARNING, format="scoring process: %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_DropTimeoutNotice())


def _serve() -> None:
    """The child's loop: limits, warm-up, then one JSON request per line on stdin, one reply per line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business; EOF ends this loop
    memory = int(sys.argv[2]) * 1024 * 1024
    _set_limit(resource.RLIMIT_AS, memory, memory)
    _set_limit(resource.RLIMIT_CORE, 0, 0)
    _quiet_math_verify()
    try:
        _resolve(sys.argv[3])()
    except Exception:  # each score that needs what failed says why; the others still work
        logging.getLogger(__name__).exception("scoring process: warm-up failed")
    out = sys.stdout.buffer
    out.write(json.dumps({"ready": True}).encode() + b"\n")
    out.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        for one in request.get("many", [request]):  # a reply a line, each written when it is ready
            out.write(json.dumps(_answer(one), default=str).encode() + b"\n")
            out.flush()
