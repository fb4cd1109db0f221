"""A learner that writes whole, general lessons (issue 26, point 4), on scripted replies: the learner prompts show
no id the library lacks; a text over the limit (or cut off by the token limit) is asked for again once, then
refused with its reason and never stored shortened; in auto review mode a flagged operation is invalid before
the validation gate, which never measures it; in manual mode it waits for the reviewer."""

from __future__ import annotations

import json
import re

import pytest
from sqlmodel import Session, select

from core.domain.library import MAX_WORDS, ProposedOp, validate_ops
from core.domain.prompts import (
    ID_PLACEHOLDER,
    advantage_messages,
    direct_messages,
    retry_messages,
    summary_messages,
    update_messages,
)
from core.domain.quality import screen_ops
from core.domain.replies import AdvantageReply, UpdateReply
from core.grpo.training import create_run, execute_run
from core.records.runs.settings import RunSettings
from core.records.tasks.demos import DEMO_TASK, demo_rows
from storage import queries
from storage.tables import Advantage, Evaluation, LibraryVersion, Operation, Step
from tests.conftest import mixed_rollouts

ID = re.compile(r"\bE\d+\b")
LIBRARY = [{"id": "E5", "text": "Write each quantity with its unit before computing."},
           {"id": "E9", "text": "Check the final answer against the question."}]
GOOD = "Re-read the question to find which quantity it asks for."
LONG = " ".join(["Always re-read the whole question slowly and carefully"] * 12) + "."  # 96 words
CUT_OFF = "Check which quantity the question asks for and the"


def learner_prompts(library: list[dict]) -> dict[str, list[dict]]:
    """Every prompt the learner reads, on a library; the proposals and rejections name ids like a learner might."""
    update = update_messages(library, [GOOD, "Merge E1 and E4 into one lesson about units."], 30, 4,
                             rejected=[("DELETE E2", "too vague"), ("Check the units.", "a duplicate of E3")])
    return {
        "summary": summary_messages("Tom has 3 apples.", "3", 1.0, library, "Agent:\n\\boxed{3}", True),
        "advantage": advantage_messages("Tom has 3 apples.", "3", [(1.0, "good"), (0.0, "bad")], library, True),
        "update": update,
        "update asked again": retry_messages(update, [(LONG, "text too long")]),
        "direct": direct_messages("Solve it.", [("Tom has 3 apples.", "3")], 4),
    }


@pytest.mark.parametrize("library", [[], LIBRARY], ids=["empty library", "library E5, E9"])
def test_a_learner_prompt_names_no_id_the_library_shown_lacks(library):
    shown = {entry["id"] for entry in library}
    for name, messages in learner_prompts(library).items():
        text = "\n".join(message["content"] for message in messages)
        assert set(ID.findall(text)) <= shown, f"the {name} prompt names {set(ID.findall(text)) - shown}"


def test_the_update_prompt_puts_a_placeholder_where_an_id_goes_and_says_when_only_add_is_possible():
    empty = update_messages([], [GOOD], 30)[-1]["content"]
    assert "there are no ids yet and only ADD is possible" in empty
    assert "MODIFY" not in empty and "MERGE" not in empty and ID_PLACEHOLDER not in empty
    full = update_messages(LIBRARY, [GOOD], 30)[-1]["content"]
    assert f'MODIFY: revise one experience (ids: ["{ID_PLACEHOLDER}"]' in full
    assert "The only ids that exist are E5, E9" in full and "only ADD" not in full
    assert "at most 32 words" in full


def test_no_learner_text_is_cut_by_the_schema():
    """llama.cpp stops a string at its maxLength mid-word ("greenpe"): the learner's texts carry none."""
    for reply in (AdvantageReply, UpdateReply):
        schema = json.dumps(reply.prompt_schema(local=True))
        for field in ("analysis", "experiences", "text", "rationale"):
            node = re.search(rf'"{field}": (\{{[^{{}}]*\}})', schema)
            assert node is None or "maxLength" not in node.group(1), (reply.__name__, field)
    long = UpdateReply.model_validate({"operations": [{"op": "ADD", "ids": [], "text": LONG, "rationale": LONG}]})
    assert long.operations[0].text == LONG  # nothing is cut when it is read either


def test_screen_ops_refuses_the_second_of_two_near_duplicates_and_is_validate_ops_without_refusals():
    ops = [ProposedOp("ADD", [], GOOD), ProposedOp("ADD", [], GOOD.replace("asks for", "asks about")),
           ProposedOp("MODIFY", ["E5"], "Write every quantity with its unit before you compute anything.")]
    plain = screen_ops(LIBRARY, ops)
    assert [(c.op, c.error) for c in plain] == [(c.op, c.error) for c in validate_ops(LIBRARY, ops)]
    first, second, modify = screen_ops(LIBRARY, ops, refuse_flagged=True)
    assert first.valid and modify.valid  # a MODIFY is not compared with the experience it rewrites
    assert not second.valid and "Nearly the same as operation 1" in second.error
    assert screen_ops(LIBRARY, ops, refused={0: "over the limit twice"})[0].error == "over the limit twice"
    assert screen_ops(LIBRARY, ops, refused={0: "over the limit twice"}, refuse_flagged=True)[1].valid


# ---- the loop, on scripted replies -------------------------------------------------------------------------


def small(**kw) -> RunSettings:
    base = {"epochs": 1, "batch_size": 2, "group_size": 2, "limit": 2, "concurrency": 2, "gate": "off"}
    return RunSettings(**{**base, **kw})


