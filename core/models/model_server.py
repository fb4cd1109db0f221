"""The embedded model as a local server: llama.cpp's own OpenAI-compatible server on loopback, one per machine
and model, supervised, and called over HTTP like every other model.

`python -m core model-server` runs the supervisor. It holds a lock file (so there are never two for a model),
starts the server in a child process, records the server's address in `<model_dir>/server-<model>.json`
where every process of the studio finds it, and watches it: a child that died, or requests waiting while no
token is produced for `model_stall_s`, is killed and started again, and the restart is recorded with its
reason. A native call cannot be cancelled inside a process; a process can be killed, so the stalled model
runs in one. A process that needs the embedded model and finds no server starts one (`address`); a server
started that way exits after `model_idle_s` unused, one started by hand (or by `make run`) stays.

A server runs llama.cpp on TFGRPO_THREADS threads, by default every core but one, so the studio's pages keep a
core while a run works. A command-line job (`train` or `eval` run in the terminal, the learning benchmark) that
finds no server running has no page waiting on its server: inside `command_line_job` it starts one on every free
core (`job_threads`) and stops it when the job ends. A server already running (`make run`, the app's worker, another job) may be
serving pages' work, so it is used as it is.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from core.models.local_model import LOCAL_PREFIX, MODELS, LocalModelError, model_path, server_params
from core.settings import PROJECT_DIR, get_settings

READY = "listening "  # the child's first line of output: READY + its address


@dataclass
class ServerRecord:
    """What a running model server tells the other processes: where it listens, and its restarts."""

    model: str
    address: str
    supervisor_pid: int
    server_pid: int
    slots: int
    restarts: list[dict] = field(default_factory=list)
    threads: int = 0  # llama.cpp threads of its server (0: a record written before it was kept)


def local_name(model: str) -> str:
    """`qwen2.5-coder-0.5b` for `local/qwen2.5-coder-0.5b`."""
    return model.removeprefix(LOCAL_PREFIX)


def default_model() -> str:
    """The studio's model when it is an embedded one, else the first embedded model."""
    configured = get_settings().model
    return configured.removeprefix(LOCAL_PREFIX) if configured.startswith(LOCAL_PREFIX) else next(iter(MODELS))


def _path(name: str, suffix: str) -> Path:
    return get_settings().model_dir / f"server-{name}.{suffix}"


