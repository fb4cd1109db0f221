"""One stored rollout: reuse it if it exists, otherwise sample, score and save it.

Training steps and evaluations share this so that both resume the same way: a stored rollout
without an error is never sampled again, a failed one (its model call, or its scoring) is replaced; the
agent's calls that succeeded come back from the ledger's cache, so a retry pays only for what failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from dataclasses import dataclass, field

from sqlalchemy import bindparam
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from core.domain import scoring
from core.domain.personas import Persona
from core.domain.prompts import LibraryWording
from core.domain.rewards import METHODS, RewardResult, scores_or_errors
from core.domain.selection import Selection, entry_ids, select_entries
from core.grpo.agent import AgentSettings, run_agent
from core.grpo.conversation_rollouts import TurnKey, play_conversation
from core.models.conversation_judge import judge_conversation
from core.models.gateway import Gateway, Scope
from core.models.judge import judge_response
from core.records.review.labeling import labels_per_rollout, needs_person
from core.records.tasks.scenarios import is_conversation, persona_of, personas_by_name, scenario_of
from storage.db import session_scope
from storage.loop_batches import Batch, asked_together, queues, settle
from storage.statuses import LabelStatus
from storage.tables import Rollout, Sample, Task, utcnow
from storage.writes import written_or_stored_together

ALL_ENTRIES = Selection()  # the paper's behaviour: every entry of the library in every prompt


async def stored_rollout(engine: Engine, gateway: Gateway, agent: AgentSettings, task: Task, sample: Sample, *,
                         group_index: int, sample_index: int, experiences: list[dict], scope: Scope,
                         selection: Selection = ALL_ENTRIES,
                         step_id: int | None = None, evaluation_id: int | None = None,
                         score: bool = True, stage: str = "rollout", people: bool = True,
                         pool: asyncio.Semaphore | None = None, stored: bool = True) -> Rollout:
    """The rollout of (step or evaluation, sample, group index). The agent is shown the entries of
    `experiences` that `selection` chooses for the sample's query (core.domain.selection, the one place that
    choice is made), and the rollout stores their ids. `score=False` leaves the reward
    to the caller (the no-ground-truth mode scores a whole group at once). `stage` names the agent's
    calls in the ledger (a validation gate's rollouts are `gate`, so their cost shows apart).
    `people=False` keeps the judge's reward and never queues the rollout for a label (the engine's own
    measurements cannot wait for people). `pool` bounds how many rollouts read the database and sample at
    once (their scoring runs outside it, so the order of model calls depends on nothing but the loop).
    `stored=False` says the caller read that no such rollout is stored (a training step reads its rollouts' keys
    once), so it is not looked for; a row written meanwhile by another writer is still the one kept."""
    async with pool or contextlib.nullcontext():
        if stored and _stored_id(engine, step_id, evaluation_id, sample.id, group_index) is not None:
            with session_scope(engine) as session:
                row = session.exec(select(Rollout).where(
                    Rollout.step_id == step_id, Rollout.evaluation_id == evaluation_id, Rollout.sample_id == sample.id,
                    Rollout.group_index == group_index)).first()
                if row is not None and row.error is None and row.reward_source != "error":
                    return row
                if row is not None:
                    session.delete(row)
        played: tuple[Persona, list[dict]] | None = None
        experiences = select_entries(experiences, sample.query, selection)
        if is_conversation(task):
            with Session(engine) as session:
                persona = persona_of(sample, personas_by_name(session, task))
            key = TurnKey(step_id, evaluation_id, sample.id, group_index)
            result, turns = await play_conversation(engine, gateway, agent, task, sample, persona, key=key,
                                                    experiences=experiences, sample_index=sample_index, scope=scope,
                                                    stage=stage)
            played = (persona, turns)
        else:
            result = await run_agent(gateway, agent, instructions=task.instructions,
                                     answer_format=task.answer_format, experiences=experiences, query=sample.query,
                                     sample_index=sample_index, scope=scope, stage=stage,
                                     wording=LibraryWording.of(task))
    row = Rollout(step_id=step_id, evaluation_id=evaluation_id, sample_id=sample.id, group_index=group_index,
                  messages=result.messages, response=result.response, final_answer=result.final_answer,
                  tokens_in=result.tokens_in, tokens_out=result.tokens_out, cost=result.cost,
                  latency_ms=result.latency_ms, error=result.error, shown_ids=entry_ids(experiences),
                  scores=None, created_at=utcnow())  # given: pydantic reads a default factory's signature each time
    if result.error is None and score:
        await _assign_reward(gateway, task, sample, row, scope, sample_index, people, played)
    # a row another writer stored meanwhile stays; it is the one returned
    return await written_or_stored_together(engine, row, step_id=step_id, evaluation_id=evaluation_id,
                                            sample_id=sample.id, group_index=group_index)


@functools.cache
def _lookup(by_step: bool, by_evaluation: bool):
    """The id of the rollout of (step or evaluation, sample, group index), a statement built once per shape: a NULL
    key is compared with IS NULL, which a bound parameter cannot say."""
    key = [Rollout.sample_id == bindparam("sample_id"), Rollout.group_index == bindparam("group_index"),
           Rollout.step_id == bindparam("step_id") if by_step else Rollout.step_id.is_(None),
           Rollout.evaluation_id == bindparam("evaluation_id") if by_evaluation else Rollout.evaluation_id.is_(None)]
    return select(Rollout.id).where(*key).limit(1)


def _stored_id(engine: Engine, step_id: int | None, evaluation_id: int | None, sample_id: int,
               group_index: int) -> int | None:
    """Whether the rollout is stored, asked through a connection: nearly every rollout of a run is new, and loading
    the whole row through the ORM to find none cost a paper-scale run 1,500 ORM queries."""
    values = {"sample_id": sample_id, "group_index": group_index}
    if step_id is not None:
        values["step_id"] = step_id
    if evaluation_id is not None:
        values["evaluation_id"] = evaluation_id
    with engine.connect() as connection:
        return connection.execute(_lookup(step_id is not None, evaluation_id is not None), values).scalar()


async def _assign_reward(gateway: Gateway, task: Task, sample: Sample, row: Rollout, scope: Scope,
                         sample_index: int, people: bool = True,
                         played: tuple[Persona, list[dict]] | None = None) -> None:
    """A verifier's reward, the judge's, or a place in the labeling queue (with the judge's suggestion);
    `played` is a conversation's persona and turns."""
    if played is not None:
        await _assign_conversation_reward(gateway, task, sample, row, scope, sample_index, people, *played)
        return
    method = METHODS.get(task.reward_method)
    if method is None or method.scored_by_function:  # an unknown method becomes an `error` reward here
        reward = await _scored_together(task.reward_method, task.reward_settings, row.response, sample.reference)
        row.reward, row.reward_source, row.reward_detail = reward.value, reward.source, reward.detail
        return
    unsure = False
    if method.uses_judge:
        verdict = await judge_response(gateway, task, sample, row.response or "", scope=scope,
                                       sample_index=sample_index)
        unsure = row.judge_unsure = verdict.unsure
        if verdict.value is None and not method.uses_people:  # no person will give the reward instead
            row.reward, row.reward_source, row.reward_detail = 0.0, "error", verdict.detail
            return
        row.reward, row.reward_source, row.reward_detail = verdict.value, "judge", verdict.detail
        row.suggested_reward, row.suggested_detail = verdict.value, verdict.detail
    _queue_if_needed(task, row, unsure, people)


@dataclass(frozen=True)
class _Scoring:
    """What makes the scores asked for in one pass one batch: the method and its settings (compared as sorted JSON)."""

    method: str
    key: str
    settings: dict | None = field(compare=False, hash=False)


_scores = queues()


async def _scored_together(method: str, settings: dict | None, response: str | None,
                           reference: str | None) -> RewardResult:
    """score_or_error in a thread, for the responses the loop's tasks ask to score under the same method and settings
    before its next pass all at once (storage.loop_batches): split among the scoring processes, each share one round
    trip to one process (scores_or_errors). A level's 500 rollouts reply together, and a thread and a round trip
    each cost the loop more than the scores."""
    group = _Scoring(method, json.dumps([method, settings or {}], sort_keys=True, default=str), settings)
    return await asked_together(_scores, group, (response, reference), _send)


def _send(group: _Scoring, batch: Batch) -> None:
    """The batch asked for under `group`, a share to each scoring process, each share in a thread of its own."""
    loop = asyncio.get_running_loop()
    shares = max(1, min(scoring.limits().processes, len(batch)))
    for part in (batch[i::shares] for i in range(shares)):
        done = loop.run_in_executor(None, scores_or_errors, group.method, [answer for answer, _ in part],
                                    group.settings)
        done.add_done_callback(functools.partial(_settle, [future for _, future in part]))


def _settle(futures: list[asyncio.Future], done: asyncio.Future) -> None:
    error = done.exception() if not done.cancelled() else asyncio.CancelledError()
    results = [error] * len(futures) if error is not None else done.result()
    for future, result in zip(futures, results, strict=True):
        if isinstance(result, BaseException):
            settle(future, error=result)
        else:
            settle(future, result=result)


def _queue_if_needed(task: Task, row: Rollout, unsure: bool, people: bool) -> None:
    """Put the rollout in the labelling queue when the task's method says a person decides this one."""
    key = f"{row.step_id}:{row.evaluation_id}:{row.sample_id}:{row.group_index}"
    if people and needs_person(task, unsure, key):
        row.reward, row.reward_source, row.label_status = None, None, LabelStatus.NEEDED
        row.reward_detail = "waiting for a label"
        row.labels_needed = labels_per_rollout(task)


async def _assign_conversation_reward(gateway: Gateway, task: Task, sample: Sample, row: Rollout, scope: Scope,
                                      sample_index: int, people: bool, persona: Persona, turns: list[dict]) -> None:
    """The rubric judge's reward for a conversation (a person's when unsure, or in the spot-check share)."""
    verdict = await judge_conversation(gateway, task, persona, scenario_of(sample), turns, scope=scope,
                                       sample_index=sample_index)
    row.judge_unsure, row.scores = verdict.unsure, verdict.scores or None
    if verdict.value is None and not people:
        row.reward, row.reward_source, row.reward_detail = 0.0, "error", verdict.detail
        return
    row.reward, row.reward_source, row.reward_detail = verdict.value, "judge", verdict.detail
    row.suggested_reward, row.suggested_detail = verdict.value, verdict.detail
    _queue_if_needed(task, row, verdict.unsure or verdict.value is None, people)
