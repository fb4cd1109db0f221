"""Auto review keeps facts true (issue 52, item 1): the facts a small model's text states, what a rewrite of a
verified entry drops or adds, and a run in auto review mode that holds such a MODIFY for a person with the reason
in words, while a faithful one lands."""

from __future__ import annotations

import json

from sqlmodel import Session, select

from core.domain.coverage import needs_of
from core.domain.facts import HELD, RewriteCheck, fact_changes, facts_of
from core.domain.library import EXAMPLE, ProposedOp
from core.domain.library_io import to_json
from core.domain.quality import screen_ops
from core.domain.reference_answers import example_text, reference_parts, template_reply
from core.grpo.training import RunSettings, create_run, execute_run
from core.records.library.versions import import_library
from core.records.tasks.demos import POLICY_TASK, ensure_policy_task
from storage import queries
from storage.tables import LibraryVersion, Operation
from tests.test_coverage import NO_POLICY, json_rows

RETURNS_REF = ("return window: 45 days | 45-day | forty-five days; "
               "ticket reference (PC- and the order number): PC-48213 | PC48213")
QUERY = "My boots pinch. Can I still send them back? The order number is 48213."
VERIFIED = example_text(QUERY, "Yes: the return window is 45 days. Your ticket reference is PC-48213.")
# The shape of the rewrite the issue measured: the window lost, an invented brand and a claim about the ticket.
INVENTED = example_text(QUERY, "Steps: check if the order number is valid. The boots cannot be returned because "
                               "they have been damaged. The company's reference is PC-48213, which is a brand "
                               "name for a specific brand of Trailpeak boots.")
FAITHFUL = example_text(QUERY, "You can send the boots back: our return window is 45 days. Please quote your "
                               "ticket reference PC-48213.")


def kinds(text: str) -> list[tuple[str, str]]:
    return [(fact.kind, fact.key) for fact in facts_of(text)]


def test_the_facts_of_a_text_are_quantities_numbers_codes_names_and_quoted_strings():
    assert kinds("Send it to the Quality Desk within a 45-day window; the fee is $20 and it opens at 8:00.") == [
        ("quantity", "45 day"), ("quantity", "20 money:usd"), ("number", "8:00"), ("name", "quality desk")]
    assert kinds("Bodies up to 25MB, 600 requests per minute, fourteen days of logs, 15% off.") == [
        ("quantity", "25 mb"), ("quantity", "600 request"), ("quantity", "14 day"), ("quantity", "15 percent")]
    assert kinds('Your reference is PC-48213 on the "Express Plus" plan for order 12345.') == [
        ("code", "PC-48213"), ("number", "12345"), ("quoted", "express plus")]
    # a sentence's first word, an example's parts and a reply's openings are no names
    assert kinds("Problem: Where is it? Steps: Look it up. Answer: Thank you, we will check.") == []


def test_a_rewrite_that_drops_a_verified_fact_or_adds_one_no_source_holds_is_named():
    needs = needs_of("facts", RETURNS_REF)
    found = fact_changes(INVENTED, [VERIFIED], references=[RETURNS_REF], known=[QUERY, RETURNS_REF], needs=needs)
    assert found.drops == ["return window: 45 days"] and found.adds == ["Trailpeak"]
    assert found.reason == "drops: return window: 45 days; adds: 'Trailpeak'"
    # another wording of the same fact ("forty-five days"), another message's ticket: nothing dropped
    assert not fact_changes(example_text("Can I return my tent? Order 49302.", "Yes, within forty-five days. Your "
                                         "ticket reference is PC-49302."), [VERIFIED],
                            references=[RETURNS_REF, RETURNS_REF.replace("48213", "49302")],
                            known=["Order 49302.", RETURNS_REF.replace("48213", "49302")], needs=needs).changed
    assert not fact_changes(FAITHFUL, [VERIFIED], references=[RETURNS_REF], known=[QUERY], needs=needs).changed
    # without the reward's needs, the facts a reference states verify the predecessor's
    plain = fact_changes("Returns are accepted within 30 days.", ["Returns are accepted within 45 days."],
                         references=["45 days"], known=[])
    assert plain.drops == ["45 days"] and plain.adds == ["30 days"]
    # no reference: nothing is verified, nothing checked
    assert not fact_changes(INVENTED, [VERIFIED], references=[], known=[]).changed


