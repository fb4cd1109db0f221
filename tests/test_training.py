"""The training loop on scripted model replies: every stage, every failure path, resume, review."""

from __future__ import annotations

import json

import litellm
from sqlmodel import Session, select

import core.grpo.training as training
from core.grpo.training import RunSettings, create_run, execute_run, plan_batches
from core.records.review.decisions import apply_step_operations, decide_all, decide_operation
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.tables import Advantage, LibraryVersion, LLMCall, Operation, Rollout, Run, Sample
from tests.conftest import mixed_rollouts


def small(**kw) -> RunSettings:
    base = {"epochs": 1, "batch_size": 2, "group_size": 2, "limit": 2, "concurrency": 2, "gate": "off"}
    return RunSettings(**{**base, **kw})


def run_once(engine, gateway, **kw) -> Run:
    run_id = create_run(engine, DEMO_TASK, small(**kw))
    return execute_run(engine, run_id, gateway=gateway)


def test_plan_batches_is_seeded_and_covers_every_sample_each_epoch():
    plan = plan_batches(list(range(10)), epochs=2, batch_size=4, seed=7)
    assert [len(ids) for _, _, ids in plan] == [4, 4, 2, 4, 4, 2]
    for epoch in (0, 1):
        assert sorted(i for e, _, ids in plan if e == epoch for i in ids) == list(range(10))
    assert plan == plan_batches(list(range(10)), epochs=2, batch_size=4, seed=7)
    assert plan != plan_batches(list(range(10)), epochs=2, batch_size=4, seed=8)


def test_mixed_groups_go_through_every_stage_and_make_a_new_version(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts())
    run = run_once(engine, gateway)
    assert run.status == "completed", run.error
    assert model.count("rollout") == 4 and model.count("summary") == 4
    assert model.count("advantage") == 2 and model.count("update") == 1
    p = run.progress
    assert (p["steps_done"], p["steps_total"], p["rollouts_done"], p["rollouts_total"]) == (1, 1, 4, 4)
    assert (p["rewards"], p["summaries"], p["advantages"], p["operations_applied"], p["calls"]) == (4, 4, 2, 1, 11)
    with Session(engine) as s:
        version = s.get(LibraryVersion, run.current_version_id)
        assert version.number == 2 and version.source == "run" and version.run_id == run.id
        assert [e["text"] for e in version.experiences] == ["Re-read the question to find which quantity it asks for."]
        rewards = sorted(r.reward for r in s.exec(select(Rollout)))
        assert rewards == [0.0, 0.0, 1.0, 1.0]
        ops = s.exec(select(Operation)).all()
        assert [(o.op, o.status) for o in ops] == [("ADD", "applied")]
        stages = {c.stage for c in queries.calls(s, run_id=run.id)}
        assert stages == {"rollout", "summary", "advantage", "update"}
        limits = {(c.stage, c.request["params"]["max_tokens"]) for c in queries.calls(s, run_id=run.id)}
        # a summary is asked for 120 words and may take SUMMARY_TOKENS, not the learner's whole 768
        assert limits == {("rollout", 1024), ("summary", 320), ("advantage", 768), ("update", 768)}


def test_equal_rewards_skip_the_group_when_ground_truth_is_used(engine, demo_task, scripted):
    model, gateway = scripted(engine)  # every rollout answers 0: all wrong
    run = run_once(engine, gateway)
    assert run.status == "completed"
    assert model.count("summary") == 0 and model.count("advantage") == 0 and model.count("update") == 0
    with Session(engine) as s:
        assert {a.status for a in s.exec(select(Advantage))} == {"skipped"}
        assert s.get(LibraryVersion, run.current_version_id).number == 1


