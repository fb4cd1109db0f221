"""The agent's python mode: generation stops where the model would write its code's output, the code runs in
the jail, its real output goes back in the same fence, and the model continues up to the turn limit."""

from __future__ import annotations

import asyncio

import litellm
from sqlmodel import Session, select

from core.domain.code_runs import (
    CODE_RUN_KEY,
    OUTPUT_FENCE,
    STOP_SEQUENCES,
    code_runs,
    cut_at_stop,
    pending_code,
)
from core.grpo.agent import AgentSettings, run_agent
from core.grpo.training import RunSettings, create_run, execute_run
from core.models import local_model, model_server, openai_http
from core.models.gateway import Gateway, Scope
from core.records.tasks.demo_data import demo_rows
from core.records.tasks.demos import DEMO_TASK
from core.settings import get_settings
from storage.tables import LLMCall, Rollout
from tests.conftest import ScriptedModel

HOSTED = "openai/gpt-4o-mini"
CODE = "import os\nprint(6 * 7, os.environ.get('SOME_API_KEY'))"
# What a Qwen-style model writes when nothing stops it: its code, an output it made up, an answer on that.
INVENTED = f"Let me compute.\n```python\n{CODE}\n```\n```output\n999 sk-made-up\n```\nSo the answer is \\boxed{{999}}."


def is_output(message: dict) -> bool:
    return message["role"] == "user" and message["content"].startswith(OUTPUT_FENCE)


def agent(engine, model: ScriptedModel, *, mode: str = "python", max_turns: int = 3, query: str = "What is 6*7?"):
    return asyncio.run(run_agent(Gateway(engine, mock=model), AgentSettings(model=HOSTED, mode=mode,
                                                                            max_turns=max_turns),
                                 instructions="Solve it.", answer_format="Box the answer.", experiences=[],
                                 query=query, sample_index=0, scope=Scope()))


def ledger(engine) -> list[LLMCall]:
    with Session(engine) as session:
        return list(session.exec(select(LLMCall).order_by(LLMCall.id)))


def test_generation_stops_at_the_output_fence_and_the_real_output_comes_back(engine, monkeypatch, jail):
    monkeypatch.setenv("SOME_API_KEY", "sk-should-not-leak-0000")

    def reply(messages):
        return "The code printed 42, so \\boxed{42}." if is_output(messages[-1]) else INVENTED

    model = ScriptedModel({"rollout": reply})
    result = agent(engine, model)

    assert [row.request["params"]["stop"] for row in ledger(engine)] == [["```output"], ["```output"]]
    system, query, first, output, last = result.messages
    # the invented output and the answer built on it are gone: the message ends with the code block
    assert first == {"role": "assistant", "content": f"Let me compute.\n```python\n{CODE}\n```"}
    assert output["content"] == "```output\n42 None\n```"  # the real output; the key never reaches the jail
    assert "999" not in str(result.messages[2:]) and "sk-made-up" not in str(result.messages)
    run = output[CODE_RUN_KEY]
    assert run["code"] == CODE and run["exit_code"] == 0 and run["timed_out"] is False and run["seconds"] > 0
    assert last == {"role": "assistant", "content": "The code printed 42, so \\boxed{42}."}
    assert result.final_answer == "42" and result.tool_calls == 1 and result.error is None
    assert result.response == last["content"] and not result.code_pending
    # the model read the real output, and only role and content: the stored run is not sent to a provider
    sent = model.calls[1][1]
    assert sent[-1] == {"role": "user", "content": "```output\n42 None\n```"}
    assert all(set(message) == {"role", "content"} for _stage, messages in model.calls for message in messages)
    assert "```output block" in system["content"]


def test_a_boxed_answer_before_unexecuted_code_is_not_final(engine, jail):
    def reply(messages):
        if is_output(messages[-1]):
            return f"It printed {messages[-1]['content'].split()[1]}: \\boxed{{8}}"
        return "The answer is \\boxed{7}. Let me check:\n```python\nprint(3 + 5)\n```"

    model = ScriptedModel({"rollout": reply})
    result = agent(engine, model, query="3+5?")

    assert model.count("rollout") == 2 and result.tool_calls == 1
    assert result.messages[3]["content"] == "```output\n8\n```"
    assert result.final_answer == "8"


