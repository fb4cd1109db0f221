"""The Audit page (AppTest) and its queries: events made by core functions, filtered by person, action group,
object, date and text; passwords never appear."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlmodel import Session, col, select

from core.grpo.training import RunSettings, create_run
from core.jobs.run_control import pause_run
from core.records.library.versions import set_label
from core.records.people.users import add_user, update_user
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.lookup import get_task
from storage import queries
from storage.db import session_scope
from storage.tables import AuditEvent, User
from tests.ui_support import markdown_texts, run_app
from ui.common import AUTH_KEY, REVIEWER_KEY

PAGE = "pages/audit.py"
PASSWORD = "first-secret-91"
NEW_PASSWORD = "second-secret-92"


@pytest.fixture
def engine(app_engine):
    """The app's database with the demo task (shadows the conftest engine on purpose)."""
    return app_engine


@pytest.fixture
def events(engine) -> dict:
    """A run created and paused by bob, the production label moved by carol, then the admin ana added by the
    command line and given a new password (which turns sign-in on, so the page is opened as ana)."""
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2),
                        created_by="bob")
    pause_run(engine, run_id, "bob")
    with session_scope(engine) as session:
        library = queries.library_by_name(session, get_task(session, DEMO_TASK).id, "default")
        version = queries.latest_version(session, library.id)
    label_id = set_label(engine, DEMO_TASK, str(version.number), "production", "carol").id
    add_user(engine, "ana", "admin", PASSWORD, actor="cli")
    update_user(engine, "ana", "cli", password=NEW_PASSWORD)
    return {"run_id": run_id, "label_id": label_id, "number": version.number, "version_id": version.id}


def all_events(engine) -> list[AuditEvent]:
    with Session(engine) as session:
        rows = list(session.exec(select(AuditEvent).order_by(col(AuditEvent.id).desc())))
        session.expunge_all()
    return rows


def open_audit():
    at = run_app(page=PAGE, session_state={REVIEWER_KEY: "ana", AUTH_KEY: "ana"})
    assert [t.value for t in at.title] == ["Audit log"]
    return at


def table(at):
    [frame] = [df.value for df in at.dataframe]
    return frame


def count_caption(at) -> str:
    [caption] = [c.value for c in at.caption if c.value.split(" ")[1:2] in (["event"], ["events"])]
    return caption


def change(at, widget):
    widget.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_every_event_is_listed_newest_first_with_a_count(engine, events):
    at = open_audit()  # first, since opening the app writes events too (the demo tasks)
    stored = all_events(engine)
    shown = table(at)
    assert shown["id"].tolist() == [event.id for event in stored]
    assert list(shown.columns) == ["id", "when", "actor", "action", "object", "before", "after"]
    assert count_caption(at) == f"{len(stored)} events"
    paused = shown[shown["action"] == "run.paused"].iloc[0]
    assert paused["actor"] == "bob" and paused["object"] == f"run {events['run_id']}"
    assert json.loads(paused["before"]) == {"status": "queued"} and json.loads(paused["after"]) == {"status": "paused"}


def test_filter_by_person(engine, events):
    at = open_audit()
    change(at, at.multiselect(key="audit_actor").set_value(["bob"]))
    shown = table(at)
    assert shown["action"].tolist() == ["run.paused", "run.create"]
    assert set(shown["actor"]) == {"bob"}
    assert count_caption(at) == "2 events"
    change(at, at.multiselect(key="audit_actor").set_value(["bob", "carol"]))
    assert table(at)["action"].tolist() == ["label.move", "run.paused", "run.create"]


def test_filter_by_action_group_narrows_the_actions_offered(engine, events):
    at = open_audit()
    change(at, at.multiselect(key="audit_group").set_value(["user"]))
    assert set(table(at)["action"]) == {"user.add", "user.update"}
    assert at.multiselect(key="audit_action").options == ["user.add", "user.update"]
    change(at, at.multiselect(key="audit_action").set_value(["user.update"]))
    assert table(at)["action"].tolist() == ["user.update"]
    change(at, at.multiselect(key="audit_group").set_value(["run"]))
    assert at.multiselect(key="audit_action").value == []
    assert set(table(at)["action"]) == {"run.create", "run.paused"}


def test_filter_by_object_type_and_id(engine, events):
    at = open_audit()
    change(at, at.multiselect(key="audit_type").set_value(["run"]))
    change(at, at.number_input(key="audit_object_id").set_value(events["run_id"]))
    shown = table(at)
    assert set(shown["object"]) == {f"run {events['run_id']}"}
    assert shown["action"].tolist() == ["run.paused", "run.create"]
    change(at, at.number_input(key="audit_object_id").set_value(events["run_id"] + 100))
    assert not at.dataframe
    assert "No event matches these filters." in [i.value for i in at.info]