def update(*texts: str) -> str:
    return json.dumps({"operations": [{"op": "ADD", "ids": [], "text": t, "rationale": "r"} for t in texts]})


def run(engine, gateway, **kw):
    return execute_run(engine, create_run(engine, DEMO_TASK, small(**kw)), gateway=gateway)


def operations(engine) -> list[Operation]:
    with Session(engine) as s:
        return list(s.exec(select(Operation).order_by(Operation.position)))


def library_texts(engine, run_) -> list[str]:
    with Session(engine) as s:
        return [e["text"] for e in s.get(LibraryVersion, run_.current_version_id).experiences]


def update_requests(model) -> list[str]:
    return [messages[-1]["content"] for stage, messages in model.calls if stage == "update"]


def test_an_over_long_text_is_asked_for_again_naming_it_and_the_limit(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts(), update=[update(LONG), update(GOOD)])
    result = run(engine, gateway)
    assert result.status == "completed", result.error
    first, again = update_requests(model)
    assert LONG not in first and LONG[:300] in again and "text too long (96 words" in again
    assert "at most 32 words" in again
    assert [(o.text, o.status) for o in operations(engine)] == [(GOOD, "applied")]
    assert library_texts(engine, result) == [GOOD]


def test_an_over_long_text_written_twice_is_refused_whole_with_its_reason(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts(), update=update(GOOD, LONG))
    result = run(engine, gateway)
    assert result.status == "completed", result.error
    assert model.count("update") == 2  # asked again once, not more
    good, long = operations(engine)
    assert (good.text, good.status) == (GOOD, "applied")
    assert (long.text, long.status) == (LONG, "invalid")  # stored whole, never cut to fit
    assert long.validation_error.startswith("text too long (96 words") and f"at most {MAX_WORDS} words" in \
        long.validation_error and "refused after asking the learner again once" in long.validation_error
    assert library_texts(engine, result) == [GOOD]


def test_a_text_cut_off_by_the_token_limit_is_asked_again_then_refused(engine, demo_task, scripted):
    cut = update(GOOD)[:-4] + '"}, {"op": "ADD", "ids": [], "text": "Write the unit of each quantity'  # max_tokens
    model, gateway = scripted(engine, rollout=mixed_rollouts(), update=cut)
    result = run(engine, gateway)
    assert model.count("update") == 2
    good, cut_op = operations(engine)
    assert good.status == "applied"
    assert (cut_op.text, cut_op.status) == ("Write the unit of each quantity", "invalid")
    assert "the learner's reply ended inside this text" in cut_op.validation_error
    assert library_texts(engine, result) == [GOOD]


def test_an_over_long_proposed_experience_is_asked_again_then_left_out_with_its_reason(engine, demo_task,
                                                                                       scripted):
    advantage = json.dumps({"analysis": "Better attempts re-read the question.", "experiences": [GOOD, LONG]})
    model, gateway = scripted(engine, rollout=mixed_rollouts(), advantage=advantage)
    result = run(engine, gateway)
    assert result.status == "completed", result.error
    assert model.count("advantage") == 4  # two groups, each asked again once
    with Session(engine) as s:
        advantages = list(s.exec(select(Advantage)))
    assert all(a.proposals == [GOOD] and "proposed experience refused" in a.error and "text too long" in a.error
               for a in advantages)
    assert all(LONG not in request for request in update_requests(model))


def gated(**kw) -> RunSettings:
    return small(gate="no_worse", validation_size=6, gate_k=1, **kw)


def test_in_auto_review_a_flagged_operation_is_invalid_and_the_gate_does_not_measure_it(engine, demo_task,
                                                                                        scripted):
    references = {row.query: row.reference for row in demo_rows()}

    def gate(messages):  # right with the clean lesson; the candidate must not hold the cut-off one
        assert CUT_OFF not in messages[0]["content"]
        return f"\\boxed{{{references[messages[1]['content']] if GOOD in messages[0]['content'] else '-1'}}}"

    model, gateway = scripted(engine, rollout=mixed_rollouts(), update=update(GOOD, CUT_OFF), gate=gate)
    result = execute_run(engine, create_run(engine, DEMO_TASK, gated()), gateway=gateway)
    assert result.status == "completed", result.error
    good, flagged = operations(engine)
    assert (good.status, good.reviewer) == ("applied", "auto")
    assert flagged.status == "invalid" and flagged.reviewer is None
    assert flagged.validation_error.startswith("refused in auto review mode, flagged: The text looks cut off")
    with Session(engine) as s:
        step = s.exec(select(Step)).one()
        measured = s.get(Evaluation, step.gate["evaluation_after"])
        assert step.gate["decision"] == "passed"
        assert [e["text"] for e in measured.experiences] == [GOOD]
    assert library_texts(engine, result) == [GOOD]


def test_in_manual_review_a_flagged_operation_waits_for_the_reviewer(engine, demo_task, scripted):
    model, gateway = scripted(engine, rollout=mixed_rollouts(), update=update(GOOD, CUT_OFF))
    result = run(engine, gateway, review_mode="manual")
    assert result.status == "awaiting_review"
    assert [(o.text, o.status) for o in operations(engine)] == [(GOOD, "pending"), (CUT_OFF, "pending")]
    with Session(engine) as s:
        assert len(queries.versions(s, result.library_id)) == 1
