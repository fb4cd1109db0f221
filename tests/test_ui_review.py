"""UI tests of the Review page (Streamlit AppTest): decisions go to the database through core.records.review.decisions."""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session, select

from core.records.review import decisions as review
from core.records.review.decisions import decide_all
from storage import queries
from storage.tables import AuditEvent, Run
from tests.ui_support import markdown_texts, run_app, seeded_run, table_with
from ui.common import REVIEWER_KEY, plain

PAGE = "pages/review.py"
REVIEWER = "alice"
ADDED = "Re-read the question to find which quantity it asks for."
HOSTILE = "<script>alert(1)</script> **bold**"


@pytest.fixture
def engine(app_engine):
    """The app's database with the demo task (shadows the conftest engine on purpose)."""
    return app_engine


def open_review(**state):
    at = run_app(page=PAGE, session_state={REVIEWER_KEY: REVIEWER, **state})
    assert [t.value for t in at.title] == ["Review"]
    return at


def state(engine, run_id: int) -> dict:
    """The run, its only step, its operations and its library versions, from the database."""
    with Session(engine) as session:
        run = session.get(Run, run_id)
        step = queries.steps(session, run_id)[0]
        ops = queries.step_operations(session, step.id)
        versions = queries.versions(session, run.library_id)
        session.expunge_all()
    return {"run": run, "step": step, "ops": ops, "versions": versions}


def click(at, key: str):
    at.button(key=key).click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_approve_the_only_pending_operation_applies_the_step(engine):
    run_id = seeded_run(engine, "manual")
    before = state(engine, run_id)
    assert before["run"].status == "awaiting_review"
    [op] = before["ops"]
    assert op.status == "pending"
    at = open_review()
    assert at.selectbox(key="review_run").value == run_id
    assert at.selectbox(key="review_step").value == before["step"].id
    assert table_with(at, "validation error")["status"].tolist() == ["pending"]

    click(at, f"review_approve_{op.id}")

    after = state(engine, run_id)
    [decided] = after["ops"]
    assert decided.status == "applied" and decided.reviewer == REVIEWER
    assert len(after["versions"]) == len(before["versions"]) + 1
    new = after["versions"][-1]
    assert new.source == "run" and new.run_id == run_id
    assert ADDED in [exp["text"] for exp in new.experiences]
    assert after["step"].status == "completed" and after["step"].version_after_id == new.id
    assert after["run"].status == "queued"
    assert f"Applied as version #{new.number}" in [s.value for s in at.success]
    assert table_with(at, "validation error")["status"].tolist() == ["applied"]
    assert not [b for b in at.button if b.key == f"review_approve_{op.id}"]
    assert any(f"applied by {REVIEWER} at" in c.value for c in at.code)


def test_reject_all_leaves_the_library_unchanged(engine):
    run_id = seeded_run(engine, "manual")
    before = state(engine, run_id)
    at = open_review()

    click(at, "review_reject_all")

    after = state(engine, run_id)
    assert [op.status for op in after["ops"]] == ["rejected"]
    assert after["ops"][0].reviewer == REVIEWER
    assert [v.id for v in after["versions"]] == [v.id for v in before["versions"]]
    assert after["step"].status == "completed"
    assert after["step"].version_after_id == after["step"].version_before_id
    assert after["run"].status == "queued"
    assert any(s.value.startswith("Applied as version #") for s in at.success)


