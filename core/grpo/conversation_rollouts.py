"""One conversation rollout played through the gateway, each turn stored as it is spoken.

core/domain/conversation.py plays the loop with injected model calls; this module supplies them (the policy
model with the library, the user simulator without it) and writes every new turn to ConversationTurn at
once, keyed like the rollout it belongs to. A killed run that plays the same rollout again reads those turns
back and continues from the last one, so completed turns are never paid for twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy.engine import Engine
from sqlmodel import select

from core.domain.conversation import Reply, agent_view, check_stored, play, transcript_text
from core.domain.personas import Persona
from core.domain.prompts import LibraryWording, agent_system_prompt
from core.errors import InvalidInput, ModelCallError
from core.grpo.agent import AgentResult, AgentSettings
from core.models.gateway import Gateway, Scope
from core.records.tasks.scenarios import scenario_of
from storage.db import session_scope
from storage.tables import ConversationTurn, Sample, Task
from storage.writes import insert_or_skip

SIMULATOR_STAGE = "simulator"


@dataclass(frozen=True)
class TurnKey:
    """Which rollout a turn belongs to (a step's or an evaluation's, a sample, a group index)."""

    step_id: int | None
    evaluation_id: int | None
    sample_id: int
    group_index: int

    def where(self) -> list:
        return [ConversationTurn.step_id == self.step_id, ConversationTurn.evaluation_id == self.evaluation_id,
                ConversationTurn.sample_id == self.sample_id, ConversationTurn.group_index == self.group_index]


def stored_turns(engine: Engine, key: TurnKey) -> list[dict]:
    """The turns already spoken in this rollout's conversation, in order."""
    with session_scope(engine) as session:
        rows = session.exec(select(ConversationTurn).where(*key.where()).order_by(ConversationTurn.position)).all()
        return [turn_dict(row) for row in rows]


def turn_dict(row: ConversationTurn) -> dict:
    return {"role": row.role, "text": row.text, "tokens_in": row.tokens_in, "tokens_out": row.tokens_out,
            "ended": row.ended}


def forget_turns(engine: Engine, key: TurnKey) -> None:
    """Drop a conversation's stored turns (they no longer fit its scenario), so it is played afresh."""
    with session_scope(engine) as session:
        for row in session.exec(select(ConversationTurn).where(*key.where())).all():
            session.delete(row)


async def play_conversation(engine: Engine, gateway: Gateway, agent: AgentSettings, task: Task, sample: Sample,
                            persona: Persona, *, key: TurnKey, experiences: list[dict], sample_index: int,
                            scope: Scope, stage: str = "rollout") -> tuple[AgentResult, list[dict]]:
    """Play (or resume) the conversation of one rollout with `persona` (the scenario's); returns the result a
    Rollout row is made of and the turns. A failed model call ends it with `error` set; the turns spoken so far
    stay stored for a resume."""
    scenario = scenario_of(sample)
    simulator_model = agent.simulator_model or agent.model
    spent = {"cost": 0.0}

    def caller(model: str, call_stage: str, who: str):
        async def call(messages: list[dict]) -> Reply:
            turn = len(messages) - 1  # the system message, then every turn so far: a stable seed per turn
            result = await gateway.complete(stage=call_stage, model=model, messages=messages, scope=scope,
                                            temperature=agent.temperature, max_tokens=agent.max_tokens,
                                            sample_index=sample_index,
                                            seed_key=f"{who}\x00{sample.query}\x00{sample_index}\x00{turn}")
            spent["cost"] += result.cost
            return Reply(result.text, result.tokens_in, result.tokens_out)
        return call

    stored = stored_turns(engine, key)
    try:
        check_stored(stored, scenario)
    except InvalidInput:  # turns of an earlier text of this scenario: play it again from the opening
        forget_turns(engine, key)
        stored = []
    turns = list(stored)

    def spoken(turn: dict) -> None:
        """Store a new turn at once, at its position in the conversation."""
        with session_scope(engine) as session:
            insert_or_skip(session, ConversationTurn(
                step_id=key.step_id, evaluation_id=key.evaluation_id, sample_id=key.sample_id,
                group_index=key.group_index, position=len(turns), role=turn["role"], text=turn["text"],
                tokens_in=turn["tokens_in"], tokens_out=turn["tokens_out"], ended=turn["ended"]))
        turns.append(turn)

    started = time.perf_counter()
    wording = LibraryWording.of(task)
    system_prompt = agent_system_prompt(task.instructions, "", experiences, python_tool=False, wording=wording)
    error = None
    try:
        conversation = await play(caller(agent.model, stage, "agent"), caller(simulator_model, SIMULATOR_STAGE, "user"),
                                  persona, scenario, experiences, max_turns=agent.max_turns,
                                  instructions=task.instructions, stored=stored, on_turn=spoken, wording=wording)
        turns = conversation.turns
    except ModelCallError as exc:
        error = str(exc)
    result = AgentResult(messages=agent_view(system_prompt, turns), response=transcript_text(turns), final_answer=None,
                         tokens_in=sum(t["tokens_in"] for t in turns), tokens_out=sum(t["tokens_out"] for t in turns),
                         cost=spent["cost"], latency_ms=(time.perf_counter() - started) * 1000, error=error)
    return result, turns
