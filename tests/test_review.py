"""Reviewer decisions (core.records.review.decisions) and manual library changes (core.records.library.versions)."""

from __future__ import annotations

import json
import threading

import pytest
from sqlmodel import Session, select

from core.domain.library import ProposedOp
from core.errors import AlreadyDecided
from core.grpo.training import execute_run
from core.records.library.versions import edit_library, revert_to
from core.records.review.decisions import (
    decide_operation,
    decide_step,
    decided_elsewhere,
    edit_operation,
    measurement_outcome,
    remeasure_progress,
    reopen_operation,
    step_state,
)
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.lookup import ensure_library, get_task
from storage import queries
from storage.db import session_scope
from storage.tables import AuditEvent, Evaluation, LibraryVersion, Operation, Run, Step
from tests.ui_support import scripted_gateway, seeded_run

TWO_ADDS = json.dumps({"operations": [
    {"op": "ADD", "ids": [], "text": "Re-read the question to find which quantity it asks for.", "rationale": "a"},
    {"op": "ADD", "ids": [], "text": "Write each quantity next to its unit before computing.", "rationale": "b"}]})


def pending_ops(engine, run_id: int) -> list[Operation]:
    with Session(engine) as session:
        return list(session.exec(select(Operation).where(Operation.run_id == run_id, Operation.status == "pending")))


def library_versions(engine) -> list[LibraryVersion]:
    with Session(engine) as session:
        return list(session.exec(select(LibraryVersion).order_by(LibraryVersion.number)))


def test_the_last_decision_applies_the_step_and_queues_the_run(engine, demo_task):
    run_id = seeded_run(engine, "manual", settings={"gate": "off"}, update=TWO_ADDS)
    first, second = pending_ops(engine, run_id)
    decide_operation(engine, first.id, "approved", "ann")
    with Session(engine) as session:
        assert session.get(Run, run_id).status == "awaiting_review"
    assert len(library_versions(engine)) == 1
    decide_operation(engine, second.id, "rejected", "bob", comment="too specific")
    versions = library_versions(engine)
    assert [v.number for v in versions] == [1, 2]
    assert [e["text"] for e in versions[-1].experiences] == [first.text]
    with Session(engine) as session:
        assert session.get(Run, run_id).status == "queued"
        ops = {o.id: o for o in session.exec(select(Operation))}
        assert ops[first.id].status == "applied" and ops[first.id].reviewer == "ann"
        assert ops[second.id].status == "rejected" and ops[second.id].comment == "too specific"
        actions = [e.action for e in session.exec(select(AuditEvent).where(AuditEvent.object_type == "operation"))]
        assert actions == ["operation.approve", "operation.reject"]


def continue_run(engine, run_id: int, **overrides) -> Run:
    """What the worker does with a queued run: carry it on, on scripted replies."""
    _model, gateway = scripted_gateway(engine, **overrides)
    return execute_run(engine, run_id, gateway=gateway)


def the_step(engine, run_id: int) -> Step:
    with Session(engine) as session:
        return session.exec(select(Step).where(Step.run_id == run_id)).one()


