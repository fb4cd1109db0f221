"""The Production page (AppTest): traces per day and version with the score's interval, the lowest scored
as text, the labelling rules, A/B arms compared with an interval, harvest and an update from production."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select
from streamlit.testing.v1 import AppTest

from core.records.library.versions import import_library, set_label
from core.records.production.ab_experiments import served_arm
from core.records.production.serving import set_ab_split
from core.records.production.traces import TraceIn, ingest_traces
from core.records.tasks.demos import DEMO_TASK
from storage.tables import AuditEvent, Run, Sample, Task
from tests.ui_support import APP, markdown_texts, run_app, table_with

PAGE = "pages/production.py"


@pytest.fixture
def engine(app_engine):
    return app_engine


@pytest.fixture
def versions(engine):
    production = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(production.number), "production", "system")
    candidate = import_library(engine, DEMO_TASK, "- Check the units.", "b.md", actor="system")
    set_label(engine, DEMO_TASK, str(candidate.number), "candidate", "system")
    return production, candidate


def post(engine, version_id: int, prefix: str, scores: list[float], users: list[str] | None = None) -> None:
    ingest_traces(engine, [TraceIn(id=f"{prefix}{i}", task=DEMO_TASK, version_id=version_id, segment="web",
                                   input=f"<b>{prefix} question {i}</b>", output="**42**", score=score,
                                   user_id=users[i] if users else None)
                           for i, score in enumerate(scores)])


def arm_users(library_id: int, arm: str, count: int) -> list[str]:
    """User ids a split of half the users serves `arm` (the hash serving uses)."""
    return [f"user-{i}" for i in range(500) if served_arm(library_id, 0.5, f"user-{i}") == arm][:count]


def open_page():
    at = run_app(page=PAGE)
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Production"]
    return at


def test_no_trace_says_how_to_get_some_and_the_rules_and_the_split_can_be_set_before_traffic(engine, versions):
    """Issue 62: the page hid its rules and the A/B experiment until the task had a trace, while only traces
    received after a rule is on count: a team preparing an experiment had to use the command line."""
    set_ab_split(engine, DEMO_TASK, "default", "candidate", 0.1, "cli")
    at = open_page()
    assert any("No trace yet" in info.value for info in at.info)
    headers = [header.value for header in at.subheader]
    assert "Which traces go to people, and which the judge scores" in headers
    assert any(header.startswith("A/B experiment") for header in headers)
    at.number_input(key="production_below").set_value(0.5).run()
    at.button(key="production_save_rules").click().run()
    with Session(engine) as session:
        assert session.exec(select(Task).where(Task.name == DEMO_TASK)).one().production_rules.get("below") == 0.5


def test_traces_per_day_and_version_lowest_as_text_and_the_arms_compared(engine, versions):
    production, candidate = versions
    set_ab_split(engine, DEMO_TASK, "default", "candidate", 0.5, "cli")
    post(engine, production.id, "p", [0.0, 0.2, 0.4, 0.3, 0.1, 0.2] * 5, arm_users(production.library_id,
                                                                                 "production", 30))
    post(engine, candidate.id, "c", [0.9, 1.0, 0.8, 1.0, 0.9, 0.7] * 5, arm_users(production.library_id,
                                                                                "candidate", 30))
    at = open_page()
    assert [m.value for m in at.metric][:2] == ["60", "100%"]
    daily = table_with(at, "scored share")
    assert sorted(daily["traces"].tolist()) == [30, 30]
    assert all(daily["low"] <= daily["mean score"]) and all(daily["mean score"] <= daily["high"])
    lowest = [e.label for e in at.expander]
    assert lowest[0].startswith("0.00 · p") and len(lowest) == 10  # named by the sender's id
    codes = [c.value for c in at.code]
    assert "<b>p question 0</b>" in codes and "**42**" in codes  # as text, never rendered
    words = " ".join(markdown_texts(at))
    words = words.replace("\\", "")  # plain(): Markdown's characters escaped
    assert f"candidate #{candidate.number} − production #{production.number}: +0." in words
    assert "anytime-valid" in words and "candidate is better" in words
    arms = table_with(at, "arm")
    assert arms["arm"].tolist() == ["production", "candidate"] and arms["scored traces"].tolist() == [30, 30]
    assert arms["users"].tolist() == [30, 30] and "mean per user" in arms.columns  # the unit the split randomises
    assert [m.value for m in at.metric if m.label == "Decided"] == ["yes"]
    # Promote from the verdict: the guarded dialog, its reason the verdict; the promotion's record carries it
    at.button(key="production_ab_promote").click().run()
    assert "A/B experiment" in at.text_area(key="production_ab_promote_reason").value
    at.button(key="production_ab_promote_confirm").click().run()
    with Session(engine) as session:
        move = session.exec(select(AuditEvent).where(AuditEvent.action == "label.move")
                            .order_by(AuditEvent.id.desc())).first()
    assert move.after["version_id"] == candidate.id and move.after["ab"]["verdict"]["decided"] is True


def test_rules_harvest_and_an_update_from_production(engine, versions):
    production, _ = versions
    post(engine, production.id, "p", [0.0, 0.9, 0.1])
    at = open_page()
    at.number_input(key="production_below").set_value(0.5)
    at.number_input(key="production_share").set_value(0.1)
    at.button(key="production_save_rules").click()
    at.run()
    with Session(engine) as session:
        rules = session.exec(select(Task).where(Task.name == DEMO_TASK)).one().production_rules
    assert rules == {"below": 0.5, "share": 0.1}

    at.number_input(key="production_max_score").set_value(0.5)
    at.run()
    at.button(key="production_harvest").click()
    at.run()
    shown = [t.value for t in [*at.success, *at.info]]  # beside the section, not a toast gone in seconds
    assert any("Added 2 train samples" in text for text in shown), shown
    with Session(engine) as session:
        harvested = session.exec(select(Sample).where(Sample.external_id.like("trace-%"))).all()
    assert len(harvested) == 2

    at.button(key="production_update").click()
    at.run()
    with Session(engine) as session:
        run = session.exec(select(Run)).one()
    assert run.start_version_id == production.id
    assert run.settings["start_label"] == "production" and run.settings["old_share"] == 0.3


def test_a_trace_the_rules_send_to_people_is_labelled_on_the_page(engine, versions):
    from core.records.production.traces import set_rules

    production, _ = versions
    set_rules(engine, DEMO_TASK, {"below": 0.5}, "cli")
    post(engine, production.id, "p", [0.1, 0.9])
    at = open_page()
    assert any(s.value == "Waiting for a person (1)" for s in at.subheader)
    assert "<b>p question 0</b>" in [c.value for c in at.code]
    at.button(key="production_save_label").click()
    at.run()
    assert "Choose a score from 1 to 5 first." in [e.value for e in at.error]
    [radio] = [r for r in at.radio if r.key.startswith("production_label_")]
    radio.set_value("4")
    at.button(key="production_save_label").click()
    at.run()
    with Session(engine) as session:
        from storage.tables import Trace

        labelled = session.exec(select(Trace).where(Trace.client_id == "p0")).one()
    assert (labelled.label_status, labelled.label_value) == ("done", 0.75) and labelled.labelled_by
    assert any(s.value == "Waiting for a person (0)" for s in at.subheader)


def test_traces_are_listed_filtered_and_opened_by_what_their_sender_gave(engine, versions):
    """An engineer finds their own trace: by its sender id (in the box, or from a link with ?trace=), by
    user, thumbs or a piece of the comment; the list shows what the sender gave."""
    production, _ = versions
    ingest_traces(engine, [
        TraceIn(id="req-7f3a", task=DEMO_TASK, version_id=production.id, input="Is the frame steel?",
                output="Yes.", user_id="ana", segment="web", thumbs="down", comment="It is aluminium."),
        TraceIn(id="req-9b1c", task=DEMO_TASK, version_id=production.id, input="Do you ship abroad?",
                output="No.", user_id="ben", thumbs="up", score=0.9),
        TraceIn(id="req-0000", task=DEMO_TASK, version_id=production.id, input="Hello?", output="Hi.")])
    at = open_page()
    listed = table_with(at, "sender id")
    assert set(listed["sender id"]) == {"req-7f3a", "req-9b1c", "req-0000"}
    row = listed[listed["sender id"] == "req-7f3a"].iloc[0]
    assert (row["user"], row["thumbs"], row["comment"], row["segment"]) == ("ana", "down", "It is aluminium.", "web")

    at.text_input(key="production_user").set_value("ben").run()
    assert table_with(at, "sender id")["sender id"].tolist() == ["req-9b1c"]
    at.text_input(key="production_user").set_value("").run()
    at.selectbox(key="production_thumbs").set_value("down").run()
    assert table_with(at, "sender id")["sender id"].tolist() == ["req-7f3a"]
    at.selectbox(key="production_thumbs").set_value(None).run()
    at.text_input(key="production_comment").set_value("ALUMIN").run()
    assert table_with(at, "sender id")["sender id"].tolist() == ["req-7f3a"]

    linked = AppTest.from_file(str(APP), default_timeout=60)  # a shared link: the page with ?trace=
    linked.run()
    linked.switch_page(PAGE)
    linked.query_params["trace"] = "req-9b1c"
    linked.run()
    assert not linked.exception, [e.value for e in linked.exception]
    codes = [c.value for c in linked.code]
    assert "Do you ship abroad?" in codes and "No." in codes
    assert linked.dataframe[0].value["sender id"].tolist() == ["req-9b1c"]  # the opened trace, above the list
    at.text_input(key="production_open").set_value("req-nope").run()
    assert any("no trace with that sender id" in w.value for w in at.warning)


def test_an_admin_starts_and_ends_a_split_from_the_page(engine, versions):
    """Issue 62: no split could be started or ended from the pages, only with `python -m core ab`."""
    from core.records.production.ab_experiments import open_experiment
    from storage import queries

    at = open_page()
    at.selectbox(key="production_ab_label").select("candidate").run()
    at.number_input(key="production_ab_share").set_value(0.2).run()
    at.button(key="production_ab_start").click().run()
    assert not at.exception, [e.value for e in at.exception]
    with Session(engine) as session:
        library = queries.library_by_name(session, queries.task_by_name(session, DEMO_TASK).id, "default")
        assert (library.ab_label, library.ab_share) == ("candidate", 0.2)
        assert open_experiment(session, library.id) is not None
    assert any(header.startswith("A/B experiment 1") for header in (h.value for h in at.subheader))
    at.button(key="production_ab_end").click().run()
    with Session(engine) as session:
        library = queries.library_by_name(session, queries.task_by_name(session, DEMO_TASK).id, "default")
        assert library.ab_label is None and open_experiment(session, library.id) is None
