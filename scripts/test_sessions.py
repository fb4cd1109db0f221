"""`make test`'s pytest sessions, run in the order and side by side the way two cores fit them, ending with one
line per session and the total wall time (CI has a time limit; the README's Tests section states the figure).

The model tests run in a session of their own beside the fast suite (the embedded model's server takes one
core, the fast suite the other; their output is kept in `.test-logs/model.log` and printed when they end); the
fast suite runs on SQLite, then its database tests on PostgreSQL when TFGRPO_TEST_DATABASE_URL names a server;
the browser tests run last and alone, as they wait on what a page shows. The exit status is 1 if any session
failed.

    python scripts/test_sessions.py [--pytest .venv/bin/pytest] [--logs .test-logs]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

POSTGRES_ENV = "TFGRPO_TEST_DATABASE_URL"


@dataclass
class Session:
    name: str
    marks: str
    on_postgres: bool = False
    durations: int = 15


@dataclass
class Outcome:
    session: Session
    returncode: int
    seconds: float
    summary: str

    def line(self) -> str:
        verdict = "ok" if self.returncode == 0 else f"FAILED (exit {self.returncode})"
        return f"{self.session.name:<22} {minutes(self.seconds):>7}  {verdict:<18} {self.summary}"


MODEL = Session("model (SQLite)", "model and not browser and not postgres")
FAST = Session("fast (SQLite)", "not model and not browser and not postgres")
POSTGRES = Session("fast (PostgreSQL)", "not model and not browser", on_postgres=True, durations=10)
BROWSER = Session("browser (SQLite)", "browser and not postgres", durations=10)


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def command(pytest: str, session: Session) -> list[str]:
    return [pytest, "-q", "-m", session.marks, f"--durations={session.durations}"]


def environment(session: Session) -> dict[str, str]:
    env = dict(os.environ)
    if not session.on_postgres:
        env.pop(POSTGRES_ENV, None)
    return env


def last_summary(text: str) -> str:
    """pytest's closing line ("1354 passed, 2 skipped in 971.2s"), without its time and rules."""
    lines = [line.strip("= ") for line in text.splitlines() if re.search(r"\b(passed|failed|error|no tests ran)\b",
                                                                             line)]
    return re.sub(r"\s+in [\d.]+s.*$", "", lines[-1]) if lines else "no pytest summary"


def run(pytest: str, session: Session, log: Path) -> Outcome:
    """One session in the foreground, its output shown as it goes and kept in `log`."""
    started = time.monotonic()
    with open(log, "w") as kept:
        proc = subprocess.Popen(command(pytest, session), env=environment(session), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            kept.write(line)
        proc.wait()
    return Outcome(session, proc.returncode, time.monotonic() - started, last_summary(log.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pytest", default=".venv/bin/pytest")
    parser.add_argument("--logs", type=Path, default=Path(".test-logs"))
    args = parser.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    postgres = bool(os.environ.get(POSTGRES_ENV, "").strip())
    if not postgres and os.environ.get("CI"):
        print(f"make test: {POSTGRES_ENV} is not set in CI: .ci/run should have started PostgreSQL", flush=True)
        return 1

    model_log = args.logs / "model.log"
    print(f"make test: the model tests run beside the fast suite (log: {model_log})", flush=True)
    model_started = time.monotonic()
    with open(model_log, "w") as kept:
        model = subprocess.Popen(command(args.pytest, MODEL), env=environment(MODEL), stdout=kept,
                                 stderr=subprocess.STDOUT)
    try:
        outcomes = [run(args.pytest, FAST, args.logs / "fast.log")]
        if postgres:
            outcomes.append(run(args.pytest, POSTGRES, args.logs / "postgres.log"))
        else:
            print(f"make test: {POSTGRES_ENV} is not set, PostgreSQL not tested (README, Team set-up)", flush=True)
        print("make test: waiting for the model tests", flush=True)
        model.wait()
    finally:
        if model.poll() is None:
            model.kill()
    model_text = model_log.read_text()
    print(model_text, flush=True)
    outcomes.insert(0, Outcome(MODEL, model.returncode, time.monotonic() - model_started, last_summary(model_text)))
    outcomes.append(run(args.pytest, BROWSER, args.logs / "browser.log"))

    print("\nmake test: sessions (wall time; the model session ran beside the fast ones)")
    for outcome in outcomes:
        print("  " + outcome.line())
    failed = any(o.returncode != 0 for o in outcomes)
    print(f"make test: {'FAILED' if failed else 'passed'} in {minutes(time.monotonic() - started)} "
          f"(wall, {os.cpu_count()} cores)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