def test_an_invalid_edit_shows_an_error_and_a_valid_one_is_applied(engine):
    # gate off: an edited step that a gate measured is measured again before it lands (core.records.review.decisions), a
    # worker's job; this test is about the page's edit, applied as the step's last decision
    run_id = seeded_run(engine, "manual", settings={"gate": "off"})
    [op] = state(engine, run_id)["ops"]
    at = open_review()

    click(at, f"review_edit_{op.id}")
    assert at.text_area(key=f"review_edit_text_{op.id}").value == ADDED
    at.text_area(key=f"review_edit_text_{op.id}").input("ok")
    click(at, f"review_save_edit_{op.id}")

    assert any("not valid" in e.value for e in at.error), [e.value for e in at.error]
    current = state(engine, run_id)
    assert current["ops"][0].status == "pending" and current["ops"][0].text == ADDED
    assert current["step"].status == "awaiting_review"

    edited = "Write each quantity with its unit before computing anything."
    at.text_area(key=f"review_edit_text_{op.id}").input(edited)
    click(at, f"review_save_edit_{op.id}")

    after = state(engine, run_id)
    [done] = after["ops"]
    assert done.text == edited and done.reviewer == REVIEWER
    assert done.status == "applied"  # edited, then applied as the step's last decision
    assert [exp["text"] for exp in after["versions"][-1].experiences][-1] == edited
    assert after["step"].status == "completed"
    assert not at.error
    with Session(engine) as session:
        actions = session.exec(select(AuditEvent.action).where(AuditEvent.object_type == "operation",
                                                               AuditEvent.object_id == op.id)).all()
    assert "operation.edit" in actions


def test_a_decision_made_elsewhere_first_shows_already_and_changes_nothing(engine):
    run_id = seeded_run(engine, "manual")
    [op] = state(engine, run_id)["ops"]
    at = open_review()
    review.decide_operation(engine, op.id, "rejected", "bob")
    first = state(engine, run_id)

    click(at, f"review_approve_{op.id}")

    assert any("already" in e.value and "bob" in e.value for e in at.error), [e.value for e in at.error]
    after = state(engine, run_id)
    assert after["ops"][0].status == first["ops"][0].status == "rejected"
    assert after["ops"][0].reviewer == "bob"
    assert [v.id for v in after["versions"]] == [v.id for v in first["versions"]]


def test_hostile_model_text_is_shown_only_as_code(engine):
    update = json.dumps({"operations": [{"op": "ADD", "ids": [], "text": ADDED, "rationale": HOSTILE}]})
    run_id = seeded_run(engine, "manual", update=update, summary=f"Summary {HOSTILE}")
    [op] = state(engine, run_id)["ops"]
    assert op.rationale == HOSTILE
    at = open_review()

    code = [c.value for c in at.code]
    assert HOSTILE in code
    assert f"Summary {HOSTILE}" in code
    for text in markdown_texts(at):
        assert "alert(1)" not in text and "bold" not in text, text


def test_reopen_and_apply_decisions(engine):
    """Two pending operations: deciding one leaves the step waiting; reopen takes it back."""
    update = json.dumps({"operations": [
        {"op": "ADD", "ids": [], "text": ADDED, "rationale": "one"},
        {"op": "ADD", "ids": [], "text": "Estimate the answer before computing it exactly.", "rationale": "two"}]})
    run_id = seeded_run(engine, "manual", update=update)
    first, second = state(engine, run_id)["ops"]
    at = open_review()

    click(at, f"review_approve_{first.id}")
    current = state(engine, run_id)
    assert [o.status for o in current["ops"]] == ["approved", "pending"]
    assert current["step"].status == "awaiting_review"

    click(at, f"review_reopen_{first.id}")
    assert [o.status for o in state(engine, run_id)["ops"]] == ["pending", "pending"]

    decide_all(engine, current["step"].id, "rejected", "bob")  # a race: decided, but the step not applied
    at.run()
    assert any("not applied yet" in w.value for w in at.warning)
    click(at, "review_apply")
    after = state(engine, run_id)
    assert after["step"].status == "completed"
    assert after["run"].status == "queued"
    assert [o.status for o in after["ops"]] == ["rejected", "rejected"]


