"""The Training-Free GRPO loop: rollouts, rewards, semantic advantages, library updates.

Every stage writes its result as soon as it completes (rollout rows, summaries, advantages,
operations, versions), and every model call is cached in the ledger, so executing a run again
after a crash replays the same seeded plan, skips what is stored and pays for nothing twice.
A failure inside one group is recorded on that group's Advantage row and the run goes on.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import random
import re
import statistics
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from core.domain.conversation import numbered_transcript
from core.domain.coverage import covering, stating_all
from core.domain.draws import stable_fraction
from core.domain.library import ProposedOp, validate_ops
from core.domain.metrics import is_answered
from core.domain.prompts import (
    REJECTED_SHOWN,
    SUMMARY_TOKENS,
    advantage_messages,
    direct_messages,
    retry_messages,
    scenario_text,
    summary_messages,
    trajectory_text,
    update_messages,
)
from core.domain.quality import screen_ops
from core.domain.replies import AdvantageReply, DirectReply, Reply, update_reply
from core.domain.rewards import METHODS, majority_rewards
from core.domain.selection import Selection
from core.errors import Conflict, InvalidInput, ModelCallError, NotFound, StructuredOutputError
from core.grpo import gate
from core.grpo.agent import AgentSettings, agent_settings, check_agent_mode
from core.grpo.reference_side import learned_from_reference, learns_from_reference, reference_note
from core.grpo.rollouts import stored_rollout
from core.grpo.worked_examples import examples_recorded, propose_examples, store_examples
from core.models.conversation_judge import rubric_settings
from core.models.gateway import REPAIRED, CallResult, Gateway, Scope
from core.models.model_choice import check_model
from core.records.library.promotion import PRODUCTION, production_version
from core.records.library.selection import adopt_selection, selection_of
from core.records.library.versions import create_version, new_experiences
from core.records.notifications.events import notify_run_failed, notify_step_awaiting_review
from core.records.people.roles import require_role
from core.records.review.decisions import (
    apply_step_operations,
    decide_all,
    decided_library_unmeasured,
    reopen_after_gate,
)
from core.records.review.fact_checks import rewrite_check
from core.records.review.gate_verdict import GateVerdict
from core.records.review.labeling import hold_for_labels
from core.records.runs.defaults import Choice, can_verify, chosen_defaults, explicit_values
from core.records.runs.duplicate_jobs import lock_task, refuse_second_run
from core.records.runs.settings import RunSettings, run_settings
from core.records.tasks.lookup import ensure_library, get_task
from core.records.tasks.scenarios import (
    check_task_kind,
    is_conversation,
    persona_of,
    personas_by_name,
    scenario_of,
    segment_sample_ids,
)
from core.settings import get_settings
from storage import queries
from storage.db import session_scope
from storage.statuses import (
    WORKER_MAY_CONTINUE,
    GroupStatus,
    JobStatus,
    LabelStatus,
    OperationStatus,
    RunKind,
    StepStatus,
)
from storage.tables import (
    Advantage,
    AuditEvent,
    Library,
    LibraryVersion,
    Operation,
    Rollout,
    Run,
    Sample,
    Step,
    Task,
)
from storage.tables import utcnow as now
from storage.writes import insert_or_skip, stored, update_by_id, updated_by_id_together, written_or_stored

log = logging.getLogger(__name__)
ProgressCallback = Callable[[dict], None]


def plan_batches(sample_ids: list[int], epochs: int, batch_size: int, seed: int) -> list[tuple[int, int, list[int]]]:
    """(epoch, batch index, sample ids) for the whole run: each epoch a seeded shuffle."""
    plan = []
    for epoch in range(epochs):
        order = sorted(sample_ids)
        random.Random(f"{seed}:{epoch}").shuffle(order)
        for b, start in enumerate(range(0, len(order), batch_size)):
            plan.append((epoch, b, order[start : start + batch_size]))
    return plan


def create_run_with_defaults(engine: Engine, task_name: str, given: RunSettings | Mapping[str, Any], *,
                             library_name: str = "default", kind: str = RunKind.TRAIN,
                             created_by: str = "cli") -> tuple[int, list[Choice]]:
    """Queue a run whose settings are `given` (a RunSettings' explicitly set fields, or a dict whose None values
    are left out) and, for a training run, the defaults chosen for its learner where `given` sets nothing
    (core.records.runs.defaults.chosen_defaults): the Train page's and the CLI's way to start a run. Returns the
    run's id and the defaults chosen, to show with their reasons."""
    if kind != RunKind.TRAIN:  # a direct or measuring run learns no entries from groups: nothing to choose
        settings = given if isinstance(given, RunSettings) else RunSettings.build(**explicit_values(given))
        return create_run(engine, task_name, settings, library_name=library_name, kind=kind,
                          created_by=created_by), []
    with Session(engine) as session:
        settings, choices = chosen_defaults(session, get_task(session, task_name), given, library_name=library_name)
    return create_run(engine, task_name, settings, library_name=library_name, kind=kind,
                      created_by=created_by), choices


