"""One rollout of the agent: the policy model answers a query with the library in its prompt.

`python` mode is tool-integrated reasoning as Qwen2.5-Math's evaluation runs it (core.domain.code_runs):
every model call asks the provider to stop at "```output", where the model would start writing its code's
result; the last Python block of that message runs in the jail (core.domain.sandbox), its real output goes
back as "```output ... ```", and the model continues, up to `max_turns` model calls. A message that holds
code is never final, even when it also boxes an answer: that answer was written before the code ran.

Continuation is a new pair of messages, not the same assistant message extended: the assistant message
(cut at the stop sequence, so it ends with the code block), then a user message holding only the output
fence, then the model's next assistant message. Many chat templates and hosted APIs cannot continue an
assistant message, and a user turn that holds nothing but the fenced output reads, to a model trained on
this convention, like the text it expected next. That user message also stores the run (code, output,
seconds, exit status) under "code_run", so the run is part of the stored rollout; the key is stripped
before messages go to a provider (code_runs.for_model).

When the turn limit is reached while the last message still holds code, the rollout ends without a final
answer (`response` empty): its boxed answer, if any, was a guess made before the code ran.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from core.domain.agent_modes import AGENT_MODES
from core.domain.answers import extract_final_answer
from core.domain.code_runs import (
    STOP_SEQUENCES,
    CodeRun,
    cut_at_stop,
    for_model,
    output_message,
    pending_code,
)
from core.domain.prompts import DEFAULT_WORDING, LibraryWording, agent_messages
from core.domain.sandbox import arun_python, require_jail
from core.errors import InvalidInput, ModelCallError
from core.models.gateway import Gateway, Scope


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
    max_turns: int = 3  # python mode: model calls, with a code run between two of them; conversations: agent turns
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
    tool_calls: int = field(default=0)  # code runs (python mode)
    code_pending: bool = False  # the turn limit came while the last message still held code that did not run


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
    wording: LibraryWording = DEFAULT_WORDING,
) -> AgentResult:
    """Answer one query; a failed model call ends the rollout with `error` set instead of raising. The library
    reads in the task's `wording` (its header and examples' intro, core.domain.prompts.LibraryWording.of).

    Python mode raises InvalidInput before any model call when model-written code cannot be jailed.
    """
    python_tool = settings.mode == "python"
    if python_tool:
        require_jail()
    messages = agent_messages(instructions, answer_format, experiences, query, python_tool, wording)
    result = AgentResult(messages=messages)
    started = time.perf_counter()
    turns = settings.max_turns if python_tool else 1
    for turn in range(turns):
        try:
            call = await gateway.complete(stage=stage, model=settings.model, messages=for_model(messages), scope=scope,
                                          temperature=settings.temperature, max_tokens=settings.max_tokens,
                                          sample_index=sample_index, seed_key=f"{query}\x00{sample_index}\x00{turn}",
                                          stop=STOP_SEQUENCES if python_tool else None)
        except ModelCallError as exc:
            result.error = str(exc)
            break
        result.tokens_in += call.tokens_in
        result.tokens_out += call.tokens_out
        result.cost += call.cost
        text = cut_at_stop(call.text) if python_tool else call.text
        messages = [*messages, {"role": "assistant", "content": text}]
        result.response = text
        code = pending_code(text) if python_tool else None
        if code is None:
            break
        if turn == turns - 1:  # no turn left to read the output: the code stays unrun, and nothing here is final
            result.code_pending, result.response = True, ""
            break
        began = time.perf_counter()
        run = await arun_python(code, timeout_s=settings.code_timeout_s)
        result.tool_calls += 1
        messages = [*messages, output_message(CodeRun.from_result(code, run, time.perf_counter() - began))]
    result.messages = messages
    result.final_answer = extract_final_answer(result.response) if result.response else None
    result.latency_ms = (time.perf_counter() - started) * 1000
    return result