def test_the_gates_figures_stand_above_the_operations_and_approving_against_a_failed_gate_needs_a_note(engine):
    from tests.test_gate import answers

    run_id = seeded_run(engine, "manual", gate=answers(right_with_experience=False),
                        settings={"validation_size": 6, "gate_k": 1})
    [op] = state(engine, run_id)["ops"]
    at = open_review()
    [failed] = [e.value for e in at.error]
    assert failed.startswith("validation, 6 queries x 1: 1.00 -> 0.00, -1.00 [") and "gate no_worse failed" in failed

    click(at, f"review_approve_{op.id}")
    assert any("needs a note" in e.value for e in at.error)
    assert state(engine, run_id)["ops"][0].status == "pending"

    at.text_input(key=f"review_note_{state(engine, run_id)['step'].id}").input(
        "the validation queries are not like production")
    click(at, f"review_approve_{op.id}")
    after = state(engine, run_id)
    assert after["ops"][0].status == "applied"
    assert after["ops"][0].comment == "the validation queries are not like production"
    assert len(after["versions"]) == 2


def test_an_operation_on_a_measured_experience_shows_its_effect(engine):
    from tests.test_attribution import HARMFUL, measured

    def scripted(engine, **replies):
        from tests.ui_support import scripted_gateway
        return scripted_gateway(engine, **replies)

    measured(engine, scripted)  # E2 (HARMFUL) hurts, measured in version #2
    delete = json.dumps({"operations": [{"op": "DELETE", "ids": ["E2"], "text": "", "rationale": "it misleads"}]})
    seeded_run(engine, "manual", update=delete, settings={"gate": "off"})
    at = open_review()
    [shown] = [c for c in at.code if c.value.startswith("E2: ")]
    assert shown.value.startswith("E2: hurts, effect -0.500 [") and "(measured in version #2)" in shown.value
    assert HARMFUL not in shown.value  # the effect line, not the text: the diff above shows the text


TWO_PENDING = json.dumps({"operations": [
    {"op": "ADD", "ids": [], "text": ADDED, "rationale": "one"},
    {"op": "ADD", "ids": [], "text": "Estimate the answer before computing it exactly.", "rationale": "two"}]})


def shortcuts(at) -> dict[str, str]:
    """Each button with a keyboard shortcut on the page, by key."""
    return {b.key: b.proto.shortcut for b in at.button if b.proto.shortcut}


def test_only_the_focused_operation_has_keys_and_next_moves_them(engine):
    run_id = seeded_run(engine, "manual", update=TWO_PENDING)
    first, second = state(engine, run_id)["ops"]
    at = open_review()
    keys = shortcuts(at)
    assert {keys[f"review_approve_{first.id}"], keys[f"review_reject_{first.id}"], keys[f"review_edit_{first.id}"],
            keys["review_next"], keys["review_previous"]} == {"a", "x", "e", "j", "k"}
    assert len(keys) == len(set(keys.values())) == 5  # a key binds one button per page
    assert sum("▶ focused" in c.value for c in at.caption) == 1

    click(at, "review_next")
    keys = shortcuts(at)
    assert f"review_approve_{second.id}" in keys and f"review_approve_{first.id}" not in keys

    at.text_input(key=f"review_reason_{second.id}").input("a guess, not a lesson")
    click(at, f"review_reject_{second.id}")
    current = state(engine, run_id)
    assert [(o.status, o.comment) for o in current["ops"]] == [("pending", None), ("rejected", "a guess, not a lesson")]
    keys = shortcuts(at)  # the focus moved on to the one still pending; no next/previous for a single one
    assert set(keys) == {f"review_approve_{first.id}", f"review_reject_{first.id}", f"review_edit_{first.id}"}
    decided = [e.label for e in at.expander if e.label.startswith("Operation 2")]
    assert decided == [f"Operation 2 · ADD · rejected by {REVIEWER}"]


