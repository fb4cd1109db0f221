"""The shop-policies demo (issue 27): the `facts` verifier, its data file, and the task built from them.

The agent's instructions leave out the shop's policies, so only a library can supply them; these tests check
offline that the verifier reads a policy stated in other words, refuses a wrong or missing one, and that a
reply stating no policy scores 0 on every held-out message.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from sqlmodel import Session, select

from core.domain.datasets import formula_like, parse_dataset_file
from core.domain.reference_answers import Part, reference_parts, template_reply
from core.domain.rewards import METHODS, parse_facts, score
from core.errors import InvalidInput
from core.grpo.reference_side import REFERENCE_SIDE_NOTE, learned_from_reference
from core.grpo.training import RunSettings, create_run, execute_run
from core.records.review.decisions import example_sources
from core.records.tasks.demo_data import DEMO_DIR, policy_rows
from core.records.tasks.demos import POLICY_INSTRUCTIONS, POLICY_TASK, ensure_policy_task
from core.records.tasks.task_io import TaskSettings, export_task, export_task_json, import_task
from storage import queries
from storage.tables import Advantage, LibraryVersion, Operation, Rollout, Run, Step
from tests.conftest import per_query

POLICY_FILE = DEMO_DIR / "policy_messages.jsonl"
TICKET = "ticket reference (PC- and the order number)"
RETURNS = "return window: 45 days | 45-day | forty-five days | forty-five-day"


def records() -> list[dict]:
    return [json.loads(line) for line in POLICY_FILE.read_text(encoding="utf-8").splitlines()]


def facts_score(reply: str, reference: str, **settings) -> tuple[float, str]:
    result = score("facts", reply, reference, settings)
    assert result.source == "verifier"
    return result.value, result.detail


# ---- the facts verifier -----------------------------------------------------------------------------------


@pytest.mark.parametrize("reply", [
    "You can return them within 45 days of delivery, and your ticket reference is PC-48213.",
    "We accept returns for forty-five days. Please quote pc 48213 when you write.",
    "Our 45-day window still applies to your boots; reference PC48213.",
    "RETURNS ARE OPEN FOR FORTY FIVE DAYS after delivery (ticket: Pc-48213).",
])
def test_facts_stated_in_other_words_pass(reply):
    value, detail = facts_score(reply, f"{RETURNS}; {TICKET}: PC-48213 | PC48213")
    assert value == 1.0 and detail == "2 of 2 facts found"


@pytest.mark.parametrize(("reply", "missing"), [
    ("You can return them within 45 days of delivery.", TICKET),
    ("Returns are accepted within 54 days; your reference is PC-48213.", "return window"),
    ("Returns are accepted within 45 days; your reference is PC-482130.", TICKET),
    ("Returns are accepted within 145 days; your reference is PC-48213.", "return window"),
    ("I will look into it for you.", f"return window, {TICKET}"),
])
def test_a_missing_or_wrong_fact_fails_and_is_named(reply, missing):
    value, detail = facts_score(reply, f"{RETURNS}; {TICKET}: PC-48213 | PC48213")
    assert value == 0.0 and detail.endswith(f"missing: {missing}")


def test_a_fact_only_inside_another_word_is_not_found():
    assert facts_score("Send it to our QualityDesk team.", "Quality Desk")[0] == 0.0
    assert facts_score("Send it to the Quality Deskworks.", "Quality Desk")[0] == 0.0
    assert facts_score("Send it to the quality desk, please.", "Quality Desk")[0] == 1.0


def test_the_label_is_never_matched_and_ends_at_the_first_colon_and_space():
    reference = "support hours: 8:00 | eight o'clock"
    [fact] = parse_facts(reference)
    assert fact.label == "support hours" and fact.wordings == ("8:00", "eight o'clock")
    assert facts_score("We open at 8:00 every day.", reference)[0] == 1.0
    value, detail = facts_score("Our support hours are long.", reference)
    assert value == 0.0 and detail == "0 of 1 facts found; missing: support hours"
    assert parse_facts("8:00")[0].wordings == ("8:00",)  # no ": ", no label
    [unlabelled] = parse_facts("Quality Desk | quality team")
    assert unlabelled.label == "" and unlabelled.name == "Quality Desk"
    assert facts_score("Ask the team.", "Quality Desk | quality team")[1].endswith("missing: Quality Desk")
    assert parse_facts("note: time: 9:30")[0].wordings == ("time: 9:30",)


def test_partial_gives_the_share_found():
    reference = "a: alpha; b: bravo; c: charlie; d: delta"
    assert facts_score("alpha and charlie", reference)[0] == 0.0
    value, detail = facts_score("alpha and charlie", reference, partial=True)
    assert value == 0.5 and detail == "2 of 4 facts found; missing: b, d"
    assert facts_score("alpha bravo charlie delta", reference, partial=True)[0] == 1.0


def test_a_reference_without_facts_is_a_configuration_error():
    with pytest.raises(InvalidInput, match="reward method 'facts' needs a reference that lists facts"):
        score("facts", "anything", " ; | ;")
    with pytest.raises(InvalidInput, match="the fact 'refund time' has no wording after its label"):
        score("facts", "anything", "refund time: ; Quality Desk")
    with pytest.raises(ValueError, match="needs a reference answer"):
        score("facts", "anything", "  ")


def test_facts_is_a_registered_verifier_with_a_partial_setting():
    method = METHODS["facts"]
    assert method.scored_by_function and method.needs_reference and not method.isolated
    assert list(method.settings_model.model_fields) == ["partial"]
    with pytest.raises(InvalidInput, match="partial must be true or false"):
        TaskSettings(name="t", instructions="i", policy_model="p", learner_model="l", judge_model="j",
                     reward_method="facts", reward_settings={"partial": "yes"}).validate()


# ---- the data file ----------------------------------------------------------------------------------------


def test_the_file_is_clean_json_lines_with_an_id_query_reference_and_split_each():
    rows = records()
    assert [r["id"] for r in rows] == [f"p{n:02d}" for n in range(1, len(rows) + 1)]
    assert all(set(r) == {"id", "query", "reference", "split"} for r in rows)
    assert Counter(r["split"] for r in rows) == {"train": 28, "test": 16}
    assert not any(formula_like(r["query"]) or formula_like(r["reference"]) for r in rows)
    for row in rows:
        assert 15 <= len(row["query"].split()) <= 60, row["id"]


def test_every_reference_parses_and_every_policy_is_in_both_splits():
    labels: dict[str, set[str]] = {"train": set(), "test": set()}
    wordings: dict[str, set[tuple[str, ...]]] = {}
    for row in records():
        facts = parse_facts(row["reference"])
        assert 1 <= len(facts) <= 2 and all(fact.label for fact in facts), row["id"]
        for fact in facts:
            labels[row["split"]].add(fact.label)
            if fact.label != TICKET:
                wordings.setdefault(fact.label, set()).add(fact.wordings)
        orders = re.findall(r"\b\d{5}\b", row["query"])
        ticket = [fact for fact in facts if fact.label == TICKET]
        assert [f.wordings[0] for f in ticket] == [f"PC-{order}" for order in orders], row["id"]
    assert labels["train"] == labels["test"] and len(labels["train"]) >= 7
    assert all(len(variants) == 1 for variants in wordings.values())  # one policy, the same wordings everywhere


def test_train_and_test_messages_differ():
    rows = records()
    train = {r["query"] for r in rows if r["split"] == "train"}
    test = {r["query"] for r in rows if r["split"] == "test"}
    assert len(train) == 28 and len(test) == 16 and not train & test
    orders = {split: {o for r in rows if r["split"] == split for o in re.findall(r"\b\d{5}\b", r["query"])}
              for split in ("train", "test")}
    assert orders["train"] and orders["test"] and not orders["train"] & orders["test"]


def test_the_file_parses_as_a_dataset_like_any_uploaded_file():
    dataset = parse_dataset_file(POLICY_FILE.read_bytes(), POLICY_FILE.name)
    assert not dataset.repeats and len(dataset.rows) == 44
    assert [(r.external_id, r.query, r.reference, r.split) for r in dataset.rows] == [
        (r["id"], r["query"], r["reference"], r["split"]) for r in records()]
    assert policy_rows() == dataset.rows


# ---- the task ---------------------------------------------------------------------------------------------


def test_the_task_is_checked_by_the_facts_verifier_and_its_instructions_hold_no_policy(engine):
    task = ensure_policy_task(engine)
    assert task.reward_method == "facts" and task.agent_mode == "direct" and task.kind == "single"
    assert TaskSettings.from_task(task).validate().reward_settings == {"partial": False}
    assert "Pinecrest Outfitters" in POLICY_INSTRUCTIONS
    for fact in ("45", "Quality Desk", "PC-", "Basecamp", "60", "business days", "warrant"):
        assert fact not in task.instructions and fact not in task.answer_format, fact
    assert "near 0" in task.description and "reasoning" in task.description
    with Session(engine) as session:
        samples = queries.samples(session, task.id)
    assert Counter(s.split for s in samples) == {"train": 28, "test": 16}
    assert all(parse_facts(s.reference) for s in samples)


def test_the_task_survives_an_export_and_import(engine):
    ensure_policy_task(engine)
    with Session(engine) as session:
        task = queries.task_by_name(session, POLICY_TASK)
        data = export_task(session, task)
        text = export_task_json(session, task)
    assert len(data["samples"]) == 44
    import_task(engine, text.encode("utf-8"), "ann", rename="policy copy")
    with Session(engine) as session:
        copy = export_task(session, queries.task_by_name(session, "policy copy"))
    assert copy["task"] == {**data["task"], "name": "policy copy"}
    assert copy["samples"] == data["samples"]


def test_the_empty_library_scores_0_and_the_policies_score_1_on_every_test_message():
    """Offline stand-ins for the agent: a reply without the shop's policies (what the empty library can say)
    and one that states them all (what a library that learned them can say)."""
    policies = ("Returns are accepted within 45 days of delivery. Refunds reach your original payment method "
                "within 7 business days. Damaged or unsafe items go to our Quality Desk. Shipping is free on "
                "orders over 60 euros. Tents carry a 3-year warranty. We match prices within 10 days of "
                "purchase. Our loyalty programme is the Basecamp Club.")
    test = [row for row in policy_rows() if row.split == "test"]
    assert len(test) == 16
    for row in test:
        assert score("facts", "Thank you for your message. I will look into it for you.", row.reference).value == 0.0
        orders = re.findall(r"\b\d{5}\b", row.query)
        ticket = f" Your ticket reference is PC-{orders[0]}." if orders else ""
        result = score("facts", policies + ticket, row.reference)
        assert result.value == 1.0, (row.external_id, result.detail)


# ---- a run on the task ------------------------------------------------------------------------------------

POLICIES = ("Returns are accepted within 45 days of delivery. Refunds reach your original payment method within 7 "
            "business days. Damaged or unsafe items go to our Quality Desk. Shipping is free on orders over 60 euros. "
            "Tents carry a 3-year warranty. We match prices within 10 days of purchase. Our loyalty programme is the "
            "Basecamp Club.")
NO_POLICY = "Thank you for your message. I will look into it for you."


def stating_the_policies(query: str) -> str:
    orders = re.findall(r"\b\d{5}\b", query)
    return POLICIES + (f" Your ticket reference is PC-{orders[0]}." if orders else "")


def test_a_policy_run_learns_from_the_reference_where_every_attempt_failed(engine, scripted):
    """One step of the shop-policies demo (3 messages, G=2) with groups where every attempt failed sent to the
    learner with the reference: each reward is the verifier's, and each group is decided by its rewards: the
    all-failed one reaches the learner with the reference and says so, the mixed one is learned from its own
    attempts, the all-right one is skipped; a new version exists because operations were applied.

    Moved off the real model, where which groups failed was the small agent's luck; it was
    test_model_e2e.py::test_a_policy_run_learns_from_the_reference_where_every_attempt_failed. All-failed groups
    on the arithmetic demo:
    test_training.py::test_an_all_failed_group_reaches_the_learner_with_the_reference_only_when_the_option_is_on;
    the embedded model's path through a run: test_model_e2e.py::test_train_and_eval_on_the_embedded_model."""
    task = ensure_policy_task(engine)
    with Session(engine) as session:
        failing, mixed, right = queries.samples(session, task.id, "train", limit=3)

    def answer(messages: list[dict]) -> str:
        query = messages[1]["content"]
        if query == failing.query:
            return NO_POLICY
        if query == mixed.query:
            attempts[query] = attempts.get(query, 0) + 1
            return stating_the_policies(query) if attempts[query] == 1 else NO_POLICY
        return stating_the_policies(query)

    attempts: dict[str, int] = {}
    for sample in (failing, mixed, right):  # the verifier agrees with the script
        assert score("facts", stating_the_policies(sample.query), sample.reference).value == 1.0
        assert score("facts", NO_POLICY, sample.reference).value == 0.0
    model, gateway = scripted(engine, rollout=answer)
    settings = RunSettings(epochs=1, batch_size=3, group_size=2, limit=3, review_mode="auto", max_tokens=160,
                           hold_flagged=False, learner_max_tokens=600, max_operations=2, gate="off",
                           reference_when_all_fail=True)
    run = execute_run(engine, create_run(engine, POLICY_TASK, settings), gateway=gateway)
    assert run.status == "completed", run.error
    with Session(engine) as session:
        step = session.exec(select(Step).where(Step.run_id == run.id)).one()
        rollouts = session.exec(select(Rollout).where(Rollout.step_id == step.id)).all()
        advantages = {a.sample_id: a for a in session.exec(select(Advantage).where(Advantage.step_id == step.id))}
        applied = [o for o in session.exec(select(Operation).where(Operation.step_id == step.id))
                   if o.status == "applied"]
        version = session.get(LibraryVersion, run.current_version_id)
    assert len(rollouts) == 6 and all(r.error is None and r.reward_source == "verifier" for r in rollouts)
    rewards = {sample.id: sorted(r.reward for r in rollouts if r.sample_id == sample.id)
               for sample in (failing, mixed, right)}
    assert rewards == {failing.id: [0.0, 0.0], mixed.id: [0.0, 1.0], right.id: [1.0, 1.0]}

    from_reference = advantages[failing.id]
    assert from_reference.status == "ok" and learned_from_reference(from_reference)
    assert from_reference.text.startswith(REFERENCE_SIDE_NOTE.split(" (")[0])
    assert advantages[mixed.id].status == "ok" and not learned_from_reference(advantages[mixed.id])
    assert advantages[right.id].status == "skipped"
    assert step.stats["from_reference"] == 1
    prompts = [messages[-1]["content"] for stage, messages in model.calls if stage == "advantage"]
    assert len(prompts) == 2
    successful_side = "Reference answer (the successful side; written by a person, not an attempt):\n"
    assert f"{successful_side}{failing.reference}" in next(p for p in prompts if failing.query in p)
    assert successful_side not in next(p for p in prompts if mixed.query in p)
    assert applied and version.number == 2 and version.experiences


