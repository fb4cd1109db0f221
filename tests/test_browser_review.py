"""A reviewer in a real browser decides a step with keys only: approve, next, reject, approve.

The run waiting for review is made beforehand with scripted replies (three operations proposed, review
mode manual); from the keys on, everything is the live studio, Streamlit and Chromium. No worker runs: the
test checks that the last decision applied the step and put the run back in the queue.
"""

from __future__ import annotations

import json
import re
import threading

import pytest
from playwright.sync_api import expect
from sqlmodel import Session

from core.grpo.training import RunSettings, create_run, execute_run
from core.records.review import decisions as review
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.db import make_engine
from storage.tables import Run
from tests.browser_support import (
    browser_page,
    expect_focus_in,
    require_chromium,
    screenshot,
    studio,
    wait_for_app,
)
from tests.ui_support import scripted_gateway

pytestmark = pytest.mark.browser

TEXTS = ["Re-read the question to find which quantity it asks for.",
         "Write each quantity with its unit before computing.",
         "Estimate the answer before computing it exactly."]
THREE_ADDS = json.dumps({"operations": [{"op": "ADD", "ids": [], "text": text, "rationale": f"lesson {i}"}
                                        for i, text in enumerate(TEXTS, 1)]})


def waiting_review(database_url: str) -> int:
    """A run of 2 queries x G=2 stopped at awaiting_review with three pending ADDs (no gate)."""
    engine = make_engine(database_url)
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2,
                                                       review_mode="manual", gate="off"), created_by="cli")
    _model, gateway = scripted_gateway(engine, update=THREE_ADDS)
    assert execute_run(engine, run_id, gateway=gateway).status == "awaiting_review"
    return run_id


def statuses(database_url: str, run_id: int) -> dict:
    with Session(make_engine(database_url)) as session:
        step = queries.steps(session, run_id)[0]
        ops = queries.step_operations(session, step.id)
        run = session.get(Run, run_id)
        version = queries.version_by_id(session, run.current_version_id)
        return {"run": run.status, "step": step.status, "ops": [op.status for op in ops],
                "library": [exp["text"] for exp in version.experiences]}


def test_a_reviewer_decides_a_step_with_keys_only_and_the_run_goes_back_in_the_queue(tmp_path):
    require_chromium()
    with studio(tmp_path, worker=False) as app:
        run_id = waiting_review(app.database_url)  # before Playwright: its event loop would stop asyncio.run
        with browser_page() as page:
            review_by_keys(page, app, run_id)


def press_until_stored(page, key: str, database_url: str, run_id: int, index: int, tries: int = 3) -> None:
    """Press a decision key until operation `index` is decided in the database: a shortcut is bound a moment
    after its button is drawn, so a press can be lost, but pressing again after it worked would decide the
    next operation, so the database (not the page) says whether to press again."""
    for _ in range(tries):
        page.keyboard.press(key)
        for _ in range(40):
            if statuses(database_url, run_id)["ops"][index] != "pending":
                return
            page.wait_for_timeout(250)
    raise AssertionError(f"pressing {key} never decided operation {index + 1}")


