"""The validation gate: a training step's library lands only when it measurably does not hurt.

After a step's operations are proposed (and, in auto mode, before they are approved), the candidate
library is evaluated against the step's starting library on the run's validation queries, `gate_k`
samples each, and the two are compared with the same paired statistics as the Evaluate page
(core.records.evaluation.comparison). Both evaluations use common random numbers, so the library is the only difference
between them, and the starting library's evaluation is reused when an earlier step (or a resumed run)
already made it. The gate's agent calls go in the ledger under the stage `gate`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.domain.held_out import MIN_GATE_QUERIES, VALIDATION_SPLIT, held_out_size
from core.domain.library import experience_texts
from core.domain.rewards import METHODS
from core.errors import InvalidInput
from core.grpo.evaluation import run_fixed_evaluation
from core.models.gateway import Gateway
from core.records.evaluation.comparison import Paired, compare_evaluations, finite
from core.records.review.decisions import library_after
from core.records.review.gate_verdict import GateVerdict
from core.records.runs.outcome import is_harvested
from core.records.runs.settings import RunSettings, run_settings
from storage import queries
from storage.db import session_scope
from storage.statuses import TO_APPLY, EvaluationPurpose, GateDecision, GateRule, OperationStatus
from storage.tables import LibraryVersion, Run, Step, Task


def choose_validation(session: Session, task: Task, settings: RunSettings,
                      only: set[int] | None = None) -> tuple[str, list[int]]:
    """The run's validation queries: the task's `validation` split when it has one, else a seeded
    sample of its train queries (which training then never uses). Empty when the gate is off or
    `validation_size` is 0. `only` keeps the queries a run may use (a segment library's segment). A run from
    production (`old_share`) never holds out a sample harvested from a trace: it must train on every one."""
    if settings.gate == GateRule.OFF or settings.validation_size == 0:
        return VALIDATION_SPLIT, []
    validation = [s for s in queries.samples(session, task.id, VALIDATION_SPLIT) if only is None or s.id in only]
    if validation:
        check_validation_size(len(validation))
        return VALIDATION_SPLIT, [s.id for s in validation]
    train = sorted(s.id for s in queries.samples(session, task.id, "train") if (only is None or s.id in only)
                   and not (settings.old_share is not None and is_harvested(s)))
    size = held_out_size(len(train), settings.validation_size)
    check_validation_size(size)
    return "train", sorted(random.Random(f"validation:{settings.seed}").sample(train, size))


def passes(rule: str, stats: Paired) -> bool:
    """`no_worse`: not significantly worse and the mean not lower; `better`: significantly better. A
    difference is significant when the paired bootstrap interval excludes 0 and the sign test agrees."""
    if rule == GateRule.BETTER:
        return stats.decided and stats.delta > 0
    return stats.mean_b >= stats.mean_a and not (stats.decided and stats.delta < 0)


def gate_line(gate: GateVerdict) -> str:
    """The gate in one line, as the Review and Train pages and the CLI print it."""
    if gate.decision == GateDecision.SKIPPED:
        return f"validation gate skipped: {gate.reason}"
    if gate.decision == GateDecision.UNDECIDED:
        return f"validation gate undecided, nothing of the step is approved or rejected: {gate.reason}"
    low, high = (f"{v:+.2f}" if v is not None else "n/a" for v in (gate.ci_low, gate.ci_high))
    summary = (f"validation, {gate.n} queries x {gate.k}: {gate.mean_before:.2f} -> {gate.mean_after:.2f}, "
               f"{gate.delta:+.2f} [{low}, {high}], sign test p = {gate.p_value:.2f}: {gate.finding}")
    if gate.missing:
        summary += f" ({gate.missing} queries left out: model-call errors)"
    return f"{summary} - gate {gate.rule} {gate.decision}"


def finding(stats: Paired) -> str:
    if stats.n < 2:
        return "cannot decide"
    if stats.decided:
        return "better" if stats.delta > 0 else "worse"
    return "no detectable difference"


def check_validation_size(size: int) -> None:
    """A gate on fewer than MIN_GATE_QUERIES queries decides on noise: refuse it with what to do instead."""
    if 0 < size < MIN_GATE_QUERIES:
        raise InvalidInput(f"the validation gate needs at least {MIN_GATE_QUERIES} validation queries, and this run "
                           f"would have {size}; add train or validation samples, set validation_size to "
                           f"{MIN_GATE_QUERIES} or more, or turn the gate off")


async def check_step(engine: Engine, gateway: Gateway, run_id: int, step_id: int, *,
                     decided_only: bool = False, check: Callable[[], None] | None = None) -> GateVerdict | None:
    """Evaluate the step's candidate (its pending or approved operations applied) against its starting
    library on the validation queries; store and return the figures and the decision on Step.gate.
    None when the gate is off; `skipped` when there is nothing to compare. `decided_only` measures again
    what the reviewers' decisions would land (approved and edited operations only), keeping the first
    measurement (of every proposed operation) under `proposed`, also when the step is measured again twice.
    `check` is the run's stop check (it raises when the run was paused or cancelled): both evaluations call it
    every second, so a cancelled run's gate stops within seconds instead of running on to its end."""
    with Session(engine) as session:
        run, step = session.get(Run, run_id), session.get(Step, step_id)
        settings = run_settings(run)
        if settings.gate == GateRule.OFF:
            return None
        if step.gate is not None and not decided_only:
            return GateVerdict.of(step)
        held = step.gate or {}  # after review, the first verdict is kept (core.records.review.decisions._queue_remeasure)
        first = held.get("proposed") or {key: value for key, value in held.items() if key not in ("remeasure", "proposed")}
        sample_ids = list(run.validation_ids or [])
        split = (run.progress or {}).get("validation_split", VALIDATION_SPLIT)
        wanted = TO_APPLY if decided_only else (OperationStatus.PENDING, *TO_APPLY)
        ops = [o for o in queries.step_operations(session, step_id) if o.status in wanted]
        before = session.get(LibraryVersion, step.version_before_id)
        task = session.get(Task, run.task_id)
        after = library_after(session, step, ops) if ops else before.experiences
    method = METHODS.get(task.reward_method)
    if not sample_ids:
        gate = GateVerdict(decision=GateDecision.SKIPPED, rule=settings.gate, reason="no validation queries")
    elif method is not None and method.uses_people and not method.uses_judge:
        gate = GateVerdict(decision=GateDecision.SKIPPED, rule=settings.gate,
                           reason="rewards come from people only; evaluate versions on the Evaluate page instead")
    elif experience_texts(after) == experience_texts(before.experiences):
        gate = GateVerdict(decision=GateDecision.SKIPPED, rule=settings.gate, reason="the library would not change")
    else:
        common = {"purpose": EvaluationPurpose.GATE, "split": split, "sample_ids": sample_ids, "k": settings.gate_k,
                  "model": settings.policy_model, "temperature": settings.temperature, "step_id": step_id,
                  "selection": settings.selection,  # the run's: the gate measures what training shows
                  "check": check}
        before_id, after_id = await asyncio.gather(
            run_fixed_evaluation(engine, gateway, run_id, experiences=before.experiences, version_id=before.id,
                                 **common),
            run_fixed_evaluation(engine, gateway, run_id, experiences=after, **common))
        comparison = compare_evaluations(engine, before_id, after_id, seed=settings.seed)
        stats = comparison.stats
        measured = {"rule": settings.gate, "k": settings.gate_k, "missing": comparison.missing,
                    "evaluation_before": before_id, "evaluation_after": after_id}
        if stats.undecided:
            gate = GateVerdict(decision=GateDecision.UNDECIDED, reason=stats.undecided, **measured)
        else:
            ok = passes(settings.gate, stats)
            gate = GateVerdict(decision=GateDecision.PASSED if ok else GateDecision.FAILED, n=stats.n,
                               mean_before=stats.mean_a, mean_after=stats.mean_b, delta=stats.delta,
                               ci_low=finite(stats.ci_low), ci_high=finite(stats.ci_high), p_value=stats.p_value,
                               wins=stats.wins, losses=stats.losses, ties=stats.ties, finding=finding(stats),
                               verdict=stats.verdict, **measured)
    gate.line = gate_line(gate)
    if decided_only:
        gate.line = f"measured again after review (the approved and edited operations only): {gate.line}"
        gate.proposed = GateVerdict.model_validate(first)
    with session_scope(engine) as session:
        row = session.get(Step, step_id)
        row.gate = gate.stored()
        session.add(row)
    return gate
