"""The studio in a real browser: Debian's Chromium driven by Playwright against `streamlit run` + a worker.

The end-to-end test trains in manual review mode from the Train page, watches the counters move without a
click, approves the proposed operations on the Review page, finds the new version and its diff on the
Library page, and evaluates it on the Evaluate page. Screenshots of each page land in tests/artifacts/
(ignored by git).

Every model call (the agent's answers, the learner, the validation gate, the evaluation) goes to the scripted
OpenAI-compatible stub of bench/stub_server.py, whose learner always proposes one valid ADD: what the pages
show is then the studio's work, not a small model's luck, and the test takes seconds of model time. The
embedded model's path through a run and an evaluation in processes of their own is
tests/test_model_e2e.py::test_train_and_eval_on_the_embedded_model.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from bench.stub_server import StubServer
from tests.browser_support import browser_page, require_chromium, screenshot, studio, wait_for_app

pytestmark = pytest.mark.browser
PAGES = {"overview": "", "train": "train", "rollouts": "rollouts", "review": "review", "library": "library",
         "evaluate": "evaluate", "labeling": "labeling", "production": "production", "tasks": "tasks",
         "people": "people", "notifications": "notifications", "models": "models", "audit": "audit"}


@pytest.fixture(autouse=True)
def _chromium():
    require_chromium()


def test_every_page_opens_without_an_error_or_an_outside_request(tmp_path):
    """With the network blocked, every page draws completely from the studio's own server (no CDN font,
    icon or script): the studio runs offline."""
    outside: list[str] = []

    def block(route):
        outside.append(route.request.url)
        route.abort()

    with studio(tmp_path, worker=False) as app, browser_page() as page:
        page.route(lambda url: not url.startswith(app.url) and not url.startswith("data:"), block)
        for name, path in PAGES.items():
            page.goto(f"{app.url}/{path}")
            wait_for_app(page)
            expect(page.locator("[data-testid='stException']"), f"an error on {name}").to_have_count(0)
            expect(page.locator("h1").first, f"no title on {name}").to_be_visible()
            screenshot(page, f"empty-{name}")
    assert outside == [], outside


def run_ended(database_url: str) -> str | None:
    """Why the first run is over (status and step errors), or None while it may still reach review."""
    from sqlmodel import Session, select

    from storage.db import make_engine
    from storage.tables import Run, Step

    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            run = session.get(Run, 1)
            if run is None or run.status not in ("completed", "failed", "cancelled"):
                return None
            errors = [step.error for step in session.exec(select(Step).where(Step.run_id == 1)) if step.error]
            return f"{run.status}; {run.error or ''} {'; '.join(errors)}"[:600]
    finally:
        engine.dispose()


def gate_failed(database_url: str) -> bool:
    """Whether the first run's step awaiting review failed its validation gate (the Review page then asks for a
    note before an approval)."""
    from sqlmodel import Session, select

    from core.records.review.gate_verdict import GateVerdict
    from storage.db import make_engine
    from storage.tables import Step

    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            step = session.exec(select(Step).where(Step.run_id == 1, Step.status == "awaiting_review")).one()
            verdict = GateVerdict.of(step)
            return verdict is not None and verdict.failed
    finally:
        engine.dispose()


def metric(page, label: str):
    """The value of the metric labelled `label`."""
    tile = page.locator("[data-testid='stMetric']").filter(
        has=page.locator("[data-testid='stMetricLabel']", has_text=label))
    return tile.first.locator("[data-testid='stMetricValue']")


def while_the_run_goes_on(database_url: str, awaited: Callable[[float], None], seconds: float) -> None:
    """Await `awaited` (an expect, given its timeout in ms) in turns of two seconds for up to `seconds`, and fail
    at once with the reason when the run ends first, instead of waiting out the patience."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            awaited(2_000)
            return
        except AssertionError:
            ended = run_ended(database_url)
            if ended:
                pytest.fail(f"the run ended without operations to review: {ended}")
            if time.monotonic() > deadline:
                raise


def fill_number(page, label: str, value) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(str(value))
    box.press("Tab")


def wait_for_text(page, text: str, timeout_s: float) -> None:
    page.get_by_text(text).first.wait_for(timeout=timeout_s * 1000)


STUB = "openai/stub"


def stub_env(url: str) -> dict[str, str]:
    """What the app and the worker need to call openai/ models on the stub: litellm's endpoint, and a key (the
    Train page refuses a provider whose key is not set)."""
    return {"OPENAI_API_BASE": url, "OPENAI_API_KEY": "sk-stub-not-a-key"}


def models_on_the_stub(database_url: str) -> None:
    """The demo task's policy and learner models (the Train and Evaluate forms' defaults) are the stub."""
    from sqlmodel import select

    from core.records.tasks.demos import DEMO_TASK
    from storage.db import make_engine, session_scope
    from storage.tables import Task

    engine = make_engine(database_url)
    try:
        with session_scope(engine) as session:
            task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
            task.policy_model = task.learner_model = STUB
            session.add(task)
    finally:
        engine.dispose()


