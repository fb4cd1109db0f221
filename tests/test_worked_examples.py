"""Worked examples as library entries (issue 26, point 2): kinds, limits, formats, and examples that the
training loop compresses from a successful rollout and proposes only when their own answer scores."""

from __future__ import annotations

import json
import re

import pytest
from sqlmodel import Session, select

from core.domain.library import (
    EXAMPLE,
    EXAMPLE_MAX_WORDS,
    LESSON,
    MAX_WORDS,
    ProposedOp,
    apply_ops,
    diff,
    kind_of,
    render_for_learner,
    validate_ops,
)
from core.domain.library_io import LibraryFormatError, parse_library_entries, to_json, to_markdown
from core.domain.prompts import (
    EXAMPLES_INTRO,
    LIBRARY_HEADER,
    PAPER_WORDING,
    agent_system_prompt,
    library_block,
)
from core.domain.reference_answers import reference_as_answer
from core.domain.rewards import score
from core.errors import InvalidInput
from core.grpo.training import RunSettings, create_run, execute_run
from core.records.library.versions import export_version, import_library
from core.records.review.decisions import edit_operation, example_sources, operation_kind, step_flags
from core.records.tasks.demo_data import demo_rows
from core.records.tasks.demos import DEMO_TASK, SUPPORT_TASK, ensure_support_task
from storage import queries
from storage.tables import Advantage, LibraryVersion, Operation, Rollout, Sample, Step
from tests.conftest import mixed_rollouts

LESSON_TEXT = "Re-read the question to find which quantity it asks for."
EXAMPLE_TEXT = ("Problem: Tom has 3 bags of 4 apples and eats 2. Steps: 3 bags times 4 apples is 12 apples. "
                "12 minus 2 eaten is 10. Answer: 10.")
OLD_LIBRARY = [{"id": "E1", "text": LESSON_TEXT}, {"id": "E2", "text": "Check the units of the final answer."}]
MIXED = [{"id": "E1", "text": LESSON_TEXT}, {"id": "E2", "text": EXAMPLE_TEXT, "kind": EXAMPLE}]
REFERENCES = {row.query: row.reference for row in demo_rows()}


def words(n: int) -> str:
    return "Problem: " + " ".join(["step"] * (n - 3)) + " Answer: 10."


def test_a_library_of_worked_examples_only_opens_with_one_introduction_and_ids_carry_no_period():
    """Issue 41: `/select` on a library of examples printed the lessons' header and the examples' intro back to
    back, and every entry read "[E1]." with a stray period after its id."""
    only_examples = [MIXED[1]]
    block = library_block(only_examples)
    assert block == f"{EXAMPLES_INTRO}\n[E2] {EXAMPLE_TEXT}"
    assert LIBRARY_HEADER not in block
    assert parse_library_entries(block) == [{"text": EXAMPLE_TEXT, "kind": EXAMPLE}]  # it reads back as examples
    assert "]." not in library_block(MIXED)
    assert library_block(MIXED) == f"{LIBRARY_HEADER}\n[E1] {LESSON_TEXT}\n\n{EXAMPLES_INTRO}\n[E2] {EXAMPLE_TEXT}"
    assert parse_library_entries("[E1]. An old block's lesson.") == [{"text": "An old block's lesson.",
                                                                      "kind": LESSON}]  # pasted from before

# --- the domain: kinds, limits, operations ---------------------------------------------------------------

def test_a_library_from_an_earlier_version_reads_as_all_lessons_and_stays_as_it_was():
    assert [kind_of(e) for e in OLD_LIBRARY] == [LESSON, LESSON]
    checked = validate_ops(OLD_LIBRARY, [ProposedOp("MODIFY", ["E2"], "Check the units of every number used."),
                                         ProposedOp("ADD", [], "Write each quantity down with its unit.")])
    assert [c.error for c in checked] == [None, None] and [c.op.kind for c in checked] == [LESSON, LESSON]
    after = apply_ops(OLD_LIBRARY, [c.op for c in checked], first_new_id=3)
    assert all("kind" not in e for e in after)  # stored exactly as before kinds existed
    assert library_block(OLD_LIBRARY) == f"{LIBRARY_HEADER}\n[E1] {LESSON_TEXT}\n[E2] Check the units of the final answer."