def test_each_card_carries_its_evidence(engine):
    run_id = seeded_run(engine, "manual")
    [op] = state(engine, run_id)["ops"]
    assert len(op.source_advantage_ids) == 2
    at = open_review()
    evidence = [e.label for e in at.expander if e.label.startswith("Evidence:")]
    assert len(evidence) == 2
    for label in evidence:
        assert label.startswith("Evidence: group ") and " · sample " in label
        rewards = label.split("rewards ")[1].split(" · closest")[0]
        assert sorted(rewards.split(", ")) == ["0", "1"]  # every seeded group is mixed
    assert sum(" · closest (" in label for label in evidence) == 1  # the likeliest source is marked, once


def test_a_flagged_operation_is_refused_in_auto_mode_and_shown_with_its_flag_as_the_reason(engine):
    """Auto review mode refuses a flagged operation before the gate (issue 26); Review shows it and why."""
    cut = "Check which quantity the question asks for and the"
    update = json.dumps({"operations": [{"op": "ADD", "ids": [], "text": ADDED, "rationale": "one"},
                                        {"op": "ADD", "ids": [], "text": cut, "rationale": "two"}]})
    run_id = seeded_run(engine, "auto", update=update, settings={"gate": "off"})
    current = state(engine, run_id)
    assert current["run"].status == "completed"
    assert [o.status for o in current["ops"]] == ["applied", "invalid"]
    at = open_review(review_run=run_id)
    [warning] = [w.value for w in at.warning if w.value.startswith("Invalid")]
    shown = " ".join(c.value for c in at.code)
    assert "refused in auto review mode, flagged: The text looks cut off mid-sentence" in shown


def test_a_flagged_operation_waits_for_the_reviewer_in_manual_mode_with_its_flags_shown(engine):
    cut = "Check which quantity the question asks for and the"
    update = json.dumps({"operations": [{"op": "ADD", "ids": [], "text": ADDED, "rationale": "one"},
                                        {"op": "ADD", "ids": [], "text": cut, "rationale": "two"}]})
    run_id = seeded_run(engine, "manual", update=update, settings={"gate": "off"})
    current = state(engine, run_id)
    assert [o.status for o in current["ops"]] == ["pending", "pending"]
    at = open_review()
    assert table_with(at, "flags")["flags"].tolist() == ["", "cut_off"]
    [warning] = [w.value for w in at.warning if w.value.startswith("Flagged")]
    assert "cut off mid-sentence" in warning


def test_a_decision_names_its_operation_as_the_card_does(engine):
    """The toast says "Operation 1 rejected." about the card titled "Operation 1", not the database id."""
    seeded_run(engine, "manual", update=TWO_PENDING)  # takes the first ids, so ids and positions differ below
    run_id = seeded_run(engine, "manual", update=TWO_PENDING)
    first, second = state(engine, run_id)["ops"]
    assert (first.id, second.id) != (1, 2) and (first.position, second.position) == (0, 1)
    at = open_review(review_run=run_id)
    assert "▶ Operation 1** · pending" in " ".join(m.value for m in at.markdown)

    click(at, f"review_reject_{first.id}")
    assert [t.value for t in at.toast] == ["Operation 1 rejected."]
    click(at, f"review_reopen_{first.id}")
    assert [t.value for t in at.toast] == ["Operation 1 reopened."]
    click(at, f"review_edit_{second.id}")
    at.text_area(key=f"review_edit_text_{second.id}").input("Write each quantity with its unit first.")
    click(at, f"review_save_edit_{second.id}")
    assert [t.value for t in at.toast] == ["Operation 2 edited."]