# ---- worked examples made from the reference (issue 36, item 3) ----------------------------------------------


def reference_example_run(engine, scripted, reply: str) -> tuple[Operation, Advantage, str, list]:
    """One auto-review step on the first train message (every attempt fails), examples only, with the learner's
    reply from the reference scripted: the example's operation, its group's advantage, the message's reference
    and the learner's calls."""
    task = ensure_policy_task(engine)
    model, gateway = scripted(engine, rollout=NO_POLICY, example=json.dumps({"reply": reply}))
    settings = RunSettings(epochs=1, batch_size=1, group_size=2, limit=1, review_mode="auto", gate="off",
                           examples=True, lessons=False, reference_when_all_fail=True)
    run = execute_run(engine, create_run(engine, POLICY_TASK, settings), gateway=gateway)
    assert run.status == "completed", run.error
    with Session(engine) as session:
        [op] = session.exec(select(Operation).where(Operation.run_id == run.id)).all()
        advantage = session.exec(select(Advantage).where(Advantage.step_id == op.step_id)).one()
        sample = next(s for s in queries.samples(session, task.id, "train") if s.id == advantage.sample_id)
    assert len(parse_facts(sample.reference)) == 2  # p01: a return window and a ticket reference
    return op, advantage, sample.reference, [messages for stage, messages in model.calls if stage == "example"]


