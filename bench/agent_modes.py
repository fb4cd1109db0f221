"""Direct against python agent mode on the same queries: right answers, rollouts that ran code, time.

On a fresh SQLite file this creates the arithmetic demo task and evaluates its empty library twice on the
first `--limit` test problems with the same k, temperature and seeds (the agent seeds each call from its query,
sample index and turn): once in `direct` mode, once in `python` mode (the code jail must work here). Each
evaluation runs through the engine's own path (core.grpo.evaluation), so the python arm stops at "```output",
runs the code in the jail and stores each run on its rollout. The two are compared query by query
(core.records.evaluation.comparison: paired interval and sign test).

Prints one line per mode (right answers, Mean@k, rollouts that ran code, code runs, rollouts that reached the
turn limit with code not yet run, model calls, tokens out, wall time), the paired difference and the command
line; `--json PATH` writes the same figures. Loads the embedded model: run it under `flock /tmp/model.lock`
on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: no price list download
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlmodel import Session, select  # noqa: E402

from core.domain.code_runs import code_runs, pending_code  # noqa: E402
from core.grpo.evaluation import create_evaluation, execute_evaluation  # noqa: E402
from core.records.evaluation.comparison import compare_evaluations  # noqa: E402
from core.records.tasks.demos import DEMO_TASK, ensure_demo_task  # noqa: E402
from storage.db import make_engine, session_scope  # noqa: E402
from storage.tables import LLMCall, Rollout, Task  # noqa: E402

MODES = ("direct", "python")


def set_mode(engine, mode: str) -> None:
    """This benchmark's own scratch database: the one task's agent mode, switched between the two arms."""
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        task.agent_mode = mode
        session.add(task)


def arm(engine, mode: str, args) -> dict:
    set_mode(engine, mode)
    evaluation_id = create_evaluation(engine, DEMO_TASK, "empty", split="test", k=args.k, limit=args.limit,
                                      model=args.model, temperature=args.temperature)
    started = time.perf_counter()
    evaluation = execute_evaluation(engine, evaluation_id)
    wall = time.perf_counter() - started
    with Session(engine) as session:
        rollouts = session.exec(select(Rollout).where(Rollout.evaluation_id == evaluation_id)).all()
        calls = session.exec(select(LLMCall).where(LLMCall.evaluation_id == evaluation_id)).all()
    ran = [r for r in rollouts if code_runs(r.messages)]
    pending = [r for r in rollouts if mode == "python" and r.final_answer is None and r.messages
               and r.messages[-1]["role"] == "assistant" and pending_code(r.messages[-1]["content"])]
    return {"mode": mode, "evaluation": evaluation_id, "rollouts": len(rollouts),
            "right": sum(1 for r in rollouts if (r.reward or 0) >= 0.5),
            "errors": sum(1 for r in rollouts if r.error), "mean": (evaluation.metrics or {}).get("mean_at_k", 0.0),
            "rollouts_with_code_run": len(ran), "code_runs": sum(len(code_runs(r.messages)) for r in rollouts),
            "right_with_code_run": sum(1 for r in ran if (r.reward or 0) >= 0.5),
            "code_left_at_turn_limit": len(pending), "calls": len(calls),
            "tokens_out": sum(c.tokens_out or 0 for c in calls), "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=20, help="test problems (the first ones of the demo's test split)")
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--model", default=None, help="policy model (default: the task's, the embedded one)")
    parser.add_argument("--db", default=None, help="SQLite file to use (default: a new temporary one)")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args(argv)
    path = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="agent_modes_")) / "bench.db"
    engine = make_engine(f"sqlite:///{path}")
    ensure_demo_task(engine)
    rows = [arm(engine, mode, args) for mode in MODES]
    comparison = compare_evaluations(engine, rows[0]["evaluation"], rows[1]["evaluation"])
    stats = comparison.stats
    for row in rows:
        print(f"{row['mode']:>6}: {row['right']}/{row['rollouts']} right (Mean@{args.k} {row['mean']:.3f}), "
              f"{row['rollouts_with_code_run']} rollouts ran code ({row['code_runs']} runs, "
              f"{row['right_with_code_run']} of them right), {row['code_left_at_turn_limit']} ended at the turn limit "
              f"with code not run, {row['errors']} errors, {row['calls']} model calls, {row['tokens_out']} tokens "
              f"out, {row['wall_s']:.0f} s")
    print(f"python - direct: {stats.delta:+.3f} [{stats.ci_low:+.3f}, {stats.ci_high:+.3f}] on {stats.n} queries, "
          f"wins {stats.wins} / losses {stats.losses} / ties {stats.ties}, sign test p = {stats.p_value:.2f}")
    command = "python bench/agent_modes.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"command: {command.strip()} (database {path})")
    if args.json:
        Path(args.json).write_text(json.dumps({"arms": rows, "paired": stats.as_dict(), "command": command,
                                               "k": args.k, "limit": args.limit,
                                               "temperature": args.temperature}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