def test_an_example_has_its_own_limit_and_one_over_it_is_refused():
    long_lesson, example, too_long = words(MAX_WORDS + 10), words(EXAMPLE_MAX_WORDS - 5), words(EXAMPLE_MAX_WORDS + 1)
    checked = validate_ops([], [ProposedOp("ADD", [], long_lesson), ProposedOp("ADD", [], example, kind=EXAMPLE),
                                ProposedOp("ADD", [], too_long, kind=EXAMPLE)])
    assert checked[0].error.startswith("text too long")  # a lesson's limit
    assert checked[1].valid and checked[1].op.kind == EXAMPLE
    assert checked[2].error.startswith(f"text too long ({EXAMPLE_MAX_WORDS + 1} words")
    assert f"at most {EXAMPLE_MAX_WORDS} words" in checked[2].error


def test_an_entry_keeps_its_kind_and_examples_have_their_own_cap():
    checked = [validate_ops(MIXED, [op])[0] for op in (
        ProposedOp("MODIFY", ["E2"], EXAMPLE_TEXT.replace("Tom", "Ann")),
        ProposedOp("MERGE", ["E1", "E2"], "Re-read the question and check the units."),
        ProposedOp("MODIFY", ["E1"], "Re-read every question twice.", kind=EXAMPLE))]
    assert checked[0].valid and checked[0].op.kind == EXAMPLE  # a MODIFY keeps its target's kind
    assert "keeps its kind" in checked[1].error and "keeps its kind" in checked[2].error
    full = validate_ops(MIXED, [ProposedOp("ADD", [], words(40), kind=EXAMPLE)], max_examples=1)[0]
    assert full.error == "the library is full (1 worked examples): merge or delete first"
    # the examples do not count towards the lessons' cap: one lesson and one example leave room for a second lesson
    assert validate_ops(MIXED, [ProposedOp("ADD", [], "Write each quantity down with its unit.")], max_size=2)[0].valid
    after = apply_ops(MIXED, [checked[0].op, ProposedOp("ADD", [], words(40), kind=EXAMPLE)], first_new_id=3)
    assert [kind_of(e) for e in after] == [LESSON, EXAMPLE, EXAMPLE] and after[1]["id"] == "E2"
    assert {(c["id"], c["kind"]) for c in diff(MIXED, after)} == {("E2", EXAMPLE), ("E3", EXAMPLE)}


def test_the_agent_reads_examples_apart_from_the_lessons_and_the_learner_only_the_lessons():
    prompt = agent_system_prompt("Solve it.", "Box the answer.", MIXED, python_tool=False)
    lessons_part, examples_part = prompt.split(EXAMPLES_INTRO)
    assert f"{LIBRARY_HEADER}\n[E1] {LESSON_TEXT}" in lessons_part and EXAMPLE_TEXT not in lessons_part
    assert examples_part == f"\n[E2] {EXAMPLE_TEXT}"  # by its id, as the pages and the learner name it
    assert render_for_learner(MIXED) == f"[E1] {LESSON_TEXT}"


# --- formats ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("export", [to_markdown, to_json, lambda e: export_version(e, "prompt")])
def test_every_format_keeps_the_kinds(export):
    entries = parse_library_entries(export(MIXED), "library.json" if export is to_json else "library.md")
    assert entries == [{"text": LESSON_TEXT, "kind": LESSON}, {"text": EXAMPLE_TEXT, "kind": EXAMPLE}]


def test_files_from_earlier_versions_read_as_lessons_and_a_bad_kind_is_refused():
    old_json = json.dumps({"experiences": [{"id": "E1", "text": LESSON_TEXT}]})
    assert parse_library_entries(old_json) == [{"text": LESSON_TEXT, "kind": LESSON}]
    assert parse_library_entries(f"# Experience library\n\n- [G0] {LESSON_TEXT}\n- [W1] {LESSON_TEXT}\n") == [
        {"text": LESSON_TEXT, "kind": LESSON}, {"text": LESSON_TEXT, "kind": LESSON}]  # the paper's numbers, read
    assert parse_library_entries(f"# Experience library\n\n- [E1] {LESSON_TEXT}\n") == [
        {"text": LESSON_TEXT, "kind": LESSON}]
    assert json.loads(to_json(OLD_LIBRARY))["experiences"] == OLD_LIBRARY  # no kind key for lessons
    with pytest.raises(LibraryFormatError, match="kind 'rule'"):
        parse_library_entries(json.dumps([{"text": LESSON_TEXT, "kind": "rule"}]))
    with pytest.raises(LibraryFormatError, match="worked example 1 is too long"):
        parse_library_entries(json.dumps([{"text": words(EXAMPLE_MAX_WORDS + 1), "kind": EXAMPLE}]))


def test_an_imported_library_keeps_its_examples(engine, demo_task):
    version = import_library(engine, DEMO_TASK, to_markdown(MIXED), "library.md", actor="alice")
    assert [(e["text"], kind_of(e)) for e in version.experiences] == [(LESSON_TEXT, LESSON), (EXAMPLE_TEXT, EXAMPLE)]
    assert json.loads(export_version(version.experiences, "json"))["experiences"][1]["kind"] == EXAMPLE