def answer_of(op: Operation) -> str:
    return op.text.split(" Answer: ", 1)[1]


def test_a_reference_example_is_the_reply_a_person_would_send(engine, scripted):
    """The learner writes the reply from the reference's facts (label and first wording, never the verifier's
    alternatives); the example states each fact in whole sentences, ends with a stop, scores 1 with the task's
    reward and lands in auto review with nothing flagged."""
    reply = ("Yes, you can still send the boots back: our return window is 45 days from delivery. Please quote "
             "your ticket reference PC-48213 when you write to us.")
    op, advantage, reference, prompts = reference_example_run(engine, scripted, reply)
    [prompt] = [messages[-1]["content"] for messages in prompts]
    facts = prompt.split("The right answer states these facts:\n")[1].split("\n\n")[0]
    assert facts == f"- return window: 45 days\n- {TICKET}: PC-48213"  # the first wordings, not the alternatives
    assert op.status == "applied" and answer_of(op) == reply
    assert op.text.endswith(".") and reference not in op.text and ";" not in answer_of(op)
    assert all(fact.wordings[0] in op.text for fact in parse_facts(reference))
    assert score("facts", answer_of(op), reference).value == 1.0
    assert "written as a reply by the learner" in advantage.text


@pytest.mark.parametrize("reply", ["Thank you, I will look into your return for you.",  # scores 0
                                   "45 days;PC-48213",  # the raw form: no sentence
                                   # scores 1, but starts by copying the customer's message (the embedded
                                   # learner's habit on 2026-11-27): it would teach the agent to echo
                                   "Hi, a pair of leather hiking boots was delivered to me three weeks ago. The "
                                   "return window is 45 days and your ticket reference is PC-48213."])
