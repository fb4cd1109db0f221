"""Command line: `python -m core COMMAND`. Same core functions as the pages and the worker.

Exit codes: 0 success, 1 the work itself failed (a run or an evaluation ended in failure),
2 bad input (one line on stderr saying why).
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import sys
import time
from pathlib import Path

from sqlmodel import Session

from core import cli_production
from core.domain.datasets import SPLITS, check_size, mapping_note, parse_mapping, resolve_columns
from core.domain.library_io import check_file_size, decode_library
from core.domain.personas import check_file_size as check_persona_file_size
from core.domain.personas import parse_personas, persona_dicts
from core.domain.selection import SelectionMode
from core.errors import InvalidInput, NotFound, StudioError, exit_code
from core.grpo import attribution
from core.grpo.evaluation import create_evaluation, evaluation_of
from core.grpo.training import RunSettings, check_resumable, create_run, run_counters
from core.jobs.run_control import resume_evaluation
from core.jobs.worker import claim_or_explain, execute_job, new_worker_id, serve
from core.models import model_server
from core.models.gateway import Gateway
from core.models.local_model import MODELS
from core.records import labeling
from core.records.comparison import compare_evaluations
from core.records.connections import (
    add_connection,
    describe,
    list_connections,
    remove_connection,
    try_connection,
)
from core.records.gate_verdict import GateVerdict
from core.records.learner_advice import learner_advice
from core.records.people import ROLES, add_user, update_user
from core.records.promotion import preview_promotion
from core.records.run_settings import run_settings
from core.records.scenarios import add_scenarios, is_conversation, split_by_persona
from core.records.segments import bind_library, paired_by_segment, routed_export
from core.records.selection import library_selection, set_selection
from core.records.serving import served_selection
from core.records.task_io import columns_of, export_task_json, import_task, save_personas, task_personas
from core.records.tasks import add_dataset_file, ensure_demo_tasks, get_task
from core.records.versions import (
    export_version,
    import_library,
    promote,
    resolve_version,
    set_label,
    version_in_library,
    version_json_meta,
)
from core.secrets import API_BASE_ENV, has_credentials, mask_url
from core.settings import engine as settings_engine
from core.settings import get_settings, secret
from storage import queries
from storage.db import describe_url
from storage.statuses import (
    EVALUATION_HAS_FIGURES,
    WORKER_MAY_CONTINUE,
    GateRule,
    GroupStatus,
    JobStatus,
    OperationStatus,
    RunKind,
)
from storage.tables import Evaluation, LibraryVersion, Run

BAD_INPUT = (ValueError, LookupError, FileNotFoundError)  # raised by argparse values and the filesystem


class UsageError(InvalidInput):
    """A mistake on the command line itself."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake on one line with exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


class StatusLine:
    """Counters on one status line: redrawn in place on a terminal, a line every few seconds otherwise."""

    def __init__(self, stream=sys.stderr) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last_line = ""
        self.last_print = 0.0

    def line(self, counters: dict) -> str:
        raise NotImplementedError

    def finished(self, counters: dict) -> bool:
        return False

    def __call__(self, counters: dict) -> None:
        line = self.line(counters)
        if line == self.last_line:
            return
        if self.tty:
            self.stream.write("\r" + line[:200].ljust(len(self.last_line)))
        elif time.monotonic() - self.last_print >= 2 or self.finished(counters):
            self.stream.write(line + "\n")
            self.last_print = time.monotonic()
        else:
            return  # not shown yet: the next call may show it (or a newer line)
        self.stream.flush()
        self.last_line = line

    def close(self) -> None:
        if self.tty and self.last_line:
            self.stream.write("\n")


class StageProgress(StatusLine):
    """A run's per-stage counters."""

    def line(self, c: dict) -> str:
        return (
            f"step {c['steps_done']}/{c['steps_total']} | rollouts {c['rollouts_done']}/{c['rollouts_total']} "
            f"| rewards {c['rewards']} | summaries {c['summaries']} | advantages {c['advantages']} "
            f"(skipped {c['groups_skipped']}, failed {c['groups_failed']}) | operations {c['operations']} "
            f"| tokens {c['tokens_in'] + c['tokens_out']} | ${c['cost']:.4f}"
        )

    def finished(self, c: dict) -> bool:
        return c["steps_done"] == c["steps_total"]


def _engine(args: argparse.Namespace):
    return settings_engine(args.db)


def cmd_demo(args: argparse.Namespace) -> int:
    for task in ensure_demo_tasks(_engine(args)):
        print(task.name)
    return 0


def _read_file(path: Path, check) -> bytes:
    """A file's bytes, its size checked by `check(size, name)` before it is read."""
    try:
        check(path.stat().st_size, path.name)
        return path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"{path.name}: cannot read file: {exc.strerror or exc}") from None


def name_list(text: str | None) -> list[str]:
    """Comma-separated names (personas) as a list, spaces and empty entries dropped."""
    return [name.strip() for name in (text or "").split(",") if name.strip()]


def cmd_dataset_add(args: argparse.Namespace) -> int:
    """Columns nobody mapped are taken by core's rule (datasets.resolve_columns, applied by add_dataset_file),
    and said when renamed; the note reads the columns the way the Tasks page does (columns_of). After the
    counts come core's notes, the rows left out as duplicates, as the Tasks page shows them."""
    path = Path(args.file)
    data = _read_file(path, check_size)
    engine = _engine(args)
    with Session(engine) as session:
        conversation = is_conversation(get_task(session, args.task))
    if conversation:  # a conversation task's samples are scenarios, checked against its personas
        held = name_list(args.test_personas)
        added, already = add_scenarios(engine, args.task, data, path.name, test_personas=held,
                                       default_split=args.split, actor="cli")
        print(f"added {added} scenarios to {args.task} ({already} already present)"
              + (f"; personas held out for test: {', '.join(held)}" if held else ""))
        return 0
    if args.test_personas:
        raise UsageError(f"dataset add: --test-personas is for conversation tasks; {args.task!r} is not one")
    explicit = parse_mapping(args.map)
    result = add_dataset_file(engine, args.task, data, path.name, mapping=explicit, default_split=args.split,
                              actor="cli", test_share=args.test_share, validation_share=args.validation_share)
    resolved = resolve_columns(columns_of(data, path.name), explicit)
    note = mapping_note({target: column for target, column in resolved.items() if target not in explicit})
    if note:
        print(note)
    print(f"added {result.added} samples to {args.task} ({result.already} already present)")
    for line in result.notes:
        print(line)
    return 0


