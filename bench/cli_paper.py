"""The paper-scale run as a person starts it: `python -m core train` from outside, its wall time against its
critical path (issue 58, item 5).

bench/engine_path.py `paper` times a run inside one process after a warm-up, with the gate off. A person types the
command instead: this script starts bench/stub_server.py at 1 s latency, seeds a fresh SQLite file with
`python -m core demo`, then times, as a separate process and from outside,

    python -m core train --task "arithmetic word problems" --model openai/stub --learner-model openai/stub \
        --api-base <stub> --epochs 3 --batch-size 100 --group-size 5 --concurrency 512 --limit 100

with every other setting the command's default (the validation gate included). The critical path is read from the
stub's request log: the run's calls, sorted by the time they were sent, fall into levels, a level being a run of
calls of one stage (rollouts, summaries, advantages, an update, the gate's rollouts go with the next rollouts);
each level waits for the one before, so the path is levels x latency. Also printed: when the first call went out
(the process start, imports and setup), the calls, and the train process's CPU.

    PYTHONPATH=. .venv/bin/python bench/cli_paper.py [--rounds 3] [--root DIR]

`--root` times another checkout's command line with this copy of the script (a before and after).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN = ["train", "--task", "arithmetic word problems", "--model", "openai/stub", "--learner-model", "openai/stub",
         "--epochs", "3", "--batch-size", "100", "--group-size", "5", "--concurrency", "512", "--limit", "100"]


def _stub_module():
    spec = importlib.util.spec_from_file_location("cli_paper_stub_server", HERE / "stub_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def levels(requests: list[dict]) -> list[tuple[str, int]]:
    """The calls in the order they were sent, as runs of one stage: (stage, calls) per level."""
    found: list[tuple[str, int]] = []
    for request in sorted(requests, key=lambda r: r["t"]):
        stage = request["stage"]
        if found and found[-1][0] == stage:
            found[-1] = (stage, found[-1][1] + 1)
        else:
            found.append((stage, 1))
    return found


def one_round(root: Path, python: str, latency: float, workdir: Path, number: int) -> dict:
    stub_server = _stub_module()
    database = workdir / f"paper{number}.db"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{database}", "TFGRPO_NO_AUTOWORKER": "1",
           "PYTHONPATH": str(root)}
    env.pop("STUDIO_API_BASE", None)
    with stub_server.StubServer(latency_s=latency) as stub:
        subprocess.run([python, "-m", "core", "demo"], cwd=root, env=env, check=True, capture_output=True,
                       timeout=600)
        stub.reset_log()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.time()
        done = subprocess.run([python, "-m", "core", *TRAIN, "--api-base", stub.url], cwd=root, env=env,
                              capture_output=True, text=True, timeout=1200)
        wall = time.time() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        requests = stub.requests()
    if done.returncode != 0:
        raise SystemExit(f"train failed ({done.returncode}): {done.stderr[-2000:]}")
    found = levels(requests)
    path = len(found) * latency
    first = min(r["t"] for r in requests) - started if requests else float("nan")
    return {"wall_s": round(wall, 2), "critical_path_s": path, "ratio": round(wall / path, 2) if path else None,
            "calls": len(requests), "first_call_after_s": round(first, 2),
            "train_cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 2),
            "levels": " ".join(f"{stage}:{calls}" for stage, calls in found)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--root", type=Path, default=HERE.parent, help="the checkout whose command line is timed")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", help="also write the rounds here")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load {load[0]:.2f}; {args.root}; latency {args.latency:g} s; "
          f"python -m core {' '.join(TRAIN)} --api-base <stub>")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="cli_paper_") as workdir:
        for number in range(args.rounds):
            result = one_round(args.root.resolve(), args.python, args.latency, Path(workdir), number)
            rounds.append(result)
            print(json.dumps(result), flush=True)
    walls = [r["wall_s"] for r in rounds]
    paths = sorted({r["critical_path_s"] for r in rounds})
    print(f"wall {min(walls):.1f}-{max(walls):.1f} s (median {statistics.median(walls):.1f}) against a critical path "
          f"of {', '.join(f'{p:g}' for p in paths)} s: {min(r['ratio'] for r in rounds):.2f}-"
          f"{max(r['ratio'] for r in rounds):.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(rounds, indent=2))


if __name__ == "__main__":
    main()
