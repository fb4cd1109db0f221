"""The worker: claims queued runs and evaluations and executes them, one at a time, with a heartbeat.

Pages only write intent (a queued row); work happens here, in a separate process, so a browser
reload, a closed tab or a second browser neither stops nor duplicates it. A claim is one
conditional UPDATE, so two workers (or a worker and `core train`) never take the same job. While
a job runs, a thread refreshes the heartbeat of the worker and of the job every few seconds; a
heartbeat older than the stall window (TFGRPO_STALL_AFTER_S) means the worker died or hangs: an idle
worker takes the job over by itself, or a person presses Resume. Every claim starts a new lease
generation and every write a worker makes for its job is fenced to it (storage/fencing.py), so a
worker that wakes up after its job was taken over writes nothing and stops.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import or_, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from core.domain.sandbox import harden_process
from core.errors import Conflict, NotFound, TakenOver
from core.records.runs.workers import alive_workers, stall_after
from core.settings import PROJECT_DIR, get_settings
from storage.db import session_scope
from storage.fencing import Lease, LeaseLost, holding
from storage.statuses import JobStatus, WorkerStatus
from storage.tables import Evaluation, Run, as_utc, utcnow
from storage.tables import Worker as WorkerRow

log = logging.getLogger(__name__)
HEARTBEAT_EVERY = 3.0
TABLES = {"run": Run, "evaluation": Evaluation}


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def holder_is_dead(worker_id: str) -> bool:
    """True when the worker id names a process on this machine that no longer exists (killed, crashed):
    its job need not wait for the stall window before it can be taken over here."""
    host, _, rest = worker_id.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def claim(engine: Engine, kind: str, job_id: int, owner: str, *,
          statuses: tuple[str, ...] = (JobStatus.QUEUED,)) -> Lease | None:
    """Atomically mark a job `running` for `owner` under a new lease generation if it is in one of
    `statuses`; `running` there means only a stalled one (its heartbeat is stale, or its holder on this
    machine is dead), never one that a live worker holds. Returns the lease, or None when not claimed.

    The new generation fences the previous holder: whatever it still tries to write is refused."""
    table = TABLES[kind]
    stale_before = utcnow() - timedelta(seconds=stall_after())
    stalled = (table.status == JobStatus.RUNNING) & or_(col(table.heartbeat_at).is_(None), table.heartbeat_at < stale_before)
    if JobStatus.RUNNING in statuses:
        with Session(engine) as session:
            row = session.get(table, job_id)
            holder = row.worker_id if row is not None and row.status == JobStatus.RUNNING else None
        if holder and holder_is_dead(holder):
            stalled = stalled | ((table.status == JobStatus.RUNNING) & (table.worker_id == holder))
    condition = col(table.status).in_([s for s in statuses if s != JobStatus.RUNNING])
    if JobStatus.RUNNING in statuses:
        condition = condition | stalled
    with holding(None), session_scope(engine) as session:
        result = session.exec(update(table).where(table.id == job_id, condition)
                              .values(status=JobStatus.RUNNING, worker_id=owner, heartbeat_at=utcnow(),
                                      lease=table.lease + 1))
        if result.rowcount != 1:
            return None
        generation = session.exec(select(table.lease).where(table.id == job_id)).one()
    return Lease(kind, job_id, owner, generation)


def claim_next(engine: Engine, owner: str) -> Lease | None:
    """The oldest queued run or evaluation, claimed for `owner`; failing that, a stalled one taken over
    (its worker stopped beating for longer than the stall window). None when nothing waits."""
    stale_before = utcnow() - timedelta(seconds=stall_after())
    with Session(engine) as session:
        waiting, stalled = [], []
        for kind, table in TABLES.items():
            waiting += [(kind, row.id, row.created_at) for row in session.exec(
                select(table).where(table.status == JobStatus.QUEUED).order_by(table.created_at).limit(5))]
            own_jobs = col(Evaluation.run_id).is_(None) if table is Evaluation else True  # a gate's belongs to its run
            stalled += [(kind, row.id, row.created_at) for row in session.exec(
                select(table).where(table.status == JobStatus.RUNNING, own_jobs,
                                    or_(col(table.heartbeat_at).is_(None), table.heartbeat_at < stale_before))
                .order_by(table.created_at).limit(5))]
    for kind, job_id, _created in sorted(waiting, key=lambda item: item[2]):
        lease = claim(engine, kind, job_id, owner)
        if lease is not None:
            return lease
    for kind, job_id, _created in sorted(stalled, key=lambda item: item[2]):
        lease = claim(engine, kind, job_id, owner, statuses=(JobStatus.RUNNING,))
        if lease is not None:
            log.warning("worker %s took over stalled %s %s (lease %d)", owner, kind, job_id, lease.generation)
            return lease
    return None


def beat(engine: Engine, owner: str, lease: Lease | None) -> None:
    """One heartbeat: the worker row, and the job it holds while the lease is still its own. A job whose
    lease has moved on is marked lost, so the engine stops before its next model call."""
    now = utcnow()
    with holding(None), session_scope(engine) as session:
        row = session.get(WorkerRow, owner)
        if row is not None:
            row.heartbeat_at, row.status = now, WorkerStatus.RUNNING
            row.current = f"{lease.table} {lease.job_id}" if lease else None
            session.add(row)
        if lease is None:
            return
        table = TABLES[lease.table]
        held = (table.id == lease.job_id) & (table.worker_id == owner) & (table.lease == lease.generation)
        session.exec(update(table).where(held, table.status == JobStatus.RUNNING).values(heartbeat_at=now))
        still_held = session.exec(select(table.id).where(held)).first() is not None
    if not still_held and not lease.lost.is_set():
        lease.lost.set()
        log.warning("worker %s: %s was taken over by another worker; stopping", owner, lease.describe())


@contextmanager
def heartbeat(engine: Engine, owner: str, lease: Lease | Callable[[], Lease | None] | None = None,
              every: float | None = None):
    """Beat in a background thread while the block runs (model calls can take longer than the stall window),
    every `every` seconds (HEARTBEAT_EVERY). `lease` is the job held, or a function that says which job is held
    at each beat (the serving loop's, so its beat names the job instead of calling the worker idle)."""
    held = lease if callable(lease) else (lambda: lease)
    with _repeating("heartbeat", every or HEARTBEAT_EVERY, lambda: beat(engine, owner, held()),
                    "heartbeat failed"):
        yield


DELIVER_EVERY = 2.0
HELD_SPANS_EVERY_S = 300.0  # held OTLP spans of every service age out this often (core/records/production/otlp_held.py)


@contextmanager
def delivering(engine: Engine, owner: str, every: float | None = None):
    """Send the webhook outbox while the worker serves (core/records/notifications/webhooks.py): every `every` seconds
    (DELIVER_EVERY) a background thread starts each due endpoint in the Deliverer's small pool, without waiting
    for it, between jobs and during them, never inside the job that raised an event; so a receiver that hangs or
    is down delays nothing but its own deliveries. The webhook module (httpx, the signing library) is imported and
    the stored secrets checked at the first pass, in that thread: at the worker's start they delayed every run's
    first call by 0.3 s of CPU (issue 52, item 6)."""
    started: list = []

    def deliver() -> None:
        if not started:
            from core.records.notifications.webhooks import Deliverer, secrets_problem

            if problem := secrets_problem(engine):
                log.warning("worker %s: %s", owner, problem)
            started.append(Deliverer(engine, owner))
        started[0].start_due()

    try:
        with _repeating("webhooks", every or DELIVER_EVERY, deliver, "webhook delivery pass failed", join_timeout=1):
            yield
    finally:
        for deliverer in started:
            deliverer.close()


@contextmanager
def guarding(engine: Engine, every: float | None = None):
    """Run the A/B guard (core/records/production/ab_verdict.py) every `every` seconds (GUARD_EVERY_S) while the worker serves:
    a significantly worse candidate's split ends, a significantly better one is announced, whoever scored it."""
    from core.records.production.ab_verdict import GUARD_EVERY_S, guard_experiments

    def check() -> None:
        for line in guard_experiments(engine):
            log.info(line)

    def age_held() -> None:
        from core.records.production.otlp import age_held_spans

        age_held_spans(engine)

    with _repeating("ab-guard", every or GUARD_EVERY_S, check, "A/B guard pass failed", join_timeout=1), \
            _repeating("held-spans", HELD_SPANS_EVERY_S, age_held, "ageing held OTLP spans failed", join_timeout=1):
        yield


@contextmanager
def _repeating(name: str, every: float, action: Callable[[], object], failure: str,
               join_timeout: float | None = None):
    """Run `action` every `every` seconds in a daemon thread while the block runs. A failed pass is logged and
    the next one retries: a locked database must not end the job or the worker's deliveries."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            try:
                action()
            except Exception:  # noqa: BLE001
                log.warning(failure, exc_info=True)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=every + 1 if join_timeout is None else join_timeout)


def release(engine: Engine, lease: Lease) -> None:
    """Put a job this worker still holds back in the queue (the worker is stopping mid-job)."""
    table = TABLES[lease.table]
    with holding(None), session_scope(engine) as session:
        session.exec(update(table).where(table.id == lease.job_id, table.worker_id == lease.owner,
                                         table.lease == lease.generation, table.status == JobStatus.RUNNING)
                     .values(status=JobStatus.QUEUED))


def claim_or_explain(engine: Engine, kind: str, job_id: int, owner: str, statuses: tuple[str, ...]) -> Lease:
    """Claim a job for a foreground command, or raise an error saying who holds it."""
    lease = claim(engine, kind, job_id, owner, statuses=statuses)
    if lease is not None:
        return lease
    with Session(engine) as session:
        row = session.get(TABLES[kind], job_id)
    if row is None:
        raise NotFound(f"no {kind} {job_id}")
    if row.status == JobStatus.RUNNING:
        raise Conflict(f"{kind} {job_id} is being executed by worker {row.worker_id}; pause it first")
    raise Conflict(f"{kind} {job_id} is {row.status}")


def execute_job(engine: Engine, lease: Lease, *, gateway=None, on_progress: Callable[[dict], None] | None = None):
    """Execute a claimed job with a heartbeat, every write fenced to its lease; the one path for the
    worker and `core train` / `core eval`. Raises TakenOver when another worker took the job meanwhile."""
    from core.grpo.evaluation import execute_evaluation
    from core.grpo.training import execute_run

    with holding(lease), heartbeat(engine, lease.owner, lease):
        try:
            if lease.table == "run":
                return execute_run(engine, lease.job_id, gateway=gateway, on_progress=on_progress)
            return execute_evaluation(engine, lease.job_id, gateway=gateway)
        except LeaseLost as lost:
            log.warning("worker %s: %s", lease.owner, lost)
            raise TakenOver(str(lost)) from None
        except BaseException:
            try:
                release(engine, lease)
            except LeaseLost:
                pass
            raise


def score_production_traces(engine: Engine, owner: str, gateway=None) -> int:
    """Between jobs, the task's own reward scores the production traces its rules choose, each once (claimed per
    trace: core/records/production/scoring.py); how many verdicts landed. A failed pass is logged, never fatal."""
    from core.grpo.production_scoring import score_production

    try:
        return score_production(engine, owner, gateway=gateway)
    except Exception:  # noqa: BLE001  (a locked database or a broken task must not stop the worker's jobs)
        log.warning("worker %s: scoring production traces failed", owner, exc_info=True)
        return 0


def worker_summary(session: Session, now: datetime | None = None) -> str:
    """The workers' state in words for the sidebar: who works on what and how far it got, or that none runs."""
    workers = alive_workers(session)
    if not workers:
        if get_settings().no_autoworker:
            return "No worker is running. Start one with “make worker” (automatic start is off)."
        return "No worker is running; queued work starts one."
    now = now or utcnow()
    lines = []
    for worker in workers:
        beat_age = max(0, int((as_utc(now) - as_utc(worker.heartbeat_at)).total_seconds()))
        current = worker.current or held_job(session, worker.id)
        lines.append(f"{worker.id}: {_job_words(session, current)} (beat {beat_age} s ago)")
    return "\n".join(lines)


