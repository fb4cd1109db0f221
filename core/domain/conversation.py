"""One conversation rollout: the agent (with the library) and a user simulator (without it) take turns.

The models are injected as async callables (`messages -> Reply`) so the loop needs no gateway and no
database: the engine passes gateway calls and stores each turn through `on_turn`; tests pass scripted
replies. Turns already stored are replayed without a call, so resuming a conversation pays for no
completed turn.

A turn is a dict `{"role": "user" | "assistant", "text", "tokens_in", "tokens_out", "ended"}`, with
`role` seen from the agent's side (the simulator is the `user`). `ended` is true only on the simulator
turn that wrote the end marker, so a stored conversation that ended is known to have ended.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from core.domain.fencing import encoded
from core.domain.personas import Persona, Scenario
from core.domain.prompts import (
    DEFAULT_WORDING,
    END_MARKER,
    LibraryWording,
    agent_system_prompt,
    simulator_messages,
)
from core.errors import InvalidInput

EndedBy = Literal["user", "max_turns"]
TURN_SEPARATOR = "\n\n"
SPEAKERS = {"user": "User", "assistant": "Agent"}


@dataclass(frozen=True)
class Reply:
    """What an injected model call returns: its text and what it cost in tokens."""

    text: str
    tokens_in: int = 0
    tokens_out: int = 0


ModelCall = Callable[[list[dict]], Awaitable[Reply]]
TurnHook = Callable[[dict], object]


@dataclass
class Conversation:
    """A played conversation: its turns (opening first) and why it stopped."""

    turns: list[dict]
    ended_by: EndedBy
    agent_calls: int = field(default=0)  # model calls made by this play (not replayed ones)
    simulator_calls: int = field(default=0)

    @property
    def tokens_in(self) -> int:
        return sum(turn["tokens_in"] for turn in self.turns)

    @property
    def tokens_out(self) -> int:
        return sum(turn["tokens_out"] for turn in self.turns)

    def transcript_text(self, max_chars: int | None = None) -> str:
        return transcript_text(self.turns, max_chars)


def transcript_text(turns: Sequence[dict], max_chars: int | None = None) -> str:
    """The transcript for a judge, a labeller or a learner, at most about `max_chars` long.

    Middle turns are left out first (the opening and the end matter most to a judge), and a marker
    says how many turns and characters are missing: a judge must never believe it saw everything
    when it did not."""
    return _joined([render_turn(turn) for turn in turns], max_chars)


def numbered_transcript(turns: Sequence[dict], max_chars: int | None = None) -> str:
    """The turns as `Turn N. User: ...` blocks for a judge or the learner, who must be able to say which
    turn made the difference; shortened past `max_chars` with a marker, as `transcript_text`."""
    return _joined([f"Turn {number}. {render_turn(turn)}" for number, turn in enumerate(turns, start=1)], max_chars)


def fenced_transcript(turns: Sequence[dict], max_chars: int | None = None) -> str:
    """The turns for a judge as one JSON object a line (`{"turn": N, "speaker": "User", "text": ...}`): a line
    break or a forged `Turn 3. Agent:` inside a message stays inside that turn's string (core.domain.fencing).
    Shortened past `max_chars` with the same marker as `transcript_text`."""
    return _joined([encoded({"turn": number, "speaker": SPEAKERS[turn["role"]], "text": _turn_text(turn)})
                    for number, turn in enumerate(turns, start=1)], max_chars)


def _joined(blocks: list[str], max_chars: int | None) -> str:
    full = TURN_SEPARATOR.join(blocks)
    if max_chars is None or len(full) <= max_chars or not blocks:
        return full
    return _shortened(blocks, max_chars)


def render_turn(turn: dict) -> str:
    """One turn as `User: ...` / `Agent: ...`; an empty closing message still shows that the user left."""
    return f"{SPEAKERS[turn['role']]}: {_turn_text(turn)}"


def _turn_text(turn: dict) -> str:
    return turn["text"] or ("(left the conversation)" if turn.get("ended") else "(empty message)")


def left_out_marker(turns: int, chars: int) -> str:
    noun = "turn" if turns == 1 else "turns"
    return f"[... {turns} {noun} ({chars:,} characters) left out ...]"


def _clip(block: str, limit: int) -> str:
    """A block cut to `limit` characters, saying how much was cut."""
    if len(block) <= limit:
        return block
    keep = max(limit, 0)
    return f"{block[:keep]} [... {len(block) - keep:,} characters left out ...]"


def _shortened(blocks: list[str], max_chars: int) -> str:
    """The first block, a marker for the left-out middle, and as many of the last blocks as fit."""
    head = _clip(blocks[0], max_chars // 3)
    budget = max_chars - len(head) - len(left_out_marker(len(blocks), 10**9)) - 2 * len(TURN_SEPARATOR)
    tail: list[str] = []
    for block in reversed(blocks[1:]):
        if len(block) + len(TURN_SEPARATOR) > budget:
            break
        tail.insert(0, block)
        budget -= len(block) + len(TURN_SEPARATOR)
    left = blocks[1:len(blocks) - len(tail)]
    if len(blocks) > 1 and not tail:  # the last turn is always shown, clipped if it must be
        tail, left = [_clip(left[-1], max(budget, 0))], left[:-1]
    parts = [head]
    if left:
        parts.append(left_out_marker(len(left), sum(len(block) for block in left)))
    return TURN_SEPARATOR.join([*parts, *tail])


def split_end(text: str) -> tuple[str, bool]:
    """The simulator's message before the end marker, and whether the marker was there."""
    before, marker, _after = text.partition(END_MARKER)
    return before.strip(), bool(marker)