def test_a_partly_approved_gated_step_is_measured_before_it_lands(engine, demo_task):
    run_id = seeded_run(engine, "manual", update=TWO_ADDS)
    first, second = pending_ops(engine, run_id)
    assert the_step(engine, run_id).gate["decision"] == "passed"  # the gate measured both ADDs together
    decide_operation(engine, first.id, "approved", "ann")
    decide_operation(engine, second.id, "rejected", "bob", comment="too specific")
    assert len(library_versions(engine)) == 1, "nothing lands that no gate measured"
    step = the_step(engine, run_id)
    assert step.status == "awaiting_review" and step.gate["remeasure"]
    assert "measured against the starting library before it lands" in step.gate["line"]
    first_line = step.gate["proposed"]["line"]  # the first verdict's own line, kept while the step waits
    assert first_line.startswith("validation, ") and first_line.endswith("gate no_worse passed"), first_line
    with Session(engine) as session:
        assert session.get(Run, run_id).status == "queued"  # for a worker: the measurement needs the model
        waiting = remeasure_progress(session, step)
    assert (waiting.done, waiting.status) == (0, "queued") and waiting.total > 0
    assert waiting.words.startswith(f"measuring the decided library: 0 of {waiting.total} validation answers")
    with Session(engine) as session:
        assert measurement_outcome(session, step) is None  # not measured yet
    continue_run(engine, run_id)
    step = the_step(engine, run_id)
    with Session(engine) as session:
        landed = session.get(LibraryVersion, step.version_after_id)
        gate = step.gate
        assert measurement_outcome(session, step) == (
            f"the decided library was measured and landed as #{landed.number} "
            f"(validation {gate['mean_before']:.2f} → {gate['mean_after']:.2f})")
    assert step.status == "completed" and step.gate["decision"] == "passed"
    assert step.gate["line"].startswith("measured again after review")
    assert step.gate["proposed"]["evaluation_after"] != step.gate["evaluation_after"]
    assert step.gate["proposed"]["line"] == first_line  # both lines: before review and after it
    with Session(engine) as session:
        assert remeasure_progress(session, step) is None  # the measurement ended
    with Session(engine) as session:
        measured = session.get(Evaluation, step.gate["evaluation_after"])
        assert [e["text"] for e in measured.experiences] == [first.text]  # what lands is what was measured
        assert measured.version_id == step.version_after_id
    assert [e["text"] for e in library_versions(engine)[-1].experiences] == [first.text]


def test_an_edited_operation_that_measures_worse_waits_for_a_person_again(engine, demo_task):
    run_id = seeded_run(engine, "manual")
    (op,) = pending_ops(engine, run_id)
    edited = "Always answer with the first number in the question."

    def gate_replies(messages):  # the edited library makes every validation answer wrong
        return "\\boxed{-1}" if edited in messages[0]["content"] else "\\boxed{0}"

    edit_operation(engine, op.id, edited, [], "ann")
    assert len(library_versions(engine)) == 1
    continue_run(engine, run_id, gate=gate_replies)
    step = the_step(engine, run_id)
    assert step.status == "awaiting_review" and step.gate["decision"] == "failed"
    assert step.gate["line"].startswith("measured again after review")
    with Session(engine) as session:
        said = measurement_outcome(session, step)
    assert said.startswith(f"the gate refused the decided library: {step.gate['mean_before']:.2f} → "
                           f"{step.gate['mean_after']:.2f}; its operations wait for a person again"), said
    assert len(library_versions(engine)) == 1, "a decided library that measured worse does not land"
    with Session(engine) as session:
        assert session.get(Operation, op.id).status == "pending"
        assert session.get(Run, run_id).status == "awaiting_review"
        reopened = session.exec(select(AuditEvent).where(AuditEvent.action == "operation.reopen")).one()
        assert reopened.actor == "gate" and "measured again" in reopened.after["reason"]
    with pytest.raises(ValueError, match="needs a note"):
        decide_operation(engine, op.id, "approved", "ann")
    decide_operation(engine, op.id, "approved", "ann", comment="the answers it breaks are a scoring artefact")
    assert [e["text"] for e in library_versions(engine)[-1].experiences] == [edited]  # measured: lands as decided


def test_a_decision_made_elsewhere_is_told_with_who_made_it_and_the_engines_own_changes_are_not(engine, demo_task):
    """What the Review page says when the step it drew changed (issue 41: a CLI decision showed only after a
    reload): each operation a person decided or reopened, by its place in the step and with who decided it."""
    run_id = seeded_run(engine, "manual", settings={"gate": "off"}, update=TWO_ADDS)
    first, second = pending_ops(engine, run_id)
    step_id = first.step_id
    with Session(engine) as session:
        drawn = step_state(session, step_id)
    assert decided_elsewhere(drawn, drawn) == []
    decide_operation(engine, first.id, "rejected", "cli", comment="too specific")
    with Session(engine) as session:
        now = step_state(session, step_id)
    assert now != drawn and decided_elsewhere(drawn, now) == ["Operation 1 rejected by cli"]
    decide_operation(engine, second.id, "approved", "bob")  # the last decision: the step lands at once
    with Session(engine) as session:
        landed = step_state(session, step_id)
    assert landed.status == "completed"
    assert decided_elsewhere(now, landed) == ["Operation 2 applied by bob"]
    assert decided_elsewhere(drawn, landed) == ["Operation 1 rejected by cli", "Operation 2 applied by bob"]


