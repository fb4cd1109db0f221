"""The task's own reward on production traces, as the worker runs it between jobs (issue 50, item 3).

Which traces, the claim that keeps each to one verdict, and where the verdict lands are in
core/records/production/scoring.py; this module makes the model call, the same one evaluation makes for a
rollout (core/grpo/rollouts.py): the judge for a judged task, the rubric judge for a conversation, a verifier
where a setting stands in for the reference. The calls go in the ledger under the stage `production_judge`,
each with its trace's id, so the Production page can say what scoring production cost.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.domain.personas import Persona, Scenario
from core.domain.rewards import METHODS, score_or_error
from core.models.conversation_judge import judge_conversation
from core.models.gateway import Gateway, Scope
from core.models.judge import judge_response
from core.records.production.scoring import PASS_LIMIT, STAGE, claim, due_traces, store_verdict
from core.records.production.traces import trace_output
from core.records.tasks.scenarios import is_conversation
from core.settings import get_settings
from storage.tables import Sample, Task, Trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Found:
    """A trace's verdict: value in [0, 1] or None, why, doubt, and whether the call failed (retried later)."""

    value: float | None
    detail: str
    unsure: bool
    failed: bool = False
OPENING_CHARS = 2000  # the judge reads the turns; the scenario's opening only has to be a valid one
PRODUCTION_USER = Persona(name="production user", segment="production",
                          description="A real user of the live agent; what they wanted is in their own turns.")


async def verdict(gateway: Gateway, task: Task, trace: Trace) -> Found:
    """The verdict on one trace, by the task's reward as evaluation applies it."""
    scope = Scope(trace_id=trace.id)
    if is_conversation(task):
        sent = trace.turns or [{"role": "user", "text": trace.input}, {"role": "agent", "text": trace.output or ""}]
        turns = [{"role": "assistant" if turn["role"] == "agent" else "user", "text": turn["text"]} for turn in sent]
        scenario = Scenario(persona=PRODUCTION_USER.name, opening=trace.input[:OPENING_CHARS],
                            goal="Help the user with what they asked, as the agent's instructions say.")
        found = await judge_conversation(gateway, task, PRODUCTION_USER, scenario, turns, scope=scope, stage=STAGE)
        return Found(found.value, found.detail, found.unsure, found.failed)
    method = METHODS[task.reward_method]
    if method.uses_judge:
        sample = Sample(task_id=task.id, external_id=f"trace-{trace.id}", query=trace.input)
        found = await judge_response(gateway, task, sample, trace_output(trace), scope=scope, stage=STAGE)
        return Found(found.value, found.detail, found.unsure, found.failed)
    reward = await asyncio.to_thread(score_or_error, task.reward_method, trace_output(trace), None,
                                     task.reward_settings)
    return Found(None, reward.detail, True) if reward.source == "error" else Found(reward.value, reward.detail, False)


async def _score_one(engine: Engine, gateway: Gateway, owner: str, trace_id: int, now: datetime | None) -> bool:
    if not claim(engine, trace_id, owner, now):
        return False  # another worker (or pass) has it, or a person labelled it meanwhile
    with Session(engine) as session:
        trace = session.get(Trace, trace_id)
        task = session.get(Task, trace.task_id)
        session.expunge_all()
    try:
        found = await verdict(gateway, task, trace)
    except Exception as exc:  # noqa: BLE001  (a trace the reward cannot read goes to a person, not round again)
        found = Found(None, f"could not be scored: {type(exc).__name__}: {exc}", True)
    return store_verdict(engine, trace_id, owner, found.value, found.detail, found.unsure, failed=found.failed,
                         now=now)


def score_production(engine: Engine, owner: str, *, gateway: Gateway | None = None, now: datetime | None = None,
                     limit: int = PASS_LIMIT) -> int:
    """One pass: score up to `limit` due production traces; returns how many verdicts landed (0: nothing due)."""
    due = due_traces(engine, now, limit)
    if not due:
        return 0
    gateway = gateway or Gateway(engine, concurrency=get_settings().concurrency)

    async def all_due() -> list[bool]:
        return list(await asyncio.gather(*(_score_one(engine, gateway, owner, trace_id, now) for trace_id in due)))

    landed = sum(asyncio.run(all_due()))
    log.info("worker %s: the task's reward scored %d production trace(s)", owner, landed)
    return landed