def models_by_stage(database_url: str) -> dict[str, set[str]]:
    """The models the first run's calls went to, by stage."""
    from sqlmodel import Session, select

    from storage.db import make_engine
    from storage.tables import LLMCall

    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            calls = session.exec(select(LLMCall).where(LLMCall.run_id == 1)).all()
    finally:
        engine.dispose()
    found: dict[str, set[str]] = {}
    for call in calls:
        found.setdefault(call.stage, set()).add(call.model)
    return found


def test_train_review_library_evaluate_from_the_pages(tmp_path):
    # each call answered after a second, one at a time: the run takes about 20 s, so the counters are seen to move
    with StubServer(latency_s=1.0) as stub, studio(tmp_path, extra_env=stub_env(stub.url)) as app, \
            browser_page() as page:
        models_on_the_stub(app.database_url)
        page.goto(app.url)
        wait_for_app(page)
        screenshot(page, "overview")

        # Train: a manual-review run of 2 queries x G=2 without ground truth, on the form's default models (the
        # task's: the stub), one call at a time
        page.goto(f"{app.url}/train")
        wait_for_app(page)
        fill_number(page, "Epochs", 1)
        fill_number(page, "Batch size", 2)
        fill_number(page, "Group size (G)", 2)
        fill_number(page, "Concurrency", 1)
        fill_number(page, "Training queries limit (0 = all)", 2)
        fill_number(page, "Validation queries", 4)  # the smallest gate: 4 held-out queries x 1 sample
        fill_number(page, "Gate samples per query", 1)
        page.get_by_text("Ground truth", exact=True).click()
        page.get_by_role("radiogroup").get_by_text("manual", exact=True).click()
        page.get_by_role("button", name="Start run").click()
        wait_for_text(page, "Rollouts", 60)

        # the counters move by themselves: no click, no reload from here on
        rollouts = metric(page, "Rollouts")
        started = rollouts.inner_text()  # only the value to move away from
        while_the_run_goes_on(app.database_url, lambda ms: expect(rollouts).not_to_have_text(started, timeout=ms),
                              900)
        page.reload()  # a reload (or a closed tab) neither stops nor restarts the run
        wait_for_app(page)
        while_the_run_goes_on(
            app.database_url, lambda ms: expect(page.get_by_text("awaiting_review").first).to_be_visible(timeout=ms),
            900)
        expect(metric(page, "Rollouts")).to_have_text("4 / 4")
        models = models_by_stage(app.database_url)  # the form's defaults reached the worker
        assert models == {stage: {STUB} for stage in ("rollout", "summary", "advantage", "update", "gate")}, models
        page.locator(".js-plotly-plot").first.wait_for()
        page.get_by_text("Time left").first.wait_for()
        page.wait_for_timeout(500)
        screenshot(page, "train")

        page.goto(f"{app.url}/rollouts")
        wait_for_app(page)
        screenshot(page, "rollouts")

        # Review: approve everything the learner proposed; the step is applied as a new version
        page.goto(f"{app.url}/review")
        wait_for_app(page)
        page.get_by_text(re.compile(r"validation, 4 queries x 1:")).first.wait_for()  # the stub's ADD measured
        screenshot(page, "review")
        note = page.get_by_label("Note for approving against the failed gate (required to approve or edit)")
        if gate_failed(app.database_url):  # a candidate that failed its gate needs a note to be approved anyway
            expect(note).to_be_visible()
            note.fill("approved for the browser test")
            note.press("Enter")
            page.wait_for_timeout(500)
        else:
            expect(note).to_have_count(0)
        page.get_by_role("button", name="Approve all pending").click()
        wait_for_text(page, "Applied as version", 60)
        screenshot(page, "review-applied")

        # Library: the new version made by the run, and its diff against the empty library
        page.goto(f"{app.url}/library")
        wait_for_app(page)
        # An added experience in the default diff: its table is a canvas grid, whose cells Playwright reads from the
        # grid's accessible table (attached, but not "visible": fresh-clone run 2 waited 90 s on to_be_visible).
        expect(page.get_by_test_id("stDataFrame").first).to_be_visible()
        expect(page.get_by_text("added", exact=True).first).to_be_attached()
        screenshot(page, "library")

        # Evaluate the latest version on 2 test queries; the chart appears when the worker is done
        page.goto(f"{app.url}/evaluate")
        wait_for_app(page)
        fill_number(page, "k (samples per query)", 1)
        fill_number(page, "Queries limit (0 = all)", 2)
        page.get_by_role("button", name="Start evaluation").click()
        page.locator(".js-plotly-plot").first.wait_for(timeout=120_000)
        wait_for_app(page)
        screenshot(page, "evaluate")
