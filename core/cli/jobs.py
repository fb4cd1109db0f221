"""The job commands: train, evaluate, compare and measure experiences. A job given here runs in the foreground
(claimed as a worker claims it) unless --queue leaves it to a worker (core.cli.worker: the worker command)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.cli.base import UsageError, engine_of
from core.cli.progress import StageProgress, VariantProgress
from core.cli.report import report_run
from core.errors import InvalidInput, NotFound
from core.grpo import attribution
from core.grpo.comparison_pair import comparison_pair
from core.grpo.evaluation import create_evaluation
from core.grpo.training import check_resumable, create_run_with_defaults
from core.jobs.run_control import cancel_attribution, cancel_evaluation, resume_evaluation
from core.jobs.worker import claim_or_explain, execute_job, new_worker_id
from core.models.gateway import Gateway
from core.models.model_server import command_line_job
from core.records.evaluation.comparison import compare_evaluations
from core.records.evaluation.figures import figures_line, read_evaluation_report
from core.records.library.segments import paired_by_segment
from core.records.models.learner_advice import learner_advice
from core.records.runs.settings import run_settings
from core.records.tasks.lookup import get_task
from core.secrets import API_BASE_ENV, has_credentials, mask_url
from storage import queries
from storage.db import describe_url
from storage.fencing import Lease
from storage.statuses import EVALUATION_HAS_FIGURES, WORKER_MAY_CONTINUE, JobStatus, RunKind
from storage.tables import Evaluation, Run


def _keep_api_base_secret(api_base: str | None, *, queued: bool) -> None:
    """An --api-base with credentials is stored masked; this process calls it with the full URL, which
    stays in its environment (core.secrets), and a queued run tells what its worker needs."""
    if not has_credentials(api_base):
        return
    os.environ[API_BASE_ENV] = api_base
    where = f"the worker needs {API_BASE_ENV} set to the full URL" if queued else "it is used by this process only"
    print(f"--api-base holds credentials: stored as {mask_url(api_base)}; {where}", file=sys.stderr)


def _claim(engine: Engine, kind: str, job_id: int, *, resuming: bool = False) -> Lease:
    """This process's claim on a job it executes in the foreground, as a worker claims one: a queued job, or
    (resuming) one a worker may continue."""
    return claim_or_explain(engine, kind, job_id, new_worker_id(),
                            WORKER_MAY_CONTINUE if resuming else (JobStatus.QUEUED,))


def _say_learner_advice(engine: Engine, task_name: str, run_id: int) -> None:
    """Before a run on the embedded learner starts, say plainly that it rarely writes a usable lesson, and name
    a hosted learner where a key is set (core.records.models.learner_advice; the Train page says the same)."""
    with Session(engine) as session:
        advice = learner_advice(session, get_task(session, task_name),
                                run_settings(session.get(Run, run_id)))
    if advice is not None:
        use = f" Use it with --learner-model {advice.hosted}." if advice.hosted else ""
        print(f"note: {advice.text}{use}", file=sys.stderr)


def _say_chosen_defaults(choices: list) -> None:
    """The defaults this run got from the studio's measurements (core.records.runs.defaults), each with its reason
    and the flag that overrides it, as the Train page shows them; on stderr, beside the learner's note, so a
    script reading stdout still gets only the run's outcome."""
    if choices:
        print("defaults chosen for this run (override with the flag named):", file=sys.stderr)
        for choice in choices:
            print(f"  {choice.line()} [{_override(choice.field, choice.value)}]", file=sys.stderr)


def _override(field: str, value) -> str:
    """The command-line words that set `field` otherwise than the chosen `value`."""
    if field == "selection":
        return "before a run: python -m core library selection --task T --mode all"
    flag = "--" + field.replace("_", "-")
    return flag.replace("--", "--no-", 1) if value is True else flag if isinstance(value, bool) else f"{flag} N"


def _execute_here(engine: Engine, lease: Lease, **kwargs):
    """A job executed in this terminal, not by a worker: no page waits on it, so an embedded model server it has to
    start gets every core and stops when the job ends (core.models.model_server.command_line_job)."""
    with command_line_job():
        return execute_job(engine, lease, **kwargs)


