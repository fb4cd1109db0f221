"""Model connections in a real browser: a connection made on the Models page (a stub OpenAI-compatible
server) is picked as `<connection>/<model>` for a run's policy and learner on the Train page; the worker's
calls reach the stub through it, and every ledger row names the connection. No OPENAI_API_BASE needed."""

from __future__ import annotations

import time

import pytest
from sqlmodel import Session, select

from bench.stub_server import StubServer
from storage.db import make_engine
from storage.tables import LLMCall, Run
from tests.browser_support import browser_page, require_chromium, screenshot, studio, wait_for_app

pytestmark = pytest.mark.browser


def pick_model(page, label: str, model: str) -> None:
    """Type a model into a selectbox that accepts new options (the Train page's model fields)."""
    box = page.get_by_label(label, exact=True)
    box.click()
    box.fill(model)
    box.press("Enter")
    wait_for_app(page)


def first_run(database_url: str) -> tuple[Run | None, list[LLMCall]]:
    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            return session.get(Run, 1), list(session.exec(select(LLMCall).where(LLMCall.run_id == 1)))
    finally:
        engine.dispose()


def test_a_run_set_up_in_the_browser_calls_the_model_through_a_connection_made_there(tmp_path):
    require_chromium()
    with StubServer() as stub, studio(tmp_path) as app, browser_page() as page:
        page.goto(f"{app.url}/models")
        wait_for_app(page)
        page.get_by_label("Name (models are then NAME/<model>)").fill("stubby")
        page.get_by_label("Base URL (OpenAI-compatible server)").fill(stub.url)
        page.get_by_role("button", name="Add connection").click()
        wait_for_app(page)
        page.get_by_text("stubby/<model>").first.wait_for()
        page.get_by_label("Model to try").fill("stub")
        page.get_by_role("button", name="Test").click()
        page.get_by_text("stubby/stub at").first.wait_for()
        screenshot(page, "models")

        page.goto(f"{app.url}/train")
        wait_for_app(page)
        page.get_by_role("button", name="Quick trial (4 queries, G=4, 1 epoch)").click()
        wait_for_app(page)
        pick_model(page, "Policy model", "stubby/stub")
        pick_model(page, "Learner model", "stubby/stub")
        page.get_by_role("button", name="Start run").click()
        deadline = time.monotonic() + 300
        run, calls = first_run(app.database_url)
        while time.monotonic() < deadline and (run is None or run.status in ("queued", "running")):
            time.sleep(1)
            run, calls = first_run(app.database_url)
    assert run is not None and run.status in ("awaiting_review", "completed"), (run and (run.status, run.error))
    assert run.settings["policy_model"] == run.settings["learner_model"] == "stubby/stub"
    assert {call.stage for call in calls} >= {"rollout", "summary"}
    assert {call.connection for call in calls} == {"stubby"} and all(call.error is None for call in calls)
    assert len(stub.requests()) >= 16  # 4 queries x G=4 rollouts at least, all on the stub