def create_run(engine: Engine, task_name: str, settings: RunSettings, *, library_name: str = "default",
               kind: str = RunKind.TRAIN, created_by: str = "cli") -> int:
    """Queue a run (validated) with exactly these settings; `execute_run` or a worker carries it out. The
    library's entry selection is frozen into its settings: every rollout of the run, and its gate, choose entries
    the same way. A selection the settings carry (a default chosen for worked examples, see
    create_run_with_defaults) becomes the library's first, audited, so what the run measures is what the library
    serves afterwards."""
    settings.validate()
    with session_scope(engine) as session:
        require_role(session, created_by, "reviewer", "starting a run")
        task = get_task(session, task_name)
        settings.policy_model = settings.policy_model or task.policy_model or get_settings().model
        settings.learner_model = settings.learner_model or task.learner_model or get_settings().model
        for name in {settings.policy_model, settings.learner_model}:
            check_model(name, settings.api_base, engine)  # here, so the browser, the CLI and production updates meet it
        method = METHODS.get(task.reward_method)
        if not settings.ground_truth and method is not None and not method.scored_by_function:
            raise InvalidInput(f"task {task.name!r} is scored by {task.reward_method}; the no-ground-truth mode "
                             "(majority answers) is for tasks with a final answer to compare, so keep ground truth on")
        check_agent_mode(task.name, task.agent_mode)
        check_task_kind(session, task)
        if settings.examples and (why := can_verify(task)):
            raise InvalidInput(f"worked examples are off for task {task.name!r}: {why}")
        if not queries.samples(session, task.id, "train", limit=1):
            raise InvalidInput(f"task {task.name!r} has no train samples")
        library = ensure_library(session, task, library_name, actor=created_by)
        wanted = Selection.from_dict(settings.selection) if settings.selection else None
        settings.selection = (wanted or selection_of(library)).as_dict()
        if kind == RunKind.TRAIN:  # a gate on too few validation queries is refused now, not when a worker starts
            gate.choose_validation(session, task, settings, only=segment_sample_ids(session, task, library.segment))
        start = queries.latest_version(session, library.id)
        if settings.start_label == PRODUCTION:  # what production serves, also before the first promotion
            start = production_version(session, library)
        elif settings.start_label:
            label = queries.label_by_name(session, library.id, settings.start_label)
            if label is None:
                raise InvalidInput(f"library {library.name!r} has no label {settings.start_label!r} to start from")
            start = session.get(LibraryVersion, label.version_id)
        run = Run(task_id=task.id, library_id=library.id, kind=kind, start_version_id=start.id,
                  current_version_id=start.id, settings=settings.model_dump(), created_by=created_by)
        lock_task(session, task.id)
        refuse_second_run(session, run)  # a form sent twice (a double click, a second tab) queues one run
        session.add(run)
        session.flush()
        session.add(AuditEvent(actor=created_by, action="run.create", object_type="run", object_id=run.id,
                               after={"task": task.name, "kind": kind, "settings": settings.model_dump()}))
        if wanted is not None and wanted != selection_of(library):
            adopt_selection(session, library, wanted, created_by, reason=f"chosen with run {run.id}'s settings")
        return run.id


@dataclass
class _Ctx:
    engine: Engine
    run_id: int
    task: Task
    library: Library
    settings: RunSettings
    gateway: Gateway
    agent: AgentSettings
    on_progress: ProgressCallback | None
    last_tick: float = 0.0
    # Rollouts and summaries in progress at once: a bounded pool, so a batch of hundreds of groups does not
    # make every task read the database and build its request before the first request goes out.
    slots: asyncio.Semaphore | None = None

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(max(1, self.settings.concurrency))

    @property
    def scope(self) -> Scope:
        return Scope(run_id=self.run_id)

    @property
    def selection(self) -> Selection:
        return Selection.from_dict(self.settings.selection)


class _Stop(Exception):
    """The run must stop here (paused, cancelled, awaiting review, budget); its status says why."""


def execute_run(engine: Engine, run_id: int, *, gateway: Gateway | None = None,
                on_progress: ProgressCallback | None = None) -> Run:
    """Carry out (or resume) a run to its end, a pause, or a review; returns the final Run row."""
    return asyncio.run(execute_run_async(engine, run_id, gateway=gateway, on_progress=on_progress))


def check_resumable(session: Session, run_id: int) -> Run:
    """The run, if it exists and can be (re)started; otherwise an error saying why not."""
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound(f"no run {run_id}")
    if run.status not in WORKER_MAY_CONTINUE:
        raise Conflict(f"run {run_id} is {run.status}; only {', '.join(WORKER_MAY_CONTINUE)} runs can be resumed")
    return run


