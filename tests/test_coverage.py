"""A library covers its task (issue 44): one worked example per need, a full library gives up its most redundant
example and never the only one of a need, the cap follows the selection (tests/test_run_defaults.py), an example
that states a fact no reference holds is flagged and refused in auto review, and the library says which train
references an example retrieval would show them covers."""

from __future__ import annotations

import json
import re

from sqlmodel import Session, select

from core.domain.coverage import FULL, coverage, covering, needs_of, needs_stated, plan_examples
from core.domain.library import EXAMPLE, apply_ops, validate_ops
from core.domain.reference_answers import (
    example_text,
    invented_facts,
    reference_parts,
    template_reply,
    unusable,
)
from core.domain.selection import Selection
from core.grpo.training import RunSettings, create_run, execute_run
from core.records.tasks.demos import POLICY_TASK, ensure_policy_task
from storage import queries
from storage.tables import LibraryVersion, Operation

RETURNS = "return window: 45 days | 45-day | forty-five days"
TICKET = "ticket reference (PC- and the order number): PC-{n} | PC{n}"
WARRANTY = "tent warranty: 3 years | three years"
REFUND = "refund to the original payment method within: 7 business days"
NO_POLICY = "Thank you for your message. I will look into it for you."


def made(reference: str, query: str = "A customer's message.") -> str:
    """A worked example as the default path's template writes it from a reference."""
    return example_text(query, template_reply(reference_parts("facts", reference)))


def library(*references: str) -> list[dict]:
    return [{"id": f"E{i}", "kind": EXAMPLE, "text": made(ref, f"Message number {i}.")}
            for i, ref in enumerate(references, start=1)]


def universe(*references: str) -> frozenset:
    return frozenset().union(*(needs_of("facts", ref) for ref in references))


def new(reference: str, query: str = "Another customer's message.") -> tuple[str, str, frozenset]:
    return made(reference, query), "from the reference", needs_of("facts", reference)


def test_a_need_is_a_fact_with_a_codes_digits_masked():
    ticket_a, ticket_b = needs_of("facts", TICKET.format(n=48213)), needs_of("facts", TICKET.format(n=49302))
    assert ticket_a == ticket_b and [n.key for n in ticket_a] == ["ticket reference: PC-…"]
    assert {n.key for n in needs_of("facts", f"{RETURNS}; {TICKET.format(n=1)}")} == {
        "return window: 45 days", "ticket reference: PC-…"}
    # what an example teaches is in its answer, not in the customer's message
    text = example_text("I bought it 45 days ago, ticket PC-1.", "Refund to the original payment method within "
                                                                   "7 business days.")
    assert {n.key for n in needs_stated(text, universe(RETURNS, REFUND, TICKET.format(n=1)))} == {
        "refund to the original payment method within: 7 business days"}
    assert needs_of("math", "12") == frozenset()  # a reward that counts no facts has no needs


def test_a_near_duplicate_replaces_instead_of_adding():
    lib = library(RETURNS, WARRANTY)
    [plan] = plan_examples(lib, [new(RETURNS, "Can I still return my boots?")], universe(RETURNS, WARRANTY), cap=6)
    assert plan.error is None and (plan.op.op, plan.op.target_ids) == ("MODIFY", ["E1"])
    assert "replaces E1" in plan.op.rationale
    [checked] = validate_ops(lib, [plan.op], max_examples=6)
    after = apply_ops(lib, [checked.op], first_new_id=3)
    assert len(after) == 2 and "Can I still return my boots?" in after[0]["text"]  # one example per need, not two
    # a new example that states the facts of two examples (the return window and the ticket) merges them
    lib = library(RETURNS, TICKET.format(n=11), WARRANTY)
    [plan] = plan_examples(lib, [new(f"{RETURNS}; {TICKET.format(n=22)}")],
                           universe(RETURNS, TICKET.format(n=1), WARRANTY), cap=6)
    assert (plan.op.op, plan.op.target_ids, plan.error) == ("MERGE", ["E1", "E2"], None)
    # an example already stating these facts and more covers it; two of one step: the first stands
    lib = library(f"{RETURNS}; {TICKET.format(n=11)}")
    plans = plan_examples(lib, [new(REFUND), new(REFUND, "When is my money back?"), new(RETURNS)],
                          universe(RETURNS, REFUND, TICKET.format(n=1)), cap=6)
    assert [p.op.op for p in plans][0] == "ADD" and plans[0].error is None
    assert plans[1].error.startswith("covered: new example 1 of this step")
    assert plans[2].error.startswith("covered: E1 already states these facts")