def cmd_dataset_show(args: argparse.Namespace) -> int:
    with Session(_engine(args)) as session:
        task = get_task(session, args.task)
        counts = queries.count_samples(session, task.id)
    print(f"{task.name}: {sum(counts.values())} samples")
    for split in sorted(counts):
        print(f"  {split:<6}{counts[split]:>6}")
    return 0


def _password(args: argparse.Namespace) -> str:
    """From the named environment variable, else one line of piped stdin, else typed twice (not echoed)."""
    if args.password_env:
        password = secret(args.password_env)
        if not password:
            raise UsageError(f"environment variable {args.password_env} is not set or empty")
        return password
    if not sys.stdin.isatty():
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise UsageError("no password: pipe one line to stdin or use --password-env VAR")
        return password
    password = getpass.getpass("password: ")
    if getpass.getpass("again: ") != password:
        raise UsageError("the two passwords differ")
    return password


def cmd_user_add(args: argparse.Namespace) -> int:
    user = add_user(_engine(args), args.name, args.role, _password(args), actor="cli")
    print(f"added user {user.name} ({user.role}); sign-in is now required")
    return 0


def cmd_user_list(args: argparse.Namespace) -> int:
    with Session(_engine(args)) as session:
        users = queries.list_users(session)
    print(f"{'name':<24}{'role':<10}active")
    for user in users:
        print(f"{user.name:<24}{user.role:<10}{'yes' if user.active else 'no'}")
    return 0


def cmd_user_set(args: argparse.Namespace) -> int:
    password = _password(args) if args.password_env else None
    if args.role is None and args.active is None and password is None:
        raise UsageError("user set: nothing to change; give --role, --active or --password-env")
    active = None if args.active is None else args.active == "yes"
    user = update_user(_engine(args), args.name, "cli", role=args.role, active=active, password=password)
    changed = ", ".join(part for part, given in (("role", args.role), ("active", args.active),
                                                   ("password", password)) if given is not None)
    print(f"updated user {user.name}: {changed} (role {user.role}, active {'yes' if user.active else 'no'})")
    return 0


def _print_version(version: LibraryVersion | None) -> None:
    if version is None:
        print("version: empty library")
        return
    print(f"version {version.id} (#{version.number}, {version.source}): {len(version.experiences)} experiences")
    for exp in version.experiences:
        print(f"  [{exp['id']}] {exp['text']}")


def _report_run(engine, run_id: int) -> int:
    with Session(engine) as session:
        run = session.get(Run, run_id)
        counters = run_counters(session, run)
        version = session.get(LibraryVersion, run.current_version_id) if run.current_version_id else None
        problems, gates = [], []
        for step in queries.steps(session, run.id):
            where = f"epoch {step.epoch + 1} batch {step.batch_index + 1}"
            if gate := GateVerdict.of(step):
                gates.append(f"  {where}: {gate.line}")
            if step.error:
                problems.append(f"{where}: {step.error}")
            unscored = [r for r in queries.step_rollouts(session, step.id) if r.reward_source == "error"]
            if unscored:
                problems.append(f"{where}: {len(unscored)} rollouts could not be scored: {unscored[0].reward_detail}")
            for adv in queries.step_advantages(session, step.id):
                if adv.status == GroupStatus.FAILED:
                    problems.append(f"{where}, sample {adv.sample_id}: group failed: {adv.error}")
            for op in queries.step_operations(session, step.id):
                if op.status == OperationStatus.INVALID:
                    problems.append(f"{where}: {op.op} {op.target_ids} rejected: {op.validation_error}")
    print(f"run {run.id}: {run.status}" + (f" ({run.error})" if run.error else ""))
    print(f"calls {counters['calls']} (cache hits {counters['cache_hits']}), tokens in {counters['tokens_in']}, "
          f"out {counters['tokens_out']}, cost ${counters['cost']:.4f}")
    print(f"structured replies repaired {counters['replies_repaired']}, malformed {counters['replies_malformed']}")
    if gates:
        print(f"validation gate ({run_settings(run).gate}, "
              f"{run.progress.get('validation_queries', 0)} {run.progress.get('validation_split', '')} queries):")
        for line in gates:
            print(line)
    for line in problems:
        print(f"  note: {line}")
    _print_version(version)
    return 0 if run.status in (JobStatus.COMPLETED, JobStatus.AWAITING_REVIEW, JobStatus.PAUSED) else 1


def _keep_api_base_secret(api_base: str | None, *, queued: bool) -> None:
    """An --api-base with credentials is stored masked; this process calls it with the full URL, which
    stays in its environment (core.secrets), and a queued run tells what its worker needs."""
    if not has_credentials(api_base):
        return
    os.environ[API_BASE_ENV] = api_base
    where = f"the worker needs {API_BASE_ENV} set to the full URL" if queued else "it is used by this process only"
    print(f"--api-base holds credentials: stored as {mask_url(api_base)}; {where}", file=sys.stderr)


def _say_learner_advice(engine, task_name: str, run_id: int) -> None:
    """Before a run on the embedded learner starts, say plainly that it rarely writes a usable lesson, and name
    a hosted learner where a key is set (core.records.learner_advice; the Train page says the same)."""
    with Session(engine) as session:
        advice = learner_advice(session, get_task(session, task_name),
                                run_settings(session.get(Run, run_id)))
    if advice is not None:
        use = f" Use it with --learner-model {advice.hosted}." if advice.hosted else ""
        print(f"note: {advice.text}{use}", file=sys.stderr)


