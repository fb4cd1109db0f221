"""The path people take (issue 36): a new run's defaults are chosen for its learner by what the learning benchmark
measured, each with its reason and figure; a value given explicitly wins; and a run in auto review mode never waits
for a person nobody asked: a flagged operation is refused before the gate, and a worked example made from a
reference is not flagged as cut off because its answer is a code or a number."""

from __future__ import annotations

import json
import re

import pytest
from sqlmodel import Session, select

from core.domain.library import EXAMPLE, MAX_EXAMPLES, MAX_EXAMPLES_TOP_K, ProposedOp
from core.domain.quality import screen_ops
from core.domain.selection import DEFAULT_K
from core.errors import InvalidInput
from core.grpo.training import RunSettings, create_run_with_defaults, execute_run
from core.records.library.selection import library_selection, set_selection
from core.records.review.decisions import operation_kind, step_flags
from core.records.runs.defaults import EXAMPLES_FIGURE, chosen_defaults
from core.records.tasks.demos import (
    DEMO_TASK,
    POLICY_TASK,
    SUPPORT_TASK,
    ensure_policy_task,
    ensure_support_task,
)
from storage import queries
from storage.tables import AuditEvent, Operation, Step

EMBEDDED = "local/qwen2.5-coder-0.5b"
HOSTED = "openai/gpt-4o-mini"
TOP_K = {"mode": "top_k", "k": DEFAULT_K}
SWITCHES = ("examples", "lessons", "reference_when_all_fail")
NO_POLICY = "Thank you for your message. I will look into it for you."


def chosen(engine, task_name: str, given) -> tuple[RunSettings, dict]:
    with Session(engine) as session:
        settings, choices = chosen_defaults(session, queries.task_by_name(session, task_name), given)
    return settings, {choice.field: choice for choice in choices}


def switches(settings: RunSettings) -> tuple[bool, bool, bool]:
    return tuple(getattr(settings, name) for name in SWITCHES)


# --- the defaults and their reasons --------------------------------------------------------------------------------

def test_the_embedded_learner_gets_the_measured_defaults_each_with_its_figure(engine):
    ensure_policy_task(engine)
    settings, choices = chosen(engine, POLICY_TASK, {"learner_model": EMBEDDED})
    assert switches(settings) == (True, False, True)
    assert settings.selection == TOP_K
    assert set(choices) == {*SWITCHES, "selection", "max_examples", "learner_replies"}
    assert settings.learner_replies is False and "used 0 times for 51 examples" in choices["learner_replies"].reason
    assert choices["examples"].line().startswith("worked examples: on. On: worked examples made from the reference")
    assert EXAMPLES_FIGURE in choices["examples"].reason
    assert "-0.125 [-0.375, +0.083]" in choices["lessons"].reason and "+0.017 [-0.050, +0.083]" in choices["lessons"].reason
    assert choices["lessons"].line().startswith("lessons: off.")
    assert "0.000" in choices["reference_when_all_fail"].reason
    assert choices["selection"].line().startswith(f"entries per query: the {DEFAULT_K} entries most similar to the query")
    # a RunSettings says what it sets explicitly (model_fields_set): the same defaults for what it leaves out
    settings, _choices = chosen(engine, POLICY_TASK, RunSettings(learner_model=EMBEDDED, epochs=1))
    assert switches(settings) == (True, False, True) and settings.epochs == 1


def test_a_hosted_learner_keeps_the_papers_defaults_and_the_library_keeps_its_selection(engine):
    ensure_policy_task(engine)
    settings, choices = chosen(engine, POLICY_TASK, {"learner_model": HOSTED})
    assert switches(settings) == (False, True, False)
    assert settings.selection is None and "selection" not in choices
    assert all("as in the paper" in choices[name].reason for name in SWITCHES)
    assert HOSTED in choices["lessons"].reason
    assert "learner_replies" not in choices and settings.learner_replies  # no examples: nothing to write
    settings, choices = chosen(engine, POLICY_TASK, {"learner_model": HOSTED, "examples": True})
    assert settings.learner_replies and choices["learner_replies"].line().startswith("example replies by the learner: on")