def held_job(session: Session, owner: str) -> str | None:
    """The running job this worker holds, by the job rows ("evaluation 5"), or None. The worker row's `current`
    is written by two heartbeats, and a beat that read "no job" just before the claim can land after the claim's
    own beat (seen under load: the sidebar said "idle" while an evaluation ran); the claim itself is one UPDATE
    of the job row, so the job rows never say idle while a job runs."""
    for kind, table in TABLES.items():
        job_id = session.exec(select(table.id).where(table.worker_id == owner,
                                                     table.status == JobStatus.RUNNING)).first()
        if job_id is not None:
            return f"{kind} {job_id}"
    return None


def _job_words(session: Session, current: str | None) -> str:
    if not current:
        return "idle, waiting for work"
    kind, _, job_id = current.partition(" ")
    row = session.get(TABLES[kind], int(job_id)) if kind in TABLES and job_id.isdigit() else None
    if row is None:
        return f"working on {current}"
    progress = row.progress or {}
    if kind == "run":
        total = progress.get("steps_total")
        steps = f"step {min(progress.get('steps_done', 0) + 1, total)} of {total}, " if total else ""
        return (f"training run {job_id} ({steps}{progress.get('rollouts_done', 0)}/"
                f"{progress.get('rollouts_total', '?')} rollouts)")
    return f"evaluating, evaluation {job_id} ({progress.get('rollouts_done', 0)}/{progress.get('rollouts_total', '?')} answers)"