def test_the_loop_continues_until_a_message_without_code(engine, jail):
    replies = ["```python\nx = 2 ** 10\nprint(x)\n```",
               "Now halve it.\n```python\nprint(1024 // 2)\n```",
               "\\boxed{512}"]
    model = ScriptedModel({"rollout": list(replies)})
    result = agent(engine, model, max_turns=4)

    assert model.count("rollout") == 3 and result.tool_calls == 2 and result.final_answer == "512"
    assert [run.output for run in code_runs(result.messages)] == ["1024", "512"]
    assert [m["role"] for m in result.messages] == ["system", "user", "assistant", "user", "assistant", "user",
                                                    "assistant"]


def test_the_turn_limit_ends_the_loop_and_code_left_unrun_gives_no_answer(engine, jail):
    model = ScriptedModel({"rollout": "Guess \\boxed{5}, then check.\n```python\nprint(5)\n```"})
    result = agent(engine, model, max_turns=3)

    assert model.count("rollout") == 3 and result.tool_calls == 2  # the third message's code has no turn left
    assert len(code_runs(result.messages)) == 2 and result.messages[-1]["role"] == "assistant"
    assert result.code_pending and result.response == "" and result.final_answer is None


def test_code_that_fails_sends_back_its_real_error_and_exit_status(engine, jail):
    def reply(messages):
        return "It failed, so \\boxed{0}" if is_output(messages[-1]) else "```python\nprint(1 / 0)\n```"

    result = agent(engine, ScriptedModel({"rollout": reply}))

    [run] = code_runs(result.messages)
    assert run.exit_code == 1 and run.status() == "exit 1" and not run.timed_out
    assert "ZeroDivisionError" in run.output and "[exit code 1]" in result.messages[3]["content"]


def test_direct_mode_is_one_turn_sends_no_stop_and_runs_nothing(engine):
    model = ScriptedModel({"rollout": "```python\nprint(1)\n```\n```output\n1\n```\n\\boxed{3}"})
    experiences = [{"id": "E1", "text": "Check units."}, {"id": "E2", "text": "Re-read the question."}]
    result = asyncio.run(run_agent(Gateway(engine, mock=model), AgentSettings(model=HOSTED),
                                   instructions="Solve it.", answer_format="", experiences=experiences,
                                   query="1+2?", sample_index=0, scope=Scope()))
    assert len(model.calls) == 1 and result.tool_calls == 0 and result.final_answer == "3"
    assert "[E1] Check units.\n[E2] Re-read the question." in result.messages[0]["content"]
    assert "stop" not in ledger(engine)[0].request["params"]  # direct calls keep their cache keys


def test_cut_at_stop_and_pending_code():
    assert cut_at_stop("a\n```python\nprint(1)\n```\n```output\n1\n```") == "a\n```python\nprint(1)\n```"
    assert cut_at_stop("no fence here ") == "no fence here "
    assert pending_code("```python\nprint(1)\n```\ntext\n```py\nprint(2)\n```") == "print(2)"
    assert pending_code("```bash\nls\n```\n\\boxed{1}") is None
    assert pending_code("```python\nprint(1)") is None  # an unclosed block (cut by max_tokens) is not code to run


def test_stop_is_part_of_the_cache_key(engine):
    model = ScriptedModel({"rollout": "x"})
    gateway = Gateway(engine, mock=model)
    messages = [{"role": "user", "content": "hi"}]
    for stop in (None, STOP_SEQUENCES, STOP_SEQUENCES):
        asyncio.run(gateway.complete(stage="rollout", model=HOSTED, messages=messages, stop=stop))
    rows = ledger(engine)
    assert rows[0].cache_key != rows[1].cache_key == rows[2].cache_key
    assert [row.cache_hit for row in rows] == [False, False, True] and model.count("rollout") == 2


def test_stop_reaches_the_openai_compatible_request(engine, monkeypatch):
    sent: list[dict] = []

    async def chat(api_base, payload, timeout_s, api_key=None, cut_loops=False):
        sent.append({**payload, "cut_loops": cut_loops})
        return openai_http.Reply(text="ok", tokens_in=1, tokens_out=1)

    monkeypatch.setattr(openai_http, "chat", chat)
    gateway = Gateway(engine, api_base="http://127.0.0.1:9/v1")
    asyncio.run(gateway.complete(stage="rollout", model="openai/qwen", messages=[{"role": "user", "content": "hi"}],
                                 stop=STOP_SEQUENCES))
    assert sent[0]["stop"] == ["```output"] and sent[0]["model"] == "qwen"
    assert not sent[0]["cut_loops"]  # another server's reply is not streamed