def cmd_train(args: argparse.Namespace) -> int:
    engine = engine_of(args)
    if args.resume is not None:
        run_id = args.resume
        with Session(engine) as session:
            check_resumable(session, run_id)
    else:
        if not args.task:
            raise UsageError("train: --task is required (or --resume RUN)")
        _keep_api_base_secret(args.api_base, queued=args.queue)
        given = {"epochs": args.epochs, "batch_size": args.batch_size, "group_size": args.group_size,
                 "temperature": args.temperature, "limit": args.limit, "seed": args.seed,
                 "review_mode": args.review or ("manual" if args.from_production else None),
                 "policy_model": args.model, "learner_model": args.learner_model,
                 "concurrency": args.concurrency, "max_experiences": args.max_experiences,
                 "examples": args.examples, "max_examples": args.max_examples,
                 "reference_when_all_fail": args.reference_when_all_fail, "lessons": args.lessons,
                 "learner_replies": args.learner_replies, "skip_covered": args.skip_covered,
                 "max_tokens": args.max_tokens, "learner_max_tokens": args.learner_max_tokens,
                 "budget_usd": args.budget, "api_base": args.api_base, "gate": args.gate,
                 "validation_size": args.validation_size, "gate_k": args.gate_k,
                 "max_operations": args.max_operations, "call_timeout_s": args.call_timeout,
                 "call_deadline_s": args.deadline, "max_turns": args.max_turns,
                 "start_label": "production" if args.from_production else args.start_label,
                 "old_share": (0.3 if args.old_share is None else args.old_share) if args.from_production
                 else args.old_share,
                 "hold_flagged": None if args.hold_flagged is None else args.hold_flagged == "on"}
        run_id, choices = create_run_with_defaults(
            engine, args.task, {**given, "ground_truth": not args.no_ground_truth}, library_name=args.library,
            kind=RunKind.DIRECT if args.direct else RunKind.TRAIN)
        _say_chosen_defaults(choices)
        _say_learner_advice(engine, args.task, run_id)
    if args.queue:
        print(f"run {run_id} queued on {describe_url(str(engine.url))}; a worker (python -m core worker) executes it")
        return 0
    lease = _claim(engine, "run", run_id, resuming=args.resume is not None)
    print(f"run {run_id} on {describe_url(str(engine.url))}", file=sys.stderr)
    progress = StageProgress()
    try:
        _execute_here(engine, lease, on_progress=progress)
    finally:
        progress.close()
    return report_run(engine, run_id)


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate a version, or (`--retry N`) run again only the rollouts of evaluation N that have no reward.
    Exits 1 while an evaluation has errors: its figures count the answered rollouts only."""
    engine = engine_of(args)
    if args.cancel is not None:
        status = cancel_evaluation(engine, args.cancel, "cli")
        print(f"evaluation {args.cancel}: {status}; a worker executing it stops within seconds; its answered "
              f"rollouts stay, and python -m core eval --retry {args.cancel} continues it")
        return 0
    if args.retry is not None:
        with Session(engine) as session:
            queued = getattr(session.get(Evaluation, args.retry), "status", None) == JobStatus.QUEUED
        if not queued:
            resume_evaluation(engine, args.retry, "cli")
        eval_id = args.retry
    else:
        if not (args.task and args.version):
            raise InvalidInput("give --task and --version (or --retry ID to retry an evaluation's failed rollouts)")
        eval_id = create_evaluation(engine, args.task, args.version, split=args.split, k=args.k, limit=args.limit,
                                    model=args.model, temperature=args.temperature, route_segments=args.route_segments,
                                    library_name=args.library)
    if args.queue:
        print(f"evaluation {eval_id} queued; a worker (python -m core worker) executes it")
        return 0
    lease = _claim(engine, "evaluation", eval_id)
    gateway = Gateway(engine, concurrency=args.concurrency) if args.concurrency else None
    ev = _execute_here(engine, lease, gateway=gateway)
    if args.json:
        print(json.dumps(read_evaluation_report(engine, ev.id)))
    elif ev.status in EVALUATION_HAS_FIGURES:
        print(f"evaluation {ev.id}: {ev.n} queries x k={ev.k} on {ev.split}")
        print(figures_line(ev) + f"  cost ${ev.cost:.4f}")
        for line in breakdown_lines(ev.metrics or {}, ev.k):
            print(line)
        if ev.status == JobStatus.INCOMPLETE:
            print(f"evaluation {ev.id} is incomplete: {ev.error}\nretry: python -m core eval --retry {ev.id}",
                  file=sys.stderr)
    elif ev.status == JobStatus.CANCELLED:
        print(f"evaluation {ev.id} was cancelled; its answered rollouts stay, and python -m core eval --retry {ev.id} "
              "continues it", file=sys.stderr)
    else:
        print(f"evaluation {ev.id} failed: {ev.error}", file=sys.stderr)
    return 0 if ev.status == JobStatus.COMPLETED else 1


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare B with A on the same queries; evaluations that are missing are run first (exit 0 either way)."""
    engine = engine_of(args)
    pair = comparison_pair(engine, args.task, args.a, args.b, split=args.split, k=args.k, limit=args.limit,
                           model=args.model, library_name=args.library)
    print(pair.words, file=sys.stderr)
    ids = list(pair.ids)
    for eval_id in ids:
        with Session(engine) as session:
            ev = session.get(Evaluation, eval_id)
            if ev is None:
                raise NotFound(f"no evaluation {eval_id}")
            status = ev.status
        if status in (JobStatus.RUNNING, JobStatus.AWAITING_LABELS):
            print(f"evaluation {eval_id} is {status} in a worker; compare again when it has ended", file=sys.stderr)
            return 1
        if status == JobStatus.QUEUED:
            print(f"running evaluation {eval_id} ...", file=sys.stderr)
            ev = _execute_here(engine, _claim(engine, "evaluation", eval_id))
            if ev.status not in EVALUATION_HAS_FIGURES:
                print(f"evaluation {eval_id} is {ev.status}: {ev.error or 'waiting for labels'}", file=sys.stderr)
                return 1
    result = compare_evaluations(engine, *ids)
    by_segment = paired_by_segment(engine, *ids)
    s = result.stats
    with Session(engine) as session:
        numbers = queries.version_numbers(session, [ev.version_id for ev in (result.a, result.b) if ev.version_id])
    played = [numbers.get(ev.version_id) for ev in (result.a, result.b)]
    if args.json:
        figures = s.as_dict()
        print(json.dumps({"evaluation_a": ids[0], "evaluation_b": ids[1], "model": pair.model, "chosen": pair.words,
                          "version_a": played[0],
                          "version_b": played[1], "version_id_a": result.a.version_id,
                          "version_id_b": result.b.version_id, "n_queries": s.n, "k": result.a.k,
                          **{key: figures[key] for key in ("mean_a", "mean_b", "delta", "ci_low", "ci_high", "p_value",
                                                           "wins", "losses", "ties", "pass_a", "pass_b", "mcnemar_p",
                                                           "detectable", "verdict")},
                          "decided": s.decided, "left_out_for_errors": result.missing, "note": result.note,
                          **({"segments": {name: stats.as_dict() for name, stats in by_segment.items()}}
                             if by_segment else {})}))
        return 0
    sides = [f"evaluation {ev_id} ({'the empty library' if number is None else f'version #{number}'})"
             for ev_id, number in zip(ids, played, strict=True)]
    print(f"A = {sides[0]}, B = {sides[1]}: {s.n} queries x k={result.a.k} on {result.a.split}")
    for line in comparison_lines(s):
        print(line)
    if result.note:
        print(result.note)
    print(s.verdict)
    for name, stats in by_segment.items():
        print(f"  segment {name}: {stats.verdict}")
    return 0