def test_an_all_failed_group_reaches_the_learner_with_the_reference_only_when_the_option_is_on(
        engine, demo_task, scripted):
    """Every rollout answers 0 (all wrong): off, the groups are skipped (the paper); on, each goes to the learner,
    whose prompt shows the reference as the successful side, and the advantage says so first."""
    model, gateway = scripted(engine)
    run = run_once(engine, gateway)
    assert model.count("advantage") == 0
    with Session(engine) as s:
        assert {a.status for a in s.exec(select(Advantage))} == {"skipped"}

    model, gateway = scripted(engine)
    run = run_once(engine, gateway, reference_when_all_fail=True, seed=1)
    assert run.status == "completed", run.error
    assert model.count("advantage") == 2 and model.count("update") == 1
    with Session(engine) as s:
        step = queries.steps(s, run.id)[0]
        assert [bool(r.summary) for r in queries.step_rollouts(s, step.id)] == [True] * 4
        advantages = s.exec(select(Advantage).where(Advantage.step_id == step.id)).all()
        samples = {a.sample_id: s.get(Sample, a.sample_id) for a in advantages}
        assert [a.status for a in advantages] == ["ok", "ok"]
        for advantage in advantages:
            assert advantage.text.startswith("Every attempt failed (2 attempts, reward 0); the reference answer was "
                                             "the successful side.")
        assert step.stats["from_reference"] == 2
        assert s.get(LibraryVersion, run.current_version_id).number == 2
    prompts = [messages[-1]["content"] for stage, messages in model.calls if stage == "advantage"]
    for sample in samples.values():
        prompt = next(p for p in prompts if sample.query in p)
        assert f"Reference answer (the successful side; written by a person, not an attempt):\n{sample.reference}" \
            in prompt
        assert "Every attempt failed." in prompt and "Attempt 1 (reward 0)" in prompt


def test_the_reference_option_needs_ground_truth():
    import pytest

    from core.errors import InvalidInput

    with pytest.raises(InvalidInput, match="needs ground truth"):
        RunSettings.build(reference_when_all_fail=True, ground_truth=False)


def test_malformed_advantage_json_fails_that_group_only(engine, demo_task, scripted):
    good = json.dumps({"analysis": "a", "experiences": ["Re-read the question to find which quantity it asks for."]})
    with Session(engine) as s:
        broken_query = queries.samples(s, demo_task.id, "train", limit=1)[0].query

    def advantage(messages):
        return "still not json" if broken_query in messages[-1]["content"] else good

    model, gateway = scripted(engine, rollout=mixed_rollouts(), advantage=advantage)
    run = run_once(engine, gateway)
    assert run.status == "completed"
    with Session(engine) as s:
        advs = s.exec(select(Advantage).order_by(Advantage.id)).all()
        assert sorted(a.status for a in advs) == ["failed", "ok"]
        failed = next(a for a in advs if a.status == "failed")
        assert "not the JSON asked for" in failed.error and failed.raw_response == "still not json"
        assert s.get(LibraryVersion, run.current_version_id).number == 2


def test_operation_on_unknown_id_is_rejected_with_a_reason(engine, demo_task, scripted):
    update = json.dumps({"operations": [
        {"op": "MODIFY", "ids": ["E42"], "text": "Check units before adding any quantities.", "rationale": "x"},
        {"op": "ADD", "ids": [], "text": "Check units before adding any quantities together.", "rationale": "y"},
    ]})
    model, gateway = scripted(engine, rollout=mixed_rollouts(), update=update)
    run = run_once(engine, gateway)
    with Session(engine) as s:
        ops = s.exec(select(Operation).order_by(Operation.position)).all()
        assert [(o.op, o.status) for o in ops] == [("MODIFY", "invalid"), ("ADD", "applied")]
        assert ops[0].validation_error == "unknown experience id E42"
        assert len(s.get(LibraryVersion, run.current_version_id).experiences) == 1