def test_after_the_last_decision_of_a_step_the_page_stays_on_it_and_offers_the_next_waiting_step(engine):
    """Issue 41: the page moved to another run's step by itself, so the reviewer never read what the step came
    to; it stays, says the outcome and which step waits next, and Next waiting step opens that one."""
    older = seeded_run(engine, "manual")
    newer = seeded_run(engine, "manual")
    older_step, newer_step = state(engine, older)["step"], state(engine, newer)["step"]
    [newer_op] = state(engine, newer)["ops"]
    at = open_review()
    assert (at.selectbox(key="review_run").value, at.selectbox(key="review_step").value) == (newer, newer_step.id)
    assert not [b for b in at.button if b.key == "review_next_step"]  # something is still to decide here

    click(at, f"review_approve_{newer_op.id}")
    assert state(engine, newer)["step"].status == "completed"
    assert (at.selectbox(key="review_run").value, at.selectbox(key="review_step").value) == (newer, newer_step.id)
    assert any(s.value.startswith("Applied as version #") for s in at.success)
    assert (f"Run {newer} · epoch 1 · batch 1 has nothing left to decide. Next step waiting for review: run "
            f"{older} · epoch 1 · batch 1 (the Next waiting step button opens it).") in [s.value for s in at.success]
    [following] = [b for b in at.button if b.key == "review_next_step"]
    assert following.label == f"Next waiting step: run {older} · epoch 1 · batch 1"

    click(at, "review_next_step")
    assert (at.selectbox(key="review_run").value, at.selectbox(key="review_step").value) == (older, older_step.id)
    [older_op] = state(engine, older)["ops"]
    assert [b.key for b in at.button if b.key == f"review_approve_{older_op.id}"]

    click(at, f"review_approve_{older_op.id}")
    assert state(engine, older)["step"].status == "completed"
    assert (at.selectbox(key="review_run").value, at.selectbox(key="review_step").value) == (older, older_step.id)
    assert (f"Run {older} · epoch 1 · batch 1 has nothing left to decide. No other step of this task waits for "
            "review.") in [s.value for s in at.success]
    assert any(s.value.startswith("Applied as version #") for s in at.success)
    assert not [b for b in at.button if b.key == "review_next_step"]


def test_a_bulk_decision_names_its_step_as_the_step_picker_does(engine):
    run_id = seeded_run(engine, "manual", update=TWO_PENDING, settings={"gate": "off"})
    at = open_review()
    assert at.selectbox(key="review_step").value == state(engine, run_id)["step"].id
    click(at, "review_reject_all")
    assert [o.status for o in state(engine, run_id)["ops"]] == ["rejected", "rejected"]
    assert [t.value for t in at.toast] == [f"Every pending operation of run {run_id} · epoch 1 · batch 1 rejected."]


def test_a_partly_approved_gated_step_says_it_is_measured_before_it_lands_then_shows_both_measurements(engine):
    """While the worker measures the decided library the page says how far it is, offers no Apply, and when the
    measurement ends it shows the gate's line before review and after it, and the reject's reason."""
    from core.grpo.evaluation import create_fixed_evaluation
    from core.grpo.training import execute_run
    from core.records.runs.settings import run_settings
    from storage.db import session_scope
    from storage.tables import Step, Task, utcnow
    from tests.test_review import TWO_ADDS
    from tests.ui_support import scripted_gateway

    run_id = seeded_run(engine, "manual", update=TWO_ADDS)
    first, second = state(engine, run_id)["ops"]
    first_line = state(engine, run_id)["step"].gate["line"]
    at = open_review()
    click(at, f"review_approve_{first.id}")
    at.text_input(key=f"review_reason_{second.id}").input("too specific to one problem")
    click(at, f"review_reject_{second.id}")
    assert [t.value for t in at.toast][-1] == "Operation 2 rejected."
    after = state(engine, run_id)
    assert len(after["versions"]) == 1 and after["run"].status == "queued"
    at = open_review(**{"review_run": run_id})
    assert any("measured against the starting library before it lands" in i.value for i in at.info), \
        [i.value for i in at.info]
    total = len(after["run"].validation_ids) * run_settings(after["run"]).gate_k
    assert f"Measuring the decided library: 0 of {total} validation answers (queued: it starts when a worker takes " \
           "the run)" in [i.value for i in at.info]
    assert not [b for b in at.button if b.key == "review_apply"]
    assert not any("not applied yet" in w.value for w in at.warning)

    with session_scope(engine) as session:  # a worker part-way through the decided library's measurement
        run, step = session.get(Run, run_id), session.get(Step, after["step"].id)
        settings = run_settings(run)
        measuring = create_fixed_evaluation(
            session, session.get(Task, run.task_id), purpose="gate", split=run.progress["validation_split"],
            sample_ids=run.validation_ids, experiences=review.decided_library(session, step), k=settings.gate_k,
            model=settings.policy_model, temperature=settings.temperature, run_id=run_id, step_id=step.id,
            selection=settings.selection)
        measuring.progress = {"rollouts_done": 3, "rollouts_total": total}
        run.status, run.heartbeat_at = "running", utcnow()
    at.run()
    assert f"Measuring the decided library: 3 of {total} validation answers" in [i.value for i in at.info]
    assert [p.value for p in at.get("progress")] == [int(100 * 3 / total)]
    with session_scope(engine) as session:
        session.get(Run, run_id).status = "queued"

    _model, gateway = scripted_gateway(engine)
    execute_run(engine, run_id, gateway=gateway)  # the worker measures the approved part, then it lands
    at.run()  # the page as it stood (its fragment redraws the whole page when the measurement ends)
    assert not at.exception, [e.value for e in at.exception]
    assert any(s.value.startswith("measured again after review") for s in at.success), [s.value for s in at.success]
    assert plain(f"Before review, all proposed operations together: {first_line}") in [c.value for c in at.caption]
    assert not any(i.value.startswith("Measuring the decided library") for i in at.info)
    reasons = table_with(at, "validation error").set_index("#")["reason"]
    assert reasons[2] == "too specific to one problem"
    assert len(state(engine, run_id)["versions"]) == 2


