"""UI tests of the Train page (Streamlit AppTest): presets, the estimate before Start, model choices, starting a
run, live counters, the status in words, pause/resume/cancel with a confirmation, and the next steps."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from sqlmodel import Session, select

from core.domain.selection import DEFAULT_K
from core.grpo.training import RunSettings, create_run
from core.records.library.selection import library_selection
from core.records.review.decisions import decide_step
from core.records.runs.defaults import EXAMPLES_FIGURE
from core.records.runs.progress import PYTHON_TURNS
from core.records.tasks.demos import DEMO_TASK
from storage import db, queries
from storage.db import session_scope
from storage.tables import LibraryVersion, Run, Step, Worker, utcnow
from tests.ui_support import run_app, seeded_run

PAGE = "pages/train.py"


@pytest.fixture
def engine(app_engine):
    """The app's database with the demo task (shadows the conftest engine on purpose)."""
    return app_engine


def shown_status(at) -> str:
    """The live status line of the chosen run in words ("**Status:** completed: 1 step, final version #2"),
    Markdown escapes undone."""
    lines = [m.value for m in at.markdown if m.value.startswith("**Status:**")]
    assert len(lines) == 1, [m.value for m in at.markdown]
    return lines[0].removeprefix("**Status:**").strip().replace("\\", "")


def confirm(at, button: str) -> None:
    """Press a control button, then Confirm in the question it asks."""
    at.button(key=button).click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.button(key="train_confirm_yes")
    at.button(key="train_confirm_yes").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]


def all_runs(engine) -> list[Run]:
    with Session(engine) as session:
        return queries.runs(session)


def metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def run_status(engine, run_id: int) -> str:
    with Session(engine) as session:
        return queries.run_by_id(session, run_id).status


def gate_table(at):
    [frame] = [df.value for df in at.dataframe if "gate" in df.value.columns]
    return frame


def test_invalid_settings_show_the_error_and_create_no_run(engine):
    at = run_app(page=PAGE)
    assert [t.value for t in at.title] == ["Train"]
    assert any("No runs of this task yet" in i.value for i in at.info)

    at.number_input(key="train_temperature").set_value(3.0)
    at.button(key="train_submit").click()
    at.run()

    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == ["temperature must be between 0 and 2"]
    assert all_runs(engine) == []