def comparison_lines(s) -> list[str]:
    """The paired comparison's figures in words, only those it could compute (Paired.figure): none without a
    query answered under both, no interval with fewer than two."""
    if s.figure("delta") is None:
        return []
    interval = (f" [{s.ci_low:+.3f}, {s.ci_high:+.3f}] (paired bootstrap 95%; a difference is real when this "
                "interval excludes 0 and the sign test agrees)" if s.figure("ci_low") is not None else "")
    return [f"Mean@k  A {s.mean_a:.3f}  B {s.mean_b:.3f}  B - A {s.delta:+.3f}{interval}",
            f"per query: B wins {s.wins}, loses {s.losses}, ties {s.ties}; sign test p = {s.p_value:.3g}",
            f"Pass@k  A {s.pass_a:.3f}  B {s.pass_b:.3f}; McNemar p = {s.mcnemar_p:.3g}"]


def breakdown_lines(metrics: dict, k: int) -> list[str]:
    """An evaluation's scores per segment and per criterion (conversation tasks), one line each."""
    lines = []
    for name, row in (metrics.get("segments") or {}).items():
        unscored = f"  ({row['unscored']} unscored, left out)" if row.get("unscored") else ""
        if row["mean_at_k"] is None:
            lines.append(f"  segment {name:<12} {row['n']:>3} queries  Mean@{k} -{unscored}")
            continue
        lo, hi = row["mean_at_k_ci"]
        lines.append(f"  segment {name:<12} {row['n']:>3} queries  Mean@{k} {row['mean_at_k']:.3f} "
                     f"[{lo:.3f}, {hi:.3f}]{unscored}")
    for name, row in (metrics.get("criteria") or {}).items():
        lines.append(f"  criterion {name:<12} mean {row['mean']:.3f} over {row['n']} conversations")
    return lines