def test_a_step_whose_every_group_failed_fails_the_run_and_a_resume_redoes_it(engine, demo_task, scripted):
    error = litellm.AuthenticationError("bad key", llm_provider="openai", model="x")
    model, gateway = scripted(engine, rollout=error)
    run = run_once(engine, gateway)
    assert run.status == "failed"
    assert "epoch 1 batch 1 failed: every group failed (2 of 2)" in run.error and "resume the run" in run.error
    with Session(engine) as s:
        advs = s.exec(select(Advantage)).all()
        assert len(advs) == 2 and all(a.status == "failed" and "AuthenticationError" in a.error for a in advs)
        assert all(r.error for r in s.exec(select(Rollout)))
        errors = s.exec(select(LLMCall).where(LLMCall.error.is_not(None))).all()
        assert len(errors) == 4 and all(c.attempts == 1 for c in errors)  # not transient: no retry
        assert [(st.status, st.error is not None) for st in queries.steps(s, run.id)] == [("failed", True)]
        assert len(queries.versions(s, run.library_id)) == 1
    model.replies["rollout"] = mixed_rollouts()  # the provider works again
    again = execute_run(engine, run.id, gateway=gateway)
    assert (again.status, again.error) == ("completed", None)
    with Session(engine) as s:
        assert [(st.status, st.error) for st in queries.steps(s, run.id)] == [("completed", None)]
        assert {a.status for a in s.exec(select(Advantage))} == {"ok"}
        assert len(s.exec(select(Rollout)).all()) == 4  # the failed rollouts were replaced, not duplicated
        assert len(queries.versions(s, run.library_id)) == 2


def test_a_run_ends_with_its_final_counters_in_the_same_commit_as_its_status(engine, demo_task, scripted,
                                                                           monkeypatch):
    """A poller that reads `failed` must read the groups that failed it: the counters are not left to a later
    write (the worker test on PostgreSQL once saw the status without them)."""
    seen = []
    notify = training.notify_run_failed
    monkeypatch.setattr(training, "notify_run_failed",
                        lambda session, run: (seen.append((run.status, dict(run.progress))), notify(session, run)))
    _model, gateway = scripted(engine, rollout=litellm.AuthenticationError("bad key", llm_provider="openai", model="x"))
    run = run_once(engine, gateway)
    assert run.status == "failed"
    [(status, progress)] = seen
    assert status == "failed" and progress["groups_failed"] == 2 and progress["rollout_errors"] == 4
    assert progress == run.progress


def test_a_failed_update_fails_the_run_and_a_resume_asks_again(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts(), update="no JSON here")
    run = run_once(engine, gateway)
    assert run.status == "failed" and "the learner's update failed" in run.error
    model.replies["update"] = json.dumps({"operations": [
        {"op": "ADD", "ids": [], "text": "Re-read the question to find which quantity it asks for.",
         "rationale": "failed attempts answered the wrong quantity"}]})
    paid = {stage: model.count(stage) for stage in ("rollout", "summary", "advantage")}
    again = execute_run(engine, run.id, gateway=gateway)
    assert again.status == "completed"
    assert {stage: model.count(stage) for stage in paid} == paid  # only the update is asked again
    with Session(engine) as s:
        assert len(queries.versions(s, run.library_id)) == 2


def test_no_ground_truth_hides_reward_and_reference_and_keeps_every_group(engine, demo_task, scripted):
    model, gateway = scripted(engine)  # all answers agree: with ground truth these groups would be skipped
    run = run_once(engine, gateway, ground_truth=False)
    assert run.status == "completed"
    assert model.count("advantage") == 2
    with Session(engine) as s:
        references = [smp.reference for smp in queries.samples(s, demo_task.id, "train", limit=2)]
        assert {r.reward_source for r in s.exec(select(Rollout))} == {"majority"}
    learner_text = " ".join(m["content"] for stage, msgs in model.calls if stage != "rollout" for m in msgs)
    assert "Reference answer" not in learner_text and "reward" not in learner_text.lower().replace("rewards", "")
    assert not any(f"Reference answer: {ref}" in learner_text for ref in references)


def test_group_size_one_critiques_single_attempts(engine, demo_task, scripted):
    model, gateway = scripted(engine)
    run = run_once(engine, gateway, group_size=1)
    assert run.status == "completed"
    assert model.count("rollout") == 2 and model.count("advantage") == 2
    assert "Critique this single attempt" in model.calls[-2][1][-1]["content"] or any(
        "Critique this single attempt" in msgs[-1]["content"] for stage, msgs in model.calls if stage == "advantage")