# --- the training loop -----------------------------------------------------------------------------------

def example_reply(right: bool):
    """The learner's compression: the answer the rollout reached (the reference) or a wrong one."""
    def reply(messages: list[dict]) -> str:
        query = re.search(r"Problem:\n(.*?)\n\nThe agent's solution", messages[-1]["content"], re.S).group(1)
        return json.dumps({"problem": query, "steps": ["Add the two amounts", "Subtract the rest"],
                           "answer": REFERENCES[query] if right else "-777"})
    return reply


def settings(**kw) -> RunSettings:
    base = {"epochs": 1, "batch_size": 1, "group_size": 2, "limit": 2, "concurrency": 2, "gate": "off",
            "examples": True}
    return RunSettings(**{**base, **kw})


def test_an_example_whose_answer_does_not_score_is_dropped_and_the_drop_recorded(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts(), example=example_reply(right=False))
    run = execute_run(engine, create_run(engine, DEMO_TASK, settings(limit=1)), gateway=gateway)
    assert run.status == "completed", run.error
    assert model.count("example") == 1
    with Session(engine) as s:
        ops = s.exec(select(Operation)).all()
        assert [(o.op, o.text) for o in ops] == [("ADD", LESSON_TEXT)]  # the learner's lesson only
        step = s.exec(select(Step)).one()
        assert step.stats["examples"] == {"proposed": 0, "dropped": 1, "sources": {}}
        note = s.exec(select(Advantage)).one().text
        assert "Worked example: dropped" in note and "'-777' scores 0 against the reference" in note
        assert all(kind_of(e) == LESSON for e in s.get(LibraryVersion, run.current_version_id).experiences)


def test_an_example_that_scores_is_proposed_lands_and_is_shown_to_the_agent(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts(), example=example_reply(right=True))
    run = execute_run(engine, create_run(engine, DEMO_TASK, settings()), gateway=gateway)
    assert run.status == "completed", run.error
    with Session(engine) as s:
        first = s.exec(select(Step).order_by(Step.id)).first()
        ops = queries.step_operations(s, first.id)
        assert [(o.op, operation_kind(first, o), o.status) for o in ops] == [
            ("ADD", None, "applied"), ("ADD", EXAMPLE, "applied")]
        example_op = ops[1]
        source = s.get(Rollout, example_sources(first)[example_op.position]["rollout_id"])
        advantage = s.exec(select(Advantage).where(Advantage.step_id == first.id)).one()
        assert example_op.source_advantage_ids == [advantage.id] and source.sample_id == advantage.sample_id
        assert source.reward == 1.0 and source.step_id == first.id  # a success of a group where another failed
        assert "Worked example: proposed" in advantage.text
        landed = s.get(LibraryVersion, first.version_after_id).experiences
        example = next(e for e in landed if kind_of(e) == EXAMPLE)
        assert example["text"] == (f"Problem: {s.get(Sample, source.sample_id).query} Steps: Add the two amounts. "
                                   f"Subtract the rest. Answer: {s.get(Sample, source.sample_id).reference}.")
    # the next step's agent reads the example under its own header, after the lessons
    later = [messages[0]["content"] for stage, messages in model.calls if stage == "rollout"][-1]
    assert later.index(LESSON_TEXT) < later.index(PAPER_WORDING.examples_intro) < later.index(  # the demo's wording
        f"[{example['id']}] {example['text']}")


def test_with_lessons_off_a_run_learns_worked_examples_only(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts(), example=example_reply(right=True))
    run = execute_run(engine, create_run(engine, DEMO_TASK, settings(limit=1, lessons=False)), gateway=gateway)
    assert run.status == "completed", run.error
    assert model.count("summary") == model.count("advantage") == model.count("update") == 0
    assert model.count("example") == 1
    with Session(engine) as s:
        ops = s.exec(select(Operation)).all()
        step = s.exec(select(Step)).one()
        assert [(o.op, operation_kind(step, o)) for o in ops] == [("ADD", EXAMPLE)]
        assert s.exec(select(Advantage)).one().text.startswith("Lessons are off in this run")
    with pytest.raises(InvalidInput, match="turn examples on"):
        RunSettings.build(lessons=False)