def test_a_value_given_explicitly_wins_and_the_rest_stay_consistent(engine, demo_task):
    settings, choices = chosen(engine, DEMO_TASK, RunSettings(learner_model=EMBEDDED, lessons=True,
                                                              reference_when_all_fail=False))
    assert switches(settings) == (True, True, False)
    assert set(choices) == {"examples", "selection", "max_examples", "learner_replies"}  # only what was not given
    # examples off by hand: lessons stay on (a run must learn something), nothing from the reference
    settings, choices = chosen(engine, DEMO_TASK, {"learner_model": EMBEDDED, "examples": False})
    assert switches(settings) == (False, True, False) and "selection" not in choices
    assert "a run must learn something" in choices["lessons"].reason
    # lessons off for a hosted learner: examples come on instead of an invalid run
    settings, choices = chosen(engine, DEMO_TASK, {"learner_model": HOSTED, "lessons": False})
    assert switches(settings) == (True, False, False) and "lessons are off" in choices["examples"].reason
    # a None in a dict is an option not given (the CLI's way)
    settings, _choices = chosen(engine, DEMO_TASK, {"learner_model": EMBEDDED, "lessons": None})
    assert settings.lessons is False
    with pytest.raises(InvalidInput, match="keep ground truth on"):  # explicit values still meet the rules
        chosen(engine, DEMO_TASK, {"learner_model": EMBEDDED, "examples": True, "ground_truth": False})


def test_where_examples_cannot_be_checked_the_embedded_learner_falls_back_with_the_reason(engine, demo_task):
    settings, choices = chosen(engine, DEMO_TASK, {"learner_model": EMBEDDED, "ground_truth": False})
    assert switches(settings) == (False, True, False)
    assert choices["examples"].reason == ("Off: worked examples are checked against the reference answer, and ground "
                                          "truth is off.")
    assert choices["reference_when_all_fail"].reason == "Off: it needs ground truth, which is off."
    ensure_support_task(engine)  # scored by a judge: an example's answer cannot be checked on the spot
    settings, choices = chosen(engine, SUPPORT_TASK, {"learner_model": EMBEDDED})
    assert switches(settings) == (False, True, False)
    assert "is not computed from the answer" in choices["examples"].reason


def test_a_run_with_the_defaults_gives_its_library_top_k_unless_a_person_chose_the_selection(engine, demo_task,
                                                                                            monkeypatch):
    run_id, choices = create_run_with_defaults(engine, DEMO_TASK, {"learner_model": EMBEDDED, "epochs": 1})
    assert [c.field for c in choices] == [*SWITCHES, "learner_replies", "selection", "max_examples"]
    with Session(engine) as session:
        run = queries.run_by_id(session, run_id)
    assert run.settings["max_examples"] == MAX_EXAMPLES_TOP_K  # the cap follows the selection: top_k, large
    assert choices[-1].line().startswith(f"worked examples kept: {MAX_EXAMPLES_TOP_K}. Each query is shown only")
    with Session(engine) as session:
        [event] = session.exec(select(AuditEvent).where(AuditEvent.action == "library.selection")).all()
    assert run.settings["selection"] == TOP_K and run.settings["examples"] and not run.settings["lessons"]
    assert library_selection(engine, DEMO_TASK).as_dict() == TOP_K  # what the run measures, the library serves
    assert (event.actor, event.before, event.after) == (
        "cli", {"mode": "all", "k": DEFAULT_K}, {**TOP_K, "reason": f"chosen with run {run_id}'s settings"})

    set_selection(engine, DEMO_TASK, "default", "all", None, "alice")  # a person's choice, recorded
    run_id, choices = create_run_with_defaults(engine, DEMO_TASK, {"learner_model": EMBEDDED, "epochs": 1})
    assert "selection" not in [c.field for c in choices]
    assert choices[-1].field == "max_examples" and choices[-1].value == MAX_EXAMPLES  # every entry shown: small
    assert "every query all its entries" in choices[-1].reason
    with Session(engine) as session:
        assert queries.run_by_id(session, run_id).settings["selection"] == {"mode": "all", "k": DEFAULT_K}
        assert queries.run_by_id(session, run_id).settings["max_examples"] == MAX_EXAMPLES
    assert not library_selection(engine, DEMO_TASK).chooses

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    run_id, choices = create_run_with_defaults(engine, DEMO_TASK, {"learner_model": HOSTED}, library_name="hosted")
    assert "selection" not in [c.field for c in choices]  # no worked examples: the paper's `all` stays
    with Session(engine) as session:
        assert queries.run_by_id(session, run_id).settings["lessons"] is True


def test_a_person_choosing_the_stored_selection_is_recorded_once(engine, demo_task):
    set_selection(engine, DEMO_TASK, "default", "all", None, "alice")
    set_selection(engine, DEMO_TASK, "default", "all", None, "alice")  # no change: no second event
    with Session(engine) as session:
        events = session.exec(select(AuditEvent).where(AuditEvent.action == "library.selection")).all()
    assert [(e.actor, e.before, e.after) for e in events] == [("alice", {"mode": "all", "k": DEFAULT_K}, {"mode": "all", "k": DEFAULT_K})]


