"""Review keeps its place (issue 41), in a real browser: after a partly approved step's measurement the page stays
on the step and says what it came to; E puts the cursor in the editor; a decision made with the CLI shows on an
open page without a reload, with who made it; the browser tab names the page.

The runs are made beforehand on scripted replies; no worker runs, so the test plays the worker's part (carrying
the run on, in a thread of its own: asyncio.run cannot run in Playwright's thread) when the page should see it.
"""

from __future__ import annotations

import json
import re
import threading

import pytest
from playwright.sync_api import expect
from sqlmodel import Session

from core import cli
from core.grpo.training import execute_run
from storage import queries
from storage.db import make_engine
from tests.browser_support import browser_page, require_chromium, screenshot, studio, wait_for_app
from tests.ui_support import scripted_gateway, seeded_run

pytestmark = pytest.mark.browser

TEXTS = ["Re-read the question to find which quantity it asks for.",
         "Write each quantity with its unit before computing.",
         "Estimate the answer before computing it exactly."]


def adds(n: int) -> str:
    return json.dumps({"operations": [{"op": "ADD", "ids": [], "text": text, "rationale": f"lesson {i}"}
                                      for i, text in enumerate(TEXTS[:n], 1)]})


def step_and_ops(database_url: str, run_id: int) -> tuple[int, list[int]]:
    with Session(make_engine(database_url)) as session:
        step = queries.steps(session, run_id)[0]
        return step.id, [op.id for op in queries.step_operations(session, step.id)]


def ready_for_keys(page, focused: int) -> None:
    """The page redrawn with operation `focused` focused, and the keyboard on the page, not in a text box."""
    expect(page.get_by_text(f"▶ focused: operation {focused}").first).to_be_visible()
    wait_for_app(page)
    page.locator("h1").first.click()


def test_after_a_measurement_the_review_page_stays_on_its_step_and_names_the_outcome(tmp_path):
    require_chromium()
    with studio(tmp_path, worker=False) as app:
        url = app.database_url
        engine = make_engine(url)
        run_id = seeded_run(engine, "manual", update=adds(2))  # gated (no_worse): both ADDs measured together
        other = seeded_run(engine, "manual", update=adds(2))  # another run's step waits for review too (newer)
        step_id, (first, second) = step_and_ops(url, run_id)
        other_step, _ops = step_and_ops(url, other)
        with browser_page() as page:
            page.goto(f"{app.url}/review?run={run_id}&step={step_id}")
            wait_for_app(page)
            expect(page).to_have_title("Review · Training-Free GRPO studio")
            page.locator(f".st-key-review_approve_{first} button").click()  # part of the step approved ...
            expect(page.get_by_text("Operation 1 · ADD · approved")).to_be_visible()
            wait_for_app(page)
            page.locator(f".st-key-review_reject_{second} button").click()  # ... the rest rejected
            expect(page.get_by_text(re.compile(r"Measuring the decided library: 0 of \d+"))).to_be_visible()

            worker = threading.Thread(target=lambda: execute_run(engine, run_id,
                                                                 gateway=scripted_gateway(engine)[1]))
            worker.start()  # what a worker does with the queued run: measure the decided library, land it
            worker.join(timeout=120)
            assert not worker.is_alive()

            expect(page.get_by_text(re.compile(rf"Run {run_id} · epoch 1 · batch 1: the decided library was "
                                               r"measured and landed as #2 \(validation \d\.\d\d → \d\.\d\d\)\.")
                                    )).to_be_visible()
            expect(page).to_have_url(re.compile(rf"[?&]step={step_id}\b"))  # it stayed on its step
            expect(page.get_by_text("Applied as version #2")).to_be_visible()
            following = page.get_by_role("button", name=f"Next waiting step: run {other} · epoch 1 · batch 1")
            expect(following).to_be_visible()
            screenshot(page, "review_measured_outcome")
            following.click()  # on to the next step that waits, when the reviewer has read this one
            expect(page).to_have_url(re.compile(rf"[?&]step={other_step}\b"))
            expect(page.get_by_text("▶ focused: operation 1")).to_be_visible()

            page.goto(f"{app.url}/evaluate")  # every tab names its page
            expect(page).to_have_title("Evaluate · Training-Free GRPO studio")


def press_until_attached(page, key: str, target, tries: int = 3) -> None:
    """Press a key until `target` is on the page: a shortcut is bound a moment after its button is drawn, so a
    press can be lost (CI lost one); once the editor is there a second press would type into it, so the page
    says whether to press again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(tries):
        page.keyboard.press(key)
        try:
            target.wait_for(state="attached", timeout=10_000)
            return
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise


def test_e_puts_the_cursor_in_the_editor_and_a_cli_decision_shows_without_a_reload(tmp_path):
    require_chromium()
    with studio(tmp_path, worker=False) as app:
        url = app.database_url
        engine = make_engine(url)
        run_id = seeded_run(engine, "manual", settings={"gate": "off"}, update=adds(3))
        _step, (first, second, third) = step_and_ops(url, run_id)
        with browser_page() as page:
            page.goto(f"{app.url}/review")
            wait_for_app(page)
            ready_for_keys(page, 1)
            editor = page.locator(f".st-key-review_edit_text_{first} textarea")
            press_until_attached(page, "e", editor)
            expect(editor).to_be_focused()
            expect(editor).to_have_value(TEXTS[0])
            page.keyboard.type(" Then check it.")  # typed straight into the editor
            expect(editor).to_have_value(f"{TEXTS[0]} Then check it.")

            assert cli.main(["--db", url, "review", "reject", str(third), "--reason", "a retold problem"]) == 0
            expect(page.get_by_text("Decided elsewhere: Operation 3 rejected by cli. The page shows it when you "
                                    "save or cancel your edit.")).to_be_visible()  # without a reload
            expect(editor).to_have_value(f"{TEXTS[0]} Then check it.")  # nothing typed is lost meanwhile
            page.locator(f".st-key-review_save_edit_{first} button").click()
            expect(page.get_by_text("Operation 3 · ADD · rejected by cli")).to_be_visible()
            expect(page.get_by_text("Operation 1 · ADD · edited by")).to_be_visible()

            assert cli.main(["--db", url, "review", "approve", str(second)]) == 0  # the last one: the step lands
            expect(page.get_by_text("Decided elsewhere: Operation 2 applied by cli.")).to_be_visible()
            expect(page.get_by_text("Operation 2 · ADD · applied by cli")).to_be_visible()
            expect(page.get_by_text("Applied as version #2")).to_be_visible()
            screenshot(page, "review_decided_elsewhere")
