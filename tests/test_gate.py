"""The validation gate on scripted model replies: a step lands only when its candidate library does not
measurably hurt on the validation queries; figures are kept on the step; manual mode shows them."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from core.errors import InvalidInput
from core.grpo.gate import choose_validation, gate_line, held_out_size, passes
from core.grpo.training import create_run, execute_run
from core.records.evaluation.comparison import paired
from core.records.review.decisions import decide_operation, decide_step
from core.records.review.gate_verdict import GateVerdict
from core.records.runs.settings import RunSettings
from core.records.tasks.demos import DEMO_TASK, demo_rows
from storage import queries
from storage.db import url_with_password
from storage.tables import (
    AuditEvent,
    Evaluation,
    LibraryVersion,
    LLMCall,
    Operation,
    Rollout,
    Run,
    Sample,
    Step,
)
from tests.conftest import mixed_rollouts

LEARNED = "Re-read the question to find which quantity it asks for."
REFERENCES = {row.query: row.reference for row in demo_rows()}


def answers(right_with_experience: bool):
    """Gate replies: right or wrong depending on whether the learned experience is in the system prompt."""

    def reply(messages: list[dict]) -> str:
        has = LEARNED in messages[0]["content"]
        right = has if right_with_experience else not has
        return f"So the answer is \\boxed{{{REFERENCES[messages[1]['content']] if right else '-1'}}}"

    return reply


def gated(**kw) -> RunSettings:
    base = {"epochs": 1, "batch_size": 2, "group_size": 2, "limit": 2, "concurrency": 2, "gate": "no_worse",
            "validation_size": 6, "gate_k": 1}
    return RunSettings(**{**base, **kw})


def run_gated(engine, gateway, **kw) -> Run:
    return execute_run(engine, create_run(engine, DEMO_TASK, gated(**kw)), gateway=gateway)


def step_of(engine, run_id: int) -> Step:
    with Session(engine) as s:
        return s.exec(select(Step).where(Step.run_id == run_id)).one()


def test_held_out_size_is_a_fifth_within_bounds_and_never_more_than_half():
    assert [held_out_size(n, None) for n in (4, 10, 40, 100, 400)] == [2, 5, 8, 20, 50]
    assert held_out_size(100, 12) == 12 and held_out_size(100, 0) == 0 and held_out_size(3, 10) == 2


def test_the_validation_queries_are_never_trained_on(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts(), gate=answers(right_with_experience=True))
    run = run_gated(engine, gateway, limit=None, batch_size=50, epochs=1, group_size=1, validation_size=20)
    assert run.status == "completed", run.error
    with Session(engine) as s:
        held_out = set(s.get(Run, run.id).validation_ids)
        trained = {r.sample_id for r in s.exec(select(Rollout).where(Rollout.step_id.is_not(None)))}
        splits = {s.get(Sample, i).split for i in held_out}
    assert len(held_out) == 20 and splits == {"train"}
    assert len(trained) == 80 and not trained & held_out


def test_a_task_with_a_validation_split_uses_it(engine, demo_task):
    with Session(engine) as s:
        ids = [smp.id for smp in queries.samples(s, demo_task.id, "test", limit=5)]
        for smp in queries.samples_by_ids(s, ids):
            smp.split = "validation"
            s.add(smp)
        s.commit()
        split, chosen = choose_validation(s, demo_task, gated())
    assert (split, chosen) == ("validation", sorted(ids))


def test_a_candidate_that_scores_lower_is_rejected_in_auto_mode_with_its_figures(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts(), gate=answers(right_with_experience=False))
    run = run_gated(engine, gateway)
    assert run.status == "completed", run.error
    step = step_of(engine, run.id)
    gate = step.gate
    assert gate["decision"] == "failed" and gate["n"] == 6 and gate["k"] == 1
    assert (gate["mean_before"], gate["mean_after"], gate["delta"]) == (1.0, 0.0, -1.0)
    assert gate["ci_high"] < 0 and gate["finding"] == "worse" and "1.00 -> 0.00" in gate["line"]
    with Session(engine) as s:
        version = s.get(LibraryVersion, run.current_version_id)
        assert version.number == 1 and step.version_after_id == step.version_before_id
        ops = s.exec(select(Operation)).all()
        assert [(o.status, o.reason, o.reviewer) for o in ops] == [("rejected", "validation", "gate")]
        assert ops[0].comment == gate["line"]
        assert s.exec(select(AuditEvent).where(AuditEvent.action == "operation.reject")).one().actor == "gate"
        stages = {c.stage for c in queries.calls(s, run_id=run.id)}
    assert "gate" in stages and model.count("gate") == 12  # 6 queries x 1 sample x 2 libraries


def test_a_candidate_that_scores_higher_lands_and_its_evaluation_becomes_the_versions(engine, demo_task, scripted):
    _model, gateway = scripted(engine, rollout=mixed_rollouts(), gate=answers(right_with_experience=True))
    run = run_gated(engine, gateway)
    step = step_of(engine, run.id)
    assert step.gate["decision"] == "passed" and step.gate["delta"] == 1.0
    with Session(engine) as s:
        version = s.get(LibraryVersion, run.current_version_id)
        assert version.number == 2 and [e["text"] for e in version.experiences] == [LEARNED]
        after = s.get(Evaluation, step.gate["evaluation_after"])
        assert after.version_id == version.id and after.purpose == "gate" and after.run_id == run.id
        assert [o.status for o in s.exec(select(Operation))] == ["applied"]


def test_the_gate_answers_with_the_runs_max_tokens(engine, demo_task, scripted):
    """A run cut at 96 tokens per answer is gated on answers cut the same way, not on the agent's default 1024."""
    _model, gateway = scripted(engine, rollout=mixed_rollouts(), gate=answers(right_with_experience=True))
    run = run_gated(engine, gateway, max_tokens=96)
    with Session(engine) as s:
        calls = s.exec(select(LLMCall).where(LLMCall.run_id == run.id)).all()
    by_stage = {}
    for call in calls:
        by_stage.setdefault(call.stage, set()).add(call.request["params"]["max_tokens"])
    assert by_stage["gate"] == by_stage["rollout"] == {96}


