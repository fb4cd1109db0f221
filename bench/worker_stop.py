"""How fast does a worker stop on SIGTERM or Ctrl-C while the embedded model answers, and is the job kept?

Seeds a fresh SQLite file with the demo task, queues a small training run on the embedded model, starts
`python -m core worker`, waits until the model is answering (a new ledger row that is not a cache hit is
written, so calls are in flight), sends the signal and times until the process has exited. Then it checks what a
person relies on: the run is back in the queue (resume covers the abandoned call) and the worker row
says stopped. Each round starts a new worker on the same run, so later rounds stop it mid-run.

    PYTHONPATH=. .venv/bin/python bench/worker_stop.py [--rounds 3] [--signal TERM INT]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def queue_run(url: str) -> int:
    from core.grpo.training import RunSettings, create_run
    from core.records.tasks.demos import DEMO_TASK, ensure_demo_task
    from storage.db import make_engine

    engine = make_engine(url)
    ensure_demo_task(engine)
    settings = RunSettings(epochs=3, batch_size=4, group_size=4, limit=8, gate="off", max_tokens=512,
                           hold_flagged=False)
    return create_run(engine, DEMO_TASK, settings, created_by="bench")


def calls_of(url: str, run_id: int) -> int:
    from sqlmodel import Session, func, select

    from storage.db import make_engine
    from storage.tables import LLMCall

    with Session(make_engine(url)) as session:
        return session.exec(select(func.count()).select_from(LLMCall).where(
            LLMCall.run_id == run_id, LLMCall.cache_hit == False)).one()  # noqa: E712  (SQL, not Python)


def states(url: str, run_id: int) -> tuple[str, list[str]]:
    from sqlmodel import Session, select

    from storage.db import make_engine
    from storage.tables import Run, Worker

    with Session(make_engine(url)) as session:
        return session.get(Run, run_id).status, [w.status for w in session.exec(select(Worker)).all()]


def one_round(url: str, run_id: int, signum: int, log: Path, timeout: float) -> dict:
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT), "TFGRPO_NO_AUTOWORKER": "1"}
    before = calls_of(url, run_id)
    with open(log, "a") as out:
        proc = subprocess.Popen([sys.executable, "-m", "core", "worker", "--poll", "0.3"], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while calls_of(url, run_id) <= before and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)  # calls are in flight now: the next ones started when the first was written
    start = time.perf_counter()
    proc.send_signal(signum)
    try:
        proc.wait(timeout=120)
        waited = time.perf_counter() - start
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        waited = float("inf")
    status, workers = states(url, run_id)
    return {"seconds": waited, "exit": proc.returncode, "run": status, "workers": workers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--signal", nargs="+", default=["TERM", "INT"], choices=["TERM", "INT"])
    parser.add_argument("--timeout", type=float, default=180, help="seconds to wait for the first model call")
    args = parser.parse_args()
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    folder = Path(tempfile.mkdtemp())
    url = f"sqlite:///{folder / 'bench.db'}"
    run_id = queue_run(url)
    print(f"run {run_id} on the embedded model; worker log {folder / 'worker.log'}; "
          f"TFGRPO_STOP_GRACE_S={os.environ.get('TFGRPO_STOP_GRACE_S', 'default')}")
    print("\n| signal | round | seconds to exit | exit code | run after | worker row |\n|---|---|---|---|---|---|")
    for name in args.signal:
        times = []
        for i in range(args.rounds):
            result = one_round(url, run_id, getattr(signal, f"SIG{name}"), folder / "worker.log", args.timeout)
            times.append(result["seconds"])
            print(f"| SIG{name} | {i + 1} | {result['seconds']:.2f} | {result['exit']} | {result['run']} | "
                  f"{', '.join(result['workers'])} |")
        print(f"| SIG{name} | median | {statistics.median(times):.2f} | | | |")


if __name__ == "__main__":
    main()
