"""A fresh install has no `production` label: an agent that fetches production (as the Production and OTLP pages
tell it to) gets the library's first version, #1 (empty), with a `note` saying so, instead of a 404 until someone
promotes; a trace it sends by that label lands on version #1. Once a version is promoted, production is that one
and the note is gone."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlmodel import Session, select

from api.app import create_app
from core.records.keys.api_keys import create_key
from core.records.library.versions import import_library, set_label
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.tables import Trace

URL = f"/v1/tasks/{DEMO_TASK}/libraries/default"


def test_production_before_any_promotion_is_the_first_empty_version_said_so(engine, demo_task):
    read = TestClient(create_app(engine), headers={
        "Authorization": f"Bearer {create_key(engine, 'agent', 'read', 'cli').secret}"})
    with Session(engine) as session:
        library = queries.library_by_name(session, demo_task.id, "default")
        first = next(v for v in queries.versions(session, library.id) if v.number == 1)
        assert queries.label_by_name(session, library.id, "production") is None
    fetched = read.get(URL)
    body = fetched.json()
    assert fetched.status_code == 200, body
    assert (body["version_id"], body["number"], body["label"], body["experiences"]) == (first.id, 1, None, [])
    assert "no version of library 'default' is labelled production yet" in body["note"]
    selected = read.get(f"{URL}/select", params={"query": "What is 2 + 2?"}).json()
    assert selected["number"] == 1 and "labelled production yet" in selected["note"]

    ingest = TestClient(create_app(engine), headers={
        "Authorization": f"Bearer {create_key(engine, 'sender', 'ingest', 'cli', any_task=True).secret}"})
    sent = ingest.post("/v1/traces", json={"traces": [{"id": "t-1", "task": DEMO_TASK, "label": "production",
                                                       "input": "What is 2 + 2?", "output": "4"}]})
    assert sent.status_code == 200 and sent.json()["stored"] == 1, sent.json()
    with Session(engine) as session:
        [row] = session.exec(select(Trace)).all()
    assert row.version_id == first.id

    promoted = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(promoted.number), "production", "system")
    after = read.get(URL).json()
    assert (after["number"], after["label"]) == (promoted.number, "production") and "note" not in after
    assert read.get(URL, params={"label": "staging"}).status_code == 404  # only production falls back


def test_update_from_production_on_a_task_never_promoted_starts_from_what_production_serves(engine, demo_task):
    """Issue 62: the API served #1 as production and every trace named #1, yet "Update from production" said the
    library had no label 'production' to start from. Both now read one rule (promotion.production_version)."""
    from core.grpo.training import create_run
    from core.records.runs.settings import RunSettings
    from storage.tables import LibraryVersion, Run

    run_id = create_run(engine, DEMO_TASK, RunSettings(start_label="production", review_mode="manual", epochs=1,
                                                       batch_size=2, group_size=2, limit=4), created_by="cli")
    with Session(engine) as session:
        run = session.get(Run, run_id)
        assert session.get(LibraryVersion, run.start_version_id).number == 1


def test_train_from_production_waits_for_review_as_the_manual_and_the_page_say(engine, demo_task, database_url):
    from core.cli import main
    from storage.tables import Run

    assert main(["--db", database_url, "train", "--task", DEMO_TASK, "--from-production", "--queue", "--epochs", "1",
                 "--batch-size", "2", "--group-size", "2", "--limit", "4"]) == 0
    with Session(engine) as session:
        run = session.exec(select(Run)).one()
    assert run.settings["review_mode"] == "manual" and run.settings["start_label"] == "production"
