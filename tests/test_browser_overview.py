"""The Overview's to-do list in a real browser (issue 25): each row opens its own task, run and step,
whatever the sidebar had chosen, and the address it opens reloads to the same view.

The work is made beforehand without a model: a run of the support task stopped with two operations pending
on its second step, and two disputed rollouts of the arithmetic task; from the clicks on, everything is the
live studio, Streamlit and Chromium (no worker needed, no sign-in: a reload keeps the session's page).
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from core.domain.library import ProposedOp
from core.grpo.training import RunSettings, create_run, store_operations
from core.records.tasks.demos import DEMO_TASK, SUPPORT_TASK
from storage.db import make_engine, session_scope
from storage.tables import Run, Step
from tests.browser_support import (
    PATIENCE_MS,
    browser_page,
    expect_address,
    require_chromium,
    screenshot,
    studio,
    wait_for_app,
)
from tests.test_browser_labeling import disputed_rollouts

pytestmark = pytest.mark.browser


def support_run_awaiting_review(database_url: str) -> tuple[int, int]:
    """A support-task run whose first step is applied and whose second waits with two operations."""
    engine = make_engine(database_url)
    run_id = create_run(engine, SUPPORT_TASK, RunSettings(epochs=1, limit=4), created_by="cli")
    with session_scope(engine) as session:
        run = session.get(Run, run_id)
        run.status = "awaiting_review"
        session.add(run)
        session.add(Step(run_id=run_id, epoch=0, batch_index=0, sample_ids=[], status="completed"))
        step = Step(run_id=run_id, epoch=0, batch_index=1, sample_ids=[], status="awaiting_review")
        session.add(step)
    store_operations(engine, step, [], [ProposedOp("ADD", text="Name the next step the customer can take."),
                                        ProposedOp("ADD", text="Say sorry once, then solve the problem.")], [])
    return run_id, step.id


def wait_for_title(page, title: str) -> None:
    page.wait_for_function("title => [...document.querySelectorAll(\"[data-testid='stMain'] h1\")]"
                           ".some(h => h.innerText.trim() === title)", arg=title)
    wait_for_app(page)


def sidebar_task(page):
    return page.locator("[data-testid='stSidebar']").get_by_role("combobox", name="Task")


def main_box(page, name: str):
    return page.locator("[data-testid='stMain']").get_by_role("combobox", name=name)


def starts(text: str) -> re.Pattern:
    return re.compile("^" + re.escape(text))


def test_each_to_do_row_opens_its_own_task_run_and_step(tmp_path):
    require_chromium()
    with studio(tmp_path, worker=False) as app:
        first_dispute, _second = disputed_rollouts(app.database_url, count=2, users=False)  # arithmetic task
        run_id, step_id = support_run_awaiting_review(app.database_url)
        with browser_page() as page:
            page.goto(app.url)
            wait_for_title(page, "Overview")
            expect(sidebar_task(page)).to_have_value(DEMO_TASK)  # another task than the review row's
            screenshot(page, "overview_todo")

            page.get_by_role("button", name=f"Review run {run_id} · {SUPPORT_TASK} · epoch 1 · batch 2").click()
            wait_for_title(page, "Review")
            # waited for, not read once: on a busy machine the page can first draw with the sidebar's old task
            # (its run 1 in the address) before the row's choice has landed
            expect_address(page, {"task": SUPPORT_TASK, "run": str(run_id), "step": str(step_id)})
            expect(main_box(page, "Run")).to_have_value(re.compile(rf"^Run {run_id} · awaiting_review"),
                                                        timeout=PATIENCE_MS)
            expect(sidebar_task(page)).to_have_value(SUPPORT_TASK)
            expect(main_box(page, "Step")).to_have_value(starts("epoch 1 · batch 2 · awaiting_review · 2 pending"))
            page.reload()  # the address it opened is the view: a reload (or the link, pasted) opens it again
            wait_for_title(page, "Review")
            expect(sidebar_task(page)).to_have_value(SUPPORT_TASK)
            expect(main_box(page, "Run")).to_have_value(starts(f"Run {run_id} · "))
            expect(main_box(page, "Step")).to_have_value(starts("epoch 1 · batch 2"))

            page.locator("[data-testid='stSidebarNav']").get_by_role("link", name="Overview", exact=True).click()
            wait_for_app(page)
            page.get_by_role("button", name=f"Settle 2 disputes · {DEMO_TASK}").click()
            wait_for_title(page, "Labeling")
            expect(sidebar_task(page)).to_have_value(DEMO_TASK)
            expect(page.get_by_role("tab", name="Agreement")).to_have_attribute("aria-selected", "true")
            expect(main_box(page, "Rollout to decide")).to_have_value(starts(f"Rollout {first_dispute} ·"))
            screenshot(page, "overview_todo_disputes")
