"""What containment costs: a jailed code run, a score in a scoring process, a password check.

Each is timed against the way it replaced or its floor (a bare `python -I` child for code; the old
unjailed sandbox measured 32-33 ms a run; the scorer called in this process; scrypt at the old
N=2^14), so "safe by default" comes with its price. `make bench-isolation`.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return times


def line(name: str, times: list[float]) -> None:
    print(f"{name:<44} median {statistics.median(times):8.3f} ms   mean {statistics.mean(times):8.3f} ms"
          f"   (n={len(times)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20, help="code runs per way")
    parser.add_argument("--scores", type=int, default=200, help="scores per method and way")
    args = parser.parse_args()

    import logging

    from core.domain import scoring
    from core.domain.rewards import METHODS, score
    from core.domain.sandbox import run_python
    from core.records.people import passwords

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout is disabled" notice
    print(f"machine: {sys.platform}, python {sys.version.split()[0]}")
    line("code: bare python -I child (the floor)", timed(lambda: subprocess.run(
        [sys.executable, "-I", "-c", "print('hi')"], capture_output=True, check=True), args.runs))
    run_python("print('warm')")  # the jail's one-off probe
    line("code: bubblewrap jail (run_python)", timed(lambda: run_python("print('hi')"), args.runs))

    cases = {"exact": ("4", "4", {}), "regex": ("order 1234", r"\d{4}", {}),
             "math": (r"so \boxed{42}", "42", {})}
    scoring.start()
    score("math", r"\boxed{1}", "1")  # the scoring processes are warm
    for method, (response, reference, settings) in cases.items():
        in_process = METHODS[method]
        line(f"score {method}: in this process",
             timed(functools.partial(in_process.score, response, reference, settings), args.scores))
        line(f"score {method}: through score()",
             timed(functools.partial(score, method, response, reference, settings), args.scores))
    started = time.perf_counter()
    scoring.configure(time_limit_s=1.0)
    scoring.start()
    print(f"{'scoring processes: start (2, warm)':<44} {(time.perf_counter() - started) * 1000:8.0f} ms")
    started = time.perf_counter()
    result = score("regex", "a" * 40 + "!", "(a+)+$")
    print(f"{'score a catastrophic regex (1 s limit)':<44} {(time.perf_counter() - started) * 1000:8.0f} ms"
          f"   reward {result.value:g}: {result.detail}")
    scoring.shutdown()

    salt = b"0" * 16
    for n in (2**14, passwords.SCRYPT_N):
        line(f"password check: scrypt N=2^{n.bit_length() - 1}", timed(lambda n=n: hashlib.scrypt(
            b"a-long-secret-1", salt=salt, n=n, r=8, p=1, dklen=32, maxmem=256 * 1024 * 1024), 5))


if __name__ == "__main__":
    main()
