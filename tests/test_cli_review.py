"""Review from the command line (issue 36): `review RUN` lists what waits in a run's steps with each operation's id,
kind, text, flags, evidence and the gate line; `review approve|reject|edit|approve-all` decide through the
Review page's core functions; `run N` says what waits and prints the command that decides it."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from sqlmodel import Session, select

from core.cli import main
from core.records.review.gate_verdict import GateVerdict
from storage import queries
from storage.tables import AuditEvent, LibraryVersion, Operation, Rollout, Run, Step
from tests.test_review import TWO_ADDS
from tests.ui_support import seeded_run

KEPT = "Re-read the question to find which quantity it asks for."
CUT = "Check which quantity the question asks for and the"
KEPT_AND_CUT = json.dumps({"operations": [{"op": "ADD", "ids": [], "text": KEPT, "rationale": "one"},
                                          {"op": "ADD", "ids": [], "text": CUT, "rationale": "two"}]})


def in_process(database_url: str, capsys) -> Callable[..., tuple[int, str, str]]:
    """`run("review", "3")`: the command run in-process on the database, as (exit code, stdout, stderr)."""

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(["--db", database_url, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def cli(database_url, demo_task, capsys):
    return in_process(database_url, capsys)


def the_step(engine, run_id: int) -> tuple[Run, Step, list[Operation], list[LibraryVersion]]:
    with Session(engine) as session:
        run = session.get(Run, run_id)
        [step] = queries.steps(session, run_id)
        ops = queries.step_operations(session, step.id)
        versions = queries.versions(session, run.library_id)
        session.expunge_all()
    return run, step, ops, versions


def test_review_lists_a_waiting_steps_operations_with_kind_text_flags_evidence_and_the_gate_line(engine, cli):
    run_id = seeded_run(engine, "manual", update=KEPT_AND_CUT)
    _run, step, (kept, cut), _versions = the_step(engine, run_id)
    gate_line = GateVerdict.of(step).line
    assert gate_line

    code, out, _ = cli("review", str(run_id))
    assert code == 0
    assert "step 1 of 1 · epoch 1 · batch 1 · awaiting_review · 2 operations pending" in out
    assert f"gate: {gate_line}" in out
    first, second = out.split(f"\nop {kept.id} · ")[1].split(f"\nop {cut.id} · ")
    assert first.startswith("operation 1 · ADD lesson · pending") and KEPT in first and "flag" not in first
    assert second.startswith("operation 2 · ADD lesson · pending") and CUT in second
    assert "cut_off: The text looks cut off mid-sentence" in second
    assert first.count("  evidence   group ") == 2 and "rewards 1, 0" in first and "semantic advantage: " in first
    assert f"python -m core review approve-all {run_id} --step 1" in out

    code, out, _ = cli("review", str(run_id), "--json")
    assert code == 0
    shown = json.loads(out)
    [listed] = shown["steps"]
    assert (shown["run_id"], shown["status"], listed["step"], listed["gate"]["line"]) == (
        run_id, "awaiting_review", 1, gate_line)
    assert [(o["id"], o["op"], o["kind"], o["text"], o["status"]) for o in listed["operations"]] == [
        (kept.id, "ADD", "lesson", KEPT, "pending"), (cut.id, "ADD", "lesson", CUT, "pending")]
    assert [[f["code"] for f in o["flags"]] for o in listed["operations"]] == [[], ["cut_off"]]
    evidence = listed["operations"][0]["evidence"]
    assert sorted(e["advantage_id"] for e in evidence) == sorted(kept.source_advantage_ids)
    assert all(sorted(r["reward"] for r in e["rollouts"]) == [0.0, 1.0] and e["query"] for e in evidence)


def test_a_run_with_nothing_waiting_says_so_and_a_missing_step_is_an_error(engine, cli):
    run_id = seeded_run(engine, "manual")
    assert cli("review", "approve-all", str(run_id))[0] == 0
    code, out, _ = cli("review", str(run_id))
    assert code == 0 and f"no step of run {run_id} waits for review; show one with --step N (1 to 1)" in out
    code, out, _ = cli("review", str(run_id), "--step", "1")  # a decided step is still shown when named
    assert code == 0 and "step 1 of 1 · epoch 1 · batch 1 · completed · 0 operations pending" in out
    code, _, err = cli("review", str(run_id), "--step", "2")
    assert code == 2 and err.startswith(f"error: run {run_id} has no step 2: it has 1 step so far")


def test_approve_all_applies_the_step_as_a_new_version(engine, cli):
    run_id = seeded_run(engine, "manual")
    _run, _step, [op], versions = the_step(engine, run_id)
    assert len(versions) == 1

    code, out, _ = cli("review", "approve-all", str(run_id))  # the run's only waiting step: no --step needed
    assert code == 0
    run, step, [op], versions = the_step(engine, run_id)
    assert (step.status, op.status, op.reviewer) == ("completed", "applied", "cli")
    assert [v.number for v in versions] == [1, 2] and [e["text"] for e in versions[-1].experiences] == [KEPT]
    assert out.splitlines() == [
        f"1 operation of run {run_id} step 1 approved",
        f"step 1 of 1 · epoch 1 · batch 1 applied as version #2; run {run_id} is queued to "
        f"go on: a worker continues it (python -m core worker), or python -m core train --resume {run_id} here"]
    assert run.status == "queued"


def test_approving_one_by_one_says_what_still_waits_then_what_landed(engine, cli):
    run_id = seeded_run(engine, "manual", settings={"gate": "off"}, update=TWO_ADDS)
    _run, _step, (first, second), _versions = the_step(engine, run_id)
    code, out, _ = cli("review", "approve", str(first.id))
    assert code == 0 and out.splitlines() == [
        f"op {first.id} (operation 1) approved",
        f"step 1 of 1 · epoch 1 · batch 1 still waits: 1 operation pending (python -m core review {run_id})"]
    code, out, _ = cli("review", "approve", str(second.id))
    assert code == 0 and "step 1 of 1 · epoch 1 · batch 1 applied as version #2" in out
    code, _, err = cli("review", "approve", str(second.id))
    assert code == 2 and err.startswith(f"error: operation {second.id} was already applied")


def test_reject_stores_the_reason_as_the_page_does(engine, cli):
    run_id = seeded_run(engine, "manual")
    _run, _step, [op], _versions = the_step(engine, run_id)
    code, out, _ = cli("review", "reject", str(op.id), "--reason", "a guess, not a lesson")
    assert code == 0
    assert out.splitlines() == [f"op {op.id} (operation 1) rejected",
                                f"step 1 of 1 · epoch 1 · batch 1 applied: the library did not change; run {run_id} "
                                f"is queued to go on: a worker continues it (python -m core worker), or python -m "
                                f"core train --resume {run_id} here"]
    _run, step, [op], versions = the_step(engine, run_id)
    assert (op.status, op.comment, op.reviewer, step.status, len(versions)) == (
        "rejected", "a guess, not a lesson", "cli", "completed", 1)
    with Session(engine) as session:
        [event] = session.exec(select(AuditEvent).where(AuditEvent.action == "operation.reject")).all()
    assert (event.actor, event.object_id) == ("cli", op.id)
    code, out, _ = cli("review", str(run_id), "--step", "1")
    assert "decision   rejected by cli at " in out and ": a guess, not a lesson" in out


def test_edit_replaces_the_text_checked_as_the_learners_and_lands_it(engine, cli):
    run_id = seeded_run(engine, "manual", settings={"gate": "off"})
    _run, _step, [op], _versions = the_step(engine, run_id)
    code, _, err = cli("review", "edit", str(op.id), "--targets", "E99")
    assert code == 2 and err.startswith("error: the edited operation is not valid")
    assert the_step(engine, run_id)[2][0].status == "pending"
    code, _, err = cli("review", "edit", str(op.id))
    assert code == 2 and "give --text, --targets or both" in err

    edited = "Write each quantity with its unit before computing."
    code, out, _ = cli("review", "edit", str(op.id), "--text", edited)
    assert code == 0 and out.splitlines()[0] == f"op {op.id} (operation 1) edited: ADD"
    assert "applied as version #2" in out
    _run, _step, [op], versions = the_step(engine, run_id)
    assert (op.status, op.text, op.reviewer) == ("applied", edited, "cli")
    assert [e["text"] for e in versions[-1].experiences] == [edited]


def test_a_partly_approved_gated_step_is_queued_to_measure_the_decided_library_and_run_says_so(engine, cli):
    run_id = seeded_run(engine, "manual", update=TWO_ADDS)
    _run, _step, (first, second), _versions = the_step(engine, run_id)
    assert cli("review", "approve", str(first.id))[0] == 0
    code, out, _ = cli("review", "reject", str(second.id))
    assert code == 0
    assert ("step 1 of 1 · epoch 1 · batch 1 decided, not applied yet: the reviewed library differs from the one "
            "the validation gate measured") in out
    assert out.splitlines()[-1].endswith(f"; run {run_id} is queued to measure it: a worker continues it (python -m "
                                         f"core worker), or python -m core train --resume {run_id} here")
    run, step, _ops, versions = the_step(engine, run_id)
    assert (run.status, step.status, len(versions)) == ("queued", "awaiting_review", 1)
    code, out, _ = cli("run", str(run_id))
    assert out.splitlines()[-1] == (
        f"queued: the decided library of step 1 of 1 · epoch 1 · batch 1 is measured before it lands; a worker "
        f"continues it (python -m core worker), or python -m core train --resume {run_id} here")


def test_approving_against_a_failed_gate_needs_a_note_as_on_the_page(engine, cli):
    from tests.test_gate import answers

    run_id = seeded_run(engine, "manual", gate=answers(right_with_experience=False),
                        settings={"validation_size": 6, "gate_k": 1})
    _run, step, [op], _versions = the_step(engine, run_id)
    assert GateVerdict.of(step).failed
    code, out, _ = cli("review", str(run_id))
    assert "gate no_worse failed" in out and "the gate failed: approving or editing needs --note saying why" in out

    for argv in (["approve", str(op.id)], ["approve-all", str(run_id), "--step", "1"],
                 ["edit", str(op.id), "--text", "Write each quantity with its unit first."],
                 ["approve", str(op.id), "--note", "  "]):
        code, _, err = cli("review", *argv)
        assert code == 2, argv
        assert err.startswith("error: the validation gate failed for this step (") and "needs a note" in err
    assert the_step(engine, run_id)[2][0].status == "pending"

    code, out, _ = cli("review", "approve", str(op.id), "--note", "the validation queries are not like production")
    assert code == 0 and "applied as version #2" in out
    _run, _step, [op], versions = the_step(engine, run_id)
    assert (op.status, op.comment, len(versions)) == ("applied", "the validation queries are not like production", 2)


def test_rejecting_against_a_failed_gate_needs_no_note(engine, cli):
    from tests.test_gate import answers

    run_id = seeded_run(engine, "manual", gate=answers(right_with_experience=False),
                        settings={"validation_size": 6, "gate_k": 1})
    code, out, _ = cli("review", "reject-all", str(run_id), "--step", "1")
    assert code == 0 and out.startswith(f"1 operation of run {run_id} step 1 rejected")
    assert the_step(engine, run_id)[2][0].status == "rejected"


def test_run_names_what_waits_and_the_command_that_decides_it(engine, cli):
    run_id = seeded_run(engine, "manual", update=TWO_ADDS)
    code, out, _ = cli("run", str(run_id))
    assert code == 0 and out.splitlines()[-1] == (
        f"waits for review: step 1 of 1 · epoch 1 · batch 1, 2 operations pending; decide: python -m core review "
        f"{run_id} --step 1")

    with Session(engine) as session:  # the same run waiting for a person's label instead
        run = session.get(Run, run_id)
        run.status = "awaiting_labels"
        rollout = session.exec(select(Rollout).where(Rollout.step_id == queries.steps(session, run_id)[0].id)).first()
        rollout.label_status = "needed"
        session.add_all([run, rollout])
        session.commit()
    code, out, _ = cli("run", str(run_id))
    assert out.splitlines()[-1] == (
        "waits for labels: 1 rollout of this run needs a person's label; label them on the Labeling page "
        "(python -m core queue --task 'arithmetic word problems' shows the queue); once labelled the run is queued "
        "again and a worker (python -m core worker) continues it")

    with Session(engine) as session:
        run = session.get(Run, run_id)
        run.status, run.error = "failed", "the learner's update failed: boom"
        session.add(run)
        session.commit()
    code, out, _ = cli("run", str(run_id))
    assert out.splitlines()[0] == f"run {run_id}: failed (the learner's update failed: boom)"
    assert out.splitlines()[-1] == (
        f"failed (the error is on the first line); resume it with python -m core run {run_id} --resume (a worker "
        f"continues it) or python -m core train --resume {run_id} (here)")


def test_a_worked_example_is_listed_as_one_with_the_output_it_was_compressed_from(engine, cli, scripted):
    from core.grpo.training import create_run, execute_run
    from core.records.tasks.demos import DEMO_TASK
    from tests.conftest import mixed_rollouts
    from tests.test_worked_examples import example_reply, settings

    _model, gateway = scripted(engine, rollout=mixed_rollouts(), example=example_reply(right=True))
    run_id = execute_run(engine, create_run(engine, DEMO_TASK, settings(limit=1, review_mode="manual")),
                         gateway=gateway).id
    code, out, _ = cli("review", str(run_id), "--json")
    ops = json.loads(out)["steps"][0]["operations"]
    assert code == 0 and [(o["op"], o["kind"]) for o in ops] == [("ADD", "lesson"), ("ADD", "example")]
    source = ops[1]["example_source"]
    assert (source["from"], source["group"], source["reward"]) == ("rollout", 1, 1.0)
    code, out, _ = cli("review", str(run_id))
    assert "operation 1 · ADD lesson · pending" in out and "operation 2 · ADD example · pending" in out
    assert f"  example    compressed from group 1 output {source['output']} · reward 1" in out


def test_an_example_made_from_the_reference_says_so(engine, cli, scripted):
    from core.grpo.training import create_run, execute_run
    from core.records.tasks.demos import DEMO_TASK
    from tests.test_worked_examples import settings

    _model, gateway = scripted(engine)  # every attempt fails: the reference is the example
    run_id = execute_run(engine, create_run(engine, DEMO_TASK, settings(
        limit=1, lessons=False, reference_when_all_fail=True, review_mode="manual")), gateway=gateway).id
    code, out, _ = cli("review", str(run_id), "--json")
    [op] = json.loads(out)["steps"][0]["operations"]
    assert (op["kind"], op["example_source"]["from"]) == ("example", "reference")
    code, out, _ = cli("review", str(run_id))
    assert "operation 1 · ADD example · pending" in out
    assert (f"  example    made from sample #{op['example_source']['sample_id']}'s reference answer: every attempt "
            "of group 1 failed") in out


def test_an_example_made_from_the_reference_of_a_group_with_a_right_attempt_says_how_the_group_went(engine, cli,
                                                                                                     scripted):
    """Without learner replies, a facts task's mixed group also gets its example from the reference: the review
    says how many attempts failed, not that every one did."""
    from core.domain.reference_answers import reference_parts, template_reply
    from core.grpo.training import RunSettings, create_run, execute_run
    from core.records.tasks.demos import POLICY_TASK, ensure_policy_task
    from tests.conftest import per_query
    from tests.test_policy_demo import NO_POLICY

    task = ensure_policy_task(engine)
    with Session(engine) as session:
        references = {s.query: s.reference for s in queries.samples(session, task.id, "train")}
    rollout = per_query(lambda query, n: template_reply(reference_parts("facts", references[query])) if n == 1
                        else NO_POLICY)
    _model, gateway = scripted(engine, rollout=rollout)
    run_id = execute_run(engine, create_run(engine, POLICY_TASK, RunSettings(
        epochs=1, batch_size=1, group_size=2, limit=1, gate="off", review_mode="manual", examples=True,
        lessons=False, reference_when_all_fail=True, learner_replies=False)), gateway=gateway).id
    code, out, _ = cli("review", str(run_id))
    assert code == 0 and "reference answer: 1 of 2 attempts of group 1 failed" in out
    assert "every attempt" not in out
