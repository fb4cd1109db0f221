"""One small train and evaluation of the conversation demo on the embedded model: what it costs and whether it helped.

A fresh SQLite file; the demo conversation task; one training run (by default 4 train scenarios, G=2, one step,
2 agent turns, the gate off); then the empty library and the run's result are evaluated on the same held-out
test scenarios (k=1) and compared with the paired statistics, overall and per segment. Verdicts the judge
could not give wait for people; a benchmark has no people, so they are counted, printed, and scored 0 (the
printed figures say how many). Prints calls and time per stage from the ledger.

    PYTHONPATH=. .venv/bin/python bench/conversation_demo.py [--scenarios 4] [--group-size 2] [--test 6]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=4, help="train scenarios (one step)")
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--test", type=int, default=6, help="held-out test scenarios evaluated")
    args = parser.parse_args()

    directory = tempfile.mkdtemp(prefix="tfgrpo-conversation-bench-")
    os.environ["DATABASE_URL"] = f"sqlite:///{directory}/bench.db"
    from sqlmodel import Session, select

    from core.grpo.evaluation import create_evaluation, execute_evaluation
    from core.grpo.training import RunSettings, create_run, execute_run
    from core.records.evaluation.comparison import compare_evaluations
    from core.records.library.segments import paired_by_segment
    from core.records.tasks.demos import CONVERSATION_TASK, ensure_conversation_task
    from core.records.tasks.lookup import get_task
    from core.settings import engine as settings_engine
    from storage.db import session_scope
    from storage.statuses import JobStatus, LabelStatus
    from storage.tables import LibraryVersion, LLMCall, Rollout, Run

    engine = settings_engine()
    ensure_conversation_task(engine)
    with session_scope(engine) as session:  # no spot checks: only what the judge cannot score waits
        task = get_task(session, CONVERSATION_TASK)
        task.reward_settings = {**task.reward_settings, "spot_check_share": 0.0}
        session.add(task)

    unscored: Counter = Counter()

    def settle(kind: str, status_of, rerun) -> object:
        """A job that waits for people: its waiting rollouts get reward 0 (counted), and it goes on."""
        job = rerun()
        while status_of(job) == JobStatus.AWAITING_LABELS:
            with session_scope(engine) as session:
                for rollout in session.exec(select(Rollout).where(Rollout.label_status == LabelStatus.NEEDED)):
                    rollout.reward, rollout.reward_source = 0.0, "error"
                    rollout.reward_detail = "benchmark: no person to label an unusable verdict"
                    rollout.label_status = LabelStatus.DONE
                    unscored[kind] += 1
                    session.add(rollout)
                _requeue(session, job)
            job = rerun()
        return job

    def _requeue(session, job) -> None:
        row = session.get(type(job), job.id)
        row.status = JobStatus.QUEUED
        session.add(row)

    started = time.perf_counter()
    settings = RunSettings(epochs=1, batch_size=args.scenarios, group_size=args.group_size, limit=args.scenarios,
                           gate="off", hold_flagged=False, max_tokens=160, learner_max_tokens=500,
                           max_turns=args.max_turns)
    run_id = create_run(engine, CONVERSATION_TASK, settings, created_by="system")
    run = settle("train", lambda r: r.status, lambda: execute_run(engine, run_id))
    train_s = time.perf_counter() - started
    with Session(engine) as session:
        run = session.get(Run, run_id)
        version = session.get(LibraryVersion, run.current_version_id).number  # what create_evaluation takes
        changed = run.current_version_id != run.start_version_id
    print(f"train: run {run_id} {run.status} in {train_s:.0f} s; {args.scenarios} scenarios x G={args.group_size}, "
          f"max {args.max_turns} agent turns; library {'changed' if changed else 'unchanged'}"
          + (f" ({run.error})" if run.error else ""))

    evaluations = {}
    for name, ref in (("empty", "empty"), ("trained", str(version))):
        began = time.perf_counter()
        eval_id = create_evaluation(engine, CONVERSATION_TASK, ref, split="test", k=1, limit=args.test,
                                    created_by="system")
        ev = settle(f"eval {name}", lambda e: e.status, lambda eid=eval_id: execute_evaluation(engine, eid))
        evaluations[name] = ev.id
        segments = ", ".join(f"{seg} {row['mean_at_k']:.2f} (n={row['n']})"
                             for seg, row in (ev.metrics or {}).get("segments", {}).items())
        criteria = ", ".join(f"{c} {row['mean']:.2f}" for c, row in (ev.metrics or {}).get("criteria", {}).items())
        print(f"eval {name}: Mean@1 {ev.mean_at_k:.3f} on {ev.n} test scenarios in {time.perf_counter() - began:.0f} s"
              f"; segments: {segments}; criteria: {criteria}")
    if changed:
        result = compare_evaluations(engine, evaluations["empty"], evaluations["trained"])
        print(f"trained - empty: {result.stats.verdict}")
        for segment, stats in paired_by_segment(engine, evaluations["empty"], evaluations["trained"]).items():
            print(f"  {segment}: {stats.delta:+.3f} on {stats.n} scenarios")
    with Session(engine) as session:
        calls = session.exec(select(LLMCall).where(LLMCall.cache_hit == False)).all()  # noqa: E712
        rollouts = session.exec(select(Rollout)).all()
    by_stage: dict[str, list[float]] = {}
    for call in calls:
        by_stage.setdefault(call.stage, []).append(call.latency_ms / 1000)
    print(f"model calls: {len(calls)} in {time.perf_counter() - started:.0f} s; "
          + ", ".join(f"{stage} {len(times)} ({sum(times):.0f} s)" for stage, times in sorted(by_stage.items())))
    rules_failed = sum(1 for r in rollouts if any(rule.get("passed") is False for rule in (r.scores or {}).get("rules", [])))
    print(f"conversations: {len(rollouts)}; with a failed rule {rules_failed}; verdicts the judge could not give "
          f"(scored 0 here): {dict(unscored) or 0}; tokens out {sum(c.tokens_out for c in calls)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
