"""The Production page (AppTest) on whose score is whose (issue 50): the card of a trace waiting for a person
shows the thumbs and comment its agent sent, and an unsure judge's suggestion; the traces' table says which
score is the judge's, the user's or a person's; the judge's rules are saved beside the labelling rules."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from core.records.library.versions import import_library, set_label
from core.records.production.traces import TraceIn, ingest_traces, set_rules
from core.records.tasks.demos import DEMO_TASK
from storage.db import session_scope
from storage.tables import Task, Trace
from tests.ui_support import run_app, table_with

PAGE = "pages/production.py"


@pytest.fixture
def engine(app_engine):
    return app_engine


@pytest.fixture
def production(engine):
    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(version.number), "production", "system")
    return version


def open_page():
    at = run_app(page=PAGE)
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_card_of_a_trace_waiting_for_a_person_shows_the_thumbs_and_comment_its_agent_sent(engine, production):
    set_rules(engine, DEMO_TASK, {"below": 0.5}, "cli")
    ingest_traces(engine, [TraceIn(id="w1", task=DEMO_TASK, version_id=production.id, input="What is 12 x 3?",
                                   output="34", thumbs="down", comment="<i>12 x 3 is 36, not 34</i>")])
    at = open_page()
    assert any(s.value == "Waiting for a person (1)" for s in at.subheader)
    captions = [c.value for c in at.caption]
    assert any(c.startswith("Trace w1 ·") and "thumbs down" in c for c in captions), captions
    assert "<i>12 x 3 is 36, not 34</i>" in [c.value for c in at.code]  # the comment, as text


def test_the_table_says_whose_score_each_is_and_an_unsure_judge_is_shown_to_the_person(engine, production):
    ingest_traces(engine, [TraceIn(id=name, task=DEMO_TASK, version_id=production.id, input=f"q {name}", output="a",
                                   **extra)
                           for name, extra in (("by-user", {"thumbs": "up"}), ("by-judge", {}), ("unsure", {}),
                                               ("by-person", {"score": 0.2}))])
    with session_scope(engine) as session:  # as the worker's pass leaves them (tests/test_production_scoring.py)
        rows = {row.client_id: row for row in session.exec(select(Trace))}
        rows["by-judge"].judge_status, rows["by-judge"].judge_score = "scored", 1.0
        rows["unsure"].judge_status, rows["unsure"].judge_score = "unsure", 0.0
        rows["unsure"].judge_detail, rows["unsure"].label_status = "judge 0/1 (judge unsure): the total is odd", "needed"
        rows["by-person"].label_value, rows["by-person"].label_status = 0.75, "done"
        session.add_all(rows.values())
    at = open_page()
    listed = table_with(at, "score by")
    by = dict(zip(listed["sender id"], listed["score by"], strict=True))
    assert by["by-user"] == "user" and by["by-judge"] == "judge" and by["by-person"] == "person"
    assert by["unsure"] not in {"user", "judge", "person"}  # unscored until a person labels it
    captions = [c.value for c in at.caption]
    assert any("judge was unsure (its suggestion 0.00)" in c for c in captions), captions
    assert "judge 0/1 (judge unsure): the total is odd" in [c.value for c in at.code]


def test_the_judges_rules_are_saved_with_the_labelling_rules_and_said_on_the_page(engine, production):
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        task.reward_method, task.judge_model = "judge", "openai/gpt-4o-mini"
        session.add(task)
    ingest_traces(engine, [TraceIn(id="t", task=DEMO_TASK, version_id=production.id, input="q", output="a")])
    at = open_page()
    at.number_input(key="production_below").set_value(0.5)
    at.number_input(key="production_judge_share").set_value(0.25)
    at.checkbox(key="production_judge_ab").check()
    at.button(key="production_save_rules").click()
    at.run()
    assert not at.exception
    with Session(engine) as session:
        rules = session.exec(select(Task).where(Task.name == DEMO_TASK)).one().production_rules
    assert (rules["below"], rules["judge_share"], rules["judge_ab"]) == (0.5, 0.25, True) and rules["judge_since"]
    assert any("The task's judge scores 25% of traces and every A/B arm's trace without feedback" in c.value
               for c in at.caption)
