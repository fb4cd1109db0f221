"""The agent's python mode: fenced code runs in the sandbox and its output is sent back."""

from __future__ import annotations

import asyncio

from core.engine.agent import AgentSettings, run_agent
from core.models.gateway import Gateway, Scope
from tests.conftest import ScriptedModel


def test_python_mode_runs_code_and_continues(engine, monkeypatch, jail):
    monkeypatch.setenv("SOME_API_KEY", "sk-should-not-leak-0000")

    def reply(messages):
        if messages[-1]["role"] == "user" and messages[-1]["content"].startswith("Code output:"):
            return "So the answer is \\boxed{42}."
        return "Let me compute.\n```python\nimport os\nprint(6 * 7, os.environ.get('SOME_API_KEY'))\n```"

    model = ScriptedModel({"rollout": reply})
    result = asyncio.run(run_agent(Gateway(engine, mock=model), AgentSettings(model="openai/gpt-4o-mini",
                                                                              mode="python"),
                                   instructions="Solve it.", answer_format="Box the answer.", experiences=[],
                                   query="What is 6*7?", sample_index=0, scope=Scope()))
    assert result.final_answer == "42" and result.tool_calls == 1 and result.error is None
    tool_output = result.messages[3]["content"]
    assert tool_output.startswith("Code output:\n42 None")  # the key is not in the sandbox's environment
    assert "python" in result.messages[0]["content"].lower()


def test_direct_mode_is_one_turn_and_experiences_are_in_the_system_prompt(engine):
    model = ScriptedModel({"rollout": "```python\nprint(1)\n```\n\\boxed{3}"})
    experiences = [{"id": "E1", "text": "Check units."}, {"id": "E2", "text": "Re-read the question."}]
    result = asyncio.run(run_agent(Gateway(engine, mock=model), AgentSettings(model="openai/gpt-4o-mini"),
                                   instructions="Solve it.", answer_format="", experiences=experiences,
                                   query="1+2?", sample_index=0, scope=Scope()))
    assert len(model.calls) == 1 and result.tool_calls == 0 and result.final_answer == "3"
    assert "[G0]. Check units.\n[G1]. Re-read the question." in result.messages[0]["content"]
