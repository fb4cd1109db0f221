"""The engine's REAL model-call path, measured against bench/stub_server.py (an OpenAI-compatible stub).

Every measurement executes a training run the way a worker does (core.jobs.worker.serve, or `python -m core
worker` subprocesses for the soak) on the demo task (arithmetic word problems), with the policy and
learner models set to `openai/stub` and the run's api_base (and STUDIO_API_BASE) pointing at the stub,
which runs in its own process (its CPU is not the engine's). The validation gate is off unless --gate
is given, so every train query is trained on and the sequential depth of a step is
rollout -> summary -> advantage -> update = 4 calls.

    overhead  engine CPU and wall per model call at zero latency over a few thousand calls
    paper     the paper-scale run (100 queries, G=5, 3 epochs, one step per epoch) at 1 s latency,
              at two concurrencies: wall time against the critical path
    soak      kill -9 a `python -m core worker` at random moments, N rounds, resume, then count duplicate
              rows and calls paid twice (from the stub's request log and the ledger)
    faults    a run at 30% injected faults (429, 500, 503, timeout, reset, bad body, bad JSON reply)

The script imports the studio only from the tree on PYTHONPATH, so one copy measures any checkout:

    cd /tmp/before && PYTHONPATH=/tmp/before /work/main/.venv/bin/python /work/main/bench/engine_path.py overhead

Proposed Makefile lines (not added to the Makefile by this script's author):

    bench-engine: install
        PYTHONPATH=. $(PY) bench/engine_path.py overhead --json bench/results/overhead.json
        PYTHONPATH=. $(PY) bench/engine_path.py paper --concurrency 64 128 --json bench/results/paper.json
        PYTHONPATH=. $(PY) bench/engine_path.py soak --rounds 5 --json bench/results/soak.json
        PYTHONPATH=. $(PY) bench/engine_path.py faults --json bench/results/faults.json

(recipe lines start with a tab; add bench-engine to .PHONY; for PostgreSQL add
`--database-url postgresql+psycopg://...` to the soak line.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
STUB_MODEL = "openai/stub"
END_STATES = ("completed", "failed", "cancelled", "paused", "awaiting_review", "awaiting_labels")


def _load_stub():
    """bench/stub_server.py next to this file (not `bench.stub_server`: the tree on PYTHONPATH may lack it)."""
    spec = importlib.util.spec_from_file_location("engine_path_stub_server", HERE / "stub_server.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


stub_server = _load_stub()


# ------------------------------------------------------------------------------------------ plumbing


def _environment(stub_url: str | None = None, db_url: str | None = None) -> None:
    os.environ.setdefault("OPENAI_API_KEY", "sk-stub-not-a-key")
    os.environ["TFGRPO_NO_AUTOWORKER"] = "1"
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if stub_url:
        os.environ["STUDIO_API_BASE"] = stub_url
    if db_url:
        os.environ["DATABASE_URL"] = db_url
    try:
        from core.settings import get_settings

        get_settings.cache_clear()
    except (ImportError, AttributeError):
        pass


def tree_root() -> Path:
    import core

    return Path(core.__file__).resolve().parent.parent


def tree_label() -> str:
    root = tree_root()
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "?", ""
    return f"{root} @ {commit or '?'}{' (modified)' if dirty else ''}"


def temp_db_url(directory: str, name: str) -> str:
    return f"sqlite:///{Path(directory) / name}"


def prepare(db_url: str):
    """A migrated database with the demo task; returns (engine, task name)."""
    from core.records.tasks.demos import DEMO_TASK, ensure_demo_task
    from storage.db import make_engine

    engine = make_engine(db_url)
    ensure_demo_task(engine)
    return engine, DEMO_TASK


def settings_for(args: argparse.Namespace, stub_url: str, concurrency: int):
    """RunSettings for a run on the stub; fields the checkout does not know are left out."""
    from core.records.runs.settings import RunSettings

    values = {"epochs": args.epochs, "batch_size": args.batch_size, "group_size": args.group_size,
              "limit": args.queries, "concurrency": concurrency, "policy_model": STUB_MODEL,
              "learner_model": STUB_MODEL, "api_base": stub_url, "review_mode": "auto", "seed": args.seed,
              "hold_flagged": False,  # the stub's texts differ only by a hash: near-duplicates by design
              "gate": "no_worse" if args.gate else "off"}
    if args.gate:
        values["validation_size"] = None
    if getattr(args, "call_timeout", None) is not None:
        values["call_timeout_s"] = args.call_timeout  # a setting of the new code; a checkout without it ignores it
    known = RunSettings.model_fields
    return RunSettings.build(**{k: v for k, v in values.items() if k in known})


def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a live process, from /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _clock_ticks()


def _descendants(root: int) -> dict[int, float]:
    """CPU seconds of every live descendant of `root` (Linux /proc)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat is not None:
                parents[int(entry.name)], cpu[int(entry.name)] = stat
    found: dict[int, float] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = cpu[pid]
                frontier.append(pid)
    return found


