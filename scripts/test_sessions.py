"""`make test`'s pytest sessions in two lanes side by side, ending with one line per session and the total wall
time (CI has a time limit; docs/contributing.md, Tests, states the measured figure).

Lane 1: the fast suite on SQLite, then its database tests on PostgreSQL in three pytest-xdist workers when
TFGRPO_TEST_DATABASE_URL names a server; its output is shown as it goes. Lane 2: the model tests (the embedded
model's server takes one core), then the browser tests; its output is kept in `.test-logs/` and printed when each of
its sessions ends. Lane 2 ends minutes before lane 1 does, so the PostgreSQL session, which waits on its server
between statements, runs in three workers, on the core lane 2 leaves free. More workers earlier did not help: with
three for the fast suite and the browser tests split in two lanes, the cores were full the whole run and it took
as long (docs/contributing.md, Tests). The exit status is 1 if any session failed.

    python scripts/test_sessions.py [--pytest .venv/bin/pytest] [--logs .test-logs]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

POSTGRES_ENV = "TFGRPO_TEST_DATABASE_URL"
RUNNING: list[subprocess.Popen] = []  # stopped if make test is interrupted, so no session outlives it


@dataclass
class Session:
    name: str
    marks: str
    on_postgres: bool = False
    durations: int = 15
    workers: int = 0  # pytest-xdist workers (-n); 0 runs the session in pytest's own process


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
POSTGRES = Session("fast (PostgreSQL)", "not model and not browser", on_postgres=True, durations=10, workers=3)
BROWSER = Session("browser (SQLite)", "browser and not postgres", durations=10)


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def command(pytest: str, session: Session) -> list[str]:
    workers = ["-n", str(session.workers)] if session.workers else []
    return [pytest, "-q", "-m", session.marks, f"--durations={session.durations}", *workers]


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


def run(pytest: str, session: Session, log: Path, *, show: bool) -> Outcome:
    """One session, its output kept in `log` and, with `show`, shown as it goes."""
    started = time.monotonic()
    with open(log, "w") as kept:
        proc = subprocess.Popen(command(pytest, session), env=environment(session), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        RUNNING.append(proc)
        for line in proc.stdout:
            if show:
                sys.stdout.write(line)
                sys.stdout.flush()
            kept.write(line)
        proc.wait()
    return Outcome(session, proc.returncode, time.monotonic() - started, last_summary(log.read_text()))


def lane(pytest: str, sessions: list[Session], logs: Path, outcomes: list[Outcome], *, show: bool) -> None:
    for session in sessions:
        log = logs / f"{session.name.split()[0]}-{'postgres' if session.on_postgres else 'sqlite'}.log"
        outcomes.append(run(pytest, session, log, show=show))
        if not show:
            print(f"\nmake test: {session.name} ended; its output ({log}):\n{log.read_text()}", flush=True)


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
    if not postgres:
        print(f"make test: {POSTGRES_ENV} is not set, PostgreSQL not tested (docs/team-setup.md)", flush=True)
    lanes = [[FAST, *([POSTGRES] if postgres else [])], [MODEL, BROWSER]]
    print("make test: " + "; ".join(" then ".join(s.name for s in sessions) for sessions in lanes[1:])
          + f" run beside this (logs in {args.logs}/)", flush=True)
    outcomes: list[list[Outcome]] = [[] for _ in lanes]
    beside = [threading.Thread(target=lane, args=(args.pytest, sessions, args.logs, outcomes[number]),
                               kwargs={"show": False}) for number, sessions in enumerate(lanes) if number]
    for thread in beside:
        thread.start()
    try:
        lane(args.pytest, lanes[0], args.logs, outcomes[0], show=True)
        for thread in beside:
            thread.join()
    finally:
        for proc in RUNNING:
            if proc.poll() is None:
                proc.terminate()

    print(f"\nmake test: sessions (wall time; the {len(lanes)} lanes ran side by side)")
    ended = [outcome for ran in outcomes for outcome in ran]
    for outcome in ended:
        print("  " + outcome.line())
    failed = any(o.returncode != 0 for o in ended) or len(ended) < sum(len(sessions) for sessions in lanes)
    print(f"make test: {'FAILED' if failed else 'passed'} in {minutes(time.monotonic() - started)} "
          f"(wall, {os.cpu_count()} cores)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
