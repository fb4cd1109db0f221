"""The worker: exclusive claims, heartbeats, stalled jobs, run control, and a real worker process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from sqlmodel import Session, select

from core.grpo.evaluation import create_evaluation
from core.grpo.training import RunSettings, create_run
from core.jobs.run_control import cancel_run, pause_run, resume_evaluation, resume_run
from core.jobs.worker import beat, claim, claim_next, heartbeat, serve
from core.records.runs.workers import alive_workers, is_stale, job_health
from core.records.tasks.demos import DEMO_TASK
from storage.db import session_scope, url_with_password
from storage.fencing import Lease
from storage.tables import Evaluation, Run, Worker, utcnow
from tests.ui_support import ROOT, scripted_gateway

SMALL = RunSettings(epochs=1, batch_size=2, group_size=2, limit=2)


def set_run(engine, run_id: int, **values) -> None:
    with session_scope(engine) as session:
        run = session.get(Run, run_id)
        for key, value in values.items():
            setattr(run, key, value)
        session.add(run)


def get_run(engine, run_id: int) -> Run:
    with Session(engine) as session:
        return session.get(Run, run_id)


def test_a_queued_run_is_claimed_once(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SMALL)
    lease = claim(engine, "run", run_id, "w1")
    assert (lease.table, lease.job_id, lease.owner, lease.generation) == ("run", run_id, "w1", 1)
    assert claim(engine, "run", run_id, "w2") is None
    run = get_run(engine, run_id)
    assert (run.status, run.worker_id) == ("running", "w1")


def test_a_running_job_is_taken_over_only_when_its_heartbeat_is_stale(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SMALL)
    assert claim(engine, "run", run_id, "w1")
    assert not claim(engine, "run", run_id, "w2", statuses=("queued", "running"))
    set_run(engine, run_id, heartbeat_at=utcnow() - timedelta(minutes=5))
    assert job_health("running", get_run(engine, run_id).heartbeat_at) == "stalled"
    assert claim(engine, "run", run_id, "w2", statuses=("queued", "running")).generation == 2
    assert get_run(engine, run_id).worker_id == "w2"


def test_staleness_threshold():
    now = utcnow()
    assert not is_stale(now - timedelta(seconds=5), now)
    assert is_stale(now - timedelta(seconds=120), now)
    assert is_stale(None, now)
    assert job_health("queued", None) == "queued"


def test_heartbeat_thread_refreshes_the_job_while_it_runs(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SMALL)
    lease = claim(engine, "run", run_id, "w1")
    old = utcnow() - timedelta(minutes=5)
    set_run(engine, run_id, heartbeat_at=old)
    with heartbeat(engine, "w1", lease, every=0.05):
        time.sleep(0.3)
    assert not is_stale(get_run(engine, run_id).heartbeat_at) and not lease.lost.is_set()
    # another worker's heartbeat never touches a job it does not hold, and learns that it lost it
    set_run(engine, run_id, heartbeat_at=old)
    stranger = Lease("run", run_id, "w2", lease.generation)
    beat(engine, "w2", stranger)
    assert is_stale(get_run(engine, run_id).heartbeat_at) and stranger.lost.is_set()


def test_serve_once_executes_runs_and_evaluations_in_queue_order(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SMALL)
    eval_id = create_evaluation(engine, DEMO_TASK, "empty", limit=2)
    _model, gateway = scripted_gateway(engine)
    assert serve(engine, once=True, owner="w-test", gateway=gateway) == 2
    with Session(engine) as session:
        assert session.get(Run, run_id).status == "completed"
        ev = session.get(Evaluation, eval_id)
        assert ev.status == "completed" and ev.progress == {"rollouts_done": 2, "rollouts_total": 2}
        row = session.get(Worker, "w-test")
        assert row.status == "stopped" and alive_workers(session) == []
    assert claim_next(engine, "w-test") is None


def test_pause_resume_cancel(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, SMALL)
    assert pause_run(engine, run_id, "ann") == "paused"
    assert resume_run(engine, run_id, "ann") == "queued"
    claim(engine, "run", run_id, "w1")
    with pytest.raises(ValueError, match="is running"):
        resume_run(engine, run_id, "ann")
    set_run(engine, run_id, heartbeat_at=utcnow() - timedelta(minutes=5))
    assert resume_run(engine, run_id, "ann") == "queued"
    assert cancel_run(engine, run_id, "ann") == "cancelled"
    with pytest.raises(ValueError, match="cancelled"):
        resume_run(engine, run_id, "ann")


def test_a_paused_run_stops_at_its_next_tick_and_resumes_where_it_stopped(engine, demo_task):
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=2, batch_size=1, group_size=2, limit=2))
    model, gateway = scripted_gateway(engine)
    original = model.replies["summary"]

    def summary_then_pause(messages):
        pause_run(engine, run_id, "ann") if get_run(engine, run_id).status == "running" else None
        return original

    model.replies["summary"] = summary_then_pause
    serve(engine, once=True, owner="w1", gateway=gateway)
    run = get_run(engine, run_id)
    assert run.status == "paused" and run.progress["steps_done"] < 4
    model.replies["summary"] = original
    resume_run(engine, run_id, "ann")
    serve(engine, once=True, owner="w2", gateway=gateway)
    run = get_run(engine, run_id)
    assert run.status == "completed" and run.progress["steps_done"] == 4


def test_resume_a_failed_evaluation(engine, demo_task):
    eval_id = create_evaluation(engine, DEMO_TASK, "empty", limit=1)
    with session_scope(engine) as session:
        ev = session.get(Evaluation, eval_id)
        ev.status, ev.error = "failed", "provider down"
        session.add(ev)
    assert resume_evaluation(engine, eval_id, "ann") == "queued"


def test_a_worker_process_claims_queued_work_and_stops_cleanly_on_sigterm(tmp_path, engine, demo_task,
                                                                           unreachable_model):
    """A real `python -m core worker` process: it registers, executes a queued run (its calls fail fast on
    a server that is down, so every group of the only step fails, and the run fails with the reason rather than
    ending `completed` with nothing learned), goes on serving, and unregisters on SIGTERM."""
    model, api_base = unreachable_model
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=1, group_size=1, limit=1,
                                                       policy_model=model, learner_model=model, api_base=api_base))
    env = {**os.environ, "DATABASE_URL": url_with_password(engine), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "core", "worker", "--poll", "0.2"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while get_run(engine, run_id).status in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.2)
        run = get_run(engine, run_id)
        assert run.status == "failed", (run.status, run.error)
        assert "epoch 1 batch 1 failed: every group failed (1 of 1)" in run.error
        assert run.progress["groups_failed"] == 1
        with Session(engine) as session:
            assert [w.pid for w in alive_workers(session)] == [proc.pid]
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, output
    with Session(engine) as session:
        assert alive_workers(session) == []


def test_a_job_held_by_a_dead_local_process_can_be_resumed_at_once(engine, demo_task):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead = f"{socket.gethostname()}:{proc.pid}:abc123"
    run_id = create_run(engine, DEMO_TASK, SMALL)
    assert claim(engine, "run", run_id, dead)
    alive = f"{socket.gethostname()}:{os.getpid()}:abc123"
    assert not claim(engine, "run", run_id, "w2", statuses=("queued",))
    assert claim(engine, "run", run_id, "w2", statuses=("queued", "running"))
    assert get_run(engine, run_id).worker_id == "w2"
    set_run(engine, run_id, worker_id=alive, status="running", heartbeat_at=utcnow())
    assert not claim(engine, "run", run_id, "w3", statuses=("queued", "running"))


STUCK_WORKER = """
import sys
import threading
from core.models import model_server
from core.jobs.worker import serve
from storage.db import make_engine