def engine_cpu(exclude: set[int]) -> tuple[float, float]:
    """CPU seconds of (this process with all its threads, its child processes: the scoring processes, live
    or finished), leaving out the `exclude`d pids (the stub) and their descendants."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    done = resource.getrusage(resource.RUSAGE_CHILDREN)
    live = _descendants(os.getpid())
    skip = set(exclude)
    for pid in exclude:
        skip |= set(_descendants(pid))
    children = done.ru_utime + done.ru_stime + sum(seconds for pid, seconds in live.items() if pid not in skip)
    return own.ru_utime + own.ru_stime, children


def execute_in_process(engine) -> None:
    """Claim and execute every queued job here, as `python -m core worker` does (core.jobs.worker.serve)."""
    from core.jobs.worker import serve

    try:
        from core.settings import configure_scoring  # what `python -m core` does at start
    except ImportError:
        configure_scoring = None
    if configure_scoring is not None:
        configure_scoring()
    serve(engine, once=True)


def run_row(engine, run_id: int):
    from sqlmodel import Session

    from storage.tables import Run

    with Session(engine) as session:
        return session.get(Run, run_id)


def ledger(engine, run_id: int) -> list:
    """The run's ledger rows (its own calls and those of its gate evaluations)."""
    from sqlmodel import Session, select

    from storage.tables import Evaluation, LLMCall

    with Session(engine) as session:
        rows = list(session.exec(select(LLMCall).where(LLMCall.run_id == run_id)))
        evaluation_ids = [e.id for e in session.exec(select(Evaluation).where(Evaluation.run_id == run_id))] \
            if hasattr(Evaluation, "run_id") else []
        if evaluation_ids:
            rows += [r for r in session.exec(select(LLMCall).where(LLMCall.evaluation_id.in_(evaluation_ids)))
                     if r.run_id != run_id]
        session.expunge_all()
    return rows


def step_profile(engine, run_id: int) -> list[dict]:
    """Per step: the calls at each sequential level and the depth (levels that made calls)."""
    from sqlmodel import Session, select

    from storage.tables import Advantage, Evaluation, Operation, Rollout, Step

    out = []
    with Session(engine) as session:
        steps = list(session.exec(select(Step).where(Step.run_id == run_id).order_by(Step.epoch, Step.batch_index)))
        for step in steps:
            rollouts = list(session.exec(select(Rollout).where(Rollout.step_id == step.id)))
            advantages = list(session.exec(select(Advantage).where(Advantage.step_id == step.id)))
            operations = list(session.exec(select(Operation).where(Operation.step_id == step.id)))
            gate_evals = list(session.exec(select(Evaluation).where(Evaluation.step_id == step.id))) \
                if hasattr(Evaluation, "step_id") else []
            levels = {
                "rollout": len(rollouts),
                "summary": sum(1 for r in rollouts if r.summary),
                "advantage": sum(1 for a in advantages if a.status in ("ok", "failed") and (a.raw_response or a.text)),
                "update": 1 if operations or (step.error and "update" in step.error) else 0,
                "gate": sum(len(e.sample_ids or []) * (e.k or 1) for e in gate_evals),
            }
            out.append({"step": f"{step.epoch}.{step.batch_index}", "depth": sum(1 for n in levels.values() if n),
                        **levels, "status": step.status})
    return out


def in_flight(times: list[float], latency: float) -> tuple[int, float]:
    """The most requests the stub held at once (arrivals within one latency), and their mean."""
    if latency <= 0 or not times:
        return 0, 0.0
    times = sorted(times)
    most, start = 0, 0
    for end, t in enumerate(times):
        while times[start] <= t - latency:
            start += 1
        most = max(most, end - start + 1)
    span = times[-1] + latency - times[0]
    return most, len(times) * latency / span if span > 0 else 0.0


