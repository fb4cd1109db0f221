"""The validation gate: a training step's library lands only when it measurably does not hurt.

After a step's operations are proposed (and, in auto mode, before they are approved), the candidate
library is evaluated against the step's starting library on the run's validation queries, `gate_k`
samples each, and the two are compared with the same paired statistics as the Evaluate page
(core.records.comparison). Both evaluations use common random numbers, so the library is the only difference
between them, and the starting library's evaluation is reused when an earlier step (or a resumed run)
already made it. The gate's agent calls go in the ledger under the stage `gate`.
"""

from __future__ import annotations

import asyncio
import random

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.domain.rewards import METHODS
from core.engine.evaluation import experience_texts, run_fixed_evaluation
from core.engine.run_settings import RunSettings
from core.models.gateway import Gateway
from core.records.comparison import Paired, compare_evaluations
from core.records.review import check_step_operations, next_library
from storage import queries
from storage.db import session_scope
from storage.models import LibraryVersion, Run, Step, Task
from storage.statuses import EvaluationPurpose, GateDecision, GateRule, OperationStatus

VALIDATION_SPLIT = "validation"
MAX_HELD_OUT = 50
MIN_HELD_OUT = 8


def held_out_size(n_train: int, setting: int | None) -> int:
    """How many train queries to hold out: the setting, else 20% within 8 to 50, never more than half."""
    if setting is not None:
        return min(setting, max(n_train - 1, 0))
    return min(MAX_HELD_OUT, max(round(0.2 * n_train), min(MIN_HELD_OUT, n_train // 2)))


def choose_validation(session: Session, task: Task, settings: RunSettings,
                      only: set[int] | None = None) -> tuple[str, list[int]]:
    """The run's validation queries: the task's `validation` split when it has one, else a seeded
    sample of its train queries (which training then never uses). Empty when the gate is off or
    `validation_size` is 0. `only` keeps the queries a run may use (a segment library's segment)."""
    if settings.gate == GateRule.OFF or settings.validation_size == 0:
        return VALIDATION_SPLIT, []
    validation = [s for s in queries.samples(session, task.id, VALIDATION_SPLIT) if only is None or s.id in only]
    if validation:
        return VALIDATION_SPLIT, [s.id for s in validation]
    train = sorted(s.id for s in queries.samples(session, task.id, "train") if only is None or s.id in only)
    size = held_out_size(len(train), settings.validation_size)
    return "train", sorted(random.Random(f"validation:{settings.seed}").sample(train, size))


def passes(rule: str, stats: Paired) -> bool:
    """`no_worse`: not significantly worse and the mean not lower; `better`: significantly better."""
    if rule == GateRule.BETTER:
        return stats.n >= 2 and stats.ci_low > 0
    return stats.mean_b >= stats.mean_a and not (stats.n >= 2 and stats.ci_high < 0)


def gate_line(gate: dict) -> str:
    """The gate in one line, as the Review and Train pages and the CLI print it."""
    if gate.get("decision") == GateDecision.SKIPPED:
        return f"validation gate skipped: {gate.get('reason', '')}"
    summary = (f"validation, {gate['n']} queries x {gate['k']}: {gate['mean_before']:.2f} -> {gate['mean_after']:.2f}, "
               f"{gate['delta']:+.2f} [{gate['ci_low']:+.2f}, {gate['ci_high']:+.2f}], p = {gate['p_value']:.2f}: "
               f"{gate['finding']}")
    return f"{summary} - gate {gate['rule']} {gate['decision']}"


def finding(stats: Paired) -> str:
    if stats.n < 2:
        return "cannot decide"
    if stats.ci_low > 0:
        return "better"
    if stats.ci_high < 0:
        return "worse"
    return "no detectable difference"


def candidate_experiences(session: Session, step: Step, ops: list) -> list[dict]:
    """The library the step would make if `ops` (Operation rows) were applied, with the ids it would get."""
    before, checked = check_step_operations(session, step, ops)
    return next_library(session, before, [item.op for _op, item in checked if item.valid])


async def check_step(engine: Engine, gateway: Gateway, run_id: int, step_id: int) -> dict | None:
    """Evaluate the step's candidate (its pending or approved operations applied) against its starting
    library on the validation queries; store and return the figures and the decision on Step.gate.
    None when the gate is off; `skipped` when there is nothing to compare."""
    with Session(engine) as session:
        run, step = session.get(Run, run_id), session.get(Step, step_id)
        settings = RunSettings.from_dict(run.settings)
        if settings.gate == GateRule.OFF:
            return None
        if step.gate is not None:
            return step.gate
        sample_ids = list(run.validation_ids or [])
        split = (run.progress or {}).get("validation_split", VALIDATION_SPLIT)
        ops = [o for o in queries.step_operations(session, step_id)
               if o.status in (OperationStatus.PENDING, OperationStatus.APPROVED, OperationStatus.EDITED)]
        before = session.get(LibraryVersion, step.version_before_id)
        task = session.get(Task, run.task_id)
        after = candidate_experiences(session, step, ops) if ops else before.experiences
    method = METHODS.get(task.reward_method)
    if not sample_ids:
        gate = {"decision": GateDecision.SKIPPED, "rule": settings.gate, "reason": "no validation queries"}
    elif method is not None and method.uses_people and not method.uses_judge:
        gate = {"decision": GateDecision.SKIPPED, "rule": settings.gate,
                "reason": "rewards come from people only; evaluate versions on the Evaluate page instead"}
    elif experience_texts(after) == experience_texts(before.experiences):
        gate = {"decision": GateDecision.SKIPPED, "rule": settings.gate, "reason": "the library would not change"}
    else:
        common = {"purpose": EvaluationPurpose.GATE, "split": split, "sample_ids": sample_ids, "k": settings.gate_k,
                  "model": settings.policy_model, "temperature": settings.temperature, "step_id": step_id}
        before_id, after_id = await asyncio.gather(
            run_fixed_evaluation(engine, gateway, run_id, experiences=before.experiences, version_id=before.id,
                                 **common),
            run_fixed_evaluation(engine, gateway, run_id, experiences=after, **common))
        stats = compare_evaluations(engine, before_id, after_id, seed=settings.seed).stats
        ok = passes(settings.gate, stats)
        gate = {"decision": GateDecision.PASSED if ok else GateDecision.FAILED, "rule": settings.gate,
                "n": stats.n, "k": settings.gate_k, "mean_before": stats.mean_a, "mean_after": stats.mean_b,
                "delta": stats.delta, "ci_low": stats.ci_low, "ci_high": stats.ci_high, "p_value": stats.p_value,
                "wins": stats.wins, "losses": stats.losses, "ties": stats.ties, "finding": finding(stats),
                "verdict": stats.verdict, "evaluation_before": before_id, "evaluation_after": after_id}
    gate["line"] = gate_line(gate)
    with session_scope(engine) as session:
        row = session.get(Step, step_id)
        row.gate = gate
        session.add(row)
    return gate