def test_direct_baseline_writes_experiences_without_rollouts(engine, demo_task, scripted):
    model, gateway = scripted(engine)
    run_id = create_run(engine, DEMO_TASK, small(), kind="direct")
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "completed" and model.count("rollout") == 0 and model.count("direct") == 1
    with Session(engine) as s:
        version = s.get(LibraryVersion, run.current_version_id)
        assert version.source == "direct"
        assert [e["id"] for e in version.experiences] == ["E1", "E2"]


def test_resume_makes_no_call_again(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts())
    run_id = create_run(engine, DEMO_TASK, small(epochs=2))
    execute_run(engine, run_id, gateway=gateway)
    with Session(engine) as s:
        run = s.get(Run, run_id)
        run.status = "failed"  # as if it had died; a resume replays the whole plan
        s.add(run)
        s.commit()
    paid_before = len(model.calls)
    again = execute_run(engine, run_id, gateway=gateway)
    assert again.status == "completed"
    assert len(model.calls) == paid_before


def test_manual_review_waits_then_continues_after_approval(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts())
    run_id = create_run(engine, DEMO_TASK, small(review_mode="manual"))
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "awaiting_review"
    with Session(engine) as s:
        step = queries.steps(s, run_id)[0]
        assert step.status == "awaiting_review"
        assert [o.status for o in queries.step_operations(s, step.id)] == ["pending"]
    assert execute_run(engine, run_id, gateway=gateway).status == "awaiting_review"  # resumed too early: waits
    try:
        apply_step_operations(engine, step.id, actor="alice")
        raise AssertionError("applying with pending operations must fail")
    except ValueError as exc:
        assert "awaiting review" in str(exc)
    assert decide_all(engine, step.id, "approved", actor="alice") == 1
    version = apply_step_operations(engine, step.id, actor="alice")
    assert version.number == 2 and version.created_by == "alice"
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "completed" and run.current_version_id == version.id