def cmd_train(args: argparse.Namespace) -> int:
    engine = _engine(args)
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
                 "review_mode": args.review, "policy_model": args.model, "learner_model": args.learner_model,
                 "concurrency": args.concurrency, "max_experiences": args.max_experiences,
                 "examples": True if args.examples else None, "max_examples": args.max_examples,
                 "reference_when_all_fail": True if args.reference_when_all_fail else None,
                 "lessons": False if args.no_lessons else None,
                 "budget_usd": args.budget, "api_base": args.api_base, "gate": args.gate,
                 "validation_size": args.validation_size, "gate_k": args.gate_k,
                 "max_operations": args.max_operations, "call_timeout_s": args.call_timeout,
                 "call_deadline_s": args.deadline, "max_turns": args.max_turns,
                 "start_label": "production" if args.from_production else args.start_label,
                 "old_share": (0.3 if args.old_share is None else args.old_share) if args.from_production
                 else args.old_share,
                 "hold_flagged": None if args.hold_flagged is None else args.hold_flagged == "on"}
        settings = RunSettings.build(ground_truth=not args.no_ground_truth,
                                     **{name: value for name, value in given.items() if value is not None})
        run_id = create_run(engine, args.task, settings, library_name=args.library,
                            kind=RunKind.DIRECT if args.direct else RunKind.TRAIN)
        _say_learner_advice(engine, args.task, run_id)
    if args.queue:
        print(f"run {run_id} queued on {describe_url(str(engine.url))}; a worker (python -m core worker) executes it")
        return 0
    owner = new_worker_id()
    lease = claim_or_explain(engine, "run", run_id, owner, WORKER_MAY_CONTINUE if args.resume is not None else (JobStatus.QUEUED,))
    print(f"run {run_id} on {describe_url(str(engine.url))}", file=sys.stderr)
    progress = StageProgress()
    try:
        execute_job(engine, lease, on_progress=progress)
    finally:
        progress.close()
    return _report_run(engine, run_id)


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate a version, or (`--retry N`) run again only the rollouts of evaluation N that have no reward.
    Exits 1 while an evaluation has errors: its figures count the answered rollouts only."""
    engine = _engine(args)
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
                                    model=args.model, temperature=args.temperature, route_segments=args.route_segments)
    if args.queue:
        print(f"evaluation {eval_id} queued; a worker (python -m core worker) executes it")
        return 0
    owner = new_worker_id()
    lease = claim_or_explain(engine, "evaluation", eval_id, owner, (JobStatus.QUEUED,))
    gateway = Gateway(engine, concurrency=args.concurrency) if args.concurrency else None
    ev = execute_job(engine, lease, gateway=gateway)
    m = ev.metrics or {}
    if args.json:
        print(json.dumps({"evaluation_id": ev.id, "status": ev.status, "version_id": ev.version_id, "split": ev.split,
                          "k": ev.k, "n": ev.n, "mean_at_k": ev.mean_at_k, "pass_at_k": ev.pass_at_k,
                          "mean_at_k_ci": m.get("mean_at_k_ci"), "pass_at_k_ci": m.get("pass_at_k_ci"),
                          "errors": m.get("errors"), "answered": m.get("answered"), "rollouts": m.get("rollouts"),
                          "unanswered_queries": m.get("unanswered_queries"), "cost": ev.cost, "model": ev.model,
                          "error": ev.error, **({"routes": ev.routes} if ev.routes else {}),
                          **{key: m[key] for key in ("segments", "personas", "criteria") if key in m}}))
    elif ev.status in EVALUATION_HAS_FIGURES:
        print(f"evaluation {ev.id}: {ev.n} queries x k={ev.k} on {ev.split}")
        print(figures_line(ev) + f"  cost ${ev.cost:.4f}")
        for line in breakdown_lines(m, ev.k):
            print(line)
        if ev.status == JobStatus.INCOMPLETE:
            print(f"evaluation {ev.id} is incomplete: {ev.error}\nretry: python -m core eval --retry {ev.id}",
                  file=sys.stderr)
    else:
        print(f"evaluation {ev.id} failed: {ev.error}", file=sys.stderr)
    return 0 if ev.status == JobStatus.COMPLETED else 1


def figures_line(ev: Evaluation) -> str:
    """Mean@k and Pass@k with their intervals and, beside them, the rollouts without a reward they leave out."""
    m = ev.metrics or {}
    lo, hi = m.get("mean_at_k_ci") or (0.0, 0.0)
    plo, phi = m.get("pass_at_k_ci") or (0.0, 0.0)
    errors = m.get("errors", 0)
    counted = f" (of {m['answered']} answered rollouts)" if errors and "answered" in m else ""
    return (f"Mean@{ev.k} {ev.mean_at_k:.3f} [{lo:.3f}, {hi:.3f}]  Pass@{ev.k} {ev.pass_at_k:.3f} [{plo:.3f}, {phi:.3f}]"
            f"{counted}  rollout errors {errors}")


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare B with A on the same queries; evaluations that are missing are run first (exit 0 either way)."""
    engine = _engine(args)
    ids = [evaluation_of(engine, args.task, ref, split=args.split, k=args.k, limit=args.limit) for ref in (args.a, args.b)]
    for eval_id in ids:
        with Session(engine) as session:
            ev = session.get(Evaluation, eval_id)
            if ev is None:
                raise NotFound(f"no evaluation {eval_id}")
            status = ev.status
        if status == JobStatus.QUEUED:
            print(f"running evaluation {eval_id} ...", file=sys.stderr)
            owner = new_worker_id()
            lease = claim_or_explain(engine, "evaluation", eval_id, owner, (JobStatus.QUEUED,))
            ev = execute_job(engine, lease)
            if ev.status not in EVALUATION_HAS_FIGURES:
                print(f"evaluation {eval_id} is {ev.status}: {ev.error or 'waiting for labels'}", file=sys.stderr)
                return 1
    result = compare_evaluations(engine, *ids)
    by_segment = paired_by_segment(engine, *ids)
    s = result.stats
    if args.json:
        figures = s.as_dict()
        print(json.dumps({"evaluation_a": ids[0], "evaluation_b": ids[1], "n_queries": s.n, "k": result.a.k,
                          **{key: figures[key] for key in ("mean_a", "mean_b", "delta", "ci_low", "ci_high", "p_value",
                                                           "wins", "losses", "ties", "pass_a", "pass_b", "mcnemar_p",
                                                           "detectable", "verdict")},
                          "decided": s.decided, "left_out_for_errors": result.missing, "note": result.note,
                          **({"segments": {name: stats.as_dict() for name, stats in by_segment.items()}}
                             if by_segment else {})}))
        return 0
    print(f"A = evaluation {ids[0]}, B = evaluation {ids[1]}: {s.n} queries x k={result.a.k} on {result.a.split}")
    print(f"Mean@k  A {s.mean_a:.3f}  B {s.mean_b:.3f}  B - A {s.delta:+.3f} [{s.ci_low:+.3f}, {s.ci_high:+.3f}] "
          f"(paired bootstrap 95%; a difference is real when this interval excludes 0 and the sign test agrees)")
    print(f"per query: B wins {s.wins}, loses {s.losses}, ties {s.ties}; sign test p = {s.p_value:.3g}")
    print(f"Pass@k  A {s.pass_a:.3f}  B {s.pass_b:.3f}; McNemar p = {s.mcnemar_p:.3g}")
    if result.note:
        print(result.note)
    print(s.verdict)
    for name, stats in by_segment.items():
        print(f"  segment {name}: {stats.verdict}")
    return 0