def register(engine: Engine, owner: str) -> None:
    with session_scope(engine) as session:
        session.add(WorkerRow(id=owner, host=socket.gethostname(), pid=os.getpid()))


def unregister(engine: Engine, owner: str) -> None:
    with session_scope(engine) as session:
        row = session.get(WorkerRow, owner)
        if row is not None:
            row.status, row.current, row.heartbeat_at = WorkerStatus.STOPPED, None, utcnow()
            session.add(row)


class _Shutdown(BaseException):
    """Raised in the main thread by SIGTERM or Ctrl-C so the current job is released before exiting."""


class _StopRequest:
    """What a stop signal sets in motion: the main thread is told to stop (it releases its job on the way
    out), and if the model call in flight keeps it waiting longer than TFGRPO_STOP_GRACE_S, a watchdog
    abandons the call: the job goes back to the queue, the worker row says stopped, the process exits.
    Nothing is lost by abandoning: every finished call is in the ledger, so resuming pays only for the
    abandoned one (llama.cpp cannot be interrupted mid-call, and asyncio waits for its thread)."""

    def __init__(self, engine: Engine, owner: str, grace_s: float) -> None:
        self.engine, self.owner, self.grace_s = engine, owner, grace_s
        self.lease: Lease | None = None
        self.requested = threading.Event()

    def on_signal(self, signum, _frame) -> None:
        if self.requested.is_set():
            return  # a second Ctrl-C: the watchdog is already counting
        self.requested.set()
        log.info("worker %s: %s received; stopping (at most %.0f s for the call in flight)", self.owner,
                 signal.Signals(signum).name, self.grace_s)
        threading.Thread(target=self._abandon_after_grace, name="stop-watchdog", daemon=True).start()
        raise _Shutdown()

    def _abandon_after_grace(self) -> None:
        time.sleep(self.grace_s)
        try:
            if self.lease is not None:
                release(self.engine, self.lease)
            unregister(self.engine, self.owner)
            log.warning("worker %s: the call in flight did not finish within %.0f s; abandoned it, %s is queued "
                        "again", self.owner, self.grace_s, self.lease.describe() if self.lease else "no job")
        except Exception:  # noqa: BLE001  (exiting regardless; a stale heartbeat then frees the job)
            log.exception("worker %s: releasing its job while stopping failed", self.owner)
        logging.shutdown()
        os._exit(0)