def test_stop_reaches_the_embedded_models_server(engine, monkeypatch):
    """The embedded model goes through the same HTTP path as every OpenAI-compatible server: its address
    comes from the model server's record, and the request carries stop, seed and max_tokens."""
    sent: list[tuple[str, dict]] = []

    async def chat(api_base, payload, timeout_s, api_key=None, cut_loops=False):
        sent.append((api_base, {**payload, "cut_loops": cut_loops}))
        return openai_http.Reply(text="```python\nprint(1)\n```", tokens_in=3, tokens_out=4)

    monkeypatch.setattr(model_server, "address", lambda name, start=True: f"http://127.0.0.1:9/{name}")
    monkeypatch.setattr(openai_http, "chat", chat)
    call = asyncio.run(Gateway(engine).complete(stage="rollout", model="local/qwen2.5-coder-0.5b",
                                                messages=[{"role": "user", "content": "hi"}], stop=STOP_SEQUENCES))
    (api_base, payload), = sent
    assert api_base == "http://127.0.0.1:9/qwen2.5-coder-0.5b/v1"
    assert payload["stop"] == ["```output"] and payload["model"] == "qwen2.5-coder-0.5b" and "seed" in payload
    assert payload["cut_loops"]  # streamed, and cut where it falls into a loop (tests/test_reply_loops.py)
    assert call.text == "```python\nprint(1)\n```" and (call.tokens_in, call.tokens_out) == (3, 4)


def test_stop_reaches_the_embedded_model_in_process(engine, monkeypatch):
    """The in-process provider, kept for one release behind TFGRPO_LOCAL_IN_PROCESS."""
    monkeypatch.setenv("TFGRPO_LOCAL_IN_PROCESS", "1")
    get_settings.cache_clear()
    bodies: list[dict] = []

    class Server:
        def handle_chat_completions(self, body):
            bodies.append(body)
            return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "```python\nprint(1)\n```"}}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}

    monkeypatch.setattr(local_model, "get_server", lambda name, slots=None: Server())
    try:
        call = asyncio.run(Gateway(engine).complete(stage="rollout", model="local/qwen2.5-coder-0.5b",
                                                    messages=[{"role": "user", "content": "hi"}], stop=STOP_SEQUENCES))
    finally:
        monkeypatch.delenv("TFGRPO_LOCAL_IN_PROCESS")
        get_settings.cache_clear()
    assert bodies[0]["stop"] == ["```output"] and call.text == "```python\nprint(1)\n```"


def test_litellm_gets_the_stop_sequences(engine, monkeypatch):
    seen: list[dict] = []
    real = litellm.acompletion

    async def spy(**kwargs):
        seen.append(kwargs)
        return await real(**kwargs)

    monkeypatch.setattr(litellm, "acompletion", spy)
    gateway = Gateway(engine, mock=ScriptedModel({"rollout": "ok"}))
    asyncio.run(gateway.complete(stage="rollout", model=HOSTED, messages=[{"role": "user", "content": "hi"}],
                                 stop=STOP_SEQUENCES))
    assert seen[0]["stop"] == ["```output"]


def test_a_training_run_stores_the_code_runs_and_the_learner_reads_the_real_output(engine, demo_task, scripted, jail):
    assert demo_task.agent_mode == "python"
    references = {row.query: row.reference for row in demo_rows()}
    answers = iter(["right", "wrong"])  # one right and one wrong answer: the group is mixed, so it is summarised

    def reply(messages):
        if is_output(messages[-1]):
            return f"So \\boxed{{{references[messages[1]['content']] if next(answers) == 'right' else -12345}}}"
        return "```python\nprint(40 + 2)\n```\n```output\n7\n```"

    model, gateway = scripted(engine, rollout=reply)
    run = execute_run(engine, create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=1, group_size=2,
                                                                        limit=1, gate="off")), gateway=gateway)
    assert run.status == "completed", run.error
    with Session(engine) as session:
        rollouts = list(session.exec(select(Rollout)))
    assert sorted(r.reward for r in rollouts) == [0.0, 1.0] and model.count("rollout") == 4
    for rollout in rollouts:
        [stored] = code_runs(rollout.messages)
        assert (stored.code, stored.output, stored.exit_code) == ("print(40 + 2)", "42", 0)
    summaries = ["\n".join(m["content"] for m in messages) for stage, messages in model.calls if stage == "summary"]
    assert len(summaries) == 2 and all("Tool output:\n```output\n42\n```" in text for text in summaries)
    assert not any("```output\n7" in text for text in summaries)  # the invented output never reached the learner