def breakdown_lines(metrics: dict, k: int) -> list[str]:
    """An evaluation's scores per segment and per criterion (conversation tasks), one line each."""
    lines = []
    for name, row in (metrics.get("segments") or {}).items():
        lo, hi = row["mean_at_k_ci"]
        lines.append(f"  segment {name:<12} {row['n']:>3} queries  Mean@{k} {row['mean_at_k']:.3f} [{lo:.3f}, {hi:.3f}]")
    for name, row in (metrics.get("criteria") or {}).items():
        lines.append(f"  criterion {name:<12} mean {row['mean']:.3f} over {row['n']} conversations")
    return lines


def cmd_library_bind(args: argparse.Namespace) -> int:
    """Bind a library to a persona segment (or unbind it): segment-routed evaluations use it for that segment."""
    if bool(args.segment) == bool(args.unbind):
        raise UsageError("library bind: give --segment SEGMENT or --unbind")
    library = bind_library(_engine(args), args.task, args.library, None if args.unbind else args.segment)
    print(f"library {library.name!r} of {args.task}: " + (f"serves segment {library.segment}" if library.segment
                                                            else "serves no segment"))
    return 0


def cmd_library_selection(args: argparse.Namespace) -> int:
    """Show the library's entry selection, or set it (`--mode all|top_k`, `--k N`; audited)."""
    engine = _engine(args)
    if args.mode is None and args.k is None:
        selection = library_selection(engine, args.task, args.library)
    else:
        selection = set_selection(engine, args.task, args.library, args.mode or library_selection(
            engine, args.task, args.library).mode, args.k, "cli")
    print(f"library {args.library!r} of {args.task}: selection {selection.mode} (k={selection.k}): "
          f"{selection.describe()}")
    return 0


def cmd_library_select(args: argparse.Namespace) -> int:
    """The entries a query would be shown from a version (the HTTP API's selection route, from the terminal)."""
    with Session(_engine(args)) as session:
        served = served_selection(session, args.task, args.library, query=args.query,
                                  label=None if args.version else args.label, version_id=args.version)
    if args.json:
        print(json.dumps(served.as_dict(), ensure_ascii=False))
        return 0
    print(f"version #{served.number} (id {served.version_id}), selection {served.selection['mode']} "
          f"(k={served.selection['k']}): {len(served.entries)} entries")
    for entry in served.entries:
        score = "" if entry["score"] is None else f"{entry['score']:>8.3f}  "
        print(f"{entry['id']:<6}{score}{entry['text']}")
    return 0


def cmd_task_split_by_persona(args: argparse.Namespace) -> int:
    """Hold out whole personas: their scenarios go to test, every other scenario to train."""
    names = name_list(args.test)
    counts = split_by_persona(_engine(args), args.task, names)
    print(f"{args.task}: " + ", ".join(f"{split} {count}" for split, count in sorted(counts.items())))
    return 0


class VariantProgress(StatusLine):
    """A measurement's progress: variants done, the one being evaluated, calls and cost."""

    def __init__(self, engine, run_id: int, stream=sys.stderr) -> None:
        super().__init__(stream)
        self.engine, self.run_id = engine, run_id

    def line(self, c: dict) -> str:
        with Session(self.engine) as session:
            progress = session.get(Run, self.run_id).progress or {}
        current = f" | now: {progress['current']}" if progress.get("current") else ""
        return (f"variants {progress.get('variants_done', 0)}/{progress.get('variants_total', '?')}{current} "
                f"| calls {c['calls']} (cache hits {c['cache_hits']}) | ${c['cost']:.4f}")