def test_the_evidence_shows_the_code_an_output_ran_and_its_real_output(engine, jail):
    def reply(messages):
        if messages[-1]["content"].startswith("```output"):
            return "It printed 42: \\boxed{42}"
        return "Let me run it.\n```python\nprint(6 * 7)\n```\n```output\n999 invented\n```"

    seeded_run(engine, "manual", rollout=reply)
    at = open_review()
    captions = [c.value for c in at.caption]
    codes = [c.value for c in at.code]
    assert any(c.startswith("Code run 1 · exit 0 · ") for c in captions), captions
    assert "print(6 * 7)" in codes and "42" in codes
    assert not any("999 invented" in text for text in codes)


def test_a_step_whose_examples_did_not_fit_says_so_above_its_operations(engine):
    """Worked examples refused because the library was full leave a need without its example (issue 44): Review
    says how many of the step's were refused, where the reviewer reads the step."""
    from storage.db import session_scope
    from storage.tables import Step

    run_id = seeded_run(engine, "manual")
    at = open_review()
    assert not any("refused for space" in w.value for w in at.warning)
    with session_scope(engine) as session:
        step = session.get(Step, state(engine, run_id)["step"].id)
        step.stats = {**(step.stats or {}), "examples": {"full": 1}}
        session.add(step)
    at = open_review()
    assert any(w.value.startswith("1 new worked example was refused for space") for w in at.warning), \
        [w.value for w in at.warning]


def test_a_rewrite_that_changes_a_verified_fact_is_shown_held_for_a_person_with_its_reason(engine, scripted):
    """Auto review holds a MODIFY that drops a verified fact and invents one (issue 52); its card says so, with the
    reason in words."""
    from core.records.tasks.demos import POLICY_TASK
    from tests.test_fact_checks import INVENTED, run_with_modify
    from ui.common import TASK_KEY

    op, _entry, _library = run_with_modify(engine, scripted, INVENTED)
    at = open_review(**{TASK_KEY: POLICY_TASK, "review_run": op.run_id})
    assert any(w.value.startswith("Held for a person") for w in at.warning)
    shown = " ".join(c.value for c in at.code)
    assert "drops: return window: 45 days; adds: 'Trailpeak'" in shown