def press_until_shown(page, key: str, text: str, tries: int = 3) -> None:
    """Press a key until `text` shows (pressing Next again only after it visibly did nothing)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(tries):
        page.keyboard.press(key)
        try:
            page.get_by_text(text).first.wait_for(timeout=10_000)
            return
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise


def ready_for_keys(page, focused: int) -> None:
    """The page redrawn with operation `focused` focused, and the keyboard on the page, not in a text box."""
    page.get_by_text(f"▶ focused: operation {focused}").first.wait_for()
    wait_for_app(page)
    page.locator("h1").first.click()


def review_by_keys(page, app, run_id: int) -> None:
    url = app.database_url
    page.goto(f"{app.url}/review")
    wait_for_app(page)
    page.get_by_text("Proposed operations").first.wait_for()
    ready_for_keys(page, 1)

    press_until_stored(page, "a", url, run_id, 0)  # approve operation 1; the focus moves on to operation 2
    ready_for_keys(page, 2)
    page.get_by_text("Operation 1 · ADD · approved").first.wait_for()
    screenshot(page, "review_keys")

    press_until_shown(page, "j", "▶ focused: operation 3")  # next
    ready_for_keys(page, 3)
    press_until_stored(page, "x", url, run_id, 2)  # reject operation 3; the focus goes back to operation 2
    ready_for_keys(page, 2)
    press_until_stored(page, "a", url, run_id, 1)  # approve operation 2: the last decision applies the step

    page.get_by_text("Applied as version #2").first.wait_for()  # the decision is stored a moment before the step
    after = statuses(url, run_id)
    assert after["ops"] == ["applied", "applied", "rejected"]
    assert after["step"] == "completed" and after["run"] == "queued"
    assert after["library"] == TEXTS[:2]
    page.get_by_text("Applied as version #2").first.wait_for()
    expect(page.get_by_text("▶ focused")).to_have_count(0)  # awaited: the page redraws after the step lands


# ---- focus after a text field (issue 25) ----------------------------------------------------------------------


DECIDING = ("Approve", "Reject", "Edit", "Save edit", "Approve all pending", "Reject all pending")


def operation_ids(database_url: str, run_id: int) -> list[int]:
    with Session(make_engine(database_url)) as session:
        return [op.id for op in queries.step_operations(session, queries.steps(session, run_id)[0].id)]


def test_tab_out_of_a_reason_never_lands_on_a_decision_and_enter_there_decides_nothing(tmp_path):
    """Typing a reject reason and pressing Tab put the focus on Approve, so Enter approved what the reason
    was written to reject; the focus must land on something harmless."""
    require_chromium()
    with studio(tmp_path, worker=False) as app:
        run_id = waiting_review(app.database_url)
        first = operation_ids(app.database_url, run_id)[0]
        with browser_page() as page:
            page.goto(f"{app.url}/review")
            wait_for_app(page)
            ready_for_keys(page, 1)
            reason = page.locator(f".st-key-review_reason_{first} input")
            reason.fill("a guess, not a lesson")
            reason.press("Tab")
            wait_for_app(page)
            expect_focus_in(page, f".st-key-review_reason_stop_{first}")
            deciding = re.compile(r"^\s*(" + "|".join(map(re.escape, DECIDING)) + r")\s*$")
            expect(page.locator("button:focus", has_text=deciding)).to_have_count(0)
            page.keyboard.press("Enter")
            page.wait_for_timeout(1500)
            wait_for_app(page)
            assert statuses(app.database_url, run_id)["ops"] == ["pending"] * 3
            press_until_stored(page, "x", app.database_url, run_id, 0)  # the key still rejects, with the reason
            with Session(make_engine(app.database_url)) as session:
                assert queries.step_operations(session, queries.steps(session, run_id)[0].id)[0].comment == (
                    "a guess, not a lesson")


# ---- the page follows the run (issue 50) -------------------------------------------------------------------


def run_next_step(database_url: str, run_id: int) -> None:
    """The run goes on to its next step, which waits for review (what a worker does, on scripted replies)."""
    engine = make_engine(database_url)
    later = json.dumps({"operations": [{"op": "ADD", "ids": [], "text": "Name the unit of the answer before writing "
                                        "it down.", "rationale": "a later lesson"}]})
    _model, gateway = scripted_gateway(engine, update=later)
    assert execute_run(engine, run_id, gateway=gateway).status == "awaiting_review"


def test_review_follows_the_run_to_its_next_waiting_step_without_a_click(tmp_path):
    """Once a step lands the run goes on by itself; the page used to show "Run status: running" for as long as
    it was left alone while the next step waited. A browser: only its timed fragment shows the page moving on."""
    require_chromium()
    with studio(tmp_path, worker=False) as app:
        engine = make_engine(app.database_url)
        run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=4,
                                                           review_mode="manual", gate="off"), created_by="cli")
        _model, gateway = scripted_gateway(engine, update=THREE_ADDS)
        assert execute_run(engine, run_id, gateway=gateway).status == "awaiting_review"
        with browser_page() as page:
            page.goto(f"{app.url}/review")
            wait_for_app(page)
            page.get_by_text("▶ focused: operation 1").first.wait_for()
            with Session(engine) as session:
                first = queries.steps(session, run_id)[0].id
            review.decide_all(engine, first, "approved", "cli")  # decided elsewhere: the step lands
            review.apply_if_decided(engine, first, "cli")
            expect(page.get_by_text("Applied as version #2").first).to_be_visible()
            worker = threading.Thread(target=run_next_step, args=(app.database_url, run_id))
            worker.start()  # a thread: Playwright's event loop in this one would stop asyncio.run
            worker.join(timeout=120)
            assert statuses(app.database_url, run_id)["run"] == "awaiting_review"
            expect(page.get_by_text(f"Run {run_id} went on: run {run_id} · epoch 1 · batch 2 waits for review "
                                    "(shown).").first).to_be_visible()
            expect(page.get_by_text("▶ focused: operation 1").first).to_be_visible()
            expect(page.get_by_text("Run status: awaiting_review", exact=False).first).to_be_visible()
            screenshot(page, "review_follows_run")
