"""UI tests of the Train page (Streamlit AppTest): starting a run, live counters, pause/resume/cancel."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlmodel import Session

from core.tasks import DEMO_TASK
from core.training import RunSettings, create_run
from storage import db, queries
from storage.models import Run, utcnow
from tests.ui_support import run_app, seeded_run

PAGE = "pages/train.py"


@pytest.fixture
def engine(app_engine):
    """The app's database with the demo task (shadows the conftest engine on purpose)."""
    return app_engine


def shown_status(at) -> str:
    """The live status line of the chosen run ("**Status:** running")."""
    lines = [m.value for m in at.markdown if m.value.startswith("**Status:**")]
    assert len(lines) == 1, [m.value for m in at.markdown]
    return lines[0].removeprefix("**Status:**").strip()


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


def test_valid_submit_queues_a_run_with_exactly_the_chosen_settings(engine):
    at = run_app(page=PAGE, session_state={"ctx_reviewer": "alice"})
    at.number_input(key="train_epochs").set_value(2)
    at.number_input(key="train_batch_size").set_value(3)
    at.number_input(key="train_group_size").set_value(4)
    at.number_input(key="train_limit").set_value(6)
    at.number_input(key="train_seed").set_value(7)
    at.number_input(key="train_budget").set_value(1.5)
    at.text_input(key="train_learner_model").input("openai/gpt-4o-mini")
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
    assert any("awaiting_review" in m.value for m in at.markdown)
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
    assert shown_status(at) == "completed"
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert spec["data"][1]["y"] == [0, 1]
    assert not [b for b in at.button if b.key in ("train_pause", "train_resume", "train_cancel")]


def test_pause_resume_cancel_change_the_run_status(engine):
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, limit=2), created_by="test")
    at = run_app(page=PAGE)
    assert {b.key for b in at.button} >= {"train_pause", "train_cancel"}
    assert "train_resume" not in {b.key for b in at.button}

    at.button(key="train_pause").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert run_status(engine, run_id) == "paused"
    assert "train_pause" not in {b.key for b in at.button}

    at.button(key="train_resume").click()
    at.run()
    assert run_status(engine, run_id) == "queued"

    at.button(key="train_cancel").click()
    at.run()
    assert run_status(engine, run_id) == "cancelled"
    assert not [b for b in at.button if b.key in ("train_pause", "train_resume", "train_cancel")]
    assert shown_status(at) == "cancelled"


def test_running_run_with_an_old_heartbeat_shows_stalled(engine):
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, limit=2), created_by="test")
    with db.session_scope(engine) as session:
        run = session.get(Run, run_id)
        run.status, run.started_at, run.heartbeat_at = "running", utcnow() - timedelta(minutes=10), \
            utcnow() - timedelta(minutes=5)
        session.add(run)
    at = run_app(page=PAGE)

    assert shown_status(at) == "stalled"
    assert any("stalled" in m.value for m in at.markdown)
    assert any("stopped beating" in w.value for w in at.warning)

    at.button(key="train_resume").click()
    at.run()
    assert run_status(engine, run_id) == "queued"
