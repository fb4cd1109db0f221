"""What the run commands print about a run (`train`, `run`, `review`) and a version (`train`, `import`)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from core.records.review.gate_verdict import GateVerdict
from core.records.runs.settings import run_settings
from storage.statuses import GroupStatus, JobStatus, LabelStatus, OperationStatus, RunKind, StepStatus

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlmodel import Session

    from storage.tables import LibraryVersion, Run, Step

WORKER = "python -m core worker"


def step_title(step: Step, position: int, total: int) -> str:
    """A step as `run` and `review` name it: its place in the run (what `review --step` takes) and the epoch
    and batch the Review page's step picker shows, e.g. "step 2 of 3 · epoch 1 · batch 2"."""
    return f"step {position} of {max(total, position)} · epoch {step.epoch + 1} · batch {step.batch_index + 1}"


def steps_total(run: Run, steps: list[Step]) -> int:
    return int((run.progress or {}).get("steps_total") or 0) or len(steps)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def continue_here(run: Run) -> str:
    """The command that continues a run in this process (a measurement of experiences has its own)."""
    return f"python -m core {'attribute' if run.kind == RunKind.ATTRIBUTE else 'train'} --resume {run.id}"


def worker_or_here(run: Run) -> str:
    """How a queued run goes on: a worker takes it, or this process continues it."""
    return f"a worker continues it ({WORKER}), or {continue_here(run)} here"


def waiting_lines(session: Session, run: Run) -> list[str]:
    """What a run waits for and the command that moves it on: the operations a reviewer decides (`review`),
    the rollouts a person labels, a worker, or a resume; nothing for a run that is over."""
    from core.records.runs.workers import job_health
    from storage import queries
    from storage.tables import Task

    shown = job_health(run.status, run.heartbeat_at)
    steps = queries.steps(session, run.id)
    total = steps_total(run, steps)
    resume = f"python -m core run {run.id} --resume (a worker continues it) or {continue_here(run)} (here)"
    if shown == JobStatus.AWAITING_REVIEW:
        pending = queries.pending_operations_by_step(session, run.id)
        lines = []
        for position, step in enumerate(steps, start=1):
            if step.status != StepStatus.AWAITING_REVIEW and not pending.get(step.id):
                continue
            title = step_title(step, position, total)
            if pending.get(step.id):
                lines.append(f"waits for review: {title}, {plural(pending[step.id], 'operation')} pending; "
                             f"decide: python -m core review {run.id} --step {position}")
            else:
                lines.append(f"waits: every operation of {title} is decided but not applied; apply: "
                             f"python -m core review apply {run.id} --step {position}")
        return lines
    if shown == JobStatus.AWAITING_LABELS:
        task = session.get(Task, run.task_id)
        needed = sum(r.label_status == LabelStatus.NEEDED for step in steps
                     for r in queries.step_rollouts(session, step.id))
        return [f"waits for labels: {plural(needed, 'rollout')} of this run {'needs' if needed == 1 else 'need'} a "
                f"person's label; label them on the Labeling page (python -m core queue --task "
                f"{shlex.quote(task.name)} shows the queue); once labelled the run is queued again and a worker "
                f"({WORKER}) continues it"]
    if shown == JobStatus.QUEUED:
        remeasured = next((step_title(step, position, total) for position, step in enumerate(steps, start=1)
                           if step.status == StepStatus.AWAITING_REVIEW
                           and getattr(GateVerdict.of(step), "remeasure", False)), None)
        why = f"the decided library of {remeasured} is measured before it lands; " if remeasured else ""
        return [f"queued: {why}{worker_or_here(run)}"]
    if shown == JobStatus.RUNNING:
        return [f"running: pause it with python -m core run {run.id} --pause, cancel it with --cancel"]
    if shown == JobStatus.STALLED:
        return [f"stalled: its worker stopped beating; resume it with {resume}"]
    if shown == JobStatus.PAUSED:
        return [f"paused: resume it with {resume}"]
    if shown == JobStatus.FAILED:
        return [f"failed (the error is on the first line); resume it with {resume}"]
    return []


def print_version(version: LibraryVersion | None) -> None:
    """A version's experiences, one a line, or that the library is empty."""
    if version is None:
        print("version: empty library")
        return
    print(f"version #{version.number} ({version.source}): {len(version.experiences)} experiences")
    for exp in version.experiences:
        print(f"  [{exp['id']}] {exp['text']}")


def report_run(engine: Engine, run_id: int) -> int:
    """A run's status, counters, gate verdicts, problems and version; exit code 1 unless it ended well."""
    from sqlmodel import Session

    from core.grpo.training import run_counters
    from core.records.runs.outcome import learned_nothing, production_note, space_note
    from storage import queries
    from storage.tables import LibraryVersion, Run

    with Session(engine) as session:
        run = session.get(Run, run_id)
        counters = run_counters(session, run)
        version = session.get(LibraryVersion, run.current_version_id) if run.current_version_id else None
        problems, gates = [], []
        steps = queries.steps(session, run.id)
        for step in steps:
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
        from_production = production_note(session, run, steps)
    print(f"run {run.id}: {run.status}" + (f" ({run.error})" if run.error else ""))
    if from_production:
        print(f"  {from_production}")
    if run.status == JobStatus.COMPLETED and (nothing := learned_nothing(steps)):
        print(f"  note: {nothing}")
    if space := space_note(steps):
        print(f"  note: {space}")
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
    print_version(version)
    with Session(engine) as session:
        for line in waiting_lines(session, session.get(Run, run_id)):
            print(line)
    return 0 if run.status in (JobStatus.COMPLETED, JobStatus.AWAITING_REVIEW, JobStatus.PAUSED) else 1