def test_valid_submit_queues_a_run_with_exactly_the_chosen_settings(engine, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")  # a configured provider is offered
    at = run_app(page=PAGE, session_state={"ctx_reviewer": "alice"})
    at.number_input(key="train_epochs").set_value(2)
    at.number_input(key="train_batch_size").set_value(3)
    at.number_input(key="train_group_size").set_value(4)
    at.number_input(key="train_limit").set_value(6)
    at.number_input(key="train_seed").set_value(7)
    at.number_input(key="train_budget").set_value(1.5)
    assert "openai/gpt-4o-mini" in at.selectbox(key="train_learner_model").options
    at.selectbox(key="train_learner_model").set_value("openai/gpt-4o-mini")
    at.checkbox(key="train_ground_truth").uncheck()
    at.radio(key="train_review_mode").set_value("manual")
    at.selectbox(key="train_gate").set_value("better")
    at.number_input(key="train_validation_size").set_value(12)
    at.number_input(key="train_gate_k").set_value(3)
    at.number_input(key="train_max_operations").set_value(6)
    at.button(key="train_submit").click()
    at.run()

    assert not at.exception, [e.value for e in at.exception]
    assert not at.error
    runs = all_runs(engine)
    assert len(runs) == 1
    run = runs[0]
    assert run.status == "queued"
    assert run.created_by == "alice"
    s = run.settings
    assert (s["epochs"], s["batch_size"], s["group_size"], s["limit"], s["seed"]) == (2, 3, 4, 6, 7)
    assert s["review_mode"] == "manual"
    assert (s["gate"], s["validation_size"], s["gate_k"], s["max_operations"]) == ("better", 12, 3, 6)
    assert s["ground_truth"] is False
    assert s["budget_usd"] == 1.5
    assert s["learner_model"] == "openai/gpt-4o-mini"
    with Session(engine) as session:
        assert s["policy_model"] == queries.task_by_name(session, DEMO_TASK).policy_model
    # The new run is the one selected, and its settings are the defaults elsewhere.
    assert at.selectbox(key="train_run").value == run.id
    assert s["temperature"] == RunSettings().temperature
    assert s["max_tokens"] == RunSettings().max_tokens


def test_zero_limit_and_budget_mean_none(engine):
    at = run_app(page=PAGE)
    at.button(key="train_submit").click()
    at.run()

    (run,) = all_runs(engine)
    assert run.settings["limit"] is None
    assert run.settings["budget_usd"] is None
    assert run.settings["review_mode"] == "auto"
    assert (run.settings["gate"], run.settings["validation_size"], run.settings["max_operations"]) == (
        "no_worse", None, None)  # empty boxes: the automatic defaults


def test_seeded_run_counters_appear_in_the_metrics_and_the_chart(engine):
    run_id = seeded_run(engine, review_mode="manual")
    at = run_app(page=PAGE)

    assert at.selectbox(key="train_run").value == run_id
    shown = metrics(at)
    assert shown["Rollouts"] == "4 / 4"
    assert shown["Steps"] == "0 / 1"  # the step waits for review
    assert shown["Rewards"] == "4"
    assert shown["Summaries"] == "4"
    assert shown["Advantages"] == "2"
    assert shown["Operations"] == "1"
    assert {"Tokens", "Cost", "Elapsed", "Time left"} <= set(shown)
    assert shown_status(at) == "step 1 waits for review (1 operation pending)"
    assert any(c.value == "Stored status: awaiting_review" for c in at.caption)
    assert any("waits for a reviewer" in i.value for i in at.info)

    charts = at.get("plotly_chart")
    assert len(charts) == 1
    spec = json.loads(charts[0].proto.spec)
    reward_trace, size_trace, validation_trace = spec["data"]
    assert reward_trace["x"] == [1] and reward_trace["y"] == [0.5]  # mixed groups: half right
    assert size_trace["y"] == [0]  # only the empty start version: the ADD awaits review
    assert validation_trace["x"] == [1]  # the gate measured the start version; the candidate awaits review
    assert any("Validation gate: no_worse on 20 train queries x 2" in c.value for c in at.caption)
    gates = gate_table(at)
    assert list(gates["step"]) == [1] and gates["gate"][0].startswith("validation, 20 queries x 2: ")


def test_a_run_whose_gate_failed_says_so_and_its_validation_line_stays_flat(engine):
    from tests.test_gate import answers

    seeded_run(engine, review_mode="auto", epochs=2, gate=answers(right_with_experience=False),
               settings={"validation_size": 6, "gate_k": 1})
    at = run_app(page=PAGE)
    assert not at.exception, [e.value for e in at.exception]
    gates = gate_table(at)
    assert list(gates["decision"]) == ["failed", "failed"]
    assert all("1.00 -> 0.00" in line and "gate no_worse failed" in line for line in gates["gate"])
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert spec["data"][1]["y"] == [0] and spec["data"][2]["x"] == [1] and spec["data"][2]["y"] == [1.0]


def test_completed_auto_run_shows_the_library_growing(engine):
    seeded_run(engine, review_mode="auto")
    at = run_app(page=PAGE)

    shown = metrics(at)
    assert shown["Steps"] == "1 / 1"
    assert shown["Time left"] == "0s"
    assert shown_status(at) == "completed: 1 step, final version #2"
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert spec["data"][1]["y"] == [0, 1]
    assert not [b for b in at.button if b.key in ("train_pause", "train_resume", "train_cancel")]


def test_pause_resume_cancel_each_ask_first_then_change_the_run_status(engine):
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, limit=2), created_by="test")
    at = run_app(page=PAGE)
    keys = {b.key for b in at.button}
    assert {"train_pause", "train_cancel"} <= keys and "train_resume" not in keys  # one toggle, and Cancel

    at.button(key="train_pause").click()
    at.run()
    assert [w.value for w in at.warning if w.value != learner_notice(at)] == [
        f"Pause run {run_id}? The call in flight finishes; resume continues where it stopped."]
    assert run_status(engine, run_id) == "queued"  # asking changed nothing
    at.button(key="train_confirm_no").click()  # Keep running
    at.run()
    assert run_status(engine, run_id) == "queued"
    assert [w.value for w in at.warning] == [learner_notice(at)] and "train_pause" in {b.key for b in at.button}

    confirm(at, "train_pause")
    assert run_status(engine, run_id) == "paused"
    keys = {b.key for b in at.button}
    assert "train_resume" in keys and "train_pause" not in keys

    confirm(at, "train_resume")
    assert run_status(engine, run_id) == "queued"

    confirm(at, "train_cancel")
    assert run_status(engine, run_id) == "cancelled"
    assert not [b for b in at.button if b.key in ("train_pause", "train_resume", "train_cancel")]
    assert shown_status(at) == "cancelled before it started"