def test_an_example_the_query_is_never_shown_does_not_cover_it():
    """The shop run of 2026-11-29: a message about returning a rain jacket was refused three times as covered by the
    return-and-ticket example, which retrieval never showed it. Covered means covered for what the query is shown."""
    lib = library(f"{RETURNS}; {TICKET.format(n=11)}")
    needs = universe(RETURNS, TICKET.format(n=1))
    [shown] = plan_examples(lib, [new(RETURNS)], needs, cap=6, shown=[frozenset({"E1"})])
    assert shown.error.startswith("covered: E1 already states these facts")
    [unseen] = plan_examples(lib, [new(RETURNS)], needs, cap=6, shown=[frozenset()])
    assert unseen.error is None and (unseen.op.op, unseen.op.target_ids) == ("ADD", [])


def test_a_full_library_gives_up_its_most_redundant_example_never_the_only_one_of_a_need():
    # the library: 4 of 6 on one policy, none for the warranty
    refs = (RETURNS, RETURNS, REFUND, RETURNS, TICKET.format(n=1), RETURNS)
    lib = library(*refs)
    everything = universe(*refs, WARRANTY)
    [plan] = plan_examples(lib, [new(WARRANTY, "How long is my tent covered?")], everything, cap=6)
    assert plan.error is None and plan.op.op == "MODIFY" and plan.op.target_ids == ["E1"]  # a returns copy
    assert "The library is full (6 worked examples)" in plan.op.rationale
    after = apply_ops(lib, [validate_ops(lib, [plan.op], max_examples=6)[0].op], first_new_id=7)
    needs = [frozenset(n.key for n in needs_stated(e["text"], everything)) for e in after]
    assert len(after) == 6 and sum("tent warranty: 3 years" in n for n in needs) == 1
    assert sum("refund to the original payment method within: 7 business days" in n for n in needs) == 1
    # each example the only one of its need: a new need is refused for space, nothing is displaced
    lib = library(RETURNS, REFUND, TICKET.format(n=1))
    [plan] = plan_examples(lib, [new(WARRANTY)], universe(RETURNS, REFUND, TICKET.format(n=1), WARRANTY), cap=3)
    assert plan.error.startswith(FULL) and "each the only example of its need" in plan.error
    # a task whose reward counts no facts: an ADD, refused for space at the cap as before
    plain = [{"id": "E1", "kind": EXAMPLE, "text": "Problem: 2 and 3. Answer: 5."}]
    [plan] = plan_examples(plain, [("Problem: 4 and 4. Answer: 8.", "r", frozenset())], frozenset(), cap=1)
    assert plan.error.startswith(FULL)


def test_an_invented_place_number_or_name_is_found():
    known = [f"{RETURNS}; {TICKET.format(n=48213)}", "My boots from order 48213 pinch. Anna",
             "You answer for Pinecrest Outdoor."]
    assert invented_facts("The workshop is located in Larkspur, Ontario, Canada.", known) == [
        "Larkspur", "Ontario", "Canada"]
    assert invented_facts("Thanks Anna, the return window is 60 days.", known) == ["60"]
    assert invented_facts("Our manager Brian Koenig will call you at Pinecrest Outdoor.", known) == ["Brian", "Koenig"]
    assert invented_facts("Hi Anna, Pinecrest Outdoor takes the boots back within 45 days. Your ticket reference "
                          "is PC-48213.", known) == []
    assert invented_facts("Your ticket reference is PC-99999.", known) == ["PC-99999"]
    assert invented_facts("3 times 4 is 12.", ["7"], numbers=False) == []
    parts = reference_parts("facts", known[0])
    reason = unusable("Boots go back within 45 days, PC-48213. The workshop is in Larkspur.", known[1], known[0],
                      parts, [known[2]])
    assert reason and "'Larkspur'" in reason


