"""The conversation loop (core.domain.conversation) and the user simulator's prompt, with scripted models."""

from __future__ import annotations

import asyncio

import pytest

from core.domain.conversation import Conversation, Reply, left_out_marker, play, render_turn
from core.domain.personas import Persona, Scenario
from core.domain.prompts import END_MARKER, SIMULATOR_CUE, simulator_messages
from core.errors import InvalidInput

PERSONA = Persona(name="Ana", description="A tired parent who writes short messages.", segment="parents",
                  hidden_facts=["Her son is allergic to peanuts."])
SCENARIO = Scenario(persona="Ana", opening="I need a dinner idea for tonight.", goal="Get a safe, quick recipe.",
                    must=["asks about allergies"], must_not=["suggests peanuts"])
EXPERIENCES = [{"id": "E1", "text": "SECRET-LESSON always ask about allergies first."}]
INSTRUCTIONS = "You are CookBot-INTERNAL, a cooking assistant."


class Scripted:
    """An injected model: replies in order (the last one repeats), recording every request."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)
        self.calls: list[list[dict]] = []

    async def __call__(self, messages: list[dict]) -> Reply:
        self.calls.append(messages)
        text = self.texts[min(len(self.calls) - 1, len(self.texts) - 1)]
        return Reply(text, tokens_in=10, tokens_out=len(text))


def run(agent, simulator, **kw) -> Conversation:
    kw.setdefault("max_turns", 5)
    return asyncio.run(play(agent, simulator, PERSONA, SCENARIO, EXPERIENCES, instructions=INSTRUCTIONS, **kw))


def test_the_conversation_ends_when_the_simulator_writes_the_end_marker():
    agent = Scripted("Any allergies?", "Try a tomato pasta.")
    simulator = Scripted("Yes, peanuts.", f"Perfect, thanks! {END_MARKER} ignored after marker")
    conversation = run(agent, simulator)
    assert conversation.ended_by == "user"
    assert [t["role"] for t in conversation.turns] == ["user", "assistant", "user", "assistant", "user"]
    assert conversation.turns[0]["text"] == SCENARIO.opening and conversation.turns[0]["tokens_in"] == 0
    assert conversation.turns[-1]["text"] == "Perfect, thanks!" and conversation.turns[-1]["ended"]
    assert len(agent.calls) == 2 and len(simulator.calls) == 2
    assert conversation.tokens_out == sum(len(t) for t in ["Any allergies?", "Try a tomato pasta.", "Yes, peanuts.",
                                                           f"Perfect, thanks! {END_MARKER} ignored after marker"])


def test_the_conversation_stops_after_max_turns_agent_turns():
    agent, simulator = Scripted("Tell me more."), Scripted("Hmm, not sure.")
    conversation = run(agent, simulator, max_turns=3)
    assert conversation.ended_by == "max_turns"
    assert len(agent.calls) == 3 and len(simulator.calls) == 2  # no simulator reply nobody would answer
    assert conversation.turns[-1]["role"] == "assistant"
    assert not any(t["ended"] for t in conversation.turns)


def test_the_agent_gets_the_library_and_the_simulator_never_does():
    agent = Scripted("Any allergies?", "Pasta then.")
    simulator = Scripted("Peanuts, yes.", f"Great. {END_MARKER}")
    run(agent, simulator)
    system = agent.calls[0][0]["content"]
    assert "SECRET-LESSON" in system and INSTRUCTIONS in system
    for messages in simulator.calls:
        seen = "\n".join(m["content"] for m in messages)
        assert "SECRET-LESSON" not in seen and "CookBot-INTERNAL" not in seen and system not in seen
        assert PERSONA.description in messages[0]["content"] and "peanuts" in messages[0]["content"]
        assert END_MARKER in messages[0]["content"]
    last = simulator.calls[-1]
    # Roles swapped: the opening is the simulator's own (assistant) line, the agent speaks as the user.
    # A cue opens the simulator's side, since several providers refuse an assistant turn right after the system.
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert last[1]["content"] == SIMULATOR_CUE
    last = [last[0], *last[2:]]
    assert last[1]["content"] == SCENARIO.opening and last[2]["content"] == "Any allergies?"


def test_simulator_messages_swap_roles():
    transcript = [{"role": "user", "text": "hi"}, {"role": "assistant", "text": "hello"}]
    messages = simulator_messages(PERSONA, SCENARIO, transcript)
    assert messages[1:] == [{"role": "user", "content": SIMULATOR_CUE}, {"role": "assistant", "content": "hi"},
                            {"role": "user", "content": "hello"}]


def test_replaying_stored_turns_calls_no_model_and_continues_where_it_stopped():
    first_agent, first_sim = Scripted("Any allergies?", "Pasta?", "Rice?"), Scripted("Peanuts.", "No pasta.")
    stored: list[dict] = []
    run(first_agent, first_sim, max_turns=2, on_turn=stored.append)
    assert len(stored) == 4  # opening, agent, simulator, agent: every turn went through on_turn

    crashed_after = stored[:3]  # the process died before the agent's second turn was stored
    agent, simulator = Scripted("Rice with vegetables?"), Scripted(f"Yes! {END_MARKER}")
    new_turns: list[dict] = []
    conversation = run(agent, simulator, stored=crashed_after, on_turn=new_turns.append)
    assert len(agent.calls) == 1 and len(simulator.calls) == 1  # only the turns not stored were paid for
    assert conversation.agent_calls == 1 and conversation.simulator_calls == 1
    assert conversation.turns[:3] == crashed_after
    assert [t["text"] for t in new_turns] == ["Rice with vegetables?", "Yes!"]
    assert agent.calls[0][-1]["content"] == "Peanuts."  # the agent saw the replayed conversation

    again_agent, again_sim = Scripted("x"), Scripted("y")
    finished = run(again_agent, again_sim, stored=conversation.turns)
    assert finished.ended_by == "user" and again_agent.calls == [] and again_sim.calls == []


def test_stored_turns_of_another_conversation_are_refused():
    with pytest.raises(InvalidInput, match="opening"):
        run(Scripted("a"), Scripted("b"), stored=[{"role": "user", "text": "Something else", "tokens_in": 0,
                                                  "tokens_out": 0}])
    with pytest.raises(InvalidInput, match="expected 'assistant'"):
        run(Scripted("a"), Scripted("b"), stored=[{"role": "user", "text": SCENARIO.opening}] * 2)


def turns_of(lengths: list[int]) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "text": str(i % 10) * n, "tokens_in": 0,
             "tokens_out": 0, "ended": False} for i, n in enumerate(lengths)]


def test_a_short_transcript_is_whole():
    conversation = Conversation(turns_of([10, 10, 10]), "max_turns")
    text = conversation.transcript_text(10_000)
    assert text == "\n\n".join(render_turn(t) for t in conversation.turns) and "left out" not in text


def test_a_long_transcript_leaves_out_middle_turns_and_says_how_many():
    conversation = Conversation(turns_of([50, 1000, 1400, 1800, 60, 70]), "max_turns")
    text = conversation.transcript_text(400)
    blocks = [render_turn(t) for t in conversation.turns]
    left_out = blocks[1:4]
    marker = "[... 3 turns (4,220 characters) left out ...]"  # 7+1000, 6+1400, 7+1800: speaker labels count
    assert sum(len(b) for b in left_out) == 4220 and left_out_marker(3, 4220) == marker
    assert text == "\n\n".join([blocks[0], marker, blocks[4], blocks[5]])
    assert len(text) <= 400


def test_a_single_huge_last_turn_is_clipped_with_a_marker_never_silently():
    conversation = Conversation(turns_of([20, 5000]), "max_turns")
    text = conversation.transcript_text(300)
    assert "characters left out" in text and len(text) < 400
    assert text.startswith(render_turn(conversation.turns[0]))