def cmd_attribute(args: argparse.Namespace) -> int:
    """Measure each experience of a version (leave-one-out): the estimate first, then the measurement in the
    foreground (unless --queue), then each experience's effect."""
    engine = _engine(args)
    say = sys.stderr if args.json else sys.stdout
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
    owner = new_worker_id()
    lease = claim_or_explain(engine, "run", run_id, owner, WORKER_MAY_CONTINUE if args.resume is not None else (JobStatus.QUEUED,))
    print(f"measurement run {run_id} on {describe_url(str(engine.url))}", file=sys.stderr)
    progress = VariantProgress(engine, run_id)
    try:
        run = execute_job(engine, lease, on_progress=progress)
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
        print(f"run {run_id}: version #{first.version_number} (id {first.version_id}), {first.n} {first.split} "
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


def cmd_worker(args: argparse.Namespace) -> int:
    logging.getLogger().setLevel(logging.INFO)
    for noisy in ("LiteLLM", "litellm", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    engine = _engine(args)
    print(f"worker on {describe_url(str(engine.url))}", file=sys.stderr, flush=True)
    done = serve(engine, poll=args.poll, once=args.once)
    print(f"worker stopped after {done} job(s)", file=sys.stderr)
    return 0


def cmd_model_server(args: argparse.Namespace) -> int:
    configured = get_settings().model
    if not args.model and not configured.startswith(model_server.LOCAL_PREFIX):
        print(f"the studio's model is {configured}, not an embedded one: no model server needed (--model NAME "
              "serves one anyway)", flush=True)
        return 0
    name = args.model or model_server.default_model()
    if args.stop:
        print(f"model server for {name} stopped" if model_server.stop(name) else f"no model server runs for {name}",
              flush=True)
        return 0
    if args.child:
        return model_server.run_child(name, args.slots or get_settings().local_slots)
    return model_server.serve(name, args.slots, idle_exit_s=args.idle_exit, stall_s=args.stall)


def cmd_models_add(args: argparse.Namespace) -> int:
    try:
        params = json.loads(args.params) if args.params else None
    except ValueError:
        raise UsageError(f"--params is not JSON: {args.params!r}") from None
    kind = "litellm" if args.provider else "openai"
    add_connection(_engine(args), args.name, kind, actor="cli", base_url=args.base_url, provider=args.provider,
                   key_env=args.key_env, params=params)
    print(f"connection {args.name} added: models are {args.name}/<model>")
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    with Session(_engine(args)) as session:
        rows = [describe(row) for row in list_connections(session)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        key = {True: "set", False: "NOT SET", None: "no key"}[row["key set here"]]
        print(f"{row['name']:<16} {row['kind']:<8} {row['where']}  key {row['key variable']} ({key})")
    if not rows:
        print("no model connections (python -m core models add NAME --base-url URL)")
    return 0


def cmd_models_test(args: argparse.Namespace) -> int:
    result = try_connection(_engine(args), args.name, args.model, timeout_s=args.timeout)
    print(result.words())
    return 0 if result.ok else 1


def cmd_models_remove(args: argparse.Namespace) -> int:
    remove_connection(_engine(args), args.name, "cli")
    print(f"connection {args.name} removed")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    with Session(_engine(args)) as session:
        task = get_task(session, args.task)
        version = resolve_version(session, task, args.version, args.library)
        if args.route_segments:
            if args.format == "json":
                raise UsageError("export --route-segments writes JSON around md or prompt text: use --format md "
                                 "or prompt")
            text = routed_export(session, task, version, args.format)
        else:
            text = export_version(version.experiences if version else [], args.format,
                                  version_json_meta(task, version))
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    path = Path(args.file)
    text = decode_library(_read_file(path, check_file_size), path.name)
    _print_version(import_library(_engine(args), args.task, text, path.name, library_name=args.library))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    with Session(_engine(args)) as session:
        task_id = get_task(session, args.task).id if args.task else None
        rows = queries.runs(session, task_id)
        tasks = {t.id: t.name for t in queries.list_tasks(session)}
        print(f"{'id':>4}  {'status':<16}{'kind':<7}{'task':<28}{'steps':>7}  {'version':>7}  created")
        for run in rows:
            steps = f"{run.progress.get('steps_done', 0)}/{run.progress.get('steps_total', 0)}"
            print(f"{run.id:>4}  {run.status:<16}{run.kind:<7}{tasks.get(run.task_id, '?')[:27]:<28}{steps:>7}  "
                  f"{run.current_version_id or '-':>7}  {run.created_at:%Y-%m-%d %H:%M}"
                  + (f"  error: {run.error}" if run.error else ""))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    engine = _engine(args)
    with Session(engine) as session:
        if session.get(Run, args.run_id) is None:
            raise NotFound(f"no run {args.run_id}")
    return _report_run(engine, args.run_id)


def cmd_versions(args: argparse.Namespace) -> int:
    with Session(_engine(args)) as session:
        task = get_task(session, args.task)
        for lib in queries.libraries(session, task.id):
            if args.library and lib.name != args.library:
                continue
            names = {}
            for label in queries.labels(session, lib.id):
                names.setdefault(label.version_id, []).append(label.name)
            print(f"library {lib.name!r}")
            for v in queries.versions(session, lib.id):
                tags = f" [{', '.join(names[v.id])}]" if v.id in names else ""
                parent = f" parent {v.parent_id}" if v.parent_id else ""
                print(f"  {v.id:>5}  #{v.number:<4}{v.source:<8}{len(v.experiences):>3} experiences{parent}"
                      f"  {v.created_at:%Y-%m-%d %H:%M}  {v.note}{tags}")
    return 0


def cmd_label(args: argparse.Namespace) -> int:
    """Point a label at a version; `production` moves through the promotion guard (a comparison, or --reason)."""
    label = set_label(_engine(args), args.task, args.version, args.name, "cli", library_name=args.library,
                      reason=args.reason or "")
    print(f"{args.name} -> version {label.version_id}")
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    """Show what promoting a version changes and what the comparison with production says, then move
    `production` (refused, exit 2, without a paired comparison or --reason); --dry-run only shows."""
    engine = _engine(args)
    with Session(engine) as session:
        version_id = version_in_library(session, args.task, args.version, args.library).id
    preview = preview_promotion(engine, version_id)
    current = f"#{preview.production_number} (id {preview.production_id})" if preview.production_id else "none"
    print(f"promote version #{preview.version_number} (id {preview.version_id}) to production; production now: "
          f"{current}")
    print(preview.evidence)
    if preview.changes:
        print(preview.diff_lines())
    if args.dry_run:
        refusal = preview.refusal(args.reason or "")
        print("dry run: nothing moved" + (f"; as given, promoting would be refused: {refusal}" if refusal else ""))
        return 0
    label = promote(engine, version_id, "cli", reason=args.reason or "")
    print(f"production -> version {label.version_id}")
    return 0


def cmd_task_export(args: argparse.Namespace) -> int:
    with Session(_engine(args)) as session:
        text = export_task_json(session, get_task(session, args.name))
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text + "\n")
    return 0


def cmd_task_import(args: argparse.Namespace) -> int:
    path = Path(args.file)
    data = _read_file(path, check_size)
    task = import_task(_engine(args), data, "cli", rename=args.name)
    print(f"imported task {task.name!r}")
    return 0


def cmd_task_personas(args: argparse.Namespace) -> int:
    """Replace a task's personas from a file, or print them (--show) as JSON that can be edited and loaded
    back; one or the other, so a forgotten file name never silently shows instead of saving."""
    if bool(args.file) == bool(args.show):
        raise UsageError("task personas: give a .json or .csv FILE to replace the personas, or --show")
    engine = _engine(args)
    if args.show:
        with Session(engine) as session:
            task = get_task(session, args.task)
            personas = task_personas(session, task.id)
        sys.stdout.write(json.dumps({"personas": persona_dicts(personas)}, ensure_ascii=False, indent=2) + "\n")
        return 0
    path = Path(args.file)
    personas = parse_personas(_read_file(path, check_persona_file_size), path.name)
    count = save_personas(engine, args.task, personas, "cli")
    print(f"{args.task}: {count} personas")
    return 0


def cmd_queue(args: argparse.Namespace) -> int:
    """What waits in the labeling queue of a task, and the agreement between its labellers."""
    with Session(_engine(args)) as session:
        task = get_task(session, args.task)
        counts = labeling.progress(session, task)
        found = labeling.agreement(session, task)
    print(f"{task.name}: {counts.needed} waiting, {counts.done} done, {counts.disputed} disputed")
    if found.fleiss is not None:
        print(f"Fleiss' kappa {found.fleiss:.2f} over {found.items} rollouts with {found.raters_per_item} labels each")
    for (a, b), (kappa, n) in sorted(found.cohen.items()):
        print(f"Cohen's kappa {a} / {b}: {'-' if kappa is None else f'{kappa:.2f}'} over {n} rollouts")
    for row in found.disagreements:
        labels = ", ".join(f"{who} {value}" for who, value in row["labels"].items())
        print(f"disputed: rollout {row['rollout']} ({labels})")
    return 0


def _default(name: str) -> str:
    """A train option's help: the RunSettings field's description and default, so the two never disagree."""
    field = RunSettings.model_fields[name]
    default = field.get_default(call_default_factory=True)
    text = field.description or name.replace("_", " ")
    help_text = f"{text} (default {default})" if default not in (None, "") else text
    return help_text.replace("%", "%%")  # argparse formats help with %


def _task_parsers(sub: argparse._SubParsersAction) -> None:
    """The task commands: demo tasks, dataset files, task files, and a library's segment and entry selection."""
    sub.add_parser("demo", help="ensure the demo tasks exist and print their names").set_defaults(func=cmd_demo)

    dataset = sub.add_parser("dataset", help="add a dataset file to a task, or show a task's data")
    dsub = dataset.add_subparsers(dest="dataset_command", required=True, parser_class=Parser)
    p = dsub.add_parser("add", help="validate a .jsonl, .json or .csv file, then add its new rows to a task")
    p.add_argument("--task", required=True)
    p.add_argument("--map", action="append", default=[], metavar="TARGET=COLUMN",
                   help="which column holds id, query, reference, rubric (or criteria), split; meta=a,b lists "
                        "the columns kept as metadata (default: all unused columns)")
    p.add_argument("--split", choices=list(SPLITS), default="train", help="split of rows that name none")
    p.add_argument("--test-share", type=float, default=0.0, metavar="SHARE",
                   help="hold this share (0-1) of the rows that name no split out for test, chosen by a fixed "
                        "seed so the same file splits the same way (default 0)")
    p.add_argument("--validation-share", type=float, default=0.0, metavar="SHARE",
                   help="hold this share (0-1) of the rows that name no split out for validation (default 0)")
    p.add_argument("--test-personas", metavar="NAMES",
                   help="conversation tasks: comma-separated persona names whose scenarios go to test")
    p.add_argument("file", help="a dataset file; for a conversation task, scenarios (.json or .csv with persona, "
                   "opening, goal, must, must_not)")
    p.set_defaults(func=cmd_dataset_add)
    p = dsub.add_parser("show", help="count a task's samples per split")
    p.add_argument("--task", required=True)
    p.set_defaults(func=cmd_dataset_show)

    task = sub.add_parser("task", help="export a task (settings and data) to a file, or import one")
    tsub = task.add_subparsers(dest="task_command", required=True, parser_class=Parser)
    p = tsub.add_parser("export", help="write a task's settings and samples as one JSON file")
    p.add_argument("name")
    p.add_argument("--output", "-o")
    p.set_defaults(func=cmd_task_export)
    p = tsub.add_parser("import", help="create a task from an exported file (checked whole before writing)")
    p.add_argument("file")
    p.add_argument("--name", help="import under this name instead of the one in the file")
    p.set_defaults(func=cmd_task_import)
    p = tsub.add_parser("personas", help="replace a task's personas from a .json or .csv file, or --show them")
    p.add_argument("task")
    p.add_argument("file", nargs="?", help="personas: a JSON list, {\"personas\": [...]}, or CSV with columns "
                   "name, description, segment, hidden_facts (facts separated by ;)")
    p.add_argument("--show", action="store_true", help="print the task's personas as JSON")
    p.set_defaults(func=cmd_task_personas)
    p = tsub.add_parser("split-by-persona", help="hold whole personas out: their scenarios to test, the rest to train")
    p.add_argument("task")
    p.add_argument("--test", required=True, metavar="NAMES", help="comma-separated persona names")
    p.set_defaults(func=cmd_task_split_by_persona)

    library = sub.add_parser("library", help="bind a library to a persona segment (conversation tasks); show or set "
                             "its entry selection, and the entries a query is shown")
    lsub = library.add_subparsers(dest="library_command", required=True, parser_class=Parser)
    p = lsub.add_parser("bind", help="the library serves this segment in segment-routed evaluations; train it "
                        "with `train --library NAME` (it then trains on that segment's scenarios only)")
    p.add_argument("--task", required=True)
    p.add_argument("--library", required=True)
    p.add_argument("--segment")
    p.add_argument("--unbind", action="store_true")
    p.set_defaults(func=cmd_library_bind)
    p = lsub.add_parser("selection", help="show or set which entries each query is shown: all, or the k most "
                        "similar to the query (top_k, BM25); frozen into each run and evaluation made after")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("--mode", choices=list(SelectionMode))
    p.add_argument("--k", type=int, help="entries per query under top_k (1 to 30; default 3)")
    p.set_defaults(func=cmd_library_selection)
    p = lsub.add_parser("select", help="the entries a query is shown from a version (as the API's selection route)")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("--query", required=True)
    p.add_argument("--label", default="production")
    p.add_argument("--version", type=int, help="a version id instead of a label")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_library_select)


def _model_parsers(sub: argparse._SubParsersAction) -> None:
    """The model connections: where models are served (`<connection>/<model>` then names one)."""
    models = sub.add_parser("models", help="add, list, test or remove model connections (an OpenAI-compatible "
                            "server or a litellm provider; a model is then <connection>/<model>)")
    msub = models.add_subparsers(dest="models_command", required=True, parser_class=Parser)
    p = msub.add_parser("add", help="add a connection")
    p.add_argument("name", help="lower-case, e.g. my-vllm; models are then my-vllm/<model>")
    p.add_argument("--base-url", help="an OpenAI-compatible server's address, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--provider", help="instead of --base-url: a litellm provider (openai, anthropic, deepseek, ...)")
    p.add_argument("--key-env", metavar="VAR", help="the environment variable that holds the key (never the key)")
    p.add_argument("--params", help='default request parameters as JSON, e.g. \'{"temperature": 0.2}\'')
    p.set_defaults(func=cmd_models_add)
    p = msub.add_parser("list", help="the connections, with whether each key variable is set here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models_list)
    p = msub.add_parser("test", help="one short call through a connection: the latency and the reply, or the error")
    p.add_argument("name")
    p.add_argument("--model", required=True, help="the model name the server or provider knows")
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(func=cmd_models_test)
    p = msub.add_parser("remove", help="remove a connection")
    p.add_argument("name")
    p.set_defaults(func=cmd_models_remove)


def _people_parsers(sub: argparse._SubParsersAction) -> None:
    """The people commands: the labeling queue and the users who may sign in."""
    p = sub.add_parser("queue", help="show a task's labeling queue, labeller agreement and disputes")
    p.add_argument("--task", required=True)
    p.set_defaults(func=cmd_queue)

    user = sub.add_parser("user", help="add, list or change the people who may sign in")
    usub = user.add_subparsers(dest="user_command", required=True, parser_class=Parser)
    password_help = ("take the password from this environment variable; without it `user add` reads one line "
                     "from piped stdin, or asks twice on a terminal")
    p = usub.add_parser("add", help="add a user (the first one switches sign-in on)")
    p.add_argument("name")
    p.add_argument("--role", choices=ROLES, required=True)
    p.add_argument("--password-env", metavar="VAR", help=password_help)
    p.set_defaults(func=cmd_user_add)
    usub.add_parser("list", help="list users: name, role, active").set_defaults(func=cmd_user_list)
    p = usub.add_parser("set", help="change a user's role, switch them on or off, or set a new password")
    p.add_argument("name")
    p.add_argument("--role", choices=ROLES)
    p.add_argument("--active", choices=["yes", "no"])
    p.add_argument("--password-env", metavar="VAR", help="set the password from this environment variable")
    p.set_defaults(func=cmd_user_set)


def _job_parsers(sub: argparse._SubParsersAction) -> None:
    """The job commands: train, evaluate, compare, measure experiences, and the worker."""
    p = sub.add_parser("train", help="learn an experience library (or resume a run)")
    p.add_argument("--task")
    p.add_argument("--library", default="default")
    p.add_argument("--epochs", type=int, help=_default("epochs"))
    p.add_argument("--batch-size", type=int, help=_default("batch_size"))
    p.add_argument("--group-size", type=int, help=_default("group_size"))
    p.add_argument("--temperature", type=float, help=_default("temperature"))
    p.add_argument("--limit", type=int, help=_default("limit"))
    p.add_argument("--model", help="policy model (litellm string); default: the task's")
    p.add_argument("--learner-model", help="learner model for summaries, advantages, updates")
    p.add_argument("--no-ground-truth", action="store_true", help="learner sees no reward or reference")
    p.add_argument("--direct", action="store_true", help="baseline: experiences asked for directly, no rollouts")
    p.add_argument("--review", choices=["auto", "manual"], help=_default("review_mode"))
    p.add_argument("--hold-flagged", choices=["on", "off"], help="in auto review, operations with a quality flag "
                   "(cut off, near-duplicate, a query's numbers, too long) are refused before the validation gate "
                   "(invalid, the flag as the reason); off: measured and approved like the others; default: on")
    p.add_argument("--seed", type=int, help=_default("seed"))
    p.add_argument("--max-turns", type=int, help=_default("max_turns"))
    p.add_argument("--concurrency", type=int, help=_default("concurrency"))
    p.add_argument("--max-experiences", type=int, help=_default("max_experiences"))
    p.add_argument("--examples", action="store_true", help="also propose worked examples: a successful attempt of "
                   "a group where others failed, compressed by the learner and proposed only if its own answer "
                   "scores as right against the reference (tasks whose reward is computed from the answer)")
    p.add_argument("--max-examples", type=int, help=_default("max_examples"))
    p.add_argument("--no-lessons", action="store_true", help="learn worked examples only (with --examples): no "
                   "lesson is asked for from the groups")
    p.add_argument("--reference-when-all-fail", action="store_true", help="a group in which every attempt failed "
                   "goes to the learner with the reference answer as the successful side, instead of being skipped "
                   "(off by default, as in the paper)")
    p.add_argument("--max-operations", type=int, help=_default("max_operations"))
    p.add_argument("--gate", choices=[rule.value for rule in GateRule], help=_default("gate"))
    p.add_argument("--validation-size", type=int, help=_default("validation_size"))
    p.add_argument("--gate-k", type=int, help=_default("gate_k"))
    p.add_argument("--budget", type=float, help=_default("budget_usd"))
    p.add_argument("--api-base", help="base URL for an OpenAI-compatible server")
    p.add_argument("--call-timeout", type=float, metavar="S", help=_default("call_timeout_s"))
    p.add_argument("--deadline", type=float, metavar="S", help=_default("call_deadline_s"))
    p.add_argument("--start-label", help=_default("start_label"))
    p.add_argument("--old-share", type=float, help=_default("old_share"))
    p.add_argument("--from-production", action="store_true", help="an update from production: start at the "
                   "production version, train on the harvested traces plus --old-share (default 0.3) of the old "
                   "train split")
    p.add_argument("--resume", type=int, metavar="RUN", help="resume a stopped run")
    p.add_argument("--queue", action="store_true", help="only queue the run; a worker executes it")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a library version on a split (exit 1 while rollouts have errors)")
    p.add_argument("--task")
    p.add_argument("--version", help="version id, label, latest, or empty")
    p.add_argument("--retry", type=int, metavar="ID", help="run again only the rollouts of evaluation ID that have "
                   "no reward (failed model calls); answered ones are not paid again")
    p.add_argument("--split", default="test")
    p.add_argument("--k", type=int, default=1)
    p.add_argument("--limit", type=int)
    p.add_argument("--model")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--concurrency", type=int)
    p.add_argument("--json", action="store_true")
    p.add_argument("--queue", action="store_true", help="only queue the evaluation; a worker executes it")
    p.add_argument("--route-segments", action="store_true", help="conversation tasks: play each scenario with the "
                   "library bound to its persona's segment (its production version, else its newest), the given "
                   "version for the rest")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("compare", help="is B better than A? a paired comparison on the same queries")
    p.add_argument("--task", required=True)
    p.add_argument("a", help="version id, label, latest, empty, or an evaluation as e12")
    p.add_argument("b", help="the same kinds of reference as A")
    p.add_argument("--split", default="test")
    p.add_argument("--k", type=int, default=1)
    p.add_argument("--limit", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("attribute", help="measure each experience of a version: the version against it without "
                       "each one, on the same queries")
    p.add_argument("--task")
    p.add_argument("--version", help="version id, label or latest")
    p.add_argument("--library", default="default")
    p.add_argument("--split", help="split of the queries (default: validation if the task has one, else test)")
    p.add_argument("--k", type=int, default=2, help="samples per query for every variant (default 2)")
    p.add_argument("--limit", type=int, help="use only the first N queries of the split")
    p.add_argument("--concurrency", type=int, help=_default("concurrency"))
    p.add_argument("--budget", type=float, help=_default("budget_usd"))
    p.add_argument("--resume", type=int, metavar="RUN", help="continue a stopped measurement")
    p.add_argument("--queue", action="store_true", help="only queue the measurement; a worker executes it")
    p.add_argument("--json", action="store_true", help="print the effects as a JSON list")
    p.set_defaults(func=cmd_attribute)

    p = sub.add_parser("worker", help="execute queued runs and evaluations until stopped (Ctrl-C, SIGTERM)")
    p.add_argument("--once", action="store_true", help="stop when the queue is empty")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between looks at an empty queue")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("model-server", help="run the embedded model as a supervised local server that every "
                       "process of this machine calls (one per model; `make run` starts it)")
    p.add_argument("--model", default=None, help="embedded model name (default: the studio's model if embedded, "
                   f"else {next(iter(MODELS))})")
    p.add_argument("--slots", type=int, help="requests served at once (default TFGRPO_LOCAL_SLOTS)")
    p.add_argument("--idle-exit", type=float, metavar="S", help="stop after S seconds unused (servers a process "
                   "started for itself)")
    p.add_argument("--stall", type=float, metavar="S", help="restart the server after S seconds of waiting "
                   "requests without a token (default TFGRPO_MODEL_STALL_S)")
    p.add_argument("--stop", action="store_true", help="stop the model's running server (for instance to start "
                   "it again with other TFGRPO_THREADS or slots)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_model_server)


def _version_parsers(sub: argparse._SubParsersAction) -> None:
    """The version commands: export, import, list runs and versions, label and promote."""
    p = sub.add_parser("export", help="print a version as Markdown, JSON or a system-prompt block")
    p.add_argument("--task", required=True)
    p.add_argument("--version", required=True, help="version id, label, latest, or empty")
    p.add_argument("--library", default="default")
    p.add_argument("--format", choices=["md", "json", "prompt"], default="md")
    p.add_argument("--output", "-o")
    p.add_argument("--route-segments", action="store_true", help="conversation tasks: one JSON file with this "
                   "version as the default and, per segment with a bound library, the version that serves it")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("import", help="create a new version from a JSON or Markdown file")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("file")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("runs", help="list runs")
    p.add_argument("--task")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("run", help="show one run: counters, failed groups, rejected operations, its version")
    p.add_argument("run_id", type=int)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("versions", help="list the library versions of a task")
    p.add_argument("--task", required=True)
    p.add_argument("--library")
    p.set_defaults(func=cmd_versions)

    p = sub.add_parser("label", help="point a label (e.g. production) at a version")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("--version", required=True)
    p.add_argument("name")
    p.add_argument("--reason", help="production only: why it moves without a paired comparison with the current "
                   "production version (or although the comparison finds it worse); stored in the audit log")
    p.set_defaults(func=cmd_label)

    p = sub.add_parser("promote", help="move production to a version: shows the diff and the paired comparison "
                       "with production first")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("--version", required=True, help="version id, label or latest")
    p.add_argument("--reason", help="why it moves without a paired comparison (or although the comparison finds "
                   "it worse); stored in the audit log")
    p.add_argument("--dry-run", action="store_true", help="only show the diff and the comparison; move nothing")
    p.set_defaults(func=cmd_promote)


def build_parser() -> Parser:
    """The command line: global options, then each command group's parsers."""
    parser = Parser(prog="python -m core", description="Training-Free GRPO studio engine")
    parser.add_argument("--db", help="SQLAlchemy URL (default: DATABASE_URL or the studio.db SQLite file)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log warnings and retries")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    _task_parsers(sub)
    _people_parsers(sub)
    _model_parsers(sub)
    _job_parsers(sub)
    _version_parsers(sub)
    cli_production.add_parsers(sub, Parser, lambda command: lambda args: command(args, _engine(args)))
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=logging.WARNING if args.verbose else logging.ERROR,
                            format="%(levelname)s %(name)s: %(message)s")
        return args.func(args)
    except (StudioError, *BAD_INPUT) as exc:
        print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return exit_code(exc)