def compressed_with_a_place(messages: list[dict]) -> str:
    """The learner's compression of a right rollout that adds a place no reference holds."""
    query = re.search(r"Problem:\n(.*?)\n\nThe agent's solution", messages[-1]["content"], re.S).group(1)
    reference = next(r for r in json_rows() if r["query"] == query)["reference"]
    return json.dumps({"problem": "Boots bought three weeks ago pinch.",
                       "steps": ["The workshop is located in Larkspur, Ontario, Canada"],
                       "answer": template_reply(reference_parts("facts", reference))})


def json_rows() -> list[dict]:
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "data" / "demo" / "policy_messages.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_an_example_inventing_a_place_is_flagged_and_not_applied_in_auto_review(engine, scripted):
    ensure_policy_task(engine)
    rows = {r["query"]: r["reference"] for r in json_rows()}
    attempts: dict[str, int] = {}

    def rollout(messages: list[dict]) -> str:  # a mixed group: the first attempt right, the second not
        query = messages[1]["content"]
        attempts[query] = attempts.get(query, 0) + 1
        return template_reply(reference_parts("facts", rows[query])) if attempts[query] == 1 else NO_POLICY

    _model, gateway = scripted(engine, rollout=rollout, example=compressed_with_a_place)
    settings = RunSettings(epochs=1, batch_size=1, group_size=2, limit=1, review_mode="auto", gate="off",
                           examples=True, lessons=False, hold_flagged=True)
    run = execute_run(engine, create_run(engine, POLICY_TASK, settings), gateway=gateway)
    assert run.status == "completed", run.error
    with Session(engine) as session:
        [op] = session.exec(select(Operation).where(Operation.run_id == run.id)).all()
        version = session.get(LibraryVersion, queries.run_by_id(session, run.id).current_version_id)
    assert op.status == "invalid" and "'Larkspur', 'Ontario', 'Canada'" in op.validation_error
    assert not any(e.get("kind") == EXAMPLE for e in version.experiences)  # not applied


def test_a_query_is_covered_only_by_one_shown_example_stating_all_its_facts():
    """The shop's price-match question with an order number was shown the price-match example and a ticket
    example, skipped as covered, and answered at test time with the price-match example's reply and no ticket: the
    agent copies the nearest answer, so two examples that state the facts between them do not cover a query."""
    query = "Can I still get a price match on order 59013, the watch I bought last week?"
    price = "price match within: 10 days | ten days"
    apart = [{"id": "E1", "kind": EXAMPLE, "text": made(price, "Is there a price match on the watch I bought?")},
             {"id": "E2", "kind": EXAMPLE, "text": made(TICKET.format(n=51904), "My order 51904 has not arrived.")}]
    reference = f"{price}; {TICKET.format(n=59013)}"
    assert covering(apart, query, reference, "facts", {}, Selection.build("top_k", 3)) == []
    together = apart + [{"id": "E3", "kind": EXAMPLE, "text": made(f"{price}; {TICKET.format(n=51904)}",
                                                                     "A price match for order 51904, please.")}]
    assert covering(together, query, reference, "facts", {}, Selection.build("top_k", 3)) == ["E3"]


