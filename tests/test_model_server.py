"""The embedded model's server (core/models/model_server.py): one per machine and model, found by every
process, and restarted by its supervisor when it stalls or dies.

The supervisor's watch runs here against a scripted /metrics page and a stand-in child (fast); the tests
marked `model` run the real llama.cpp server with the smallest embedded model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlmodel import Session, select

from core.grpo.training import RunSettings, create_run, execute_run
from core.models import model_server
from core.models.gateway import Gateway
from core.records.tasks.demos import DEMO_TASK
from storage.tables import AuditEvent

ROOT = Path(__file__).resolve().parent.parent
SMALL = "smollm2-135m"


class ScriptedMetrics:
    """A /metrics page whose numbers the test sets, or that stops answering (a stopped server)."""

    def __init__(self) -> None:
        self.values = {"requests_processing": 0, "requests_deferred": 0, "n_decode_total": 0}
        self.silent = False
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802  (the http.server name)
                if owner.silent:
                    time.sleep(2)
                    return
                body = "".join(f"llamacpp:{k} {v}\n" for k, v in owner.values.items()).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def metrics():
    page = ScriptedMetrics()
    yield page
    page.close()


@pytest.fixture
def child():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def watch(child, where, **limits) -> tuple[str | None, float]:
    started = time.monotonic()
    reason = model_server._watch(child, where, threading.Event(), poll_s=0.1, **limits)
    return reason, time.monotonic() - started


def test_requests_waiting_without_a_token_restart_the_server(metrics, child):
    metrics.values.update(requests_processing=1, n_decode_total=40)  # busy, and the counters never move
    reason, took = watch(child, metrics.url, stall_s=1.0, idle_exit_s=None)
    assert reason is not None and reason.startswith("embedded model restarted after") and "without progress" in reason
    assert 1.0 <= took < 5


def test_a_server_that_stops_answering_is_a_stall_even_if_it_looked_idle(metrics, child):
    """Stopped right after a request came in, before the supervisor saw it busy: silence alone counts."""

    def stop_answering():
        time.sleep(0.5)
        metrics.silent = True

    threading.Thread(target=stop_answering, daemon=True).start()
    reason, _ = watch(child, metrics.url, stall_s=1.5, idle_exit_s=None)
    assert reason is not None and "without progress" in reason


def test_tokens_being_produced_are_progress(metrics, child):
    metrics.values.update(requests_processing=1)

    def produce():
        for n in range(30):
            metrics.values["n_decode_total"] = n
            time.sleep(0.1)
        metrics.values["requests_processing"] = 0

    threading.Thread(target=produce, daemon=True).start()
    reason, took = watch(child, metrics.url, stall_s=1.0, idle_exit_s=1.0)
    assert reason is None and took >= 3  # never restarted while tokens came; stopped once idle


def test_a_server_that_died_is_restarted_with_its_exit_code(metrics):
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    reason, _ = watch(dead, metrics.url, stall_s=10, idle_exit_s=None)
    assert reason == "embedded model restarted: its server exited with code 3"


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_a_record_of_a_supervisor_that_is_gone_is_no_server(tmp_path, monkeypatch, reaped):
    """Gone also when the supervisor exited unreaped: a process that started one and still holds it keeps a
    zombie, which answers signal 0."""
    monkeypatch.setenv("TFGRPO_MODEL_DIR", str(tmp_path))
    from core.settings import get_settings

    get_settings.cache_clear()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        if reaped:
            gone.wait()
        else:
            deadline = time.monotonic() + 30
            while model_server.process_state(gone.pid) != "Z":
                assert time.monotonic() < deadline, "the child did not exit"
                time.sleep(0.05)
        (tmp_path / f"server-{SMALL}.json").write_text(json.dumps(
            {"model": SMALL, "address": "http://127.0.0.1:9", "supervisor_pid": gone.pid, "server_pid": gone.pid,
             "slots": 1, "restarts": []}))
        assert model_server.read_record(SMALL) is None
        with pytest.raises(model_server.LocalModelError, match="no model server runs"):
            model_server.address(SMALL, start=False)
    finally:
        gone.wait()
        get_settings.cache_clear()


def test_the_servers_prompt_cache_is_bounded_by_the_setting(monkeypatch, tmp_path):
    """llama.cpp keeps up to 8 GiB of earlier prompts by default; the studio's server keeps what the setting says."""
    from core.models import local_model
    from core.settings import get_settings

    monkeypatch.setattr(local_model, "model_path", lambda name: tmp_path / "model.gguf")
    monkeypatch.setenv("TFGRPO_LOCAL_CACHE_MIB", "64")
    get_settings.cache_clear()
    try:
        assert local_model.server_params(SMALL, 1).cache_ram_mib == 64
        monkeypatch.delenv("TFGRPO_LOCAL_CACHE_MIB")
        get_settings.cache_clear()
        assert local_model.server_params(SMALL, 2).cache_ram_mib == 512
    finally:
        get_settings.cache_clear()


