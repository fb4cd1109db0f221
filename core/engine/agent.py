"""One rollout of the agent: the policy model answers a query with the library in its prompt.

In `python` mode the model may write fenced Python blocks; each runs in the sandbox process and
its output is appended as the next message, up to a turn limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from core.domain.answers import extract_final_answer
from core.domain.prompts import agent_messages
from core.domain.sandbox import arun_python, extract_code_blocks, require_jail
from core.errors import InvalidInput, ModelCallError
from core.models.gateway import Gateway, Scope

AGENT_MODES = ("direct", "python")


def check_agent_mode(task_name: str, mode: str) -> None:
    """Refuse a job whose agent mode is unknown, or needs the code jail on a machine without one, when it
    is created rather than when its first answer runs."""
    if mode not in AGENT_MODES:
        raise InvalidInput(f"task {task_name!r} has an unknown agent mode {mode!r}")
    if mode == "python":
        require_jail()


@dataclass
class AgentSettings:
    model: str
    temperature: float = 0.7
    max_tokens: int = 1024
    mode: str = "direct"
    max_turns: int = 3  # python mode: model turns with code output between them; conversations: agent turns
    code_timeout_s: float = 10.0
    simulator_model: str = ""  # conversation tasks: the user simulator ("" = the policy model)


def agent_settings(task, *, model: str, temperature: float, max_tokens: int = 1024,
                   max_turns: int | None = None) -> AgentSettings:
    """How the agent answers for this task: python mode gets `max_turns` model turns (default 3); a
    conversation task plays up to `max_turns` agent turns (default the task's) against its simulator model."""
    conversation = (getattr(task, "kind", None) or "single") == "conversation"
    turns = max_turns or (int(getattr(task, "max_turns", 0) or 4) if conversation else 3)
    return AgentSettings(model=model, temperature=temperature, max_tokens=max_tokens, mode=task.agent_mode,
                         max_turns=turns, simulator_model=(getattr(task, "simulator_model", "") or "") if conversation
                         else "")


@dataclass
class AgentResult:
    messages: list[dict]
    response: str = ""
    final_answer: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0
    error: str | None = None
    tool_calls: int = field(default=0)


async def run_agent(
    gateway: Gateway,
    settings: AgentSettings,
    *,
    instructions: str,
    answer_format: str,
    experiences: list[dict],
    query: str,
    sample_index: int,
    scope: Scope,
    stage: str = "rollout",
) -> AgentResult:
    """Answer one query; a failed model call ends the rollout with `error` set instead of raising.

    Python mode raises InvalidInput before any model call when model-written code cannot be jailed.
    """
    python_tool = settings.mode == "python"
    if python_tool:
        require_jail()
    messages = agent_messages(instructions, answer_format, experiences, query, python_tool)
    result = AgentResult(messages=messages)
    started = time.perf_counter()
    turns = settings.max_turns if python_tool else 1
    for turn in range(turns):
        try:
            call = await gateway.complete(stage=stage, model=settings.model, messages=messages, scope=scope,
                                          temperature=settings.temperature, max_tokens=settings.max_tokens,
                                          sample_index=sample_index, seed_key=f"{query}\x00{sample_index}\x00{turn}")
        except ModelCallError as exc:
            result.error = str(exc)
            break
        result.tokens_in += call.tokens_in
        result.tokens_out += call.tokens_out
        result.cost += call.cost
        messages = [*messages, {"role": "assistant", "content": call.text}]
        result.response = call.text
        blocks = extract_code_blocks(call.text) if python_tool else []
        if not blocks or _has_boxed(call.text):
            break
        outputs = []
        for code in blocks:
            run = await arun_python(code, timeout_s=settings.code_timeout_s)
            result.tool_calls += 1
            outputs.append(run.as_text())
        messages = [*messages, {"role": "user", "content": "Code output:\n" + "\n---\n".join(outputs)}]
    result.messages = messages
    result.final_answer = extract_final_answer(result.response) if result.response else None
    result.latency_ms = (time.perf_counter() - started) * 1000
    return result


def _has_boxed(text: str) -> bool:
    return "\\boxed{" in text