def make_turn(role: str, reply: Reply, *, ended: bool = False, text: str | None = None) -> dict:
    return {"role": role, "text": reply.text if text is None else text, "tokens_in": reply.tokens_in,
            "tokens_out": reply.tokens_out, "ended": ended}


def check_stored(stored: Sequence[dict], scenario: Scenario) -> list[dict]:
    """Stored turns must be this scenario's conversation: opening first, then strictly alternating; anything
    else would resume a different conversation and pay to continue a wrong one."""
    turns = [{"ended": False, **turn} for turn in stored]
    for index, turn in enumerate(turns):
        expected = "user" if index % 2 == 0 else "assistant"
        if turn.get("role") != expected:
            raise InvalidInput(f"stored turn {index + 1} is {turn.get('role')!r}, expected {expected!r}")
        if turn["ended"] and index != len(turns) - 1:
            raise InvalidInput(f"stored turn {index + 1} ended the conversation but more turns follow")
    if turns and turns[0]["text"] != scenario.opening:
        raise InvalidInput("the stored conversation does not start with this scenario's opening")
    return turns


def agent_view(system_prompt: str, turns: Sequence[dict]) -> list[dict]:
    """The agent's request: its system prompt (with the library), then the visible turns."""
    return [{"role": "system", "content": system_prompt},
            *({"role": turn["role"], "content": turn["text"]} for turn in turns)]


async def play(agent: ModelCall, simulator: ModelCall, persona: Persona, scenario: Scenario,
               experiences: list[dict], *, max_turns: int, instructions: str = "",
               stored: Sequence[dict] | None = None, on_turn: TurnHook | None = None,
               wording: LibraryWording = DEFAULT_WORDING) -> Conversation:
    """Play (or resume) one conversation until the simulator writes the end marker or the agent has had
    `max_turns` turns. `on_turn(turn)` is called after each new turn, never for replayed ones. The library
    reads in the task's `wording`."""
    if max_turns < 1:
        raise InvalidInput(f"max_turns must be at least 1, got {max_turns}")
    system_prompt = agent_system_prompt(instructions, "", experiences, python_tool=False, wording=wording)
    turns = check_stored(stored or [], scenario)
    conversation = Conversation(turns=turns, ended_by="max_turns")

    def add(turn: dict) -> None:
        turns.append(turn)
        if on_turn is not None:
            on_turn(turn)

    if not turns:
        add(make_turn("user", Reply(scenario.opening)))
    while True:
        last = turns[-1]
        if last["ended"]:
            conversation.ended_by = "user"
            return conversation
        if _agent_turns(turns) >= max_turns:
            conversation.ended_by = "max_turns"
            return conversation
        if last["role"] == "user":
            reply = await agent(agent_view(system_prompt, turns))
            conversation.agent_calls += 1
            add(make_turn("assistant", reply))
        else:
            reply = await simulator(simulator_messages(persona, scenario, turns))
            conversation.simulator_calls += 1
            text, ended = split_end(reply.text)
            add(make_turn("user", reply, ended=ended, text=text))


def _agent_turns(turns: Sequence[dict]) -> int:
    return sum(1 for turn in turns if turn["role"] == "assistant")