def test_model_server_stop_ends_the_running_supervisor(tmp_path, monkeypatch, capsys):
    """`python -m core model-server --stop`: the way to start the server again with other threads or slots."""
    from core.cli import main
    from core.settings import get_settings

    monkeypatch.setenv("TFGRPO_MODEL_DIR", str(tmp_path))
    get_settings.cache_clear()
    supervisor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / f"server-{SMALL}.json").write_text(json.dumps(
            {"model": SMALL, "address": "http://127.0.0.1:9", "supervisor_pid": supervisor.pid,
             "server_pid": supervisor.pid, "slots": 1, "restarts": []}))
        assert main(["model-server", "--model", SMALL, "--stop"]) == 0
        assert supervisor.wait(timeout=10) == -signal.SIGTERM
        assert capsys.readouterr().out.strip() == f"model server for {SMALL} stopped"
        assert main(["model-server", "--model", SMALL, "--stop"]) == 0
        assert capsys.readouterr().out.strip() == f"no model server runs for {SMALL}"
    finally:
        supervisor.kill()
        get_settings.cache_clear()


def _stand_in_supervisors(tmp_path, monkeypatch):
    """`start_detached` replaced by a stand-in supervisor (a sleeping process) that records itself as the server,
    with the threads it was given: what a job's server would run with, without loading a model."""
    from core.models import local_model

    started = []

    def start_detached(name, *, idle_exit_s=None, threads=None):
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        started.append((process, threads))
        (tmp_path / f"server-{name}.json").write_text(json.dumps(
            {"model": name, "address": "http://127.0.0.1:9", "supervisor_pid": process.pid,
             "server_pid": process.pid, "slots": 1, "restarts": [], "threads": threads or 0}))
        return process

    monkeypatch.setattr(model_server, "start_detached", start_detached)
    monkeypatch.setattr(model_server, "model_path", lambda name: tmp_path / "model.gguf")
    monkeypatch.setattr(local_model, "model_path", lambda name: tmp_path / "model.gguf")
    return started


@pytest.mark.parametrize(("threads_env", "load", "threads"), [(None, 0.2, 8), (None, 2.6, 5), (None, 30.0, 1),
                                                               ("1", 0.0, 1)],
                         ids=["every core", "the free cores", "one on a busy machine", "TFGRPO_THREADS set"])
def test_a_command_line_job_starts_its_own_server_on_every_free_core_and_stops_it_at_the_end(
        tmp_path, monkeypatch, threads_env, load, threads):
    """Issue 52 item 5: a job run in the terminal that finds no server has no page waiting on its model, so its
    server gets every core that other processes leave free (unless TFGRPO_THREADS says otherwise), and is stopped
    when the job ends; outside a job a server keeps a core for the pages (TFGRPO_THREADS' default) and stays."""
    from core.settings import get_settings

    monkeypatch.setenv("TFGRPO_MODEL_DIR", str(tmp_path))
    if threads_env is None:
        monkeypatch.delenv("TFGRPO_THREADS", raising=False)
    else:
        monkeypatch.setenv("TFGRPO_THREADS", threads_env)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(model_server, "others_busy_cores", lambda cores: load)
    get_settings.cache_clear()
    started = _stand_in_supervisors(tmp_path, monkeypatch)
    try:
        with model_server.command_line_job():
            assert model_server.address(SMALL) == "http://127.0.0.1:9"
            with model_server.command_line_job():  # nested: the same job, nothing stopped at its end
                model_server.address(SMALL)
            assert started[0][0].poll() is None
        [(process, _threads)] = started
        assert started[0][1] == threads
        assert process.wait(timeout=10) == -signal.SIGTERM
        assert model_server.read_record(SMALL) is None

        model_server.address(SMALL)  # a server a worker or page starts: TFGRPO_THREADS' own (cores minus one)
        assert started[1][1] is None
        assert started[1][0].poll() is None
    finally:
        for process, _threads in started:
            process.kill()
            process.wait()
        get_settings.cache_clear()