def cmd_attribute(args: argparse.Namespace) -> int:
    """Measure each experience of a version (leave-one-out): the estimate first, then the measurement in the
    foreground (unless --queue), then each experience's effect."""
    engine = engine_of(args)
    say = sys.stderr if args.json else sys.stdout
    if args.cancel is not None:
        status = cancel_attribution(engine, args.cancel, "cli")
        print(f"measurement run {args.cancel}: {status}; a worker executing it stops within seconds; finished "
              "variants and answered rollouts stay")
        return 0
    if args.resume is not None:
        run_id = args.resume
        with Session(engine) as session:
            run = check_resumable(session, run_id)
            if run.kind != RunKind.ATTRIBUTE:
                raise InvalidInput(f"run {run_id} is a {run.kind} run, not a measurement; resume it with train --resume")
    else:
        if not (args.task and args.version):
            raise UsageError("attribute: --task and --version are required (or --resume RUN)")
        est = attribution.estimate(engine, args.task, args.version, split=args.split, k=args.k, limit=args.limit,
                                   library_name=args.library)
        print(f"estimate: {attribution.estimate_line(est)}", file=say)
        if est["note"]:
            print(f"note: {est['note']}", file=say)
        run_id = attribution.create_attribution(engine, args.task, args.version, split=args.split, k=args.k,
                                                limit=args.limit, library_name=args.library,
                                                concurrency=args.concurrency, budget_usd=args.budget)
    if args.queue:
        print(f"measurement run {run_id} queued on {describe_url(str(engine.url))}; a worker (python -m core worker) "
              "executes it", file=say)
        if args.json:
            print(json.dumps({"run_id": run_id, "status": JobStatus.QUEUED}))
        return 0
    lease = _claim(engine, "run", run_id, resuming=args.resume is not None)
    print(f"measurement run {run_id} on {describe_url(str(engine.url))}", file=sys.stderr)
    progress = VariantProgress(engine, run_id)
    try:
        run = _execute_here(engine, lease, on_progress=progress)
    finally:
        progress.close()
    if run.status != JobStatus.COMPLETED:
        print(f"measurement run {run_id} is {run.status}" + (f": {run.error}" if run.error else "")
              + (f"; continue it with: python -m core attribute --resume {run_id}" if run.status != JobStatus.CANCELLED
                 else ""), file=sys.stderr)
        return 0 if run.status == JobStatus.PAUSED else 1
    effects = list(attribution.run_effects(engine, run_id).values())
    if args.json:
        print(json.dumps([e.as_dict() for e in effects]))
        return 0
    first = effects[0] if effects else None
    if first is not None:
        print(f"run {run_id}: version #{first.version_number}, {first.n} {first.split} "
              f"queries x k={first.k}; effect = mean reward with the experience minus without it")
    print(f"{'id':<6}{'effect':>8}  {'95% interval':<18}{'p':>7}  {'verdict':<9}{'shown':<20}text")
    for e in effects:
        print(f"{e.experience_id:<6}{e.delta:>+8.3f}  {e.interval:<18}{e.p_value:>7.3g}  {e.verdict:<9}"
              f"{e.shown_line:<20}{e.text}")
    hurting = [e.experience_id for e in effects if e.verdict == attribution.Verdict.HURTS]
    if hurting:
        print(f"{len(hurting)} hurt ({', '.join(hurting)}); the Library page removes "
              f"{'it' if len(hurting) == 1 else 'them'} as a new version")
    return 0