def test_where_the_learners_reply_does_not_score_a_sentence_per_fact_does(engine, scripted, reply):
    op, advantage, reference, _prompts = reference_example_run(engine, scripted, reply)
    assert op.status == "applied"
    assert answer_of(op) == ("Our return window is 45 days. Your ticket reference is PC-48213, made of PC- and your "
                             "order number.")
    assert all(fact.wordings[0] in op.text for fact in parse_facts(reference)) and op.text.endswith(".")
    assert score("facts", answer_of(op), reference).value == 1.0
    assert "a sentence per part" in advantage.text and "the learner's reply" in advantage.text


def test_with_learner_replies_off_the_learner_is_not_asked_and_a_sentence_per_fact_lands(engine, scripted):
    """The embedded learner's default (core.records.runs.defaults): its replies were never used in the measured runs,
    so the run writes the example from the reference without the call."""
    ensure_policy_task(engine)
    model, gateway = scripted(engine, rollout=NO_POLICY, example=json.dumps({"reply": "never asked"}))
    settings = RunSettings(epochs=1, batch_size=1, group_size=2, limit=1, review_mode="auto", gate="off",
                           examples=True, lessons=False, reference_when_all_fail=True, learner_replies=False)
    run = execute_run(engine, create_run(engine, POLICY_TASK, settings), gateway=gateway)
    assert run.status == "completed", run.error
    assert model.count("example") == 0
    with Session(engine) as session:
        [op] = session.exec(select(Operation).where(Operation.run_id == run.id)).all()
        advantage = session.exec(select(Advantage).where(Advantage.step_id == op.step_id)).one()
    assert op.status == "applied" and answer_of(op) == ("Our return window is 45 days. Your ticket reference is "
                                                        "PC-48213, made of PC- and your order number.")
    assert "the run does not ask the learner for replies" in advantage.text


