"""What the worker's production scoring pass costs (issue 50, item 3): the task's judge scores a share of traces.

On a temporary SQLite file (fully migrated), the demo task with a judge reward and `--traces` production traces
received under the rule `judge_share` (`--share`), each pass run as if ten minutes later. The judge is mocked through litellm's
`mock_response` (no network), so the figures are the studio's own work: choosing, claiming and storing. It prints
the passes the worker needs to score every chosen trace, the judge calls in the ledger (exactly one per chosen
trace), the wall time, and the time of an idle pass afterwards (what the worker spends each poll when nothing
is due).

    PYTHONPATH=. .venv/bin/python bench/production_scoring.py
    PYTHONPATH=. .venv/bin/python bench/production_scoring.py --traces 20000 --share 0.05
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=10_000)
    parser.add_argument("--share", type=float, default=0.1)
    args = parser.parse_args()

    from sqlalchemy import func
    from sqlmodel import Session, select

    from core.grpo.production_scoring import score_production
    from core.models.gateway import Gateway
    from core.records.library.versions import import_library
    from core.records.production.scoring import STAGE
    from core.records.production.traces import TraceIn, ingest_traces, set_rules
    from core.records.tasks.demos import DEMO_TASK, ensure_demo_task
    from storage.db import make_engine, session_scope
    from storage.tables import LLMCall, Task, utcnow

    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{folder}/bench.db")
        ensure_demo_task(engine)
        with session_scope(engine) as session:
            task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
            task.reward_method, task.judge_model = "judge", "openai/gpt-4o-mini"
            task.reward_settings = {"scale": "binary", "criteria": "The total is right."}
            session.add(task)
        version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
        set_rules(engine, DEMO_TASK, {"judge_share": args.share}, "system")
        for start in range(0, args.traces, 100):
            ingest_traces(engine, [TraceIn(id=f"t{i}", task=DEMO_TASK, version_id=version.id, output=str(2 * i),
                                           input=f"What is {i} + {i}?") for i in range(start, min(start + 100,
                                                                                                  args.traces))])
        reply = json.dumps({"reason": "the total is right", "score": 1, "confident": True})
        gateway = Gateway(engine, concurrency=4, mock=lambda stage, messages: reply, backoff_s=0.001)
        later = utcnow() + timedelta(minutes=10)

        started, passes, scored = time.perf_counter(), 0, 0
        while landed := score_production(engine, "bench", gateway=gateway, now=later):
            passes, scored = passes + 1, scored + landed
        busy_s = time.perf_counter() - started
        started = time.perf_counter()
        idle = [score_production(engine, "bench", gateway=gateway, now=later) for _ in range(10)]
        idle_ms = (time.perf_counter() - started) / len(idle) * 1000
        with Session(engine) as session:
            calls = session.exec(select(func.count()).select_from(LLMCall).where(LLMCall.stage == STAGE)).one()
        engine.dispose()
    print(f"{args.traces} traces, judge_share {args.share}: {scored} scored in {passes} passes, {calls} judge calls "
          f"in the ledger, {busy_s:.1f} s ({busy_s / max(scored, 1) * 1000:.1f} ms a trace); an idle pass "
          f"{idle_ms:.1f} ms")
    return 0 if calls == scored and not any(idle) else 1


if __name__ == "__main__":
    raise SystemExit(main())
