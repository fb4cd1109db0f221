"""One stored rollout: reuse it if it exists, otherwise sample, score and save it.

Training steps and evaluations share this so that both resume the same way: a stored rollout
without an error is never sampled again, a failed one is replaced.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.engine import Engine
from sqlmodel import select

from core.agent import AgentSettings, run_agent
from core.gateway import Gateway, Scope
from core.rewards import score_or_error
from storage.db import session_scope
from storage.models import Rollout, Sample, Task


async def stored_rollout(engine: Engine, gateway: Gateway, agent: AgentSettings, task: Task, sample: Sample, *,
                         group_index: int, sample_index: int, experiences: list[dict], scope: Scope,
                         step_id: int | None = None, evaluation_id: int | None = None,
                         score: bool = True) -> Rollout:
    """The rollout of (step or evaluation, sample, group index); `score=False` leaves the reward
    to the caller (the no-ground-truth mode scores a whole group at once)."""
    with session_scope(engine) as session:
        row = session.exec(select(Rollout).where(Rollout.step_id == step_id, Rollout.evaluation_id == evaluation_id,
                                                 Rollout.sample_id == sample.id,
                                                 Rollout.group_index == group_index)).first()
        if row is not None and row.error is None:
            return row
        if row is not None:
            session.delete(row)
    result = await run_agent(gateway, agent, instructions=task.instructions, answer_format=task.answer_format,
                             experiences=experiences, query=sample.query, sample_index=sample_index, scope=scope)
    row = Rollout(step_id=step_id, evaluation_id=evaluation_id, sample_id=sample.id, group_index=group_index,
                  messages=result.messages, response=result.response, final_answer=result.final_answer,
                  tokens_in=result.tokens_in, tokens_out=result.tokens_out, cost=result.cost,
                  latency_ms=result.latency_ms, error=result.error)
    if result.error is None and score:
        reward = await asyncio.to_thread(score_or_error, task.reward_method, result.response, sample.reference,
                                         task.reward_settings)
        row.reward, row.reward_source, row.reward_detail = reward.value, reward.source, reward.detail
    with session_scope(engine) as session:
        session.add(row)
    return row
