"""End to end on the real embedded model (Qwen2.5-Coder-0.5B through xllamacpp), through the CLI.

The training run uses `--no-ground-truth` so that every group reaches the learner: with ground
truth, a 2x2 run on easy problems often has only all-right or all-wrong groups, which the paper's
filter skips, and then no new version would be expected.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func
from sqlmodel import Session, select

from core.domain.replies import clean_text
from core.grpo.training import RunSettings, create_run, execute_run
from core.models.gateway import Gateway, Scope
from core.models.judge import judge_response, to_value
from core.records.labeling import submit_label
from core.records.tasks import DEMO_TASK, SUPPORT_TASK, ensure_demo_tasks, get_task
from storage.db import make_engine, session_scope
from storage.tables import Advantage, LibraryVersion, LLMCall, Operation, Rollout, Run, Sample, Step, Task

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parent.parent
TRAIN = ["train", "--task", DEMO_TASK, "--limit", "2", "--group-size", "2", "--epochs", "1", "--batch-size", "2",
         "--no-ground-truth", "--gate", "no_worse", "--validation-size", "4", "--gate-k", "1",
         "--hold-flagged", "off"]  # the small model's text is often flagged; this test is about the path to completed


# A learner's request is made at most twice (training._ask_learner: again when its texts are cut off or over the
# limit), each at most twice (Gateway.complete_json: again when the reply is not the JSON asked for).
LEARNER_CALLS_PER_REQUEST = 2 * 2


# Limits against a hang, not speed checks: on a busy 2-core machine the 0.5B model is several times slower than
# alone (a run's 4 rollouts of up to 1024 tokens took over 600 s there).
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


def test_train_and_eval_on_the_embedded_model(url):
    """What the small learner makes of the step is its luck: its advantages may propose nothing, its update only
    operations that are invalid on the empty library, and the gate may pass or fail what it proposed. So every
    outcome is checked for what the studio guarantees of it: each group reaches the learner (no ground truth: no
    group is skipped), an update call is made when and only when there are proposals, the gate measures a
    library that changed and is skipped with its reason otherwise, and the version the run ends on is the one
    the gate's decision says."""
    result = cli(url, *TRAIN)
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
    print("\ngate:", step.gate["line"], "| calls:", dict(by_stage), "| operations:", [(o.op, o.status) for o in ops])
    # every rollout answered, scored by the group's majority (the reward without ground truth); how many turns
    # the agent took is its own choice in python mode (code to run, or an answer at once), each turn a ledger call
    assert len(rollouts) == 4 and all(r.error is None and r.reward_source == "majority" for r in rollouts)
    assert all(r.response in (agent_turns(r)[-1], "") for r in rollouts)  # "": code left unrun at the turn limit
    assert sum(len(agent_turns(r)) for r in rollouts) == by_stage["rollout"]
    # every group reaches the learner: each rollout summarised, each group given an advantage or a failure's reason
    assert by_stage["summary"] == 4 and all(r.summary is not None for r in rollouts)
    assert len(advantages) == 2 and all(a.status == "ok" or (a.status == "failed" and a.error) for a in advantages)
    assert 2 <= by_stage["advantage"] <= 2 * LEARNER_CALLS_PER_REQUEST  # one request per group
    proposals = [p for a in advantages if a.status == "ok" for p in a.proposals]
    if proposals:  # one learner call per batch folds the proposals into operations
        assert 1 <= by_stage["update"] <= LEARNER_CALLS_PER_REQUEST and ops
    else:
        assert "update" not in by_stage and not ops
    # the gate measures a changed library on the 4 held-out queries x 1 sample (the fewest it accepts), for the
    # start and the candidate
    decision = step.gate["decision"]
    assert f"epoch 1 batch 1: {step.gate['line']}" in result.stdout
    valid = [o for o in ops if o.status != "invalid"]
    if decision in ("passed", "failed"):
        assert valid and step.gate["n"] == 4 and step.gate["k"] == 1, step.gate
        with Session(engine) as s:
            measured = s.exec(select(Rollout).where(Rollout.evaluation_id.in_(
                [step.gate["evaluation_before"], step.gate["evaluation_after"]]))).all()
        assert len(measured) == 8 and sum(len(agent_turns(r)) for r in measured) == by_stage["gate"]
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

    result = cli(url, "eval", "--task", DEMO_TASK, "--version", "latest", "--limit", "2", "--k", "2", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["k"] == 2 and report["n"] == 2 and report["status"] == "completed"
    assert 0.0 <= report["mean_at_k"] <= report["pass_at_k"] <= 1.0
    with Session(engine) as s:  # the evaluation's own calls (the gate's evaluations are the run's): one per turn
        evaluated = s.exec(select(Rollout).where(Rollout.evaluation_id == report["evaluation_id"])).all()
        paid = s.exec(select(func.count()).select_from(LLMCall).where(
            LLMCall.evaluation_id == report["evaluation_id"])).one()
    assert len(evaluated) == 4 and paid == sum(len(agent_turns(r)) for r in evaluated)


def agent_turns(rollout: Rollout) -> list[str]:
    """What the agent said in a rollout, turn by turn (one model call each)."""
    return [m["content"] for m in rollout.messages if m["role"] == "assistant"]


def _paid_calls(engine) -> list[LLMCall]:
    with Session(engine) as s:
        return list(s.exec(select(LLMCall).where(LLMCall.cache_hit.is_(False), LLMCall.error.is_(None))))


def test_killed_run_resumes_without_paying_again(url):
    """The run goes without the gate (the test above checks the gate's held-out rollouts), so it is shorter."""
    engine = make_engine(url)
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "core", *TRAIN, "--gate", "off"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + HANG_S
    while len(_paid_calls(engine)) < 5:
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {c.cache_key for c in _paid_calls(engine)}
    with Session(engine) as s:
        assert s.get(Run, 1).status == "running"  # died without a chance to say so

    result = cli(url, "train", "--resume", "1")
    assert result.returncode == 0, result.stderr + result.stdout
    assert "run 1: completed" in result.stdout
    paid = _paid_calls(engine)
    keys = [c.cache_key for c in paid]
    assert len(keys) == len(set(keys)), "a completed call was paid for twice"
    assert done_before < set(keys)  # the resume did the remaining work, and only that


# ---- the judge and the labeling queue on the customer-support demo, in this process --------------------------

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
        asked = [c for c in calls if c.request["messages"][-1]["content"].endswith(f"Answer to judge:\n{answer}")]
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


def test_a_support_run_waits_for_spot_checks_then_continues(engine):
    task, sample = _support_task_and_first_sample(engine)
    with session_scope(engine) as s:
        row = s.get(Task, task.id)
        row.reward_settings = {**row.reward_settings, "spot_check_share": 1.0}
        s.add(row)
    # the labeling queue is what this test is about; the learner's token limit holds its longest JSON replies (an
    # advantage of 3 proposals at their length limits, an update of at most 1 operation): a reply cut off mid-JSON
    # could fail this step's only group, and the run would not complete
    settings = RunSettings(epochs=1, batch_size=1, group_size=2, limit=1, review_mode="auto", max_tokens=200,
                           hold_flagged=False, learner_max_tokens=600, max_operations=1, gate="off")
    run_id = create_run(engine, SUPPORT_TASK, settings)

    assert execute_run(engine, run_id).status == "awaiting_labels"
    with Session(engine) as s:
        rollouts = s.exec(select(Rollout).order_by(Rollout.id)).all()
        assert len(rollouts) == 2 and all(r.sample_id == sample.id and r.response for r in rollouts)
        assert [r.label_status for r in rollouts] == ["needed", "needed"]
        assert all(r.reward is None and r.suggested_detail.startswith("judge ") for r in rollouts)
        print("\njudge suggestions:", [(r.suggested_reward, r.suggested_detail[:120]) for r in rollouts])
        assert s.exec(select(Step)).one().status == "awaiting_labels"
        assert not s.exec(select(Advantage)).all()

    first, second = (r.id for r in rollouts)
    labelled = submit_label(engine, first, 1.0, "cli")
    assert labelled.rollout.label_status == "done" and not labelled.released
    with Session(engine) as s:
        assert s.get(Run, run_id).status == "awaiting_labels"  # one rollout still open
    labelled = submit_label(engine, second, 0.25, "cli")
    assert labelled.rollout.reward == 0.25 and labelled.released
    with Session(engine) as s:
        assert s.get(Run, run_id).status == "queued"

    assert execute_run(engine, run_id).status == "completed"
    with Session(engine) as s:
        labelled = s.exec(select(Rollout).order_by(Rollout.id)).all()
        assert [(r.reward, r.reward_source, r.label_status) for r in labelled] == [(1.0, "human", "done"),
                                                                                 (0.25, "human", "done")]
        assert s.exec(select(Step)).one().status == "completed"
        advantage = s.exec(select(Advantage)).one()
        print("advantage:", advantage.status, advantage.error or advantage.text)
        assert advantage.status == "ok" or (advantage.status == "failed" and advantage.error)
        assert s.exec(select(func.count()).select_from(Rollout)).one() == 2  # nothing was sampled again


# ---- the conversation demo: the agent against the simulated customers, judged by the rubric ------------------


def test_a_conversation_run_and_evaluation_on_the_embedded_model(engine):
    """One short step of the conversation demo (2 scenarios, G=2, 2 agent turns) and an evaluation of the
    result on 2 held-out scenarios: every conversation is played by the local model on both sides, stored
    turn by turn and judged.

    Whether the small judge's rewards differ within a group is its luck (it often ties both groups, and a tied
    group is skipped without a summary), so the training step sends every rollout to a person with the judge's
    suggestion, and the labels decide both cases: the first group is labelled 1 and 0, so it is mixed and
    summarised by the learner on the model; the second is labelled 0.5 twice, so it is skipped with the reason
    and costs the learner nothing. The evaluation keeps the judge's verdicts as rewards; the ones the judge is
    unsure of or cannot give go to a person, labelled here."""
    from core.grpo.evaluation import create_evaluation, execute_evaluation
    from core.records.tasks import CONVERSATION_TASK, ensure_conversation_task
    from storage.tables import ConversationTurn, Evaluation

    def spot_check(share: float) -> None:
        with session_scope(engine) as s:
            task = get_task(s, CONVERSATION_TASK)
            task.reward_settings = {**task.reward_settings, "spot_check_share": share}
            s.add(task)

    ensure_conversation_task(engine)
    spot_check(1.0)
    # at most 1 operation: the learner's update always fits its token limit (an update cut off mid-JSON fails
    # the step); an advantage cut off fails its group only, which the checks below allow
    settings = RunSettings(epochs=1, batch_size=2, group_size=2, limit=2, gate="off", hold_flagged=False,
                           max_tokens=120, learner_max_tokens=400, max_operations=1, max_turns=2)
    run_id = create_run(engine, CONVERSATION_TASK, settings)
    run = execute_run(engine, run_id)
    assert run.status == "awaiting_labels", run.error
    with Session(engine) as s:
        waiting = s.exec(select(Rollout).where(Rollout.step_id.is_not(None))
                         .order_by(Rollout.sample_id, Rollout.group_index)).all()
    # the judge was asked about every conversation; its verdict (or why there is none) waits beside it
    assert len(waiting) == 4 and all(r.error is None and r.label_status == "needed" and r.suggested_detail
                                     for r in waiting)
    mixed, tied = waiting[0].sample_id, waiting[-1].sample_id
    for rollout in waiting:
        label = (1.0 if rollout.group_index == 0 else 0.0) if rollout.sample_id == mixed else 0.5
        submit_label(engine, rollout.id, label, "cli")
    run = execute_run(engine, run_id)
    assert run.status == "completed", run.error
    with Session(engine) as s:
        rollouts = s.exec(select(Rollout).where(Rollout.step_id.is_not(None))).all()
        advantages = {a.sample_id: a for a in s.exec(select(Advantage)).all()}
        turns = s.exec(select(ConversationTurn).where(ConversationTurn.step_id.is_not(None))
                       .order_by(ConversationTurn.sample_id, ConversationTurn.group_index,
                                 ConversationTurn.position)).all()
        calls = s.exec(select(LLMCall).where(LLMCall.run_id == run_id)).all()
    by_stage = Counter(c.stage for c in calls)
    print("\nconversation rewards:", [(r.sample_id, r.reward, (r.scores or {}).get("criteria")) for r in rollouts],
          "\ngroups:", {sample_id: (a.status, a.text or a.error) for sample_id, a in advantages.items()})
    assert len(rollouts) == 4 and all(r.error is None and r.reward_source == "human" for r in rollouts)

    # every conversation stored turn by turn as spoken: the opening, then the agent and the simulated user in turn
    # (at least opening, agent, user with 2 agent turns), each turn the text of its model call
    assert len(turns) >= 4 * 3
    for key in {(t.sample_id, t.group_index) for t in turns}:
        roles = [t.role for t in turns if (t.sample_id, t.group_index) == key]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"] * (len(roles) % 2), roles
    assert (Counter(t.text for t in turns if t.role == "assistant")
            == Counter(c.response for c in calls if c.stage == "rollout"))
    assert sum(1 for t in turns if t.role == "user" and t.position > 0) == by_stage["simulator"]

    # the mixed group is summarised by the learner and given an advantage (or its failure's reason); the tied one
    # is skipped with the reason, unsummarised
    assert set(advantages) == {mixed, tied} and mixed != tied
    assert sorted((r.sample_id, r.reward) for r in rollouts) == sorted([(mixed, 0.0), (mixed, 1.0), (tied, 0.5),
                                                                       (tied, 0.5)])
    advantage = advantages[mixed]
    assert advantage.status == "ok" or (advantage.status == "failed" and advantage.error), advantage
    assert advantages[tied].status == "skipped", advantages[tied]
    assert advantages[tied].text == "all 2 rewards equal (0.5): no group advantage"
    assert all((r.summary is not None) == (r.sample_id == mixed) for r in rollouts)
    assert by_stage["summary"] == 2 and 1 <= by_stage["advantage"] <= LEARNER_CALLS_PER_REQUEST
    assert {"rollout", "simulator", "judge", "summary", "advantage"} <= set(by_stage)

    # the evaluation: the judge's verdicts are the rewards, a person gives the ones it was unsure of or had none for
    spot_check(0.0)
    with Session(engine) as s:
        version = s.get(Run, run_id).current_version_id
    eval_id = create_evaluation(engine, CONVERSATION_TASK, str(version), split="test", k=1, limit=2)
    ev = execute_evaluation(engine, eval_id)
    if ev.status == "awaiting_labels":
        with Session(engine) as s:
            for rollout in s.exec(select(Rollout).where(Rollout.label_status == "needed")).all():
                submit_label(engine, rollout.id, 0.5, "cli")
        ev = execute_evaluation(engine, eval_id)
    assert ev.status == "completed", ev.error
    with Session(engine) as s:
        ev = s.get(Evaluation, eval_id)
        scored = s.exec(select(Rollout).where(Rollout.evaluation_id == eval_id)).all()
    print("evaluation rewards:", [(r.reward, r.reward_source, r.judge_unsure) for r in scored])
    assert len(scored) == 2 and all(r.error is None and r.reward is not None for r in scored)
    assert all(r.reward_source == ("human" if r.judge_unsure or r.suggested_reward is None else "judge") for r in scored)
    assert ev.n == 2 and ev.metrics["segments"] and sum(r["n"] for r in ev.metrics["segments"].values()) == 2


# ---- the shop-policies demo: knowledge the agent cannot have, learned from the reference ------------------


def test_a_policy_run_learns_from_the_reference_where_every_attempt_failed(engine):
    """One short step of the shop-policies demo (2 messages, G=2) with groups where every attempt failed sent
    to the learner with the reference. The agent's instructions leave the policies out, so its attempts mostly
    fail; what the studio guarantees is checked: each reward is the verifier's, each group is decided by its
    rewards (an all-failed one reaches the learner with the reference and says so, or is recorded with its
    reason), and a new version exists exactly when operations were applied."""
    from core.grpo.reference_side import REFERENCE_SIDE_NOTE, learned_from_reference
    from core.records.tasks import POLICY_TASK

    ensure_demo_tasks(engine)
    settings = RunSettings(epochs=1, batch_size=2, group_size=2, limit=2, review_mode="auto", max_tokens=160,
                           hold_flagged=False, learner_max_tokens=600, max_operations=2, gate="off",
                           reference_when_all_fail=True)
    run = execute_run(engine, create_run(engine, POLICY_TASK, settings))
    assert run.status == "completed", run.error
    with Session(engine) as s:
        step = s.exec(select(Step).where(Step.run_id == run.id)).one()
        rollouts = s.exec(select(Rollout).where(Rollout.step_id == step.id)).all()
        assert len(rollouts) == 4 and all(r.reward_source == "verifier" for r in rollouts if r.error is None)
        advantages = s.exec(select(Advantage).where(Advantage.step_id == step.id)).all()
        assert len(advantages) == 2
        for advantage in advantages:
            rewards = [r.reward for r in rollouts if r.sample_id == advantage.sample_id and r.error is None]
            print(f"\nsample {advantage.sample_id}: rewards {rewards}, {advantage.status}: "
                  f"{(advantage.text or advantage.error or '')[:300]}")
            if advantage.status == "failed":
                assert advantage.error
            elif len(rewards) == 2 and max(rewards) < 1 and len(set(rewards)) == 1:
                assert advantage.status == "ok" and learned_from_reference(advantage)
                assert advantage.text.startswith(REFERENCE_SIDE_NOTE.split(" (")[0])
            elif len(set(rewards)) == 2:
                assert advantage.status == "ok" and not learned_from_reference(advantage)
            else:
                assert advantage.status == "skipped"
        assert step.stats["from_reference"] == sum(1 for a in advantages if learned_from_reference(a))
        applied = [o for o in s.exec(select(Operation).where(Operation.step_id == step.id)) if o.status == "applied"]
        version = s.get(LibraryVersion, run.current_version_id)
        assert (version.number > 1) == bool(applied)
        print("library:", [e["text"] for e in version.experiences])