def read_record(name: str) -> ServerRecord | None:
    """The record of the model's server, if its supervisor is alive."""
    try:
        record = ServerRecord(**json.loads(_path(name, "json").read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return record if _alive(record.supervisor_pid) else None


def restart_count(name: str) -> int:
    record = read_record(name)
    return len(record.restarts) if record else 0


def process_state(pid: int) -> str | None:
    """The process's state letter from /proc (`Z` for a zombie), or None where there is no /proc to read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """A process that exited but whose parent has not reaped it yet (a zombie, e.g. an idle-exited supervisor
    the starting process still holds) still answers signal 0: it counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return process_state(pid) != "Z"  # without /proc (not Linux) signal 0 is all there is


@dataclass
class _Job:
    """The command-line job this process runs (`command_line_job`): the threads a server it starts gets, and the
    supervisors it started (model name -> pid), stopped when the job ends."""

    threads: int
    started: dict[str, int] = field(default_factory=dict)


_job: _Job | None = None
_job_lock = threading.Lock()


def job_threads() -> int:
    """The threads of a server a command-line job starts: every core other processes leave free (the cores minus what
    they use now, rounded; at least one), unless TFGRPO_THREADS says otherwise. Not simply every core: llama.cpp's
    threads wait for each other at every step, so on a machine that other processes keep busy two threads were far
    slower than one (2 cores at load 8: 30-120 s per agent call against about 7 s; bench/README.md)."""
    settings = get_settings()
    if "threads" in settings.model_fields_set:
        return settings.threads
    cores = max(1, os.cpu_count() or 1)
    return max(1, min(cores, cores - int(others_busy_cores(cores) + 0.5)))


CpuSample = tuple[int, int, int]  # jiffies: all cores' total, their idle, this process's own


def others_busy_cores(cores: int, window_s: float = 0.3) -> float:
    """The cores other processes keep busy now, sampled over `window_s` from /proc (this process's own use left
    out). Not the 1-minute load average, which still counts for a minute what this job did just before it (its
    own imports, a test run a minute ago: 2 cores at load 0.7 gave the job one thread on an idle machine); that
    average where /proc cannot be read."""
    before = _cpu_sample()
    if before is None:
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):  # no load average on this system
            return 0.0
    time.sleep(window_s)
    after = _cpu_sample()
    return busy_between(before, after, cores) if after is not None else 0.0


def busy_between(before: CpuSample, after: CpuSample, cores: int) -> float:
    """The cores other processes used between two samples."""
    total, idle, own = (b - a for a, b in zip(before, after, strict=True))
    return 0.0 if total <= 0 else max(0.0, (total - idle - own) / total * cores)


def _cpu_sample() -> CpuSample | None:
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        with open("/proc/self/stat", encoding="ascii") as own:
            mine = own.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and waiting on I/O
    return sum(fields[:8]), idle, int(mine[11]) + int(mine[12])  # utime, stime (fields 14 and 15)


@contextmanager
def command_line_job() -> Iterator[None]:
    """A job run from the terminal with no page waiting on its model: a server this process starts meanwhile
    (none ran) gets every core (`job_threads`) and is stopped at the end, so the next page's work gets a server
    that leaves a core to the pages again. A server that already ran is used as it is and left running. Nested
    uses are one job."""
    global _job
    with _job_lock:
        outer, _job = _job, _job or _Job(job_threads())
    try:
        yield
    finally:
        with _job_lock:
            job, _job = _job, outer
        if outer is None:
            for name, pid in job.started.items():
                record = read_record(name)
                if record is not None and record.supervisor_pid == pid:
                    stop(name)


def address(name: str, *, start: bool = True) -> str:
    """The base URL (`http://127.0.0.1:PORT`) of the model's server; without one, a server is started (or,
    when another process is starting it, awaited) unless `start` is False. Inside `command_line_job` the server
    started here gets every core and belongs to the job."""
    record = read_record(name)
    if record is not None and record.address:
        return record.address
    process = None
    if record is None:  # none runs (an empty address: one is restarting, so wait for it)
        if not start:
            raise LocalModelError(f"no model server runs for {name}; start one with `python -m core model-server "
                                  f"--model {name}`")
        model_path(name)  # a missing or corrupt model file is said here, not as a server that never comes up
        job = _job
        process = start_detached(name, idle_exit_s=get_settings().model_idle_s,
                                 threads=job.threads if job else None)
        if job is not None:
            job.started[name] = process.pid
    deadline = time.monotonic() + get_settings().model_start_s
    while time.monotonic() < deadline:
        record = read_record(name)
        if record is not None and record.address:
            return record.address
        if process is not None and process.poll() not in (None, 0):
            break
        time.sleep(0.2)
    raise LocalModelError(f"the model server for {name} did not come up within {get_settings().model_start_s:g} s; "
                          f"its log: {_path(name, 'log')}")


def start_detached(name: str, *, idle_exit_s: float | None = None, threads: int | None = None) -> subprocess.Popen:
    """A supervisor in its own session, so it outlives the process that needed it; its output goes to the log.
    When another supervisor holds the lock, this one exits at once and the other's record is used. `threads`:
    its llama.cpp threads (default TFGRPO_THREADS)."""
    log = _path(name, "log")
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "core", "model-server", "--model", name]
    if idle_exit_s:
        command += ["--idle-exit", f"{idle_exit_s:g}"]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR)}
    if threads is not None:
        env["TFGRPO_THREADS"] = str(threads)
    with log.open("ab") as out:
        return subprocess.Popen(command, cwd=PROJECT_DIR, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def stop(name: str, timeout_s: float = 30.0) -> bool:
    """Stop the model's server (its supervisor and child); True when one was running."""
    record = read_record(name)
    if record is None:
        return False
    os.kill(record.supervisor_pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(record.supervisor_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return True


# ---- the server process (the child) ------------------------------------------------------------------------


def run_child(name: str, slots: int) -> int:
    """llama.cpp's server on a free loopback port; prints its address, then lives until its stdin closes
    (the supervisor ends, or is killed)."""
    import xllamacpp

    params = server_params(name, slots)
    params.port = 0
    params.hostnames = ["127.0.0.1"]
    params.endpoint_metrics = True
    server = xllamacpp.Server(params)
    print(READY + server.listening_address, flush=True)
    sys.stdin.read()
    return 0


# ---- the supervisor ----------------------------------------------------------------------------------------


def serve(name: str, slots: int | None = None, *, idle_exit_s: float | None = None,
          stall_s: float | None = None, poll_s: float = 1.0) -> int:
    """Run and watch the model's server until SIGTERM (or `idle_exit_s` unused); 0 also when another
    supervisor already serves this model."""
    settings = get_settings()
    slots, stall_s = slots or settings.local_slots, stall_s or settings.model_stall_s
    model_path(name)
    lock_file = _path(name, "lock")
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = lock_file.open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"a model server for {name} already runs", flush=True)
        return 0
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    restarts: list[dict] = []
    try:
        while not stopping.is_set():
            child, where = _start_child(name, slots)
            _write_record(ServerRecord(name, where, os.getpid(), child.pid, slots, restarts, settings.threads))
            print(f"model server for {name} at {where} (pid {child.pid}, {slots} slots, {settings.threads} threads)",
                  flush=True)
            reason = _watch(child, where, stopping, stall_s=stall_s, idle_exit_s=idle_exit_s, poll_s=poll_s)
            if reason is not None:  # callers wait for the new address instead of retrying the dead one
                restarts.append({"at": datetime.now(UTC).isoformat(timespec="seconds"), "reason": reason})
                _write_record(ServerRecord(name, "", os.getpid(), child.pid, slots, restarts, settings.threads))
                print(reason, flush=True)
            _end(child)
            if reason is None:
                break
    finally:
        _path(name, "json").unlink(missing_ok=True)
        lock.close()
    return 0


def _start_child(name: str, slots: int) -> tuple[subprocess.Popen, str]:
    child = subprocess.Popen([sys.executable, "-m", "core", "model-server", "--model", name, "--slots", str(slots),
                              "--child"], cwd=PROJECT_DIR, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR)},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    if not line.startswith(READY):
        _end(child)
        raise LocalModelError(f"the model server for {name} did not start: {line.strip() or 'no output'}")
    return child, line.removeprefix(READY).strip()


def _end(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.kill()  # SIGKILL also ends a stopped (SIGSTOP) or stuck native process
    child.wait()
    for stream in (child.stdin, child.stdout):
        if stream is not None:
            stream.close()


def _write_record(record: ServerRecord) -> None:
    path = _path(record.model, "json")
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(asdict(record)))
    partial.replace(path)


def _watch(child: subprocess.Popen, where: str, stopping: threading.Event, *, stall_s: float,
           idle_exit_s: float | None, poll_s: float) -> str | None:
    """Until the child must be restarted (the reason) or the supervisor stops (None). No progress means
    requests waiting while the decode counters stand still, or no answer at all to /metrics."""
    last_progress = last_busy = time.monotonic()
    last_counters, busy = None, False
    while not stopping.wait(poll_s):
        now = time.monotonic()
        if child.poll() is not None:
            return f"embedded model restarted: its server exited with code {child.returncode}"
        metrics = server_metrics(where, timeout_s=min(5.0, stall_s))
        if metrics is None:
            busy = True  # a server that does not answer at all is stuck (or stopped), whatever it was doing
        else:
            busy = metrics.get("requests_processing", 0) + metrics.get("requests_deferred", 0) > 0
            counters = (metrics.get("n_decode_total"), metrics.get("prompt_tokens_total"),
                        metrics.get("tokens_predicted_total"))
            if counters != last_counters or not busy:
                last_counters, last_progress = counters, now
        if busy:
            last_busy = now
            if now - last_progress > stall_s:
                return f"embedded model restarted after {now - last_progress:.0f} s without progress"
        elif idle_exit_s and now - last_busy > idle_exit_s:
            print(f"unused for {idle_exit_s:g} s: stopping", flush=True)
            return None
    return None


_METRIC = re.compile(r"^llamacpp:(\w+)\s+([0-9.eE+-]+)$", re.MULTILINE)


def server_metrics(where: str, timeout_s: float = 5.0) -> dict[str, float] | None:
    """llama.cpp's /metrics as numbers (requests_processing, requests_deferred, n_decode_total, ...); None
    when the server does not answer in time (a stalled or stopped server)."""
    try:
        with urllib.request.urlopen(f"{where}/metrics", timeout=timeout_s) as response:
            text = response.read().decode()
    except (OSError, ValueError):
        return None
    return {name: float(value) for name, value in _METRIC.findall(text)}