def test_running_run_with_an_old_heartbeat_shows_stalled(engine):
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, limit=2), created_by="test")
    with db.session_scope(engine) as session:
        run = session.get(Run, run_id)
        run.status, run.started_at, run.heartbeat_at = "running", utcnow() - timedelta(minutes=10), \
            utcnow() - timedelta(minutes=5)
        session.add(run)
    at = run_app(page=PAGE)

    assert shown_status(at) == "stalled at its first step: its worker stopped beating"
    assert any("stopped beating" in w.value for w in at.warning)
    assert "train_pause" not in {b.key for b in at.button}  # the toggle of a stalled run is Resume

    confirm(at, "train_resume")
    assert run_status(engine, run_id) == "queued"


def learner_notice(at) -> str | None:
    """The warning the form shows when the learner is the embedded model (the demo task's is)."""
    return next((w.value for w in at.warning if w.value.startswith("The learner is the embedded model")), None)


def estimate_line(at) -> str:
    [line] = [m.value for m in at.markdown if m.value.startswith("**Estimate:**")]
    return line.replace("\\", "")


def form_values(at) -> tuple:
    return tuple(at.number_input(key=key).value for key in
                 ("train_limit", "train_batch_size", "train_group_size", "train_epochs"))


def preset_caption(at) -> str:
    return next(c.value for c in at.caption if c.value.startswith("The settings below"))


def test_the_quick_trial_preset_fills_the_form_and_a_change_by_hand_makes_it_custom(engine):
    at = run_app(page=PAGE)
    assert preset_caption(at) == "The settings below are the defaults of a full run."
    assert form_values(at) == (0, 8, 5, 3)

    at.button(key="train_preset_quick").click()
    at.run()
    assert form_values(at) == (4, 4, 4, 1)
    assert at.radio(key="train_review_mode").value == "manual"
    assert at.selectbox(key="train_gate").value == "off"
    assert preset_caption(at) == "The settings below are the quick trial."
    with Session(engine) as session:  # the demo answers in python mode where the code jail works (PYTHON_TURNS calls)
        per_answer = PYTHON_TURNS if queries.task_by_name(session, DEMO_TASK).agent_mode == "python" else 1
    # 16 answers; with all-failed groups learning from the reference every group may give a worked example (the
    # estimate's upper bound until the run shows its own share): 4 compressions; the embedded learner's default
    # is lessons off, so no summary, advantage or update
    calls = round(16 * per_answer + 4)
    assert estimate_line(at).startswith(f"**Estimate:** about {calls} calls")

    at.number_input(key="train_group_size").set_value(2)
    at.run()
    assert preset_caption(at) == "The settings below were changed by hand (custom)."
    assert form_values(at) == (4, 4, 2, 1)

    at.button(key="train_preset_full").click()
    at.run()
    assert form_values(at) == (0, 8, 5, 3)
    assert at.radio(key="train_review_mode").value == "auto"