def test_a_reviewer_edits_an_example_within_the_example_limit(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts(), example=example_reply(right=True))
    run = execute_run(engine, create_run(engine, DEMO_TASK, settings(limit=1, review_mode="manual")), gateway=gateway)
    assert run.status == "awaiting_review"
    with Session(engine) as s:
        step = s.exec(select(Step)).one()
        example_op = next(o for o in queries.step_operations(s, step.id) if operation_kind(step, o) == EXAMPLE)
        # an example names its problem's numbers and is longer than a lesson: no flag for either
        assert step_flags(s, step)[example_op.id] == []
    with pytest.raises(InvalidInput, match=f"at most {EXAMPLE_MAX_WORDS} words"):
        edit_operation(engine, example_op.id, words(EXAMPLE_MAX_WORDS + 1), [], actor="alice")
    edited = edit_operation(engine, example_op.id, words(EXAMPLE_MAX_WORDS), [], actor="alice")
    assert edited.status == "edited"


def test_examples_need_a_reward_computed_from_the_answer(engine, demo_task):
    ensure_support_task(engine)
    with pytest.raises(InvalidInput, match="worked examples are off for task"):
        create_run(engine, SUPPORT_TASK, settings())
    with pytest.raises(InvalidInput, match="keep ground truth on"):
        RunSettings.build(examples=True, ground_truth=False)


def reference_reply(reply: str | None):
    """The learner's reply written from a reference: `reply` with {answer} filled from the facts its prompt
    lists, or (None) a JSON it cannot read."""
    def write(messages: list[dict]) -> str:
        facts = re.search(r"The right answer states these facts:\n(.*?)\n\n", messages[-1]["content"], re.S).group(1)
        return json.dumps({"reply": reply.format(answer=facts.removeprefix("- "))}) if reply else "no JSON here"
    return write


def test_a_group_where_every_attempt_failed_gives_its_reference_as_the_example(engine, demo_task, scripted):
    """With the reference option and examples on, an all-failed group (every rollout answers 0) has no
    successful rollout to compress: the learner writes the reply a person would send from its reference, which
    the task's reward checks like any example's answer; the example is linked to no rollout; without the option
    the group gives none."""
    model, gateway = scripted(engine, example=reference_reply("Katie ends up with {answer} folders."))
    run = execute_run(engine, create_run(engine, DEMO_TASK, settings(limit=1, lessons=False, hold_flagged=False,
                                                                     reference_when_all_fail=True)), gateway=gateway)
    assert run.status == "completed", run.error
    assert model.count("example") == 1  # one reply written from the reference, no compression
    with Session(engine) as s:
        step = s.exec(select(Step)).one()
        [op] = s.exec(select(Operation)).all()
        sample = s.get(Sample, s.exec(select(Advantage)).one().sample_id)
        assert op.text == f"Problem: {sample.query} Answer: Katie ends up with {sample.reference} folders."
        assert op.status == "applied"
        assert example_sources(step)[op.position]["rollout_id"] is None
        assert "proposed from the reference answer, written as a reply by the learner" in s.exec(
            select(Advantage)).one().text
    [(_stage, messages)] = [call for call in model.calls if call[0] == "example"]
    assert f"- {sample.reference}\n" in messages[-1]["content"] and sample.query in messages[-1]["content"]

    model, gateway = scripted(engine)
    run = execute_run(engine, create_run(engine, DEMO_TASK, settings(limit=1, lessons=False, seed=3)), gateway=gateway)
    with Session(engine) as s:
        assert not queries.step_operations(s, queries.steps(s, run.id)[0].id)


@pytest.mark.parametrize("reply", [None, "I would need to check {answer}", "The answer is 12345."])
def test_where_the_learner_cannot_write_the_reply_a_template_states_the_reference(engine, demo_task, scripted, reply):
    """A reply the learner could not write (no JSON), that is no whole sentence, or that does not score: the
    example is the template's sentence, which scores as right with the task's reward."""
    _model, gateway = scripted(engine, example=reference_reply(reply))
    run = execute_run(engine, create_run(engine, DEMO_TASK, settings(limit=1, lessons=False,
                                                                     reference_when_all_fail=True)), gateway=gateway)
    assert run.status == "completed", run.error
    with Session(engine) as s:
        [op] = s.exec(select(Operation)).all()
        advantage = s.exec(select(Advantage)).one()
        sample = s.get(Sample, advantage.sample_id)
    assert op.text == f"Problem: {sample.query} Answer: In your case: {sample.reference}." and op.status == "applied"
    assert "a sentence per part" in advantage.text
    assert score("math", op.text.split(" Answer: ")[1], sample.reference).value == 1.0


def test_a_facts_reference_reads_as_an_answer():
    reference = "return window: 45 days | forty-five days; ticket reference: PC-48213 | PC48213"
    assert reference_as_answer("facts", reference) == "return window: 45 days; ticket reference: PC-48213"
    assert reference_as_answer("math", " 18 ") == "18"
