"""Resident memory of the processes that use the embedded model: one shared model server against the
in-process path it replaced (each process loading its own copy, TFGRPO_LOCAL_IN_PROCESS=1).

Measures the peak resident set (ru_maxrss from wait4) of a CLI evaluation (`python -m core eval`) and of a
worker executing one queued evaluation (`python -m core worker --once`), each on the same two test queries
of the demo task, and the model server's own resident memory. Run it on a quiet machine:

    PYTHONPATH=. .venv/bin/python bench/model_memory.py [--model qwen2.5-coder-0.5b] [--limit 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def peak_mb(command: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(peak resident MB, seconds, exit code) of one process."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    return usage.ru_maxrss / 1024, time.perf_counter() - started, os.waitstatus_to_exitcode(status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--limit", type=int, default=2)
    args = parser.parse_args()
    from bench.local_throughput import resident_mb
    from core.models import model_server
    from core.records.tasks.demos import DEMO_TASK

    with tempfile.TemporaryDirectory() as folder:
        counter = iter(range(100))

        def fresh(env: dict[str, str]) -> dict[str, str]:
            """A new database for each measurement: the ledger would answer a repeated call from its cache."""
            url = f"sqlite:///{Path(folder) / f'memory{next(counter)}.db'}"
            env = {**env, "DATABASE_URL": url}
            subprocess.run([sys.executable, "-m", "core", "demo"], cwd=ROOT, env=env, check=True,
                           stdout=subprocess.DEVNULL)
            return env

        base_env = {**os.environ, "PYTHONPATH": str(ROOT), "TFGRPO_NO_AUTOWORKER": "1"}
        evaluate = [sys.executable, "-m", "core", "eval", "--task", DEMO_TASK, "--version", "empty", "--limit",
                    str(args.limit), "--model", f"local/{args.model}"]
        queue = evaluate + ["--queue"]
        worker = [sys.executable, "-m", "core", "worker", "--once"]
        rows = []
        print(f"model {args.model}  limit {args.limit}  load {os.getloadavg()[0]:.2f}")
        for path, env in (("in-process", {**base_env, "TFGRPO_LOCAL_IN_PROCESS": "1"}), ("model server", base_env)):
            if path == "model server":
                model_server.stop(args.model)
                model_server.start_detached(args.model)
                model_server.address(args.model)  # waits until it is up
            rows.append((path, "CLI eval", *peak_mb(evaluate, fresh(env))))
            queued = fresh(env)
            subprocess.run(queue, cwd=ROOT, env=queued, check=True, stdout=subprocess.DEVNULL)
            rows.append((path, "worker (one evaluation)", *peak_mb(worker, queued)))
            if path == "model server":
                record = model_server.read_record(args.model)
                server_mb, supervisor_mb = resident_mb(record.server_pid), resident_mb(record.supervisor_pid)
                model_server.stop(args.model)
                rows.append((path, "model server (shared)", server_mb, 0.0, 0))
                rows.append((path, "its supervisor", supervisor_mb, 0.0, 0))
        print(f"\n{'path':<13} {'process':<24} {'peak MB':>8} {'seconds':>8} {'exit':>5}")
        for path, process, mb, seconds, code in rows:
            print(f"{path:<13} {process:<24} {mb:>8.0f} {seconds:>8.1f} {code:>5}")


if __name__ == "__main__":
    main()
