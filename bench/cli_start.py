"""How long does the command line take to start? (issue 35)

Times, as a person runs them, an empty Python start (`python -c pass`, the floor), `python -m core --help`,
a command that reads the database (`runs`, on a temporary SQLite file the demo tasks were loaded into
beforehand) and a worker that starts, finds the queue empty and exits (`worker --once`). Each is run
`--runs` times; the table gives the median, the fastest and the slowest wall time, and the load average
before and after, since on a busy machine every figure grows.

    PYTHONPATH=. .venv/bin/python bench/cli_start.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wall_time(argv: list[str]) -> float:
    """Seconds from start to exit of one process; a failure stops the benchmark with its output."""
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}")
    return elapsed


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command (default 5)")
    args = parser.parse_args()
    core = [sys.executable, "-m", "core"]
    with tempfile.TemporaryDirectory() as folder:
        db = ["--db", f"sqlite:///{Path(folder) / 'studio.db'}"]
        wall_time(core + db + ["demo"])  # migrates the new file and loads the demo tasks: not timed
        commands = {"python -c pass": [sys.executable, "-c", "pass"],
                    "python -m core --help": core + ["--help"],
                    "python -m core runs": core + db + ["runs"],
                    "python -m core worker --once": core + db + ["worker", "--once"]}
        before = load()
        rows = [(name, [wall_time(argv) for _ in range(args.runs)]) for name, argv in commands.items()]
        after = load()
    print(f"{'command':<30}{'median s':>10}{'min s':>8}{'max s':>8}  ({args.runs} runs each)")
    for name, times in rows:
        print(f"{name:<30}{statistics.median(times):>10.2f}{min(times):>8.2f}{max(times):>8.2f}")
    print(f"load average (1, 5, 15 min): {before} before, {after} after; {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