def test_a_better_gate_needs_a_significant_improvement(engine, demo_task, scripted):
    def half(messages):  # the experience helps on every other query only: a mean up, not significant on 6
        has = LEARNED in messages[0]["content"]
        right = has or sum(map(ord, messages[1]["content"])) % 2
        return f"\\boxed{{{REFERENCES[messages[1]['content']] if right else '-1'}}}"

    _model, gateway = scripted(engine, rollout=mixed_rollouts(), gate=half)
    run = run_gated(engine, gateway, gate="better")
    gate = step_of(engine, run.id).gate
    assert gate["mean_after"] >= gate["mean_before"] and gate["decision"] == "failed"


def test_gate_off_lands_what_would_have_failed(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts(), gate=answers(right_with_experience=False))
    run = run_gated(engine, gateway, gate="off")
    with Session(engine) as s:
        assert s.get(LibraryVersion, run.current_version_id).number == 2
        assert s.get(Run, run.id).validation_ids == []
    assert step_of(engine, run.id).gate is None and model.count("gate") == 0


def test_manual_mode_shows_the_figures_and_waits_and_approving_against_a_failed_gate_needs_a_note(
        engine, demo_task, scripted):
    _model, gateway = scripted(engine, rollout=mixed_rollouts(), gate=answers(right_with_experience=False))
    run = run_gated(engine, gateway, review_mode="manual")
    assert run.status == "awaiting_review"
    step = step_of(engine, run.id)
    assert step.gate["decision"] == "failed"
    with Session(engine) as s:
        op = s.exec(select(Operation)).one()
    assert op.status == "pending"
    with pytest.raises(InvalidInput, match="needs a note"):
        decide_operation(engine, op.id, "approved", actor="cli")
    with pytest.raises(InvalidInput, match="needs a note"):
        decide_step(engine, step.id, "approved", actor="cli")
    decide_operation(engine, op.id, "approved", actor="cli", comment="the validation queries are too easy")
    with Session(engine) as s:
        assert s.get(Operation, op.id).status == "applied"
        assert s.get(Step, step.id).version_after_id != step.version_before_id