model_server.address = lambda name, start=True: sys.argv[2]  # a model server that never answers
serve(make_engine(sys.argv[1]), poll=0.2)
"""


def test_a_stop_signal_ends_an_embedded_model_call_in_flight_and_queues_the_job_again(tmp_path, engine, demo_task):
    """SIGTERM while the embedded model's server holds a call for two minutes: the call is an HTTP request,
    so the worker cancels it, releases the run (back in the queue; resume pays only for that call) and exits
    within the grace period, without abandoning anything; the worker row says stopped."""
    from bench.stub_server import StubServer

    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=1, group_size=1, limit=1, gate="off",
                                                       policy_model="local/qwen2.5-coder-0.5b"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TFGRPO_STOP_GRACE_S": "10"}
    with StubServer(script=["timeout"] * 4, hang_s=120) as stub:
        proc = subprocess.Popen([sys.executable, "-c", STUCK_WORKER, url_with_password(engine),
                                 stub.url.removesuffix("/v1")], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 120
            while not stub.requests() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)  # SIGTERM once the call is really in flight (a fixed sleep raced a busy machine)
            assert stub.requests(), proc.stdout.read() if proc.poll() is not None else "no request in 120 s"
            assert get_run(engine, run_id).status == "running"
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            output = proc.communicate(timeout=60)[0]  # the call alone would take 120 s
            took = time.monotonic() - signalled
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, output
    assert took < 10, (took, output)  # within the grace period: nothing had to be abandoned
    assert "abandoned it" not in output, output
    assert get_run(engine, run_id).status == "queued"
    with Session(engine) as session:
        assert [w.status for w in session.exec(select(Worker)).all()] == ["stopped"]


def test_a_late_idle_beat_does_not_make_a_running_job_look_idle(engine, demo_task):
    """The serving loop's heartbeat may read "no job" just before a claim and write it just after the claim's own
    beat (fresh-clone CI run, load 6): the worker row then says idle while its evaluation runs. The line is read
    from the job rows, which the claim wrote in one UPDATE."""
    from core.jobs.worker import register, worker_summary

    eval_id = create_evaluation(engine, DEMO_TASK, "empty", k=1, limit=1)
    register(engine, "w-late")
    lease = claim(engine, "evaluation", eval_id, "w-late", statuses=("queued",))
    beat(engine, "w-late", lease)
    beat(engine, "w-late", None)  # the stale idle beat, landing last
    with Session(engine) as session:
        assert f"w-late: evaluating, evaluation {eval_id}" in worker_summary(session)


def test_the_worker_line_names_the_job_while_it_runs_never_idle(engine, demo_task, monkeypatch):
    """The serving loop's own heartbeat used to write the worker as idle between the job's beats, so the sidebar's
    worker line flickered to "idle" while a run or an evaluation was running (issue 37)."""
    from core.jobs import worker as worker_module
    from core.jobs.worker import worker_summary

    monkeypatch.setattr(worker_module, "HEARTBEAT_EVERY", 0.02)
    eval_id = create_evaluation(engine, DEMO_TASK, "empty", k=1, limit=1)
    started, release = threading.Event(), threading.Event()

    def held_reply(messages):
        started.set()
        release.wait(30)
        return "so \\boxed{0}"

    _model, gateway = scripted_gateway(engine, rollout=held_reply)
    thread = threading.Thread(target=serve, kwargs={"engine": engine, "once": True, "owner": "w-line",
                                                    "gateway": gateway})
    thread.start()
    try:
        assert started.wait(30)
        lines = []
        for _ in range(20):  # many beats of both heartbeats
            with Session(engine) as session:
                lines.append(worker_summary(session))
            time.sleep(0.02)
    finally:
        release.set()
        thread.join(30)
    assert all(f"evaluating, evaluation {eval_id}" in line for line in lines), set(lines)


def test_a_stop_signal_that_a_database_driver_wraps_still_stops_the_worker_cleanly(engine, monkeypatch):
    """SIGTERM raises the stop wherever the main thread is; inside psycopg's pool ping it came out as "can't change
    'autocommit' now" (a fresh-clone CI run), and the worker exited 1 as if it had crashed. A stop wrapped by a
    library is still a stop; any other error still escapes."""
    from sqlalchemy.exc import ProgrammingError

    from core.jobs import worker as worker_module

    def claim_during_a_stop(*_args, **_kwargs):
        try:
            raise worker_module._Shutdown()
        except worker_module._Shutdown:
            raise ProgrammingError("SELECT 1", {}, Exception("can't change 'autocommit' now")) from None

    monkeypatch.setattr(worker_module, "claim_next", claim_during_a_stop)
    assert serve(engine, owner="w-wrapped", once=True) == 0
    with Session(engine) as session:
        assert session.get(Worker, "w-wrapped").status == "stopped"

    def claim_fails(*_args, **_kwargs):
        raise ProgrammingError("SELECT 1", {}, Exception("a real database error"))

    monkeypatch.setattr(worker_module, "claim_next", claim_fails)
    with pytest.raises(ProgrammingError, match="a real database error"):
        serve(engine, owner="w-broken", once=True)