def test_a_later_change_never_brings_back_a_preset_over_what_was_typed(engine):
    """The race a busy machine showed: the preset used to be a choice that a callback rewrote, and the
    browser's stale copy of it re-applied the defaults over every typed setting. With buttons, a change
    after a change keeps both."""
    at = run_app(page=PAGE)
    at.number_input(key="train_epochs").set_value(1)
    at.run()
    at.number_input(key="train_group_size").set_value(2)
    at.checkbox(key="train_ground_truth").set_value(False)
    at.run()
    assert form_values(at)[2:] == (2, 1)
    assert at.checkbox(key="train_ground_truth").value is False


def test_a_quick_trial_asked_for_by_another_page_is_selected_and_queued_as_shown(engine):
    at = run_app(page=PAGE, session_state={"train_preset_request": "quick"})
    assert preset_caption(at) == "The settings below are the quick trial."
    assert "embedded model" in estimate_line(at) or "measured calls" in estimate_line(at)
    at.button(key="train_submit").click()
    at.run()

    (run,) = all_runs(engine)
    s = run.settings
    assert (s["limit"], s["batch_size"], s["group_size"], s["epochs"], s["review_mode"], s["gate"]) == (
        4, 4, 4, 1, "manual", "off")


def test_a_model_that_cannot_be_called_is_refused_before_anything_is_queued(engine, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("STUDIO_API_BASE", raising=False)
    at = run_app(page=PAGE)
    assert "local/qwen2.5-coder-0.5b" in at.selectbox(key="train_policy_model").options
    assert not [o for o in at.selectbox(key="train_policy_model").options if o.startswith("openai/")]

    for typed, error in (("local/no-such-model", "model 'local/no-such-model' is not an embedded model; the embedded "
                                                 "ones are local/qwen2.5-coder-0.5b, local/smollm2-135m"),
                         ("openai/gpt-4o-mini", "model 'openai/gpt-4o-mini' needs OPENAI\\_API\\_KEY in the "
                                                "environment of the app and the worker, and it is not set")):
        at = run_app(page=PAGE, session_state={"train_policy_model": typed})  # a name typed as a new option
        assert at.selectbox(key="train_policy_model").value == typed
        at.button(key="train_submit").click()
        at.run()
        assert [e.value for e in at.error] == [error]
        assert all_runs(engine) == []


def queue_lines(at) -> list[str]:
    """The run's info lines (its place in line), not the new run's notice of the defaults chosen."""
    return [i.value for i in at.info if not i.value.startswith("Defaults chosen")]


def test_a_queued_run_says_its_place_in_line_and_when_it_starts(engine):
    first = create_run(engine, DEMO_TASK, RunSettings(epochs=1, limit=2), created_by="test")
    second = create_run(engine, DEMO_TASK, RunSettings(epochs=1, limit=3), created_by="test")
    at = run_app(page=PAGE, session_state={"train_run": second})
    assert queue_lines(at) == ["queued: 2nd in line; no worker is running to take it"]

    with db.session_scope(engine) as session:
        session.add(Worker(id="test-worker", status="running", heartbeat_at=utcnow()))
    at.selectbox(key="train_run").set_value(first)
    at.run()
    assert queue_lines(at) == ["queued: 1st in line, starts in a moment"]
    at.selectbox(key="train_run").set_value(second)
    at.run()
    [line] = queue_lines(at)
    assert re.fullmatch(r"queued: 2nd in line, starts in about (\d+ min|\d+ h( \d+ min)?)", line), line
    assert shown_status(at) == "queued, not started yet"


def test_a_step_applied_after_review_and_queued_again_says_so(engine):
    run_id = seeded_run(engine, review_mode="manual")
    with Session(engine) as session:
        (step,) = queries.steps(session, run_id)
    decide_step(engine, step.id, "approved", "cli", comment="approved in a test")
    assert run_status(engine, run_id) == "queued"
    at = run_app(page=PAGE)

    assert shown_status(at) == "step 1 applied after review (version #2); queued to go on"
    assert metrics(at)["Time left"] != "–"


def test_a_completed_run_offers_its_version_to_evaluate_and_the_library(engine):
    run_id = seeded_run(engine, review_mode="auto", settings={"policy_model": "local/smollm2-135m"})
    with Session(engine) as session:
        version_id = queries.run_by_id(session, run_id).current_version_id
    at = run_app(page=PAGE)
    assert any(link.proto.page.endswith("library.py") or "library" in link.proto.page for link in at.get("page_link")
               if link.proto.label == "Open in Library")

    at.button(key="train_evaluate").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Evaluate"]
    [version] = [box for box in at.selectbox if box.label == "Version"]
    with Session(engine) as session:
        number = session.get(LibraryVersion, version_id).number
    assert version_id != number and version.value == str(number)  # the run's version, by its number
    [model] = [box for box in at.selectbox if box.label == "Model"]
    assert model.value == "local/smollm2-135m"  # the model the run learned with, not the task's


def test_a_run_whose_every_group_was_skipped_says_it_learned_nothing_instead_of_next_measure(engine, capsys):
    """Every answer wrong in every group: each group is skipped, the library never changes, and the page (and
    the CLI's report) say so instead of "completed. Next: measure its version"."""
    from core.cli.report import report_run

    run_id = seeded_run(engine, review_mode="auto", settings={"gate": "off"},
                        rollout="I add the numbers. \\boxed{-12345}")
    at = run_app(page=PAGE)
    assert not at.exception, [e.value for e in at.exception]
    assert shown_status(at).startswith("completed")
    warnings = [w.value for w in at.warning]
    assert any(f"Run {run_id} is completed, and learned nothing" in w and "every group of this run was skipped "
               "(2 of 2)" in w for w in warnings), warnings
    assert not any("Next: measure" in s.value for s in at.success)
    assert "train_evaluate" not in {b.key for b in at.button}
    report_run(engine, run_id)
    assert "note: every group of this run was skipped (2 of 2)" in capsys.readouterr().out


def test_a_run_that_learned_says_next_measure(engine):
    seeded_run(engine, review_mode="auto", settings={"gate": "off"})
    at = run_app(page=PAGE)
    assert any("Next: measure" in s.value for s in at.success)
    assert not any("learned nothing" in w.value for w in at.warning)
    assert not any("refused for space" in w.value for w in at.warning)


def test_a_run_whose_examples_did_not_fit_says_so_on_the_page_and_in_the_report(engine, capsys):
    """Worked examples refused because the library was full leave a need without its example (issue 44): the
    run's summary says how many, on the Train page and in `report`."""
    from core.cli.report import report_run

    run_id = seeded_run(engine, review_mode="auto", settings={"gate": "off"})
    with session_scope(engine) as session:
        step = session.exec(select(Step).where(Step.run_id == run_id)).first()
        step.stats = {**(step.stats or {}), "examples": {**((step.stats or {}).get("examples") or {}), "full": 2}}
        session.add(step)
    at = run_app(page=PAGE)
    assert any("Next: measure" in s.value for s in at.success)
    assert any(w.value.startswith("2 new worked examples were refused for space") for w in at.warning), \
        [w.value for w in at.warning]
    report_run(engine, run_id)
    assert "note: 2 new worked examples were refused for space" in capsys.readouterr().out


@pytest.fixture
def no_provider_keys(monkeypatch):
    from core.models.model_choice import PROVIDERS

    for variable, _models in PROVIDERS.values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("STUDIO_API_BASE", raising=False)


def test_an_embedded_learner_is_said_to_rarely_write_a_usable_lesson_with_the_figures(engine, no_provider_keys):
    at = run_app(page=PAGE)
    notice = learner_notice(at).replace("\\", "")
    assert notice.startswith("The learner is the embedded model local/qwen2.5-coder-0.5b: it rarely writes a usable "
                             "lesson.")
    assert "11 of its 14 operations were invalid" in notice and "cut off mid-sentence" in notice
    assert "+0.017 [-0.050, +0.083]" in notice and "60 held-out GSM8K problems" in notice
    assert "set a provider's API key (OPENAI_API_KEY," in notice  # no key: nothing to offer yet
    assert "train_use_hosted_learner" not in {b.key for b in at.button}


def test_a_hosted_learner_is_offered_with_its_cost_and_then_the_notice_goes(engine, no_provider_keys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    at = run_app(page=PAGE)
    notice = learner_notice(at).replace("\\", "")
    assert "A hosted learner can be used here: openai/gpt-4o-mini (its API key is set), about $" in notice
    assert "cost" not in estimate_line(at)  # the embedded models cost nothing

    at.button(key="train_use_hosted_learner").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="train_learner_model").value == "openai/gpt-4o-mini"
    assert learner_notice(at) is None
    assert "API cost" in estimate_line(at) and "learner openai/gpt-4o-mini $" in estimate_line(at)


# --- the defaults chosen for the learner (issue 36) ----------------------------------------------------------------

SWITCHES = ("train_examples", "train_lessons", "train_reference_when_all_fail")


def switches(at) -> tuple[bool, ...]:
    return tuple(at.checkbox(key=key).value for key in SWITCHES)


def defaults_notice(at) -> str:
    [notice] = [i.value for i in at.info if i.value.startswith("Defaults chosen")]
    return notice.replace("\\", "")


def test_the_form_starts_from_the_defaults_chosen_for_the_embedded_learner_and_says_why(engine, no_provider_keys):
    at = run_app(page=PAGE, session_state={"ctx_reviewer": "alice"})
    assert switches(at) == (True, False, True)  # worked examples, no lessons, learning from the reference
    notice = defaults_notice(at)
    assert notice.startswith("Defaults chosen for the learner local/qwen2.5-coder-0.5b:")
    assert "- worked examples: on. On: worked examples made from the reference" in notice
    assert EXAMPLES_FIGURE in notice and "- lessons: off. Off:" in notice
    assert "-0.125 [-0.375, +0.083]" in notice
    assert f"- entries per query: the {DEFAULT_K} entries most similar to the query" in notice
    at.button(key="train_submit").click()
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]

    (run,) = all_runs(engine)
    s = run.settings
    assert (s["examples"], s["lessons"], s["reference_when_all_fail"]) == (True, False, True)
    assert s["selection"] == {"mode": "top_k", "k": DEFAULT_K}
    assert library_selection(engine, DEMO_TASK).as_dict() == {"mode": "top_k", "k": DEFAULT_K}