def test_text_filter_searches_before_and_after_json(engine, events):
    at = open_audit()
    change(at, at.text_input(key="audit_contains").input("PRODUCTION"))
    shown = table(at)
    assert shown["action"].tolist() == ["label.move"]
    assert shown["object"].tolist() == ["label 'production' of 'default'"]  # by its name, not its row id
    assert json.loads(shown["after"].iloc[0])["number"] == events["number"]  # the version as people name it
    assert count_caption(at) == "1 event"
    change(at, at.text_input(key="audit_contains").input('"status": "queued"'))
    assert table(at)["action"].tolist() == ["run.paused"]


def test_date_range(engine, events):
    day = all_events(engine)[0].created_at.date()
    at = open_audit()
    change(at, at.date_input(key="audit_dates").set_value((day - timedelta(days=30), day - timedelta(days=1))))
    assert not at.dataframe
    change(at, at.date_input(key="audit_dates").set_value((day - timedelta(days=1), day)))
    assert len(table(at)) == len(all_events(engine))


def test_one_event_before_and_after_side_by_side(engine, events):
    [paused] = [e for e in all_events(engine) if e.action == "run.paused"]
    at = open_audit()
    change(at, at.selectbox(key="audit_event").set_value(paused.id))
    codes = [c.value for c in at.code]
    assert json.dumps({"status": "queued"}, indent=2) in codes
    assert json.dumps({"status": "paused"}, indent=2) in codes


def test_passwords_never_appear(engine, events):
    with Session(engine) as session:
        stored_hash = session.exec(select(User.password_hash).where(User.name == "ana")).one()
    at = open_audit()
    for action in ("user.add", "user.update"):
        [event] = [e for e in all_events(engine) if e.action == action]
        change(at, at.selectbox(key="audit_event").set_value(event.id))
        page_text = "\n".join([table(at).to_csv(), *[c.value for c in at.code], *markdown_texts(at)])
        assert action in page_text
        for secret in ("password_hash", PASSWORD, NEW_PASSWORD, stored_hash, "scrypt$"):
            assert secret not in page_text
    for event in all_events(engine):
        stored = json.dumps([event.before, event.after])
        assert PASSWORD not in stored and NEW_PASSWORD not in stored and "scrypt$" not in stored


def test_audit_events_query(engine, events):
    with Session(engine) as session:
        assert [e.action for e in queries.audit_events(session, action_prefix="run")] == ["run.paused", "run.create"]
        assert [e.action for e in queries.audit_events(session, action_prefix="run.create")] == ["run.create"]
        assert queries.audit_events(session, action_prefix="ru") == []
        assert [e.actor for e in queries.audit_events(session, actor=["carol", "cli"])] == ["cli", "cli", "carol"]
        assert len(queries.audit_events(session, limit=2)) == 2
        newest = queries.audit_events(session, limit=1)[0]
        later = newest.created_at + timedelta(seconds=1)
        assert queries.audit_events(session, since=later) == []
        assert len(queries.audit_events(session, until=later)) == len(all_events(engine))
        facets = queries.audit_facets(session)
    assert {"bob", "carol", "cli", "system"} <= set(facets["actors"])
    assert {"run.create", "run.paused", "label.move", "user.add", "user.update"} <= set(facets["actions"])
    assert facets["object_types"] == sorted(set(facets["object_types"]))
    assert {"run", "librarylabel", "user"} <= set(facets["object_types"])


def test_csv_download_holds_what_is_shown_with_formulas_kept_as_text(engine, monkeypatch):
    import streamlit

    downloads = []
    original = streamlit.download_button

    def recording(label, data, *args, **kwargs):
        downloads.append(data)
        return original(label, data, *args, **kwargs)

    monkeypatch.setattr(streamlit, "download_button", recording)
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2),
                        created_by="=1+2")
    at = run_app(page=PAGE)
    change(at, at.multiselect(key="audit_group").set_value(["run"]))
    assert table(at)["actor"].tolist() == ["'=1+2"]  # the table's own CSV download and copy take it as shown
    lines = downloads[-1].splitlines()
    assert lines[0] == "id,when,actor,action,object,before,after"
    assert len(lines) == 2 and f",'=1+2,run.create,run {run_id}," in lines[1]


def test_an_empty_log_says_so(engine):
    at = run_app(page=PAGE)  # the first run creates the demo tasks, which writes events
    with session_scope(engine) as session:
        for event in session.exec(select(AuditEvent)):
            session.delete(event)
    at.run()
    assert "Nothing has been recorded yet." in [i.value for i in at.info]
    assert not at.dataframe


def test_a_version_is_named_by_its_number_in_its_library(engine, events):
    """A version's event names it as every page does, "version #N of 'library'", never by its database id."""
    with session_scope(engine) as session:
        session.add(AuditEvent(actor="cli", action="version.import", object_type="libraryversion",
                               object_id=events["version_id"], after={"number": events["number"]}))
    at = open_audit()
    change(at, at.multiselect(key="audit_type").set_value(["libraryversion"]))
    assert f"version #{events['number']} of 'default'" in table(at)["object"].tolist()
    shown = at.selectbox(key="audit_event")
    assert shown.format_func(shown.value).startswith("event ") and "#" not in shown.format_func(shown.value)[:8]