def test_resume_after_a_kill_during_the_gate_pays_for_no_completed_call_again(engine, demo_task, scripted):
    calls = {"n": 0}
    right = answers(right_with_experience=True)

    def dies_midway(messages):
        calls["n"] += 1
        if calls["n"] == 9:
            raise KeyboardInterrupt  # the process is killed in the middle of the gate's evaluations
        return right(messages)

    _model, gateway = scripted(engine, rollout=mixed_rollouts(), gate=dies_midway)
    run_id = create_run(engine, DEMO_TASK, gated())
    with pytest.raises(KeyboardInterrupt):
        execute_run(engine, run_id, gateway=gateway)
    with Session(engine) as s:
        paid_before = s.exec(select(LLMCall).where(LLMCall.stage == "gate", LLMCall.cache_hit.is_(False),
                                                   LLMCall.error.is_(None))).all()
    assert 0 < len(paid_before) < 12
    model, gateway = scripted(engine, rollout=mixed_rollouts(), gate=right)
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "completed", run.error
    assert model.count("gate") == 12 - len(paid_before)
    assert step_of(engine, run_id).gate["decision"] == "passed"


def test_passes_follows_the_rule():
    worse = paired({i: [1.0] for i in range(8)}, {i: [0.0] for i in range(8)})
    same = paired({i: [1.0] for i in range(8)}, {i: [1.0] for i in range(8)})
    slightly = paired({i: [0.0] for i in range(8)}, {i: [1.0 if i < 2 else 0.0] for i in range(8)})
    assert not passes("no_worse", worse) and passes("no_worse", same) and passes("no_worse", slightly)
    assert not passes("better", same) and not passes("better", slightly)
    assert passes("better", paired({i: [0.0] for i in range(8)}, {i: [1.0] for i in range(8)}))


def test_the_gate_line_reads_like_the_issue():
    line = gate_line(GateVerdict.model_validate({
        "decision": "passed", "rule": "no_worse", "n": 20, "k": 2, "mean_before": 0.55, "mean_after": 0.62,
        "delta": 0.07, "ci_low": -0.02, "ci_high": 0.16, "p_value": 0.21, "finding": "no detectable difference"}))
    assert line.startswith("validation, 20 queries x 2: 0.55 -> 0.62, +0.07 [-0.02, +0.16], sign test p = 0.21: "
                           "no detectable difference")


def test_the_cli_takes_the_gate_settings_and_prints_each_steps_gate(engine, demo_task, scripted, capsys):
    from core.cli import main

    url = url_with_password(engine)
    assert main(["--db", url, "train", "--task", DEMO_TASK, "--limit", "2", "--batch-size", "2", "--group-size", "2",
                 "--epochs", "1", "--gate", "better", "--validation-size", "6", "--gate-k", "1",
                 "--max-operations", "3", "--lessons", "--no-examples", "--no-reference-when-all-fail",
                 "--queue"]) == 0  # the paper's lessons, not the embedded learner's defaults (test_run_defaults.py)
    with Session(engine) as s:
        run = s.exec(select(Run)).one()
    assert {k: run.settings[k] for k in ("gate", "validation_size", "gate_k", "max_operations")} == {
        "gate": "better", "validation_size": 6, "gate_k": 1, "max_operations": 3}
    model, gateway = scripted(engine, rollout=mixed_rollouts(), gate=answers(right_with_experience=True))
    execute_run(engine, run.id, gateway=gateway)
    assert "At most 3 operations" in next(m for stage, m in model.calls if stage == "update")[-1]["content"]
    capsys.readouterr()
    assert main(["--db", url, "run", str(run.id)]) == 0
    out = capsys.readouterr().out
    assert "validation gate (better, 6 train queries):" in out
    assert "epoch 1 batch 1: validation, 6 queries x 1: 0.00 -> 1.00, +1.00 [+1.00, +1.00]" in out
    assert "gate better passed" in out
    assert main(["--db", url, "train", "--task", DEMO_TASK, "--gate", "sometimes"]) == 2