def test_coverage_names_the_train_references_no_shown_example_states():
    refs = [("p01", "Can I return my boots?", RETURNS), ("p02", "When is my refund back?", REFUND),
            ("p03", "How long is the tent warranty?", WARRANTY)]
    entries = [{"id": "E1", "kind": EXAMPLE, "text": made(RETURNS, "Can I return my hiking boots?")},
               {"id": "E2", "kind": EXAMPLE, "text": made(REFUND, "When will my refund arrive?")}]
    result = coverage(entries, refs, "facts", {}, Selection.build("top_k", 1))
    assert (result.covered, result.uncovered) == (["p01", "p02"], ["p03"])
    assert result.line() == ("coverage: 2 of 3 train references have an example that retrieval shows them and that "
                             "states their facts; uncovered: p03")
    assert not coverage(entries, refs, "math", {}, Selection()).counted


def test_of_two_new_examples_the_one_stating_more_stands():
    plans = plan_examples([], [new(TICKET.format(n=5)), new(f"{RETURNS}; {TICKET.format(n=6)}")],
                          universe(RETURNS, TICKET.format(n=1)), cap=6)
    assert plans[0].error.startswith("covered: new example 2 of this step") and plans[1].error is None


def test_versions_says_which_train_references_the_latest_version_covers(database_url, capsys, tmp_path):
    from core.cli import main
    from core.domain.library_io import to_json

    assert main(["--db", database_url, "demo"]) == 0
    rows = [r for r in json_rows() if r["split"] == "train"]
    entries = [{"id": f"E{i}", "kind": EXAMPLE, "text": made(r["reference"], r["query"])}
               for i, r in enumerate(rows[:2], start=1)]  # p01 (returns and a ticket), p02 (a refund)
    path = tmp_path / "lib.json"
    path.write_text(to_json(entries))
    assert main(["--db", database_url, "import", "--task", POLICY_TASK, str(path)]) == 0
    assert main(["--db", database_url, "library", "selection", "--task", POLICY_TASK, "--mode", "top_k"]) == 0
    capsys.readouterr()
    assert main(["--db", database_url, "versions", "--task", POLICY_TASK]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "coverage:" in line)
    covered = int(re.search(r"coverage: (\d+) of 28 train references", line).group(1))
    assert 2 <= covered < 28 and "uncovered: " in line and "p06" in line  # the warranty: no example states it

    assert main(["--db", database_url, "library", "coverage", "--task", POLICY_TASK]) == 0
    out = capsys.readouterr().out
    assert f"coverage: {covered} of 28 train references" in out.splitlines()[0]
    warranty = next(line for line in out.splitlines() if line.strip().startswith("p06:"))
    assert "warranty" in warranty or "tent" in warranty  # each uncovered reference with its message
    assert main(["--db", database_url, "library", "coverage", "--task", POLICY_TASK, "--version", "1"]) == 0
    assert "coverage: 0 of 28" in capsys.readouterr().out  # #1, the empty library


def test_a_refusal_names_the_example_that_covers_it_in_the_end():
    plans = plan_examples([], [new(TICKET.format(n=5)), new(TICKET.format(n=7)), new(f"{RETURNS}; {TICKET.format(n=6)}")],
                          universe(RETURNS, TICKET.format(n=1)), cap=6)
    assert [p.error.split(" of this step")[0] for p in plans[:2]] == ["covered: new example 3"] * 2
    assert plans[2].error is None


def test_a_learner_reply_with_a_sentence_stating_no_fact_is_not_used():
    reference = "refund to the original payment method within: 7 business days; " + TICKET.format(n=49302)
    query = "Your warehouse got my returned headlamp on Friday, order 49302. How long until the refund shows up?"
    parts = reference_parts("facts", reference)
    echo = ("The warehouse received my returned headlamp on Friday, order 49302. The refund to the original payment "
            "method within 7 business days will show up. Your ticket reference is PC-49302.")
    assert "states no fact of the reference" in unusable(echo, query, reference, parts, ["Be brief."])
    focused = "Your refund reaches the original payment method within 7 business days. Quote PC-49302."
    assert unusable(focused, query, reference, parts, ["Be brief."]) is None