def stopped_by_signal(error: BaseException) -> bool:
    """Whether the stop signal raised this, itself or as the cause of what a library raised while handling it:
    _Shutdown lands wherever the main thread is, and inside a database driver's call (a pool's ping) it comes
    out wrapped ("can't change 'autocommit' now"), which is still the requested stop, not a crash."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, (_Shutdown, KeyboardInterrupt)):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def serve(engine: Engine, *, poll: float = 1.0, once: bool = False, owner: str | None = None,
          gateway=None) -> int:
    """Claim and execute jobs until stopped (or, with `once`, until the queue is empty); returns jobs done.

    SIGTERM and Ctrl-C stop it within TFGRPO_STOP_GRACE_S seconds (_StopRequest), the job queued again."""
    harden_process()
    owner = owner or new_worker_id()
    register(engine, owner)
    done = 0
    stop = _StopRequest(engine, owner, get_settings().stop_grace_s)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, stop.on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    log.info("worker %s started", owner)
    try:
        with (heartbeat(engine, owner, lambda: stop.lease),  # the job held, never "idle"
              delivering(engine, owner), guarding(engine)):
            while True:
                lease = claim_next(engine, owner)
                if lease is None:
                    if score_production_traces(engine, owner, gateway):
                        continue  # more may be due; a job queued meanwhile still comes first
                    if once:
                        break
                    time.sleep(poll)
                    continue
                stop.lease = lease
                log.info("worker %s: %s", owner, lease.describe())
                beat(engine, owner, lease)
                try:
                    execute_job(engine, lease, gateway=gateway)
                    done += 1
                except TakenOver:
                    pass  # logged by execute_job; the job goes on under its new holder
                stop.lease = None
                beat(engine, owner, None)
    except BaseException as error:
        if not stopped_by_signal(error):
            raise
        log.info("worker %s stopping", owner)
    finally:
        unregister(engine, owner)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return done


def default_log_path() -> Path:
    return get_settings().worker_log


def spawn_worker(database_url: str, log_path: Path | None = None) -> int:
    """Start `python -m core worker` as a detached process on `database_url`; returns its pid."""
    log_path = log_path or default_log_path()
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(PROJECT_DIR)}
    with open(log_path, "a") as out:
        proc = subprocess.Popen([sys.executable, "-m", "core", "worker"], cwd=PROJECT_DIR, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return proc.pid


_spawned: dict[str, float] = {}


def ensure_worker(engine: Engine, database_url: str) -> str:
    """Start a worker when none is alive, at most once per 30 s per database; says what it found or did.

    TFGRPO_NO_AUTOWORKER=1 turns this off (tests, or a team that runs its workers elsewhere).
    """
    if get_settings().no_autoworker:
        return "automatic worker start is off (TFGRPO_NO_AUTOWORKER)"
    with Session(engine) as session:
        alive = alive_workers(session)
    if alive:
        return f"worker {alive[0].id} is alive"
    if time.monotonic() - _spawned.get(database_url, -1e9) < stall_after():
        return "a worker was started a moment ago"
    pid = spawn_worker(database_url)
    _spawned[database_url] = time.monotonic()
    return f"started a worker (pid {pid})"
