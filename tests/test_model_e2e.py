"""End to end on the real embedded model (Qwen2.5-Coder-0.5B through llama.cpp's server): the CLI's train and
eval in processes of their own, and the support task's judge under a JSON schema. Only what needs the real model
is here. The studio's guarantees that hold for any model run on scripted replies or the stub server:
- a conversation run waits for labels that decide its groups, then its evaluation asks people for the unsure:
  tests/test_conversation_engine.py::test_a_conversation_run_waits_for_labels_that_decide_its_groups_then_its_evaluation_asks_for_the_unsure;
- a killed `train` process resumes without paying again: tests/test_train_kill.py;
- a policy run learns from the reference where every attempt failed:
  tests/test_policy_demo.py::test_a_policy_run_learns_from_the_reference_where_every_attempt_failed;
- a support run waits for its spot checks, then continues:
  tests/test_labeling.py::test_a_support_run_waits_for_its_spot_checks_then_continues.

The training run uses `--no-ground-truth` so that every group reaches the learner: with ground truth, a run on
easy problems often has only all-right or all-wrong groups, which the paper's filter skips, and then no new
version would be expected.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func
from sqlmodel import Session, select

from core.domain.replies import clean_text
from core.models.gateway import Gateway, Scope
from core.models.judge import judge_response, to_value
from core.records.tasks.demos import DEMO_TASK, SUPPORT_TASK, ensure_demo_tasks
from core.records.tasks.lookup import get_task
from storage.db import make_engine, session_scope
from storage.tables import Advantage, LibraryVersion, LLMCall, Operation, Rollout, Run, Sample, Step, Task

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parent.parent
# The smallest run that still has groups, a learner, a gate and a version to decide on: 2 queries x G=2 (with one
# group a learner reply cut off mid-JSON fails the step: CI saw it), the gate on 4 validation queries x 1 sample
# (the fewest it accepts), at most 1 operation.
TRAIN = ["train", "--task", DEMO_TASK, "--limit", "2", "--group-size", "2", "--epochs", "1", "--batch-size", "2",
         "--no-ground-truth", "--gate", "no_worse", "--gate-k", "1", "--max-operations", "1",
         "--hold-flagged", "off"]  # the small model's text is often flagged; this test is about the path to completed
# The gate and the evaluation measure on a validation split of bare arithmetic (added with `dataset add`), which the
# small model answers in about 100 tokens where it works a word problem at 250: their answers are not held to the
# run's token limit. The run's limits (--max-tokens, --learner-max-tokens) cut a training answer at ANSWER_TOKENS (scored like any other; the learner still reads the working) and hold the
# learner's longest JSON (an advantage of 3 proposals at their length limits, an update of 1 operation). Asked for
# the number alone, the agent answers in a few tokens, but in a trial the learner then had nothing to compare and
# proposed nothing, so the gate measured nothing.
VALIDATION = [("What is 17 + 25?", "42"), ("What is 63 - 28?", "35"), ("What is 12 * 7?", "84"),
              ("What is 48 + 39?", "87")]
ANSWER_TOKENS, LEARNER_TOKENS = 96, 768


# A learner's request is made at most twice (training._ask_learner: again when its texts are cut off or over the
# limit), each at most twice (Gateway.complete_json: again when the reply is not the JSON asked for).
LEARNER_CALLS_PER_REQUEST = 2 * 2


# Limits against a hang, not speed checks: on a busy 2-core machine the 0.5B model is several times slower than
# alone (a run's 4 rollouts of up to 1024 tokens once took over 600 s there).
HANG_S = 1800


def cli(url: str, *argv: str, timeout: float = HANG_S) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "core", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'e2e.db'}"
    assert cli(url, "demo").returncode == 0
    return url


def direct_mode(url: str) -> None:
    """The demo task answers in direct mode (as the demo does where the code jail does not work; the python mode on
    the real model is tests/test_model_python_mode.py)."""
    engine = make_engine(url)
    try:
        with session_scope(engine) as s:
            task = s.exec(select(Task).where(Task.name == DEMO_TASK)).one()
            task.agent_mode = "direct"
            s.add(task)
    finally:
        engine.dispose()


def test_train_and_eval_on_the_embedded_model(url, tmp_path):
    """The CLI adds a validation split (`dataset add`), queues the run (`train --queue`) and executes it (`train
    --resume`), and `eval` measures the result, each a process of its own calling the embedded model's server, at
    the smallest sizes the code accepts.

    What the small learner makes of the step is its luck: its advantage may propose nothing, its update only
    operations that are invalid on the empty library, and the gate may pass or fail what it proposed. So every
    outcome is checked for what the studio guarantees of it: the group reaches the learner (no ground truth: no
    group is skipped), an update call is made when and only when there are proposals, the gate measures a
    library that changed and is skipped with its reason otherwise, and the version the run ends on is the one
    the gate's decision says."""
    rows = tmp_path / "validation.jsonl"
    rows.write_text("".join(json.dumps({"query": q, "answer": a}) + "\n" for q, a in VALIDATION))
    added = cli(url, "dataset", "add", "--task", DEMO_TASK, "--split", "validation", str(rows))
    assert added.returncode == 0, added.stderr + added.stdout
    direct_mode(url)
    queued = cli(url, *TRAIN, "--max-tokens", str(ANSWER_TOKENS), "--learner-max-tokens", str(LEARNER_TOKENS),
                 "--queue")
    assert queued.returncode == 0 and "run 1 queued" in queued.stdout, queued.stderr + queued.stdout
    result = cli(url, "train", "--resume", "1")
    assert result.returncode == 0, result.stderr + result.stdout
    assert "run 1: completed" in result.stdout
    engine = make_engine(url)
    with Session(engine) as s:
        run = s.get(Run, 1)
        version = s.get(LibraryVersion, run.current_version_id)
        step = s.exec(select(Step).where(Step.run_id == run.id)).one()
        calls = s.exec(select(LLMCall).where(LLMCall.run_id == run.id)).all()
        rollouts = s.exec(select(Rollout).where(Rollout.step_id.is_not(None))).all()
        advantages = s.exec(select(Advantage).where(Advantage.step_id == step.id)).all()
        ops = s.exec(select(Operation).where(Operation.step_id == step.id)).all()
    by_stage = Counter(c.stage for c in calls)
    tokens = {stage: sum(c.tokens_out for c in calls if c.stage == stage) for stage in by_stage}
    print("\ngate:", step.gate["line"], "| calls:", dict(by_stage), "| tokens out:", tokens,
          "| operations:", [(o.op, o.status) for o in ops])
    # every rollout answered in one model call (direct mode) held to the run's limit, scored by the group's
    # majority (the reward without ground truth)
    assert len(rollouts) == 4 and all(r.error is None and r.reward_source == "majority" for r in rollouts)
    assert all(agent_turns(r) == [r.response] for r in rollouts) and by_stage["rollout"] == 4
    limits = {(c.stage, c.request["params"]["max_tokens"]) for c in calls}
    assert {("rollout", ANSWER_TOKENS), ("advantage", LEARNER_TOKENS)} <= limits, limits
    # every group reaches the learner: each rollout summarised, each group given an advantage or a failure's reason
    assert by_stage["summary"] == 4 and all(r.summary is not None for r in rollouts)
    assert len(advantages) == 2 and all(a.status == "ok" or (a.status == "failed" and a.error) for a in advantages)
    assert 2 <= by_stage["advantage"] <= 2 * LEARNER_CALLS_PER_REQUEST  # one request per group
    proposals = [p for a in advantages if a.status == "ok" for p in a.proposals]
    if proposals:  # one learner call per batch folds the proposals into operations
        assert 1 <= by_stage["update"] <= LEARNER_CALLS_PER_REQUEST and 1 <= len(ops) <= 1
    else:
        assert "update" not in by_stage and not ops
    # the gate measures a changed library on the 4 validation queries x 1 sample (the fewest it accepts), for the
    # start and the candidate
    decision = step.gate["decision"]
    assert f"epoch 1 batch 1: {step.gate['line']}" in result.stdout
    valid = [o for o in ops if o.status != "invalid"]
    if decision in ("passed", "failed"):
        assert valid and step.gate["n"] == 4 and step.gate["k"] == 1, step.gate
        with Session(engine) as s:
            measured = s.exec(select(Rollout).where(Rollout.evaluation_id.in_(
                [step.gate["evaluation_before"], step.gate["evaluation_after"]]))).all()
        assert len(measured) == 8 and all(len(agent_turns(r)) == 1 for r in measured) and by_stage["gate"] == 8
    else:  # nothing valid to measure: the gate says why and spends nothing
        assert decision == "skipped" and step.gate["reason"] == "the library would not change", step.gate
        assert "gate" not in by_stage and version.experiences == []
    if decision == "passed":
        assert version.number == 2 and version.source == "run" and version.experiences
        assert f"version {version.id} (#2, run)" in result.stdout
        assert all(o.status == "applied" for o in valid)
    elif decision == "failed":  # the gate kept the empty library: the operations are rejected for validation
        assert version.number == 1
        assert all(o.status == "rejected" and o.reason == "validation" for o in valid)
    # every model call has its ledger row, on the embedded model at no cost, with the tokens of what it said
    assert all(c.model == "local/qwen2.5-coder-0.5b" and c.cost == 0 for c in calls)
    assert all(c.tokens_out > 0 for c in calls if not c.cache_hit and c.error is None and c.response)

    result = cli(url, "eval", "--task", DEMO_TASK, "--version", "latest", "--split", "validation", "--limit", "1",
                 "--k", "1", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["k"] == 1 and report["n"] == 1 and report["status"] == "completed"
    assert 0.0 <= report["mean_at_k"] <= report["pass_at_k"] <= 1.0
    with Session(engine) as s:  # the evaluation's own call (the gate's evaluations are the run's)
        evaluated = s.exec(select(Rollout).where(Rollout.evaluation_id == report["evaluation_id"])).all()
        paid = s.exec(select(func.count()).select_from(LLMCall).where(
            LLMCall.evaluation_id == report["evaluation_id"])).one()
    assert len(evaluated) == 1 and evaluated[0].error is None and paid == 1


def agent_turns(rollout: Rollout) -> list[str]:
    """What the agent said in a rollout, turn by turn (one model call each)."""
    return [m["content"] for m in rollout.messages if m["role"] == "assistant"]


# ---- the judge on the customer-support demo, in this process -------------------------------------------------

GOOD_SUPPORT_REPLY = (
    "I'm sorry about the double charge of $64.99, I know money is tight this month. The duplicate payment goes "
    "back to your original payment method within 3-5 business days. If it has not arrived by then, reply here "
    "and I will escalate it to a team lead."
)
BAD_SUPPORT_REPLY = (
    "Not our problem. Under our billing policy a second charge is kept as a processing fee for 60 days. "
    "Talk to your bank."
)


def _support_task_and_first_sample(engine):
    ensure_demo_tasks(engine)
    with Session(engine) as s:
        task = get_task(s, SUPPORT_TASK)
        sample = s.exec(select(Sample).where(Sample.task_id == task.id).order_by(Sample.id)).first()
        s.expunge_all()
    return task, sample


def test_the_embedded_judge_scores_a_support_reply(engine):
    """Each verdict is the judge's reply read faithfully. The reply is always the JSON the request's schema asks
    for (llama.cpp holds the sampling to it); what the 0.5B judge says in it is its luck: it does not reliably
    rank the good reply above the bad one (bench/judge.py: half the pairs tie, some go the wrong way), may leave
    the reason empty, and the schema does not bound the score, so a score off the 1-5 scale, asked again once,
    leaves a verdict without a value for a person to give. Both outcomes are checked for what the studio makes
    of them."""
    task, sample = _support_task_and_first_sample(engine)
    assert task.judge_model == "local/qwen2.5-coder-0.5b" and sample.external_id == "s01"

    async def both():
        gateway = Gateway(engine)
        return [await judge_response(gateway, task, sample, reply, scope=Scope())
                for reply in (GOOD_SUPPORT_REPLY, BAD_SUPPORT_REPLY)]

    good, bad = asyncio.run(both())
    print(f"\njudge on s01: good {good.value} {good.detail!r}\n              bad {bad.value} {bad.detail!r}")
    with Session(engine) as s:
        calls = s.exec(select(LLMCall).where(LLMCall.stage == "judge").order_by(LLMCall.id)).all()
    assert calls and all(c.error is None and not c.cache_hit and c.tokens_out > 0 for c in calls)
    for answer, verdict in ((GOOD_SUPPORT_REPLY, good), (BAD_SUPPORT_REPLY, bad)):
        fenced = json.dumps(answer, ensure_ascii=False)  # the answer reaches the judge JSON-encoded in its fence
        asked = [c for c in calls if f'"answer_to_judge": {fenced}' in c.request["messages"][-1]["content"]]
        assert 1 <= len(asked) <= 2, asked  # a second attempt only after an unusable reply
        replies = [json.loads(c.response) for c in asked]  # plain JSON of the schema, nothing to repair
        assert all(set(r) == {"reason", "score", "confident"} and isinstance(r["score"], int) for r in replies)
        last, doubt = replies[-1], " (judge unsure)" if replies[-1]["confident"] is False else ""
        if verdict.value is None:  # off the scale twice: unsure, no value, the problem named
            assert len(asked) == 2 and all(c.reply_status == "malformed" for c in asked), asked
            assert verdict.unsure and verdict.detail.startswith("judge reply unusable: ") and "score" in verdict.detail
        else:
            assert asked[-1].reply_status == "parsed" and all(c.reply_status == "malformed" for c in asked[:-1])
            assert 1 <= last["score"] <= 5 and verdict.value == to_value(last["score"], "1-5")
            assert verdict.unsure == bool(doubt)
            assert verdict.detail == f"judge {last['score']}/5{doubt}: {clean_text(last['reason'])}"