@pytest.mark.parametrize("learner_replies", [False, True])
def test_with_learner_replies_off_a_group_with_a_right_attempt_gets_its_example_from_the_reference(
        engine, scripted, learner_replies):
    """A mixed group on a task whose reward reads stated facts: with learner replies off (the embedded learner's
    default) its example is the reference's sentences, not a compression of the right attempt, whose other
    sentences nothing verifies (here an invented claim about logs); with them on, the learner compresses it."""
    ensure_policy_task(engine)
    right = ("According to the warehouse logs your boots can still come back: our return window is 45 days, and "
             "your ticket reference is PC-48213.")
    rollout = per_query(lambda _query, n: right if n == 1 else NO_POLICY)
    compressed = json.dumps({"problem": "Boots that pinch, order 48213.", "steps": "The logs say so.",
                             "answer": right})
    model, gateway = scripted(engine, rollout=rollout, example=compressed)
    settings = RunSettings(epochs=1, batch_size=1, group_size=2, limit=1, review_mode="auto", gate="off",
                           examples=True, lessons=False, reference_when_all_fail=True, learner_replies=learner_replies)
    run = execute_run(engine, create_run(engine, POLICY_TASK, settings), gateway=gateway)
    assert run.status == "completed", run.error
    with Session(engine) as session:
        [op] = session.exec(select(Operation).where(Operation.run_id == run.id)).all()
        step = session.get(Step, op.step_id)
        advantage = session.exec(select(Advantage).where(Advantage.step_id == op.step_id)).one()
    rollout_id = example_sources(step)[op.position]["rollout_id"]
    if learner_replies:
        assert model.count("example") == 1 and rollout_id is not None and "logs" in op.text
        assert "compressed from output" in advantage.text
        return
    assert model.count("example") == 0 and rollout_id is None and "logs" not in op.text
    assert op.status == "applied" and answer_of(op) == ("Our return window is 45 days. Your ticket reference is "
                                                        "PC-48213, made of PC- and your order number.")
    assert "a sentence per part: 1 of 2 attempts failed" in advantage.text
    assert "a group where 1 of 2 attempts failed" in op.rationale


