"""Keep N cores busy, to run the suite (`.ci/run`) on a loaded machine (issue 41: green every time, once with
both cores taken by another process for the whole run).

    .venv/bin/python bench/burner.py                      # every core, until Ctrl-C or kill
    .venv/bin/python bench/burner.py --cores 1 --seconds 600
    .venv/bin/python bench/burner.py -- .ci/run           # every core while .ci/run runs; exits with its code

Each core gets a process spinning in pure Python at normal priority. On its way out the burner prints the
CPU time its processes got (how many cores it really held) and the load average it saw, sampled every 5 s.
A burner process whose parent dies (kill -9) notices within a second and stops: none is left spinning.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

SAMPLE_S = 5.0


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def spin(parent: int) -> None:
    """Burn one core until the parent is gone or tells us to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent decides
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    check_at = time.monotonic() + 1.0
    x = 0
    while True:
        for _ in range(200_000):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        if time.monotonic() >= check_at:
            if os.getppid() != parent:
                os._exit(0)
            check_at = time.monotonic() + 1.0


class Stopped(Exception):
    """SIGINT or SIGTERM: stop now, not at the end of the current sample's sleep."""


@dataclass
class Load:
    """The 1-minute load average, sampled while the burner runs."""

    samples: list[float] = field(default_factory=list)

    def sample(self) -> None:
        self.samples.append(os.getloadavg()[0])

    def line(self) -> str:
        if not self.samples:
            return "load: no sample"
        mean = sum(self.samples) / len(self.samples)
        return f"load (1-min average, every {SAMPLE_S:.0f} s): mean {mean:.2f}, max {max(self.samples):.2f}"


def burn(cores: int, seconds: float | None, command: list[str]) -> int:
    """Start `cores` spinners; stop them after `seconds`, when `command` ends, or on SIGINT/SIGTERM. The exit
    code is the command's (0 without one)."""
    def on_signal(signum, _frame) -> None:
        raise Stopped(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    context = multiprocessing.get_context("fork")
    spinners = [context.Process(target=spin, args=(os.getpid(),), daemon=True) for _ in range(cores)]
    for spinner in spinners:
        spinner.start()
    started = time.monotonic()
    print(f"burner: {cores} process(es) spinning (pids {' '.join(str(s.pid) for s in spinners)}), "
          f"stop with kill {os.getpid()}", flush=True)
    child = subprocess.Popen(command) if command else None
    load = Load()
    code = 0
    try:
        while True:
            load.sample()
            if seconds is not None and time.monotonic() - started >= seconds:
                break
            if child is not None and child.poll() is not None:
                code = child.returncode
                break
            wait = SAMPLE_S if seconds is None else min(SAMPLE_S, max(0.0, seconds - (time.monotonic() - started)))
            if child is None:
                time.sleep(wait)
            else:
                _wait(child, wait)
    except Stopped:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the cleanup short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if child is not None and child.poll() is None:
            child.terminate()
            code = child.wait()
        wall = time.monotonic() - started
        spun = sum(cpu_seconds(spinner.pid) for spinner in spinners)
        for spinner in spinners:
            spinner.terminate()
        for spinner in spinners:
            spinner.join()
    beside = f" beside `{' '.join(command)}` (exit {code})" if command else ""
    print(f"burner: {cores} process(es) for {wall:.0f} s{beside} held {spun / wall:.2f} cores on average "
          f"({spun:.0f} CPU s); {load.line()}", flush=True)
    return code


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a running process (Linux's /proc; 0 where there is none)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def _wait(child: subprocess.Popen, seconds: float) -> None:
    try:
        child.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description="Keep N cores busy until killed, for --seconds, or while a "
                                                 "command given after -- runs.")
    parser.add_argument("--cores", type=int, default=available_cores(),
                        help="processes to spin (default: every core this process may use)")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long (default: until killed)")
    args = parser.parse_args(argv)
    if args.cores < 1:
        parser.error("--cores must be at least 1")
    if args.seconds is not None and args.seconds <= 0:
        parser.error("--seconds must be positive")
    return burn(args.cores, args.seconds, command)


if __name__ == "__main__":
    sys.exit(main())
