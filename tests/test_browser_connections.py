"""Model connections in a real browser: a connection made on the Models page (a stub OpenAI-compatible
server) lists its models there and in the pickers (read from its /v1/models); picked as `<connection>/<model>` for
a run's policy and learner on the Train page, it stays through the Quick trial preset and the run, and picked on
Evaluate it stays through the evaluation (issue 37: both used to fall back to the embedded model). The worker's
calls reach the stub through it, and every ledger row names the connection. No OPENAI_API_BASE needed.

A browser is needed: what the person sees in a selectbox after a preset, a worker's job and the page's own redraws
(a fragment on a timer reruns the page when an evaluation ends) is the browser's state, which AppTest does not keep."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect
from sqlmodel import Session, select

from bench.stub_server import StubServer
from storage.db import make_engine
from storage.tables import Evaluation, LLMCall, Run
from tests.browser_support import (
    PATIENCE_MS,
    browser_page,
    require_chromium,
    screenshot,
    studio,
    wait_for_app,
)

pytestmark = pytest.mark.browser


MODEL = "stubby/stub-large"  # one of the models the stub lists at /v1/models


def pick_model(page, label: str, model: str) -> None:
    """Open a model picker and click one of the models it offers (a connection's, listed by its server)."""
    page.get_by_role("combobox", name=label, exact=True).click()
    page.get_by_role("option", name=model, exact=True).click()
    wait_for_app(page)


def expect_model(page, label: str, model: str) -> None:
    """The picker shows `model`, awaited (a redraw may still be under way)."""
    expect(page.get_by_role("combobox", name=label, exact=True)).to_have_value(model, timeout=PATIENCE_MS)


def first_job(database_url: str, table) -> tuple[object | None, list[LLMCall]]:
    """Row 1 of `table` (Run or Evaluation) and its ledger rows."""
    engine = make_engine(database_url)
    column = LLMCall.run_id if table is Run else LLMCall.evaluation_id
    try:
        with Session(engine) as session:
            return session.get(table, 1), list(session.exec(select(LLMCall).where(column == 1)))
    finally:
        engine.dispose()


def wait_until_done(database_url: str, table, limit_s: float = 300) -> tuple[object | None, list[LLMCall]]:
    deadline = time.monotonic() + limit_s
    job, calls = first_job(database_url, table)
    while time.monotonic() < deadline and (job is None or job.status in ("queued", "running")):
        time.sleep(1)
        job, calls = first_job(database_url, table)
    return job, calls


def test_a_run_and_an_evaluation_set_up_in_the_browser_keep_the_connections_model_they_were_given(tmp_path):
    require_chromium()
    with StubServer() as stub, studio(tmp_path) as app, browser_page() as page:
        page.goto(f"{app.url}/models")
        wait_for_app(page)
        page.get_by_label("Name (models are then NAME/<model>)").fill("stubby")
        page.get_by_label("Base URL (OpenAI-compatible server)").fill(stub.url)
        page.get_by_role("button", name="Add connection").click()
        wait_for_app(page)
        page.get_by_text("stubby/<model>").first.wait_for()
        expect(page.get_by_text("stub, stub-large (listed").first).to_be_visible()  # what /v1/models listed
        page.get_by_label("Model to try").fill("stub")
        page.get_by_role("button", name="Test").click()
        page.get_by_text("stubby/stub at").first.wait_for()
        screenshot(page, "models")

        page.goto(f"{app.url}/train")
        wait_for_app(page)
        pick_model(page, "Policy model", MODEL)  # offered in the picker: the server's list, nothing typed
        pick_model(page, "Learner model", MODEL)
        page.get_by_role("button", name="Quick trial (4 queries, G=4, 1 epoch)").click()
        wait_for_app(page)
        expect(page.get_by_text("The settings below are the quick trial.")).to_be_visible()
        expect_model(page, "Policy model", MODEL)  # the preset set everything else, not the models
        expect_model(page, "Learner model", MODEL)
        # the form's own fields drawn with the preset (a submit sends what the browser shows: a click before the
        # redraw once queued the previous settings, auto review and the gate)
        expect(page.get_by_label("Group size (G)", exact=True)).to_have_value("4")
        wait_for_app(page)
        page.get_by_role("button", name="Start run").click()
        run, calls = wait_until_done(app.database_url, Run)
        expect(page.get_by_text("waits for a reviewer")).to_be_visible(timeout=PATIENCE_MS)  # the live part saw it end
        expect_model(page, "Policy model", MODEL)
        expect_model(page, "Learner model", MODEL)

        page.goto(f"{app.url}/evaluate")
        wait_for_app(page)
        form = page.locator("[data-testid='stForm']").first
        form.get_by_label("k (samples per query)").fill("1")
        form.get_by_label("Queries limit (0 = all)").fill("2")
        pick_model(page, "Model", MODEL)
        page.get_by_role("button", name="Start evaluation").click()
        wait_for_app(page)
        evaluation, eval_calls = wait_until_done(app.database_url, Evaluation)
        # the page redraws itself when an evaluation ends: the Promote section then offers it
        expect(page.get_by_role("combobox", name="Evaluation to promote")).to_be_visible(timeout=PATIENCE_MS)
        expect_model(page, "Model", MODEL)
        for name in ("Rollouts", "Evaluate"):  # another page and back, in the same session
            page.locator("[data-testid='stSidebarNav']").get_by_role("link", name=name, exact=True).click()
            wait_for_app(page)
        expect_model(page, "Model", MODEL)
    assert run is not None and run.status in ("awaiting_review", "completed"), (run and (run.status, run.error))
    assert run.settings["policy_model"] == run.settings["learner_model"] == MODEL
    assert {call.stage for call in calls} >= {"rollout", "summary"}
    assert {call.connection for call in calls} == {"stubby"} and all(call.error is None for call in calls)
    assert evaluation is not None and evaluation.status == "completed", (evaluation and evaluation.error)
    assert evaluation.model == MODEL and {call.connection for call in eval_calls} == {"stubby"}
    assert len(stub.requests()) >= 16 + 2  # 4 queries x G=4 rollouts at least, and the evaluation, all on the stub