def table(rows: list[dict], columns: list[str]) -> str:
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
        return str(value)

    cells = [[cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def header(title: str, args: argparse.Namespace) -> None:
    print(f"== {title}: {tree_label()}")
    load = os.getloadavg()
    print(f"   {os.cpu_count()} CPUs, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{args.queries} queries x G={args.group_size}, {args.epochs} epoch(s), batch {args.batch_size}, "
          f"gate {'on' if args.gate else 'off'}")


def write_json(path: str | None, data: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=2, default=str))
        print(f"   wrote {path}")


# ------------------------------------------------------------------------------------ one measured run


def measured_run(args: argparse.Namespace, *, concurrency: int, latency: float, db_url: str | None,
                 fault_rate: float = 0.0, hang_s: float = 30.0, workdir: str) -> dict:
    """One run executed in this process against a fresh stub; the figures of the run."""
    with stub_server.StubServer(latency_s=latency, fault_rate=fault_rate, hang_s=hang_s, seed=args.seed) as stub:
        url = db_url or temp_db_url(workdir, f"run_c{concurrency}_{int(time.time() * 1000)}.db")
        _environment(stub.url, url)
        engine, task = prepare(url)
        from core.grpo.training import create_run

        if args.warmup:  # first calls import lazily and the scoring processes start: not per-call cost
            warm = settings_for(args, stub.url, concurrency)
            warm.limit, warm.epochs, warm.group_size, warm.seed = 2, 1, 2, args.seed + 1000
            create_run(engine, task, warm, library_name="warmup")
            execute_in_process(engine)
            stub.reset_log()
        run_id = create_run(engine, task, settings_for(args, stub.url, concurrency))
        exclude = {stub.proc.pid}
        (own0, children0), wall0 = engine_cpu(exclude), time.perf_counter()
        execute_in_process(engine)
        wall = time.perf_counter() - wall0
        own1, children1 = engine_cpu(exclude)
        own, children = own1 - own0, children1 - children0
        cpu = own + children
        stub_cpu = (_proc_stat(stub.proc.pid) or (0, 0.0))[1]
        requests = stub.requests()
    run = run_row(engine, run_id)
    rows = ledger(engine, run_id)
    paid = [r for r in rows if not r.cache_hit]
    steps = step_profile(engine, run_id)
    most, mean = in_flight([r["t"] for r in requests], latency)
    http = len(requests)
    result = {
        "run_id": run_id, "status": run.status, "error": run.error, "concurrency": concurrency, "latency_s": latency,
        "wall_s": wall, "engine_cpu_s": cpu, "process_cpu_s": own, "child_cpu_s": children, "stub_cpu_s": stub_cpu, "http_requests": http,
        "ledger_calls": len(paid), "ledger_attempts": sum(r.attempts or 1 for r in paid),
        "ledger_errors": sum(1 for r in paid if r.error), "cache_hits": sum(1 for r in rows if r.cache_hit),
        "cpu_ms_per_call": 1000 * cpu / http if http else math.nan,
        "wall_ms_per_call": 1000 * wall / http if http else math.nan,
        "stages": dict(Counter(r["stage"] for r in requests)),
        "outcomes": dict(Counter(r["outcome"] for r in requests)),
        "max_in_flight": most, "mean_in_flight": mean, "steps": steps,
        "repeated_keys": sum(n - 1 for n in Counter(r["key"] for r in requests).values() if n > 1),
        "progress": {k: v for k, v in (run.progress or {}).items() if isinstance(v, int | float)},
    }
    if hasattr(engine, "dispose"):
        engine.dispose()
    return result


# ---------------------------------------------------------------------------------------- subcommands


def cmd_overhead(args: argparse.Namespace) -> dict:
    header("overhead (zero latency)", args)
    with tempfile.TemporaryDirectory(prefix="engine_path_") as workdir:
        r = measured_run(args, concurrency=args.concurrency[0], latency=0.0, db_url=args.database_url, workdir=workdir)
    print(table([r], ["status", "concurrency", "http_requests", "ledger_calls", "wall_s", "engine_cpu_s",
                      "cpu_ms_per_call", "wall_ms_per_call", "process_cpu_s", "child_cpu_s", "stub_cpu_s"]))
    print("   engine CPU = the engine process (all threads) + its child processes (scoring); the stub's is apart")
    print(f"   stages {r['stages']}")
    if r["status"] != "completed":
        print(f"   run ended {r['status']}: {r['error']}")
    return {"overhead": r}


def critical_path(steps: list[dict], latency: float, concurrency: int) -> tuple[float, float]:
    """(sequential depth x latency, the same with each step's calls also bounded by the concurrency)."""
    depth = sum(s["depth"] for s in steps) * latency
    bound = 0.0
    for s in steps:
        calls = s["rollout"] + s["summary"] + s["advantage"] + s["update"] + s["gate"]
        bound += max(s["depth"], math.ceil(calls / concurrency)) * latency
    return depth, bound


def cmd_paper(args: argparse.Namespace) -> dict:
    header(f"paper scale ({args.latency:g} s latency)", args)
    results = []
    with tempfile.TemporaryDirectory(prefix="engine_path_") as workdir:
        for concurrency in args.concurrency:
            r = measured_run(args, concurrency=concurrency, latency=args.latency, db_url=args.database_url,
                             workdir=workdir)
            r["critical_path_s"], r["throughput_bound_s"] = critical_path(r["steps"], args.latency, concurrency)
            r["ratio"] = r["wall_s"] / r["critical_path_s"] if r["critical_path_s"] else math.nan
            results.append(r)
            print(f"   concurrency {concurrency}: {r['status']} in {r['wall_s']:.1f} s", flush=True)
    print(table(results, ["concurrency", "status", "wall_s", "critical_path_s", "ratio", "throughput_bound_s",
                          "http_requests", "repeated_keys", "engine_cpu_s", "max_in_flight", "mean_in_flight"]))
    steps = results[0]["steps"] if results else []
    print("   critical path = sum over the run's steps of (sequential levels that made calls: rollout, summary, "
          "advantage, update[, gate]) x latency;")
    print("   throughput bound = the same, each step at least ceil(its calls / concurrency) x latency")
    print("   steps: " + "; ".join(f"{s['step']} depth {s['depth']} ({s['rollout']} rollouts, {s['summary']} summaries, "
                                    f"{s['advantage']} advantages, {s['update']} update)" for s in steps))
    return {"paper": results}


def _worker_env(db_url: str, stub_url: str, stall_after: float) -> dict:
    root = str(tree_root())
    return {**os.environ, "DATABASE_URL": db_url, "STUDIO_API_BASE": stub_url, "TFGRPO_NO_AUTOWORKER": "1",
            "PYTHONPATH": root, "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "sk-stub-not-a-key"),
            "TFGRPO_STALL_AFTER_S": f"{stall_after:g}", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def _holder_pid(worker_id: str | None) -> int | None:
    if not worker_id:
        return None
    host, _, rest = worker_id.partition(":")
    pid = rest.partition(":")[0]
    return int(pid) if host == socket.gethostname() and pid.isdigit() else None


def duplicates(engine, run_id: int) -> dict[str, int]:
    """Rows that share a natural identity (extra copies counted) among the run's rows."""
    from sqlalchemy import func
    from sqlmodel import Session, select

    from storage.tables import Advantage, LibraryVersion, Operation, Rollout, Run, Step

    def extra(session, *columns, where) -> int:
        counts = session.exec(select(*columns, func.count()).where(*where).group_by(*columns)).all()
        return sum(row[-1] - 1 for row in counts if row[-1] > 1)

    with Session(engine) as session:
        step_ids = select(Step.id).where(Step.run_id == run_id)
        library_id = session.get(Run, run_id).library_id
        return {
            "rollouts": extra(session, Rollout.step_id, Rollout.evaluation_id, Rollout.sample_id, Rollout.group_index,
                              where=[Rollout.step_id.in_(step_ids)]),
            "advantages": extra(session, Advantage.step_id, Advantage.sample_id, where=[Advantage.step_id.in_(step_ids)]),
            "operations": extra(session, Operation.step_id, Operation.position, where=[Operation.step_id.in_(step_ids)]),
            "versions": extra(session, LibraryVersion.library_id, LibraryVersion.number,
                              where=[LibraryVersion.library_id == library_id]),
        }


def repaid_calls(requests: list[dict], rows: list) -> list[dict]:
    """Requests whose key the stub saw before, made although the ledger had recorded that key as a success
    (error IS NULL, not a cache hit) before the request arrived. A ledger row's key is the `ref` the stub
    wrote into the reply it stored."""
    import re

    success_at: dict[str, float] = {}
    for row in rows:
        if row.error is None and not row.cache_hit and row.response:
            match = re.search(r"ref ([0-9a-f]{16})", row.response)
            if match:
                created = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=UTC)
                at = created.timestamp()
                success_at[match.group(1)] = min(at, success_at.get(match.group(1), at))
    seen: set[str] = set()
    repaid = []
    for request in sorted(requests, key=lambda r: r["t"]):
        key = request["key"]
        if key in seen and key[:16] in success_at and success_at[key[:16]] < request["t"]:
            repaid.append(request)
        seen.add(key)
    return repaid


class _Soak:
    """The workers of a soak, and the person who presses Resume when a run is held by a worker that is
    gone (killed) or silent (stopped)."""

    def __init__(self, engine, run_id: int, env: dict, log_file, args: argparse.Namespace) -> None:
        self.engine, self.run_id, self.env, self.log_file, self.args = engine, run_id, env, log_file, args
        self.workers: list[subprocess.Popen] = []
        self.events: list[str] = []
        self.person_resumes = self.takeovers = 0
        self.deadline = time.monotonic() + args.timeout

    def start_worker(self) -> subprocess.Popen:
        worker = subprocess.Popen([sys.executable, "-m", "core", "worker"], cwd=str(tree_root()), env=self.env,
                                  stdout=self.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
        self.workers.append(worker)
        return worker

    def wait_for(self, worker: subprocess.Popen, since: float, where: str) -> str:
        """Until `worker` holds the run (or the run is over); a person presses Resume on a run held by
        another worker once `--resume-after` seconds have passed since it was killed or stopped (the
        baseline accepts that only when the run shows `stalled`, 30 s after its last heartbeat)."""
        resumed = False
        while time.monotonic() < self.deadline:
            run = run_row(self.engine, self.run_id)
            holder = _holder_pid(run.worker_id) if run.status == "running" else None
            if run.status in END_STATES:
                return run.status
            if run.status == "running" and holder == worker.pid:
                if not resumed and since:
                    self.takeovers += 1
                    self.events.append(f"{where}: taken over by the new worker after {time.monotonic() - since:.1f} s")
                return "held"
            if (run.status == "running" and holder is not None and holder != worker.pid and since
                    and time.monotonic() - since >= self.args.resume_after):
                from core.errors import StudioError
                from core.jobs.run_control import resume_run

                try:
                    resume_run(self.engine, self.run_id, "cli")
                except StudioError:
                    pass
                else:
                    resumed = True
                    self.person_resumes += 1
                    self.events.append(f"{where}: resumed by resume_run after {time.monotonic() - since:.1f} s")
            time.sleep(0.2)
        return "timeout"

    def stop_all(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGCONT)
                worker.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


def _wait_quiet(stub, quiet_s: float, deadline: float) -> None:
    """Until the stub has had no request for `quiet_s` seconds (a woken worker may still be writing)."""
    while time.monotonic() < deadline:
        requests = stub.requests()
        if not requests or time.time() - max(r["t"] for r in requests) >= quiet_s:
            return
        time.sleep(0.5)


def cmd_soak(args: argparse.Namespace) -> dict:
    verb = "SIGKILL" if args.mode == "kill" else "SIGSTOP"
    header(f"{'kill' if args.mode == 'kill' else 'pause'}-and-resume soak ({args.rounds} rounds, "
           f"{args.latency:g} s latency, stall window {args.stall_after:g} s)", args)
    if args.resume_after is None:
        args.resume_after = args.stall_after + 3.0
    rng = random.Random(args.seed)
    workdir = tempfile.mkdtemp(prefix="engine_path_soak_")
    db_url = args.database_url or temp_db_url(workdir, "soak.db")
    worker_log = Path(workdir) / "workers.log"
    with stub_server.StubServer(latency_s=args.latency, seed=args.seed) as stub, open(worker_log, "ab") as log_file:
        _environment(stub.url, db_url)
        os.environ["TFGRPO_STALL_AFTER_S"] = f"{args.stall_after:g}"
        engine, task = prepare(db_url)
        from core.grpo.training import create_run

        run_id = create_run(engine, task, settings_for(args, stub.url, args.concurrency[0]))
        soak = _Soak(engine, run_id, _worker_env(db_url, stub.url, args.stall_after), log_file, args)
        started = time.monotonic()
        worker, since, kills = soak.start_worker(), 0.0, 0
        try:
            for round_ in range(1, args.rounds + 1):
                if soak.wait_for(worker, since, f"round {round_}") != "held":
                    break
                for paused in [w for w in soak.workers if w is not worker and w.poll() is None]:
                    paused.send_signal(signal.SIGCONT)  # woken after another worker took its run
                    soak.events.append(f"round {round_}: SIGCONT to worker {paused.pid}")
                delay = rng.uniform(args.kill_min, args.kill_max)
                time.sleep(delay)
                run = run_row(engine, run_id)
                if run.status in END_STATES:
                    soak.events.append(f"round {round_}: run {run.status} before the {verb}")
                    break
                progress = run.progress or {}
                if args.mode == "kill":
                    worker.send_signal(signal.SIGKILL)
                    worker.wait()
                else:
                    worker.send_signal(signal.SIGSTOP)
                since, kills = time.monotonic(), kills + 1
                soak.events.append(f"round {round_}: {verb} worker {worker.pid} {delay:.1f} s after its claim (steps "
                                   f"{progress.get('steps_done')}, rollouts {progress.get('rollouts_done')}, calls "
                                   f"{progress.get('calls')})")
                worker = soak.start_worker()
            final = soak.wait_for(worker, since, "final")
            for paused in [w for w in soak.workers if w is not worker and w.poll() is None]:
                paused.send_signal(signal.SIGCONT)
            while final == "held" and time.monotonic() < soak.deadline:
                if run_row(engine, run_id).status in END_STATES:
                    break
                time.sleep(0.5)
            _wait_quiet(stub, max(3.0, 3 * args.latency), soak.deadline)
        finally:
            soak.stop_all()
        wall = time.monotonic() - started
        requests = stub.requests()
    run = run_row(engine, run_id)
    rows = ledger(engine, run_id)
    dupes = duplicates(engine, run_id)
    repaid = repaid_calls(requests, rows)
    keys = Counter(r["key"] for r in requests)
    result = {"mode": args.mode, "run_id": run_id, "status": run.status, "error": run.error, "kills": kills,
              "person_resumes": soak.person_resumes, "worker_takeovers": soak.takeovers, "wall_s": wall,
              "http_requests": len(requests), "repeated_keys": sum(n - 1 for n in keys.values() if n > 1),
              "repaid_calls": len(repaid), "repaid_by_stage": dict(Counter(r["stage"] for r in repaid)),
              "duplicates": dupes, "events": soak.events,
              "database": "postgresql" if db_url.startswith("postgres") else "sqlite", "worker_log": str(worker_log),
              "steps_done": (run.progress or {}).get("steps_done"), "steps_total": (run.progress or {}).get("steps_total")}
    for line in soak.events:
        print(f"   {line}")
    print(table([{**result, **{f"dup_{k}": v for k, v in dupes.items()}}],
                ["database", "mode", "status", "kills", "person_resumes", "worker_takeovers", "wall_s", "http_requests",
                 "repeated_keys", "repaid_calls", "dup_rollouts", "dup_advantages", "dup_operations", "dup_versions"]))
    print("   repeated_keys: requests whose exact key the stub had seen before; repaid_calls: those among them made "
          "after the ledger had recorded the key as a success")
    if repaid:
        print(f"   repaid by stage: {result['repaid_by_stage']}")
    if run.status != "completed":
        print(f"   run ended {run.status}: {run.error}  (worker log: {worker_log})")
    return {"soak": result}


def cmd_faults(args: argparse.Namespace) -> dict:
    header(f"faults ({args.fault_rate:.0%} injected, {args.latency:g} s latency, hang {args.hang:g} s)", args)
    with tempfile.TemporaryDirectory(prefix="engine_path_") as workdir:
        r = measured_run(args, concurrency=args.concurrency[0], latency=args.latency, db_url=args.database_url,
                         fault_rate=args.fault_rate, hang_s=args.hang, workdir=workdir)
    progress = r["progress"]
    r["operations_valid"] = progress.get("operations", 0) - progress.get("operations_invalid", 0)
    r["operations_invalid"] = progress.get("operations_invalid", 0)
    r["groups_failed"] = progress.get("groups_failed", 0)
    r["rollout_errors"] = progress.get("rollout_errors", 0)
    r["replies_malformed"] = progress.get("replies_malformed", 0)
    print(table([r], ["status", "wall_s", "http_requests", "ledger_calls", "ledger_attempts", "ledger_errors",
                      "operations_valid", "operations_invalid", "groups_failed", "rollout_errors", "replies_malformed"]))
    print(f"   outcomes at the stub: {r['outcomes']}")
    print(f"   HTTP requests per ledger attempt: {r['http_requests'] / max(1, r['ledger_attempts']):.2f}")
    if r["status"] != "completed":
        print(f"   run ended {r['status']}: {r['error']}")
    return {"faults": r}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    defaults = {
        "overhead": dict(queries=100, group_size=5, epochs=3, batch_size=100, concurrency=[64], latency=0.0),
        "paper": dict(queries=100, group_size=5, epochs=3, batch_size=100, concurrency=[64, 128], latency=1.0),
        "soak": dict(queries=40, group_size=4, epochs=3, batch_size=10, concurrency=[16], latency=0.2),
        "faults": dict(queries=20, group_size=4, epochs=1, batch_size=10, concurrency=[16], latency=0.05),
    }
    helps = {"overhead": "engine CPU and wall per call at zero latency",
             "paper": "paper-scale run at 1 s latency against its critical path, at two concurrencies",
             "soak": "kill -9 a worker at random moments, resume; count duplicate rows and repaid calls",
             "faults": "a run at 30%% injected faults: completion, valid operations, HTTP requests vs attempts"}
    for name, d in defaults.items():
        p = sub.add_parser(name, help=helps[name])
        p.add_argument("--queries", type=int, default=d["queries"], help="train queries (demo task: at most 100)")
        p.add_argument("--group-size", type=int, default=d["group_size"])
        p.add_argument("--epochs", type=int, default=d["epochs"])
        p.add_argument("--batch-size", type=int, default=d["batch_size"])
        p.add_argument("--concurrency", type=int, nargs="+", default=d["concurrency"],
                       help="calls in flight per model (paper: one run per value)")
        p.add_argument("--latency", type=float, default=d["latency"], help="the stub's seconds per reply")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--gate", action="store_true", help="keep the validation gate on (20%% of queries held out)")
        p.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
        p.add_argument("--json", default=None, help="also write the figures to this file")
        p.add_argument("-v", "--verbose", action="store_true", help="show the engine's warnings")
        p.add_argument("--no-warmup", dest="warmup", action="store_false",
                       help="measure from a cold start (by default a 4-call run on a library of its own goes first)")
        p.set_defaults(func=globals()[f"cmd_{name}"])
        if name == "soak":
            p.add_argument("--rounds", type=int, default=5, help="workers killed (then one runs to the end)")
            p.add_argument("--kill-min", type=float, default=1.0, help="earliest kill, s after the worker claims")
            p.add_argument("--kill-max", type=float, default=6.0, help="latest kill, s after the worker claims")
            p.add_argument("--stall-after", type=float, default=3.0, help="TFGRPO_STALL_AFTER_S for the workers")
            p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
            p.add_argument("--mode", choices=("kill", "pause"), default="kill",
                           help="kill: SIGKILL the worker; pause: SIGSTOP it, and SIGCONT it once another worker "
                                "holds its run (a worker silent past the stall window, then woken)")
            p.add_argument("--resume-after", type=float, default=None,
                           help="a person presses Resume this many seconds after a kill (default: stall window + 3 s)")
        if name == "faults":
            p.add_argument("--fault-rate", type=float, default=0.3)
            p.add_argument("--hang", type=float, default=5.0, help="seconds a 'timeout' fault holds its connection")
            p.add_argument("--call-timeout", type=float, default=None,
                           help="the run's per-attempt timeout (call_timeout_s, where the checkout has that setting)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.CRITICAL,
                        format="%(levelname)s %(name)s: %(message)s")
    _environment()
    result = args.func(args)
    result["tree"] = tree_label()
    result["load"] = os.getloadavg()
    result["at"] = datetime.now(UTC).isoformat(timespec="seconds")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