# --- auto review finishes ------------------------------------------------------------------------------------------

def test_an_auto_review_run_on_the_policy_demo_with_the_defaults_completes_with_nothing_pending(engine, scripted):
    """The issue's stall: every attempt fails, each group's reference becomes a worked example (once "... ticket
    reference: PC-48213", no full stop; now the learner's reply or a sentence per fact), and auto review used to
    hold every one of them for a person, flagged cut off. With the embedded learner's defaults and the gate on, the run completes and its examples land."""
    ensure_policy_task(engine)
    model, gateway = scripted(engine, rollout=NO_POLICY)
    run_id, _choices = create_run_with_defaults(engine, POLICY_TASK, {
        "learner_model": EMBEDDED, "epochs": 1, "batch_size": 4, "group_size": 2, "limit": 4, "max_tokens": 160})
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "completed", run.error
    assert model.count("summary") == model.count("advantage") == model.count("update") == 0  # lessons off
    assert model.count("example") == 0  # the embedded learner is not asked for replies: a sentence per fact
    with Session(engine) as session:
        step = session.exec(select(Step).where(Step.run_id == run_id)).one()
        ops = queries.step_operations(session, step.id)
        flags = step_flags(session, step)
    assert step.gate["decision"] == "passed" and step.status == "completed"
    assert ops and all(operation_kind(step, op) == EXAMPLE for op in ops)
    assert not [op for op in ops if op.status == "pending"]
    applied = [op for op in ops if op.status == "applied"]
    assert [(op.status, op.validation_error) for op in ops] == [("applied", None)] * 4  # one per group, whole
    assert any(re.search(r"Answer: .*\bPC-\d+\b.*\.$", op.text) for op in applied)  # the ticket's code, in a sentence
    assert all(flags[op.id] == [] for op in applied)
    assert not [op for op in ops if "cut off" in (op.validation_error or "")]


def test_in_auto_review_a_flagged_lesson_is_refused_with_its_reason_and_the_reference_examples_land(engine, demo_task,
                                                                                                   scripted):
    cut_off = "Re-read the question to find which quantity it asks for and the"
    update = json.dumps({"operations": [{"op": "ADD", "ids": [], "text": cut_off, "rationale": "r"}]})
    model, gateway = scripted(engine, update=update)  # every answer is \boxed{0}: every group fails
    run_id, _choices = create_run_with_defaults(engine, DEMO_TASK, {
        "learner_model": EMBEDDED, "lessons": True, "epochs": 1, "batch_size": 2, "group_size": 2, "limit": 2})
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == "completed", run.error
    with Session(engine) as session:
        step = session.exec(select(Step).where(Step.run_id == run_id)).one()
        ops = session.exec(select(Operation).where(Operation.step_id == step.id)).all()
    lesson = next(op for op in ops if op.text == cut_off)
    examples = [op for op in ops if operation_kind(step, op) == EXAMPLE]
    assert lesson.status == "invalid" and lesson.reviewer is None
    assert lesson.validation_error.startswith("refused in auto review mode, flagged: The text looks cut off "
                                              'mid-sentence: it ends on "the" with no full stop')
    assert examples and {op.status for op in examples} == {"applied"}  # "... Answer: 16": a number ends it
    assert not [op for op in ops if op.status == "pending"]


def test_in_auto_review_a_flagged_worked_example_is_refused_by_an_examples_rules():
    text = "Problem: A tent's warranty? Answer: tent warranty: 3 years; ticket reference: PC-48213"
    library = [{"id": "E1", "text": text.replace("48213", "48214"), "kind": EXAMPLE}]
    close, ends_badly, whole = screen_ops(library, [
        ProposedOp("ADD", [], text, kind=EXAMPLE),
        ProposedOp("ADD", [], "Problem: How long do refunds take? Answer: refunds reach you within 7 business days and",
                   kind=EXAMPLE),
        ProposedOp("ADD", [], "Problem: Is the bike frame covered? Answer: 7 years;LK-72886", kind=EXAMPLE)],
        refuse_flagged=True)
    assert close.error.startswith("refused in auto review mode, flagged: Nearly the same as experience E1")
    assert ends_badly.error.startswith('refused in auto review mode, flagged: The text looks cut off mid-sentence: '
                                       'it ends on "and"')
    assert whole.valid
