"""The python agent mode on the real embedded model (Qwen2.5-Coder-0.5B through xllamacpp), through an evaluation.

Asserts what the studio guarantees, not a right answer: generation was asked to stop at "```output", the code
the model wrote ran in the jail, and the output stored on the rollout (and shown to the model) is what that
code really prints, not one the model wrote itself.

The query asks for a Python program: at temperature 0 the small model wrote a ```python block for it in each of
the three tries made while this test was written, whereas on the demo's own word problems it mostly answers in
prose (docs/agent-modes.md). Run it under `flock /tmp/model.lock` where several people share the machine's cores.
"""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session, select

from core.domain.code_runs import OUTPUT_FENCE, code_runs
from core.domain.sandbox import run_python
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.records.tasks.demos import DEMO_TASK, ensure_demo_task
from core.records.tasks.samples import add_dataset
from storage.tables import LLMCall, Rollout

pytestmark = pytest.mark.model
QUERY = ("Write a Python program that prints the sum of the squares of the integers from 1 to 250, run it, and give "
         "the printed number.")


def test_the_embedded_agent_runs_its_code_and_the_real_output_is_stored(engine, jail):
    task = ensure_demo_task(engine)
    assert task.agent_mode == "python"
    row = {"query": QUERY, "answer": str(sum(i * i for i in range(1, 251))), "split": "validation"}
    add_dataset(engine, DEMO_TASK, json.dumps(row).encode(), "python_probe.jsonl")
    evaluation_id = create_evaluation(engine, DEMO_TASK, "empty", split="validation", k=1, temperature=0.0)
    execute_evaluation(engine, evaluation_id)

    with Session(engine) as session:
        [rollout] = session.exec(select(Rollout).where(Rollout.evaluation_id == evaluation_id)).all()
        calls = session.exec(select(LLMCall).where(LLMCall.evaluation_id == evaluation_id)).all()
    assert rollout.error is None
    runs = code_runs(rollout.messages)
    assert runs, f"the model wrote no code this time: {rollout.messages[2:]}"
    assert all(call.request["params"]["stop"] == ["```output"] for call in calls)
    assert len(calls) == len(runs) + (0 if rollout.final_answer is None else 1)
    for run in runs:
        assert run.exit_code is not None and run.seconds > 0
        again = run_python(run.code)  # the stored output is what the stored code prints
        assert run.output == again.as_text()
    outputs = [m["content"] for m in rollout.messages if m["role"] == "user" and "code_run" in m]
    assert outputs == [f"{OUTPUT_FENCE}\n{run.output}\n```" for run in runs]
    for message in rollout.messages:  # every assistant message ends before an output it would have invented
        if message["role"] == "assistant":
            assert OUTPUT_FENCE not in message["content"]