def test_the_switches_follow_the_learner_unless_changed_by_hand(engine, no_provider_keys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    at = run_app(page=PAGE)
    at.checkbox(key="train_lessons").check()  # by hand: lessons on beside the examples
    at.run()
    assert "Changed here: lessons on (default off)." in [c.value for c in at.caption]

    at.selectbox(key="train_learner_model").set_value("openai/gpt-4o-mini")
    at.run()
    assert switches(at) == (False, True, False)  # the paper's defaults; lessons stayed as set
    notice = defaults_notice(at)
    assert notice.startswith("Defaults chosen for the learner openai/gpt-4o-mini:")
    assert "- lessons: on. On, as in the paper" in notice and "entries per query" not in notice
    assert not [c.value for c in at.caption if c.value.startswith("Changed here")]

    at.checkbox(key="train_examples").check()  # by hand now, and back to the embedded learner
    at.selectbox(key="train_learner_model").set_value("local/qwen2.5-coder-0.5b")
    at.run()
    assert switches(at) == (True, False, True)  # examples kept, the other two follow the embedded learner again
    at.checkbox(key="train_examples").uncheck()
    at.run()
    assert "Changed here: worked examples off (default on)." in [c.value for c in at.caption]
    at.button(key="train_use_chosen").click()
    at.run()
    assert switches(at) == (True, False, True)


def test_the_quick_trial_learns_from_the_reference_whatever_the_learner(engine, no_provider_keys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    at = run_app(page=PAGE, session_state={"train_preset_request": "quick"})
    assert switches(at) == (True, False, True)
    at.selectbox(key="train_learner_model").set_value("openai/gpt-4o-mini")
    at.run()
    assert switches(at) == (False, True, True)  # the quick trial's own switch stays; the others follow
    assert "learning from the reference" not in defaults_notice(at)  # the preset's, not a default