@contextmanager
def collector_spared():
    """The objects alive when a job starts (the imported libraries: litellm's, openai's and pydantic's alone are
    hundreds of thousands) are left out of the garbage collector's full passes until it ends. Each full pass over
    them stopped the event loop for 0.3 s, four times in a paper-scale run (bench/README.md, issue 52 item 6); what
    the job itself makes is still collected, and at the end everything is handed back to the collector."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def execute_run_async(engine: Engine, run_id: int, *, gateway: Gateway | None = None,
                            on_progress: ProgressCallback | None = None) -> Run:
    with collector_spared():
        return await _execute_run(engine, run_id, gateway=gateway, on_progress=on_progress)


async def _execute_run(engine: Engine, run_id: int, *, gateway: Gateway | None,
                       on_progress: ProgressCallback | None) -> Run:
    with session_scope(engine) as session:
        run = check_resumable(session, run_id)
        settings = run_settings(run)
        task = session.get(Task, run.task_id)
        library = session.get(Library, run.library_id)
        run.status, run.error, run.heartbeat_at = JobStatus.RUNNING, None, now()
        run.started_at = run.started_at or now()
        session.add(run)
    gateway = gateway or Gateway(engine, concurrency=settings.concurrency, api_base=settings.api_base,
                                 **settings.gateway_limits())
    agent = agent_settings(task, model=settings.policy_model, temperature=settings.temperature,
                           max_tokens=settings.max_tokens, max_turns=settings.max_turns)
    ctx = _Ctx(engine, run_id, task, library, settings, gateway, agent, on_progress)
    try:
        if run.kind == RunKind.DIRECT:
            await _direct_experiences(ctx)
        elif run.kind == RunKind.ATTRIBUTE:
            from core.grpo.attribution import (
                measure_experiences,  # the attribution job reuses this run machinery
            )

            await measure_experiences(engine, run_id, gateway, check=lambda: _tick(ctx))
        else:
            await _train(ctx)
        _finish(ctx, JobStatus.COMPLETED)
    except _Stop:
        _tick(ctx, final=True)  # stopped from outside (pause, cancel): its counters follow the status
    except Exception as exc:  # noqa: BLE001  (a run that dies records why; the CLI shows it)
        log.exception("run %s failed", run_id)
        unreachable = ctx.gateway.unreachable()  # said first: the reason, and that resuming waits on the server
        _finish(ctx, JobStatus.FAILED, (f"nothing answered at a model's address, so no more calls were sent there: "
                                        f"{unreachable}. Start the server (the Models page's Test says when it "
                                        f"answers), then resume the run. " if unreachable else "")
                + f"{type(exc).__name__}: {exc}")
    with Session(engine) as session:
        return session.get(Run, run_id)


def _finish(ctx: _Ctx, status: str, error: str | None = None) -> None:
    """The run's end and its final counters in one transaction: whoever reads the status reads the counts it
    ended with (a poller that sees `failed` never sees the groups that failed it still uncounted)."""
    with session_scope(ctx.engine) as session:
        run = session.get(Run, ctx.run_id)
        counters = _store_counters(session, run)
        run.status, run.error, run.finished_at = status, error, now()
        notify_run_failed(session, run)
    if ctx.on_progress:
        ctx.on_progress(counters)


def _tick(ctx: _Ctx, *, checkpoint: bool = False, final: bool = False) -> None:
    """Heartbeat, progress snapshot, budget and stop requests: at every checkpoint (step boundary)
    and otherwise at most twice a second."""
    if not (checkpoint or final) and time.monotonic() - ctx.last_tick < 0.5:
        return
    ctx.last_tick = time.monotonic()
    with session_scope(ctx.engine) as session:
        run = session.get(Run, ctx.run_id)
        counters = _store_counters(session, run)
        status = run.status
    if ctx.on_progress:
        ctx.on_progress(counters)
    if final:
        return
    if status in (JobStatus.PAUSED, JobStatus.CANCELLED):
        raise _Stop()
    budget = ctx.settings.budget_usd
    if budget is not None and counters["cost"] >= budget:
        _finish(ctx, JobStatus.PAUSED, f"budget of ${budget:.2f} reached (${counters['cost']:.4f} spent)")
        raise _Stop()


def _store_counters(session: Session, run: Run) -> dict:
    """The run's counters written on its row with a heartbeat, in the caller's transaction (a tick's, or the
    run's end, so the counters land with the status)."""
    counters = run_counters(session, run)
    run.progress = {**run.progress, **counters}
    run.heartbeat_at = now()
    session.add(run)
    return counters


def run_counters(session: Session, run: Run) -> dict:
    """Per-stage counters of a run, derived from what is stored (so they survive restarts)."""
    counts = queries.run_stage_counts(session, run.id)
    totals = queries.call_totals(session, run_id=run.id)
    adv, ops = counts["advantages"], counts["operations"]
    return {
        "steps_done": counts["steps_done"],
        "steps_total": run.progress.get("steps_total", 0),
        "rollouts_done": counts["rollouts"],
        "rollouts_total": run.progress.get("rollouts_total", 0),
        "rollout_errors": counts["rollout_errors"],
        "rewards": counts["rewards"],
        "summaries": counts["summaries"],
        "advantages": adv.get(GroupStatus.OK, 0),
        "groups_skipped": adv.get(GroupStatus.SKIPPED, 0),
        "groups_failed": adv.get(GroupStatus.FAILED, 0),
        "operations": sum(ops.values()),
        "operations_applied": ops.get(OperationStatus.APPLIED, 0),
        "operations_invalid": ops.get(OperationStatus.INVALID, 0),
        "calls": totals["calls"],
        "cache_hits": totals["cache_hits"],
        "replies_repaired": totals["repaired"],
        "replies_malformed": totals["malformed"],
        "tokens_in": totals["tokens_in"],
        "tokens_out": totals["tokens_out"],
        "cost": totals["cost"],
    }


def _validation(ctx: _Ctx) -> list[int]:
    """The run's validation queries, chosen when it first executes and then kept (a resume uses the same)."""
    with session_scope(ctx.engine) as session:
        run = session.get(Run, ctx.run_id)
        if run.validation_ids is None:
            split, ids = gate.choose_validation(session, ctx.task, ctx.settings,
                                                only=segment_sample_ids(session, ctx.task, ctx.library.segment))
            run.validation_ids = ids
            run.progress = {**run.progress, "validation_split": split, "validation_queries": len(ids)}
            session.add(run)
        return list(run.validation_ids)


def _train_sample_ids(session: Session, task: Task, limit: int | None, held_out: list[int],
                      segment: str | None = None, old_share: float | None = None, seed: int = 0) -> list[int]:
    """The training queries: the train split without the held-out validation queries (and, for a library
    bound to a segment, only that segment's scenarios), the first `limit`. An update from production
    (`old_share`) keeps every sample harvested from a trace and a stable share of the others, so the
    library learns from the failures without forgetting what the old train split taught it; the harvested come
    first, so a `limit` never leaves out the failures the run is for."""
    only = segment_sample_ids(session, task, segment)
    kept = [s for s in queries.samples(session, task.id, "train")
            if s.id not in set(held_out) and (only is None or s.id in only)]
    if old_share is not None:
        kept = [s for s in kept if "source_trace" in (s.meta or {})
                or stable_fraction(f"{seed}:{s.id}") < old_share]
        kept.sort(key=lambda s: "source_trace" not in (s.meta or {}))
    ids = [s.id for s in kept]
    return ids[:limit] if limit else ids


async def _train(ctx: _Ctx) -> None:
    s = ctx.settings
    held_out = _validation(ctx)
    with Session(ctx.engine) as session:
        train_ids = _train_sample_ids(session, ctx.task, s.limit, held_out, ctx.library.segment, s.old_share, s.seed)
        if not train_ids:
            raise InvalidInput(f"no training queries are left after holding out {len(held_out)} for validation; "
                               "lower validation_size or add train samples")
        plan = plan_batches(train_ids, s.epochs, s.batch_size, s.seed)
    with session_scope(ctx.engine) as session:
        run = session.get(Run, ctx.run_id)
        run.progress = {**run.progress, "steps_total": len(plan),
                        "rollouts_total": sum(len(ids) for _, _, ids in plan) * s.group_size}
        session.add(run)
    for epoch, batch_index, sample_ids in plan:
        _tick(ctx, checkpoint=True)
        step = _ensure_step(ctx, epoch, batch_index, sample_ids)
        if step.status == StepStatus.COMPLETED:
            continue
        if step.status == StepStatus.AWAITING_REVIEW:
            await _apply_or_wait(ctx, step.id, actor="reviewer")
            continue
        await _run_step(ctx, step)


def _ensure_step(ctx: _Ctx, epoch: int, batch_index: int, sample_ids: list[int]) -> Step:
    with session_scope(ctx.engine) as session:
        step = queries.step_by_position(session, ctx.run_id, epoch, batch_index)
        if step is None:
            run = session.get(Run, ctx.run_id)
            insert_or_skip(session, Step(run_id=ctx.run_id, epoch=epoch, batch_index=batch_index, sample_ids=sample_ids,
                                         version_before_id=run.current_version_id, status=StepStatus.RUNNING))
            step = stored(session, Step, run_id=ctx.run_id, epoch=epoch, batch_index=batch_index)
        return step


async def _apply_or_wait(ctx: _Ctx, step_id: int, actor: str) -> None:
    """Apply the step's decided operations, or mark step and run `awaiting_review` and stop. A decided library
    the gate did not measure (part of the step approved, an operation edited) is measured first, with the
    run's rule; when it does not pass, its operations wait for a person again."""
    with Session(ctx.engine) as session:
        step = session.get(Step, step_id)
        unmeasured = (not any(o.status == OperationStatus.PENDING for o in queries.step_operations(session, step_id))
                      and decided_library_unmeasured(session, step))
    if unmeasured:
        verdict = await gate.check_step(ctx.engine, ctx.gateway, ctx.run_id, step_id, decided_only=True,
                                        check=lambda: _tick(ctx))
        if verdict is not None and (verdict.failed or verdict.undecided):
            reopen_after_gate(ctx.engine, step_id, verdict)
    with session_scope(ctx.engine) as session:
        pending = any(o.status == OperationStatus.PENDING for o in queries.step_operations(session, step_id))
        if pending:
            step, run = session.get(Step, step_id), session.get(Run, ctx.run_id)
            step.status, run.status = StepStatus.AWAITING_REVIEW, StepStatus.AWAITING_REVIEW
            session.add(step)
            session.add(run)
            notify_step_awaiting_review(session, run, step)
    if pending:
        raise _Stop()
    apply_step_operations(ctx.engine, step_id, actor=actor)


class StepFailed(Exception):
    """A step that cannot give a library change (every group failed, or the update did): the run fails with
    this reason, and resuming it redoes the step."""


def _where(step: Step) -> str:
    return f"epoch {step.epoch + 1} batch {step.batch_index + 1}"


def _fail_step(ctx: _Ctx, step: Step, reason: str) -> None:
    with session_scope(ctx.engine) as session:
        row = session.get(Step, step.id)
        row.status, row.error = StepStatus.FAILED, reason
        session.add(row)
    raise StepFailed(f"{_where(step)} failed: {reason}; resume the run to retry it")


async def _run_step(ctx: _Ctx, step: Step) -> None:
    with session_scope(ctx.engine) as session:
        before = session.get(LibraryVersion, step.version_before_id)
        by_id = {sample.id: sample for sample in queries.samples_by_ids(session, list(step.sample_ids))}
        samples = [by_id.get(sid) for sid in step.sample_ids]
        if step.status == StepStatus.FAILED:  # a resumed run redoes the step that failed it
            row = session.get(Step, step.id)
            row.status, row.error = StepStatus.RUNNING, None
            if (verdict := GateVerdict.of(row)) is not None and verdict.undecided:
                row.gate = None  # measured again: the evaluations it made are reused, their failed calls retried
            session.add(row)
    experiences = before.experiences
    while True:
        done, rolled = _stored_groups(ctx, step)
        advantages = await asyncio.gather(*(_process_group(ctx, step, sample, experiences, done.get(sample.id),
                                                           rolled.get(sample.id, set())) for sample in samples))
        if not any(a.status == GroupStatus.WAITING for a in advantages):
            break
        if hold_for_labels(ctx.engine, step_id=step.id, run_id=ctx.run_id):
            raise _Stop()
    _tick(ctx)
    with session_scope(ctx.engine) as session:
        rewards = list(session.exec(select(Rollout.reward)  # the rewards alone, not 500 rows with their messages
                                    .where(Rollout.step_id == step.id, queries.answered())).all())
        row = session.get(Step, step.id)
        row.reward_mean = statistics.fmean(rewards) if rewards else None
        row.reward_std = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0 if rewards else None
        row.stats = {**(row.stats or {}), "groups": len(samples), **{k: sum(1 for a in advantages if a.status == k)
                                                 for k in (GroupStatus.OK, GroupStatus.SKIPPED, GroupStatus.FAILED)},
                     "from_reference": sum(1 for a in advantages if learned_from_reference(a))}
        session.add(row)
        has_ops = bool(queries.step_operations(session, step.id))
    failed = [a for a in advantages if a.status == GroupStatus.FAILED]
    if failed and len(failed) == len(samples) and not has_ops:
        _fail_step(ctx, step, f"every group failed ({len(failed)} of {len(samples)}): {failed[0].error}")
    if not has_ops:
        proposals = [text for a in advantages if a.status == GroupStatus.OK for text in a.proposals]
        source_ids = [a.id for a in advantages if a.status == GroupStatus.OK]
        await _consolidate(ctx, step, experiences, proposals, source_ids)
    if ctx.settings.examples and not examples_recorded(ctx.engine, step.id):  # before the gate measures the step
        found = await propose_examples(ctx.engine, ctx.gateway, ctx.task, step, advantages, scope=ctx.scope,
                                       model=ctx.settings.learner_model, max_tokens=ctx.settings.learner_max_tokens,
                                       learner_replies=ctx.settings.learner_replies)
        store_examples(ctx.engine, step.id, experiences, found, max_size=ctx.settings.max_experiences,
                       max_examples=ctx.settings.max_examples, refuse_flagged=ctx.settings.refuses_flagged(),
                       hold_rewrites=ctx.settings.review_mode == "auto")
    verdict = await gate.check_step(ctx.engine, ctx.gateway, ctx.run_id, step.id, check=lambda: _tick(ctx))
    _tick(ctx)
    if ctx.settings.review_mode == "auto":
        _decide_unattended(ctx, step, verdict)
    await _apply_or_wait(ctx, step.id, actor="auto")




def _decide_unattended(ctx: _Ctx, step: Step, verdict: GateVerdict | None) -> None:
    """Auto review mode decides every pending operation of the step, so the run never waits for a person who
    was not asked: the gate's failure rejects them (reason `validation`), otherwise they are approved (flagged
    ones were refused before the gate, store_operations and store_examples). A gate that could not decide
    (too many validation queries without answers) fails the step with its reason, its operations left pending;
    resuming the run measures again (_run_step), paying only for the calls that failed."""
    if verdict is not None and verdict.undecided:
        _fail_step(ctx, step, f"the validation gate could not decide in auto review mode ({verdict.reason})")
    if verdict is not None and verdict.failed:
        decide_all(ctx.engine, step.id, OperationStatus.REJECTED, actor="gate", comment=verdict.line,
                   reason="validation")
    else:
        decide_all(ctx.engine, step.id, OperationStatus.APPROVED, actor="auto")


def _stored_groups(ctx: _Ctx, step: Step) -> tuple[dict[int, Advantage], dict[int, set[int]]]:
    """The step's stored advantages by sample, and the group indices of its stored rollouts by sample: read once
    per step instead of once per group and per rollout (a paper-scale step asked 600 times, nearly always for
    nothing)."""
    with Session(ctx.engine) as session:
        advantages = {a.sample_id: a for a in session.exec(select(Advantage).where(Advantage.step_id == step.id))}
        keys = session.exec(select(Rollout.sample_id, Rollout.group_index).where(Rollout.step_id == step.id)).all()
    rolled: dict[int, set[int]] = {}
    for sample_id, group_index in keys:
        rolled.setdefault(sample_id, set()).add(group_index)
    return advantages, rolled


async def _process_group(ctx: _Ctx, step: Step, sample: Sample, experiences: list[dict], done: Advantage | None,
                         rolled: set[int]) -> Advantage:
    """Rollouts, rewards, summaries and the semantic advantage of one query's group; `done` is its stored advantage
    and `rolled` the group indices of its stored rollouts (_stored_groups)."""
    if done is not None and done.status in (GroupStatus.OK, GroupStatus.SKIPPED):
        return done
    if (unchanging := _no_change_possible(ctx, step, sample, experiences)):
        skipped = _save_advantage(ctx, step, sample, done, status=GroupStatus.SKIPPED, text=unchanging)
        with session_scope(ctx.engine) as session:  # the plan's rollouts shrink, so the time left follows
            run = session.get(Run, ctx.run_id)
            run.progress = {**run.progress, "rollouts_total": max(
                0, int(run.progress.get("rollouts_total") or 0) - ctx.settings.group_size)}
            session.add(run)
        return skipped
    try:
        rollouts = await asyncio.gather(*(_rollout(ctx, step, sample, g, experiences, stored=g in rolled)
                                          for g in range(ctx.settings.group_size)))
        rollouts = _assign_rewards(ctx, sample, rollouts)
        if any(r.label_status == LabelStatus.NEEDED for r in rollouts):
            return Advantage(step_id=step.id, sample_id=sample.id, status=GroupStatus.WAITING)
        valid = [r for r in rollouts if is_answered(r)]  # a failed call is not a failed answer
        if not valid:
            reason = next((r.error or r.reward_detail for r in rollouts if r.error or r.reward_detail), "no reward")
            return _save_advantage(ctx, step, sample, done, status=GroupStatus.FAILED,
                                   error=f"every rollout failed: {reason}")
        errors = len(rollouts) - len(valid)
        if len(rollouts) > 1 and len(valid) == 1:
            return _save_advantage(ctx, step, sample, done, status=GroupStatus.SKIPPED,
                                   text=f"only 1 of {len(rollouts)} attempts has a reward ({errors} failed calls): "
                                        "nothing to compare it with")
        rewards = [r.reward for r in valid]
        query, reference = _task_for_learner(ctx, sample)
        from_reference = False
        if ctx.settings.ground_truth and len(valid) > 1 and len(set(rewards)) == 1:
            from_reference = learns_from_reference(ctx.settings, rewards, reference)
            if not from_reference:
                left_out = f"; {errors} failed calls left out" if errors else ""
                return _save_advantage(ctx, step, sample, done, status=GroupStatus.SKIPPED,
                                       text=f"all {len(valid)} rewards equal ({rewards[0]:g}){left_out}: "
                                            "no group advantage")
        opening = f"{reference_note(len(valid), rewards[0])} " if from_reference else ""  # first, so it can be told apart
        if not ctx.settings.lessons:  # worked examples only: the group is kept for them, no lesson is asked for
            return _save_advantage(ctx, step, sample, done, status=GroupStatus.OK,
                                   text=f"{opening}Lessons are off in this run: the group is used for worked examples "
                                        "only.")
        summaries = await asyncio.gather(*(_summarise(ctx, sample, r, experiences) for r in valid))
        messages = advantage_messages(query, reference,
                                      [(r.reward, text) for r, text in zip(valid, summaries, strict=True)],
                                      experiences, ctx.settings.ground_truth, conversation=is_conversation(ctx.task),
                                      reference_side=from_reference)
        parsed, call, refused = await _ask_learner(
            ctx, "advantage", messages, AdvantageReply,
            lambda reply, call: _unusable_texts([], [ProposedOp("ADD", [], text) for text in reply.experiences], call))
        kept = [text for i, text in enumerate(parsed.experiences) if i not in refused]
        note = "; ".join(f'proposed experience refused: "{parsed.experiences[i]}" ({why})' for i, why in refused.items())
        return _save_advantage(ctx, step, sample, done, status=GroupStatus.OK, text=f"{opening}{parsed.analysis}",
                               proposals=kept, raw=call.text, error=note or None)
    except _Stop:
        raise
    except StructuredOutputError as exc:
        return _save_advantage(ctx, step, sample, done, status=GroupStatus.FAILED, error=str(exc), raw=exc.raw)
    except Exception as exc:  # noqa: BLE001  (one bad group never stops the run)
        log.warning("group of sample %s failed: %s", sample.id, exc)
        return _save_advantage(ctx, step, sample, done, status=GroupStatus.FAILED, error=f"{type(exc).__name__}: {exc}")


def _no_change_possible(ctx: _Ctx, step: Step, sample: Sample, experiences: list[dict]) -> str | None:
    """Why rolling the sample out could bring no change, only its cost, where the run learns examples only and
    skips such queries (RunSettings.skip_covered); None when it could. Either examples shown to it already state
    every fact of its reference, so an example from its group would be refused as covered; or an example stating
    them all was rejected earlier in this run (by the gate or a reviewer), and any example from its group states
    the same facts (a shop run's gate refused the return-window example in epoch 2 and was asked again in epoch 3,
    each time a group's five rollouts and a validation pass)."""
    s, task = ctx.settings, ctx.task
    if not (s.skip_covered and s.examples and not s.lessons and s.ground_truth):
        return None
    if covered_by := covering(experiences, sample.query, sample.reference, task.reward_method, task.reward_settings,
                              ctx.selection):
        return (f"covered: {', '.join(covered_by)}, shown to this query, each state every fact of its reference, so "
                "it was not rolled out; an example from its group would be refused as covered")
    with Session(ctx.engine) as session:
        rejected = session.exec(select(Operation).where(
            Operation.run_id == ctx.run_id, Operation.step_id < step.id,
            Operation.status == OperationStatus.REJECTED).order_by(Operation.id)).all()
    refused = stating_all([op.text or "" for op in rejected], sample.reference, task.reward_method,
                          task.reward_settings)
    if refused is None:
        return None
    op = rejected[refused]
    return (f"refused before: operation #{op.id}, an example stating every fact of its reference, was rejected in "
            f"step {op.step_id} by {op.reviewer or 'a reviewer'}, so it was not rolled out; an example from its group "
            "would state the same facts")


def _save_advantage(ctx: _Ctx, step: Step, sample: Sample, existing: Advantage | None, *, status: str,
                    text: str | None = None, proposals: list[str] | None = None, raw: str | None = None,
                    error: str | None = None) -> Advantage:
    """The group's advantage row with these values: a new one is one fenced INSERT (storage.writes.written_or_stored,
    no Session: a paper-scale run writes 300 and the Session's insert, read-back and flush cost 2.5 ms each); a row
    already stored (a failed group retried, or another writer's) is updated by id, fenced the same way."""
    values = {"status": status, "text": text, "proposals": proposals or [], "raw_response": raw, "error": error}
    if existing is None:
        new = Advantage(step_id=step.id, sample_id=sample.id, **values)
        existing = written_or_stored(ctx.engine, new, step_id=step.id, sample_id=sample.id)
        if existing is new:
            return new
    update_by_id(ctx.engine, Advantage, existing.id, **values)
    for name, value in values.items():
        setattr(existing, name, value)
    return existing


async def _rollout(ctx: _Ctx, step: Step, sample: Sample, g: int, experiences: list[dict], *,
                   stored: bool = True) -> Rollout:
    row = await stored_rollout(ctx.engine, ctx.gateway, ctx.agent, ctx.task, sample, group_index=g,
                               sample_index=ctx.settings.seed * 10_000 + g, experiences=experiences,
                               selection=ctx.selection, scope=ctx.scope, step_id=step.id,
                               score=ctx.settings.ground_truth, pool=ctx.slots, stored=stored)
    _tick(ctx)
    return row


def _assign_rewards(ctx: _Ctx, sample: Sample, rollouts: list[Rollout]) -> list[Rollout]:
    """Without ground truth the group's own agreement stands in for the reward (source `majority`)."""
    if ctx.settings.ground_truth:
        return rollouts
    valid = [r for r in rollouts if r.error is None]
    results = majority_rewards([r.response or "" for r in valid])
    with session_scope(ctx.engine) as session:
        for row, result in zip(valid, results, strict=True):
            row.reward, row.reward_source, row.reward_detail = result.value, result.source, result.detail
            session.add(row)
    return rollouts


def _task_for_learner(ctx: _Ctx, sample: Sample) -> tuple[str, str | None]:
    """What the learner reads as the task and its reference: the query and reference answer, or for a
    conversation the persona, the opening and the goal (the goal is the reference, already in the text)."""
    if not is_conversation(ctx.task):
        return sample.query, sample.reference
    with Session(ctx.engine) as session:
        persona = persona_of(sample, personas_by_name(session, ctx.task))
    scenario = scenario_of(sample)
    return f"{scenario_text(persona, scenario)}\nThe user opened with: {scenario.opening}", None


def _trajectory(ctx: _Ctx, rollout: Rollout) -> str:
    """The attempt as the learner reads it; a conversation with its turns numbered, shortened past the task's
    transcript budget with a marker that says how much was left out."""
    if not is_conversation(ctx.task):
        return trajectory_text(rollout.messages)
    turns = [{"role": m["role"], "text": m["content"]} for m in rollout.messages if m["role"] in ("user", "assistant")]
    return numbered_transcript(turns, rubric_settings(ctx.task).transcript_chars)


async def _summarise(ctx: _Ctx, sample: Sample, rollout: Rollout, experiences: list[dict]) -> str:
    if rollout.summary:
        return rollout.summary
    query, reference = _task_for_learner(ctx, sample)
    if rollout.shown_ids is not None:  # the learner is told what this attempt was shown, not the whole library
        experiences = [e for i in rollout.shown_ids for e in experiences if e["id"] == i]
    messages = summary_messages(query, reference, rollout.reward, experiences, _trajectory(ctx, rollout),
                                ctx.settings.ground_truth, conversation=is_conversation(ctx.task))
    async with ctx.slots:
        call = await ctx.gateway.complete(stage="summary", model=ctx.settings.learner_model, messages=messages,
                                          scope=ctx.scope,
                                          max_tokens=min(SUMMARY_TOKENS, ctx.settings.learner_max_tokens))
    await updated_by_id_together(ctx.engine, Rollout, rollout.id, summary=call.text.strip())  # fenced, no row load
    _tick(ctx)
    return call.text.strip()


async def _consolidate(ctx: _Ctx, step: Step, experiences: list[dict], proposals: list[str],
                       source_ids: list[int]) -> None:
    """One learner call per batch turns all proposals into operations; invalid ones are kept with a reason."""
    if not proposals:
        return
    limit = ctx.settings.operations_limit()
    messages = update_messages(experiences, proposals, ctx.settings.max_experiences, limit,
                               rejected=_rejected_earlier(ctx, step))
    try:
        reply, _call, refused = await _ask_learner(
            ctx, "update", messages, update_reply(limit),
            lambda reply, call: _unusable_texts(experiences, reply.proposed(), call))
    except StructuredOutputError as exc:
        _fail_step(ctx, step, f"the learner's update failed: {exc} | raw reply: {exc.raw[:500]}")
    except ModelCallError as exc:
        _fail_step(ctx, step, f"the learner's update failed: {exc}")
    store_operations(ctx.engine, step, experiences, reply.proposed(), source_ids,
                     max_size=ctx.settings.max_experiences, refused=refused,
                     refuse_flagged=ctx.settings.refuses_flagged(), hold_rewrites=ctx.settings.review_mode == "auto")


# How core.domain.library.validate_ops begins the reason of a text over its kind's length limit.
TOO_LONG = "text too long"
CUT_BY_TOKENS = "cut off: the learner's reply ended inside this text (its token limit)"


def _closed_in(raw: str, text: str) -> bool:
    """Whether `text` ends in the raw reply as a closed JSON string, its closing quote written by the model. Only
    the end is compared (a repaired escape earlier in the text changes nothing)."""
    tails = {json.dumps(text)[1:-1][-40:], json.dumps(text, ensure_ascii=False)[1:-1][-40:]}
    return any(re.search(re.escape(tail) + r"\s*[\"']", raw or "") for tail in tails)


def _unusable_texts(experiences: list[dict], ops: list[ProposedOp], call: CallResult) -> dict[int, tuple[str, str]]:
    """The learner's texts that cannot be stored whole, by position, with the text and why: over the length
    limit (validate_ops' reason; the schema no longer cuts a string, core.domain.replies), or cut off by the
    learner's token limit (a reply json-repair had to close, whose text is not closed in it)."""
    problems = {}
    for position, op in enumerate(ops):
        error = validate_ops(experiences, [op])[0].error
        if error and error.startswith(TOO_LONG):
            problems[position] = (op.text or "", error)
        elif op.text and call.reply_status == REPAIRED and not _closed_in(call.text, op.text):
            problems[position] = (op.text, CUT_BY_TOKENS)
    return problems


async def _ask_learner(ctx: _Ctx, stage: str, messages: list[dict], reply: type[Reply],
                       unusable: Callable[[Reply, CallResult], dict[int, tuple[str, str]]],
                       ) -> tuple[Reply, CallResult, dict[int, str]]:
    """A learner's structured reply whose texts are whole and within the limit, or the reasons they are not.

    When texts of the first reply are over the limit (or cut off), the learner is asked once more, a different
    sample whose request names those texts and the limit (prompts.retry_messages); the second reply is taken
    whole. What is still unusable then comes back by position with its reason, to be refused: a text is never
    cut to fit. A second request that fails leaves the first reply, its unusable texts refused."""
    parsed, call = await ctx.gateway.complete_json(stage=stage, model=ctx.settings.learner_model, messages=messages,
                                                   reply=reply, scope=ctx.scope,
                                                   max_tokens=ctx.settings.learner_max_tokens)
    problems = unusable(parsed, call)
    if not problems:
        return parsed, call, {}
    try:
        parsed, call = await ctx.gateway.complete_json(
            stage=stage, model=ctx.settings.learner_model, messages=retry_messages(messages, list(problems.values())),
            reply=reply, scope=ctx.scope, max_tokens=ctx.settings.learner_max_tokens, temperature=0.3, sample_index=1)
    except (StructuredOutputError, ModelCallError) as exc:
        log.warning("asking the learner again (%s) failed: %s", stage, exc)
        return parsed, call, {i: f"{why}; asking the learner again failed" for i, (_text, why) in problems.items()}
    return parsed, call, {i: f"{why}; refused after asking the learner again once"
                          for i, (_text, why) in unusable(parsed, call).items()}


def _rejected_earlier(ctx: _Ctx, step: Step) -> list[tuple[str, str]]:
    """The run's most recent rejected operations of earlier steps with why, oldest first, so the learner
    does not propose them again (a person's note, or the validation gate's verdict)."""
    with Session(ctx.engine) as session:
        rows = session.exec(select(Operation).where(Operation.run_id == ctx.run_id, Operation.step_id != step.id,
                                                    Operation.status == OperationStatus.REJECTED)
                            .order_by(Operation.id.desc()).limit(REJECTED_SHOWN)).all()
    rejected = []
    for op in reversed(rows):
        what = op.text or f"{op.op} {', '.join(op.target_ids)}".strip()
        if op.reason == "validation":
            why = "the library with it did worse on the held-out validation queries"
        else:
            why = (op.comment or "").strip() or "no reason was given"
        rejected.append((what, why))
    return rejected


def store_operations(engine: Engine, step: Step, experiences: list[dict], ops: list[ProposedOp],
                     source_ids: list[int], max_size: int | None = None, *, refused: dict[int, str] | None = None,
                     refuse_flagged: bool = False, hold_rewrites: bool = False) -> list[Operation]:
    """Validate and store a step's proposed operations (pending, or invalid with the reason). `refused`: positions
    whose text the learner wrote over the limit twice, with why. `refuse_flagged` (auto review mode with
    hold_flagged): an operation with a quality flag is invalid too, its flags the reason, so the validation gate
    never measures it and it never lands (core.domain.quality.screen_ops). `hold_rewrites` (auto review mode): a
    MODIFY or MERGE that drops a verified fact or adds one its source groups do not hold is left to a person
    (core.domain.facts), so the gate is not the only guard of what the library states."""
    with Session(engine) as session:
        query_texts = [s.query for s in queries.samples_by_ids(session, list(step.sample_ids or []))]
        check = rewrite_check(session, session.get(Task, session.get(Run, step.run_id).task_id),
                              source_ids) if hold_rewrites else None
    checked = screen_ops(experiences, ops, max_size=max_size, refused=refused, refuse_flagged=refuse_flagged,
                         query_texts=query_texts, rewrite_checks={i: check for i in range(len(ops))} if check else None)
    with session_scope(engine) as session:
        for position, item in enumerate(checked):
            insert_or_skip(session, Operation(
                step_id=step.id, run_id=step.run_id, position=position, op=item.op.op, target_ids=item.op.target_ids,
                text=item.op.text, rationale=item.op.rationale, source_advantage_ids=source_ids,
                status=OperationStatus.PENDING if item.valid else OperationStatus.INVALID, validation_error=item.error))
        return queries.step_operations(session, step.id)


async def _direct_experiences(ctx: _Ctx) -> None:
    """The paper's baseline: experiences asked for directly from the training queries, no rollouts."""
    with Session(ctx.engine) as session:
        samples = queries.samples(session, ctx.task.id, "train", limit=ctx.settings.limit or 20)
        queries_ = [(s.query, s.reference if ctx.settings.ground_truth else None) for s in samples]
        existing = session.exec(select(LibraryVersion).where(LibraryVersion.run_id == ctx.run_id)).first()
    if existing is not None:
        return
    parsed, _call = await ctx.gateway.complete_json(
        stage="direct", model=ctx.settings.learner_model, messages=direct_messages(
            ctx.task.instructions, queries_, ctx.settings.direct_count),
        reply=DirectReply, scope=ctx.scope, max_tokens=ctx.settings.learner_max_tokens)
    with session_scope(ctx.engine) as session:
        run = session.get(Run, ctx.run_id)
        library = session.get(Library, run.library_id)
        version = create_version(session, library, new_experiences(session, library, parsed.experiences),
                                 parent_id=None, source="direct", created_by=run.created_by, run_id=run.id,
                                 note="directly generated experiences (baseline, no rollouts)")
        run.current_version_id = version.id
        session.add(run)