def covered_run(engine, scripted, **settings) -> tuple[int, list[Step], dict[int, int], dict[int, Advantage]]:
    """Two epochs over one message (every attempt fails), examples only: the first epoch's example covers it.
    The run's id, its steps, rollouts per step and the second step's advantage by sample."""
    ensure_policy_task(engine)
    _model, gateway = scripted(engine, rollout=NO_POLICY)
    base = dict(epochs=2, batch_size=1, group_size=2, limit=1, review_mode="auto", gate="off", examples=True,
                lessons=False, reference_when_all_fail=True, learner_replies=False)
    run = execute_run(engine, create_run(engine, POLICY_TASK, RunSettings(**{**base, **settings})), gateway=gateway)
    assert run.status == "completed", run.error
    with Session(engine) as session:
        steps = queries.steps(session, run.id)
        rollouts = {step.id: len(queries.step_rollouts(session, step.id)) for step in steps}
        advantages = {a.sample_id: a for a in session.exec(select(Advantage).where(Advantage.step_id == steps[1].id))}
    return run.id, steps, rollouts, advantages


def test_a_message_the_library_already_covers_is_not_rolled_out_again(engine, scripted):
    """Epoch 2 meets the message whose example epoch 1 landed: an example from it would be refused as covered
    (core.domain.coverage.plan_examples), so its group is skipped with the reason and costs no call; with
    skip_covered off it is rolled out as before."""
    run_id, steps, rollouts, advantages = covered_run(engine, scripted)
    assert [rollouts[step.id] for step in steps] == [2, 0]
    with Session(engine) as session:  # the plan shrank with it: the Train page's time left counts only what runs
        progress = session.get(Run, run_id).progress
    assert progress["rollouts_total"] == progress["rollouts_done"] == 2
    [advantage] = advantages.values()
    assert advantage.status == "skipped" and advantage.text.startswith("covered: E1, shown to this query")
    assert steps[1].version_after_id in (None, steps[1].version_before_id)  # nothing changed, nothing paid

    _run, steps, rollouts, advantages = covered_run(engine, scripted, skip_covered=False, seed=1)
    assert [rollouts[step.id] for step in steps] == [2, 2]