def test_two_reviewers_deciding_the_same_operation_at_once(engine, demo_task):
    run_id = seeded_run(engine, "manual")
    (op,) = pending_ops(engine, run_id)
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def review(name: str, decision: str) -> None:
        barrier.wait()
        try:
            decide_operation(engine, op.id, decision, name)
            outcomes[name] = "won"
        except AlreadyDecided as exc:
            outcomes[name] = str(exc)

    threads = [threading.Thread(target=review, args=("ann", "approved")),
               threading.Thread(target=review, args=("bob", "approved"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [name for name, outcome in outcomes.items() if outcome == "won"]
    assert len(winners) == 1, outcomes
    loser = "bob" if winners == ["ann"] else "ann"
    assert "already" in outcomes[loser] and winners[0] in outcomes[loser]
    assert [v.number for v in library_versions(engine)] == [1, 2]  # applied exactly once
    with Session(engine) as session:
        step = session.exec(select(Step).where(Step.run_id == run_id)).one()
        assert step.status == "completed"
        assert session.get(Operation, op.id).reviewer == winners[0]


def test_an_invalid_edit_is_refused_and_a_valid_one_is_applied(engine, demo_task):
    run_id = seeded_run(engine, "manual", settings={"gate": "off"})
    (op,) = pending_ops(engine, run_id)
    with pytest.raises(ValueError, match="not valid"):
        edit_operation(engine, op.id, "ok", [], "ann")
    assert pending_ops(engine, run_id)[0].status == "pending"
    edit_operation(engine, op.id, "Check which quantity the question asks for before answering.", [], "ann")
    latest = library_versions(engine)[-1]
    assert [e["text"] for e in latest.experiences] == ["Check which quantity the question asks for before answering."]


def test_reopen_before_apply_and_decide_step(engine, demo_task):
    # the gate off: what it measures on scripted replies depends on which evaluation's calls come first (they run at
    # once, and the replies alternate right and wrong per query in call order), and reopening is not about it
    run_id = seeded_run(engine, "manual", settings={"gate": "off"}, update=TWO_ADDS)
    first, _second = pending_ops(engine, run_id)
    decide_operation(engine, first.id, "approved", "ann")
    reopen_operation(engine, first.id, "ann")
    assert len(pending_ops(engine, run_id)) == 2
    assert decide_step(engine, first.step_id, "rejected", "ann") == 2
    with pytest.raises(AlreadyDecided):
        reopen_operation(engine, first.id, "ann")  # applied (as rejected): the step is completed
    assert len(library_versions(engine)) == 1


def test_manual_edits_and_revert_make_new_versions(engine, demo_task):
    with session_scope(engine) as session:
        library = ensure_library(session, get_task(session, DEMO_TASK))
    v2 = edit_library(engine, DEMO_TASK, [ProposedOp("ADD", text="Write each quantity with its unit first.")], "ann")
    e_id = v2.experiences[0]["id"]
    v3 = edit_library(engine, DEMO_TASK, [ProposedOp("MODIFY", [e_id], "Write every quantity with its unit.")], "ann")
    with pytest.raises(ValueError, match="unknown experience id"):
        edit_library(engine, DEMO_TASK, [ProposedOp("DELETE", ["E99"])], "ann")
    with pytest.raises(ValueError, match="duplicates"):
        edit_library(engine, DEMO_TASK, [ProposedOp("ADD", text="Write every quantity with its unit.")], "ann")
    v4 = revert_to(engine, DEMO_TASK, v2.id, "bob")
    with session_scope(engine) as session:
        assert (v3.source, v3.parent_id, v3.created_by) == ("manual", v2.id, "ann")
        assert v4.source == "revert" and v4.parent_id == v3.id and v4.experiences == v2.experiences
        assert [v.number for v in queries.versions(session, library.id)] == [1, 2, 3, 4]