def test_screening_refuses_only_the_rewrite_that_changes_a_fact():
    library = [{"id": "E1", "kind": EXAMPLE, "text": VERIFIED}]
    check = RewriteCheck((RETURNS_REF,), (QUERY, RETURNS_REF), needs_of("facts", RETURNS_REF))
    ops = [ProposedOp("MODIFY", ["E1"], INVENTED, "", EXAMPLE), ProposedOp("ADD", [], "Quote the order number.", "")]
    checked = screen_ops(library, ops, rewrite_checks={0: check, 1: check})
    assert checked[0].error.startswith(f"{HELD}: ") and "drops: return window: 45 days" in checked[0].error
    assert checked[1].valid  # an ADD replaces nothing
    assert screen_ops(library, [ProposedOp("MODIFY", ["E1"], FAITHFUL, "", EXAMPLE)],
                      rewrite_checks={0: check})[0].valid


def run_with_modify(engine, scripted, text: str):
    """An auto review run of the policy task whose library holds a verified returns example (E1) and whose
    learner rewrites it with `text`; the gate off, so nothing but the fact check stands between it and the
    library."""
    ensure_policy_task(engine)
    rows = {r["query"]: r["reference"] for r in json_rows()}
    [entry] = import_library(engine, POLICY_TASK, to_json([{"id": "E1", "kind": EXAMPLE, "text": VERIFIED}]),
                             "lib.json").experiences
    attempts: dict[str, int] = {}

    def rollout(messages: list[dict]) -> str:  # a mixed group: the first attempt right, the second not
        query = messages[1]["content"]
        attempts[query] = attempts.get(query, 0) + 1
        return template_reply(reference_parts("facts", rows[query])) if attempts[query] == 1 else NO_POLICY

    update = json.dumps({"operations": [{"op": "MODIFY", "ids": [entry["id"]], "text": text,
                                         "rationale": "the example should say more"}]})
    _model, gateway = scripted(engine, rollout=rollout, update=update)
    settings = RunSettings(epochs=1, batch_size=1, group_size=2, limit=1, review_mode="auto", gate="off",
                           examples=False, hold_flagged=True)
    run = execute_run(engine, create_run(engine, POLICY_TASK, settings), gateway=gateway)
    assert run.status == "completed", run.error
    with Session(engine) as session:
        [op] = session.exec(select(Operation).where(Operation.run_id == run.id)).all()
        library = session.get(LibraryVersion, queries.run_by_id(session, run.id).current_version_id).experiences
    return op, entry, library


def test_auto_review_holds_a_modify_that_drops_a_verified_fact_or_invents_one(engine, scripted):
    op, entry, library = run_with_modify(engine, scripted, INVENTED)
    assert op.status == "invalid" and op.validation_error.startswith(f"{HELD}: ")
    assert "drops: return window: 45 days; adds: 'Trailpeak'" in op.validation_error
    assert [e["text"] for e in library if e["id"] == entry["id"]] == [VERIFIED]  # the verified example stands


def test_auto_review_applies_a_faithful_modify(engine, scripted):
    op, entry, library = run_with_modify(engine, scripted, FAITHFUL)
    assert op.status == "applied", op.validation_error
    assert FAITHFUL in [e["text"] for e in library] and VERIFIED not in [e["text"] for e in library]


def test_a_code_prefix_the_reference_writes_joined_to_its_number_is_no_invented_name():
    """The template names how a ticket is formed ("made of PC- and your order number"): the "PC" of that sentence
    is stated by the reference's "PC-48213", so a faithful rewrite in that voice is not held (two were, in a run)."""
    rewrite = example_text(QUERY, "Our return window is 45 days. Your ticket reference is PC-48213, made of PC- "
                                  "and your order number.")
    found = fact_changes(rewrite, [VERIFIED], references=[RETURNS_REF], known=[QUERY, RETURNS_REF],
                         needs=needs_of("facts", RETURNS_REF))
    assert not found.changed, found.reason