def test_the_free_cores_are_what_other_processes_use_now_not_what_this_job_did_a_minute_ago():
    """The 1-minute load average still counted a job's own start and the test run before it (2 idle cores at load
    0.7 gave a job one thread): the free cores are sampled now, this process's own use left out."""
    # 2 cores, 200 jiffies between the samples: 100 idle, 60 this process's own, 40 another process's
    assert model_server.busy_between((1000, 400, 50), (1200, 500, 110), 2) == pytest.approx(0.4)
    assert model_server.busy_between((1000, 400, 50), (1000, 400, 50), 2) == 0.0
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert model_server.others_busy_cores(os.cpu_count() or 1, window_s=0.5) >= 0.5
    finally:
        burner.kill()
        burner.wait()


def test_a_server_that_already_ran_before_the_job_is_used_as_it_is_and_left_running(tmp_path, monkeypatch):
    """A server someone else started (`make run`, the app's worker) may be serving the pages: a job uses it with
    its threads and never stops it."""
    from core.settings import get_settings

    monkeypatch.setenv("TFGRPO_MODEL_DIR", str(tmp_path))
    get_settings.cache_clear()
    started = _stand_in_supervisors(tmp_path, monkeypatch)
    model_server.start_detached(SMALL)
    try:
        with model_server.command_line_job():
            model_server.address(SMALL)
        assert len(started) == 1 and started[0][0].poll() is None
    finally:
        started[0][0].kill()
        started[0][0].wait()
        get_settings.cache_clear()


def test_train_and_eval_in_the_terminal_run_as_command_line_jobs(monkeypatch):
    """`python -m core train`/`eval`/`compare` execute their job here (not queued): inside command_line_job."""
    from core.cli import jobs

    seen = []
    monkeypatch.setattr(jobs, "execute_job", lambda engine, lease, **kwargs: seen.append(model_server._job))
    jobs._execute_here(None, None)
    assert seen and seen[0] is not None and model_server._job is None


# ---- the real server --------------------------------------------------------------------------------------


@pytest.mark.model
def test_two_processes_calling_the_embedded_model_at_once_share_one_server():
    model_server.stop(SMALL)
    code = ("import sys; from core.models import model_server as m; a = m.address(sys.argv[1]); "
            "r = m.read_record(sys.argv[1]); print(a, r.supervisor_pid)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    callers = [subprocess.Popen([sys.executable, "-c", code, SMALL], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                text=True) for _ in range(2)]
    try:
        answers = [caller.communicate(timeout=300)[0].split() for caller in callers]
        assert all(caller.returncode == 0 for caller in callers), answers
        assert answers[0] == answers[1]  # the same address and the same supervisor
        supervisors = subprocess.run(["pgrep", "-f", f"core model-server --model {SMALL}"], capture_output=True,
                                     text=True).stdout.split()
        assert answers[0][1] in supervisors and len(supervisors) == 2  # one supervisor and its one server child
    finally:
        model_server.stop(SMALL)


@pytest.mark.model
def test_a_stalled_server_is_restarted_the_call_retried_and_the_run_completes(engine, demo_task):
    """The server is stopped (SIGSTOP) in the middle of the run's only model call: the supervisor sees
    requests waiting without a token, kills and restarts it, the gateway retries on the new server, the run
    completes, and its events say the embedded model was restarted and why."""
    model_server.stop(SMALL)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    supervisor = subprocess.Popen([sys.executable, "-m", "core", "model-server", "--model", SMALL, "--stall", "3"],
                                  cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert _wait_for_record(), "no model server came up"
        first = model_server.read_record(SMALL)
        # worked examples only (no learner call): the 135M model cannot write the learner's JSON
        run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=1, group_size=2, limit=1, gate="off",
                                                           lessons=False, examples=True,
                                                           policy_model=f"local/{SMALL}",
                                                           learner_model=f"local/{SMALL}"))
        stopper = threading.Thread(target=_stop_when_busy, args=(first,), daemon=True)
        stopper.start()
        run = execute_run(engine, run_id, gateway=Gateway(engine, backoff_s=0.5))
        stopper.join(timeout=5)
        assert run.status == "completed", run.error
        record = model_server.read_record(SMALL)
        assert record.server_pid != first.server_pid and record.restarts
        with Session(engine) as session:
            events = session.exec(select(AuditEvent).where(AuditEvent.action == "model.restart",
                                                           AuditEvent.object_id == run_id)).all()
        assert events and events[0].object_type == "run"
        assert events[0].after["reason"].startswith("embedded model restarted after")
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.communicate(timeout=60)


def _wait_for_record(timeout_s: float = 180) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = model_server.read_record(SMALL)
        if record is not None and record.address:
            return True
        time.sleep(0.2)
    return False


def _stop_when_busy(record: model_server.ServerRecord) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        metrics = model_server.server_metrics(record.address, timeout_s=2) or {}
        if metrics.get("requests_processing", 0) > 0:
            os.kill(record.server_pid, signal.SIGSTOP)
            return
        time.sleep(0.05)