def test_budget_pauses_the_run(engine, demo_task, scripted, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-never-sent")  # a priced model passes the model check; replies are scripted
    model, gateway = scripted(engine, rollout=mixed_rollouts())
    run_id = create_run(engine, DEMO_TASK, small(epochs=3, policy_model="openai/gpt-4o-mini",
                                                learner_model="openai/gpt-4o-mini", budget_usd=0.00001))
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "paused" and "budget" in run.error


def test_invalid_settings_are_refused(engine, demo_task):
    for bad in ({"epochs": 0}, {"group_size": 0}, {"temperature": 3}, {"review_mode": "maybe"}):
        try:
            create_run(engine, DEMO_TASK, small(**bad))
        except ValueError:
            continue
        raise AssertionError(f"{bad} was accepted")


def test_a_sample_without_reference_is_scored_zero_with_the_reason_and_the_run_goes_on(engine, demo_task, scripted,
                                                                                       capsys):
    from core.cli.report import report_run
    from storage.tables import Sample

    with Session(engine) as s:
        first_id = queries.samples(s, demo_task.id, "train", limit=1)[0].id
        row = s.get(Sample, first_id)
        row.reference = None
        s.add(row)
        s.commit()
    model, gateway = scripted(engine, rollout=mixed_rollouts())
    run = run_once(engine, gateway)
    assert run.status == "completed"
    with Session(engine) as s:
        bad = [r for r in s.exec(select(Rollout)) if r.sample_id == first_id]
        assert {(r.reward, r.reward_source) for r in bad} == {(0.0, "error")}
        assert "needs a reference answer" in bad[0].reward_detail
    report_run(engine, run.id)
    assert "2 rollouts could not be scored" in capsys.readouterr().out


def test_pause_requested_mid_step_stops_cleanly_and_resume_finishes(engine, demo_task, scripted):
    run_id = create_run(engine, DEMO_TASK, small(epochs=2))
    answers = mixed_rollouts()

    def rollout(messages):
        if len([c for c in model.calls if c[0] == "rollout"]) == 3:
            with Session(engine) as s:  # what the Train page's pause button will do
                run = s.get(Run, run_id)
                run.status = "paused"
                s.add(run)
                s.commit()
        return answers(messages)

    model, gateway = scripted(engine, rollout=rollout)
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "paused"
    with Session(engine) as s:
        assert not [a for a in s.exec(select(Advantage)) if a.status == "failed"]
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "completed"
    with Session(engine) as s:
        assert len(queries.steps(s, run_id)) == 2


CUT_OFF = "Check which quantity the question asks for and the"
TWO_ADDS_ONE_CUT_OFF = json.dumps({"operations": [
    {"op": "ADD", "ids": [], "text": "Re-read the question to find which quantity it asks for.", "rationale": "a"},
    {"op": "ADD", "ids": [], "text": CUT_OFF, "rationale": "b"}]})


def test_auto_review_refuses_a_flagged_operation_and_approves_the_rest(engine, demo_task, scripted):
    """A flagged operation is invalid in auto review mode (issue 26): the run goes on without a person."""
    model, gateway = scripted(engine, rollout=mixed_rollouts(), update=TWO_ADDS_ONE_CUT_OFF)
    run_id = create_run(engine, DEMO_TASK, small())
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "completed"
    with Session(engine) as s:
        clean, flagged = queries.step_operations(s, queries.steps(s, run_id)[0].id)
        texts = [e["text"] for e in s.get(LibraryVersion, run.current_version_id).experiences]
    assert (clean.status, clean.reviewer) == ("applied", "auto")
    assert (flagged.text, flagged.status, flagged.reviewer) == (CUT_OFF, "invalid", None)
    assert "The text looks cut off mid-sentence" in flagged.validation_error
    assert texts == [clean.text]


def test_auto_review_without_hold_flagged_approves_flagged_operations_too(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts(), update=TWO_ADDS_ONE_CUT_OFF)
    run = run_once(engine, gateway, hold_flagged=False)
    assert run.status == "completed"
    with Session(engine) as s:
        assert [(o.status, o.reviewer) for o in s.exec(select(Operation).order_by(Operation.position))] == [
            ("applied", "auto"), ("applied", "auto")]


def test_a_rejection_and_its_reason_are_told_to_the_learner_in_later_steps(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts())
    run_id = create_run(engine, DEMO_TASK, small(epochs=2, review_mode="manual"))
    assert execute_run(engine, run_id, gateway=gateway).status == "awaiting_review"
    [first_update] = [m for stage, m in model.calls if stage == "update"]
    assert "rejected because" not in first_update[-1]["content"]
    with Session(engine) as s:
        [op] = queries.step_operations(s, queries.steps(s, run_id)[0].id)
    decide_operation(engine, op.id, "rejected", "alice", comment="too vague to help")

    assert execute_run(engine, run_id, gateway=gateway).status == "awaiting_review"  # the second step
    later = [m for stage, m in model.calls if stage == "update"][-1][-1]["content"]
    assert f"Rejected earlier: {op.text} — rejected because too vague to help" in later


def test_a_redone_step_asks_nothing_again_for_its_finished_groups(engine, demo_task, scripted):
    """A step redone after a failure reads which of its groups and rollouts are stored (once, for the whole step)
    and leaves the finished ones alone: no call, not even one answered from the cache."""
    model, gateway = scripted(engine, rollout=mixed_rollouts())
    run_id = create_run(engine, DEMO_TASK, small(epochs=1))
    assert execute_run(engine, run_id, gateway=gateway).status == "completed"
    with Session(engine) as s:
        run = s.get(Run, run_id)
        step = queries.steps(s, run_id)[0]
        run.status, step.status = "failed", "failed"  # as if the step had failed after its groups were done
        s.add(run)
        s.add(step)
        s.commit()
        ledger_before = len(s.exec(select(LLMCall)).all())
    paid_before = len(model.calls)
    assert execute_run(engine, run_id, gateway=gateway).status == "completed"
    with Session(engine) as s:
        assert len(s.exec(select(LLMCall)).all()) == ledger_before
    assert len(model.calls) == paid_before