def test_a_message_whose_example_the_gate_refused_is_not_rolled_out_again(engine, scripted):
    """The gate refuses epoch 1's example (it asks for a significantly better validation score, which an agent
    that never answers cannot give): epoch 2 would make the same example from the same reference, so the message is
    skipped, naming the refused operation, and costs no call."""
    _run_id, steps, rollouts, advantages = covered_run(engine, scripted, gate="better")
    assert [rollouts[step.id] for step in steps] == [2, 0]
    with Session(engine) as session:
        [refused] = queries.step_operations(session, steps[0].id)
    assert refused.status == "rejected" and refused.reviewer == "gate"
    [advantage] = advantages.values()
    assert advantage.status == "skipped"
    assert advantage.text.startswith(f"refused before: operation #{refused.id}, an example stating every fact")


def test_the_template_states_every_reference_of_the_demo_so_that_it_scores():
    """The fallback is generic: every reference of the demo file, written a sentence per fact, scores 1 with the
    task's reward; a `contains_all` reference of a code and a quantity reads as the issue's reply."""
    for row in records():
        reply = template_reply(reference_parts("facts", row["reference"]))
        assert reply.endswith(".") and score("facts", reply, row["reference"]).value == 1.0, row["id"]
    replies = [template_reply(reference_parts("facts", row["reference"])) for row in records()[:4]]
    assert replies == ["Our return window is 45 days. Your ticket reference is PC-48213, made of PC- and your order "
                       "number.",
                       "We offer refund to the original payment method within 7 business days.",
                       "Your ticket reference is PC-47758, made of PC- and your order number.",
                       "Damaged or unsafe items go to Quality Desk."]
    for reference, expected in (("7 years;LK-72886", "In your case: 7 years and LK-72886."),
                                ("APP-5;P4", "In your case: APP-5 and P4."),  # a queue and a priority, no field
                                ("0800 123 456;Tuesday;FORM-7", "In your case: 0800 123 456, Tuesday and FORM-7.")):
        reply = template_reply(reference_parts("contains_all", reference))
        assert reply == expected and "reference is" not in reply  # no sentence of the shop's about what a value is
        assert score("contains_all", reply, reference).value == 1.0
    phrases = {"phrases": ["Quality Desk", "PC-"]}  # the task's phrases are the parts its reward counts
    assert template_reply(reference_parts("contains_all", "ignored", phrases)) == "In your case: Quality Desk and PC-."
    mixed = [Part("return window", "45 days"), Part("", "LK-51294")]  # a labelled fact, then a bare value
    assert template_reply(mixed) == "Our return window is 45 days. In your case: LK-51294."
