"""Context a person can trust, in a real Chromium (issue 14): the acting name and the sidebar's task survive a
page switch and a reload, a shared link opens the same task and library; the Evaluate form queues what it
shows after a task switch; Promote shows the diff and the verdict and moves nothing until confirmed.

No worker runs: queued evaluations stay queued, and the completed ones are made beforehand with scripted
replies (before Playwright starts: its event loop would stop asyncio.run).
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect
from sqlmodel import Session, select

from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.records.library.versions import PRODUCTION, import_library, set_label
from core.records.tasks.demos import DEMO_TASK, SUPPORT_TASK
from storage import queries
from storage.db import make_engine
from storage.tables import Evaluation, Task
from tests.browser_support import (
    PATIENCE_MS,
    browser_page,
    require_chromium,
    screenshot,
    studio,
    wait_for_app,
)
from tests.ui_support import scripted_gateway

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def _chromium():
    require_chromium()


def sidebar_select(page, label: str, option: str) -> None:
    page.locator("[data-testid='stSidebar']").get_by_role("combobox", name=label).click()
    page.get_by_role("option", name=option, exact=True).click()
    wait_for_app(page)


def sidebar_box(page, label: str):
    return page.locator("[data-testid='stSidebar']").get_by_role("combobox", name=label)


def name_box(page):
    return page.locator("[data-testid='stSidebar']").get_by_role("textbox", name="Your name")


def open_page(page, name: str) -> None:
    page.locator("[data-testid='stSidebarNav']").get_by_role("link", name=name, exact=True).click()
    wait_for_app(page)


def test_the_name_and_the_context_survive_page_switches_reloads_and_a_shared_link(tmp_path):
    with studio(tmp_path, worker=False) as app, browser_page() as page:
        page.goto(app.url)
        wait_for_app(page)
        name_box(page).fill("dana")
        name_box(page).press("Enter")
        wait_for_app(page)
        sidebar_select(page, "Task", SUPPORT_TASK)
        expect(page).to_have_url(re.compile(r"[?&]task=customer"))

        for name in ("Evaluate", "Labeling", "Review"):
            open_page(page, name)
            expect(name_box(page), name).to_have_value("dana")
            expect(sidebar_box(page, "Task"), name).to_have_value(SUPPORT_TASK)
        expect(page).to_have_url(re.compile(r"[?&]task="))
        shared = page.url

        page.reload()
        wait_for_app(page)
        expect(name_box(page)).to_have_value("dana")  # the browser remembers who typed here
        expect(sidebar_box(page, "Task")).to_have_value(SUPPORT_TASK)  # the URL does
        expect(page.get_by_role("heading", name="Review").first).to_be_visible()
        screenshot(page, "context_after_reload")

        other = page.context.browser.new_context(viewport={"width": 1400, "height": 1200})
        try:  # someone else opens the shared link: same page and task, their own name
            colleague = other.new_page()
            colleague.goto(shared)
            wait_for_app(colleague)
            expect(sidebar_box(colleague, "Task")).to_have_value(SUPPORT_TASK)
            expect(colleague.get_by_role("heading", name="Review").first).to_be_visible()
            expect(name_box(colleague)).not_to_have_value("dana")
        finally:
            other.close()


def completed_evaluation(engine, version: str) -> int:
    evaluation_id = create_evaluation(engine, DEMO_TASK, version, k=1, limit=3, created_by="cli")
    _model, gateway = scripted_gateway(engine)
    assert execute_evaluation(engine, evaluation_id, gateway=gateway).status == "completed"
    return evaluation_id


def seed_promotion(database_url: str) -> tuple[int, int, int]:
    """Version #1 in production, an imported #2, both evaluated on the same test queries."""
    engine = make_engine(database_url)
    candidate = import_library(engine, DEMO_TASK, "- Re-read the question before answering.", "lib.md")
    with Session(engine) as session:
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        library = queries.library_by_name(session, task.id, "default")
        first = queries.versions(session, library.id)[0]
    set_label(engine, DEMO_TASK, str(first.number), PRODUCTION, "cli")
    completed_evaluation(engine, str(first.number))
    completed_evaluation(engine, str(candidate.number))
    return library.id, first.id, candidate.id


def production_of(database_url: str, library_id: int) -> int:
    with Session(make_engine(database_url)) as session:
        return queries.label_by_name(session, library_id, PRODUCTION).version_id


def test_evaluate_queues_what_it_shows_after_a_task_switch_and_promote_asks_first(tmp_path):
    with studio(tmp_path, worker=False) as app:
        library_id, first_id, candidate_id = seed_promotion(app.database_url)
        with browser_page() as page:
            page.goto(app.url)
            wait_for_app(page)
            open_page(page, "Evaluate")
            form = page.locator("[data-testid='stForm']").first
            form.get_by_role("combobox", name="Split").click()
            page.get_by_role("option", name=re.compile(r"^train ")).click()
            sidebar_select(page, "Task", SUPPORT_TASK)

            # the other task's choice did not carry over; waited for, not read once: the task switch's rerun can
            # still be under way when the app first looks idle on a busy machine
            split_box = form.get_by_role("combobox", name="Split")
            expect(split_box).to_have_value(re.compile(r"^test\b"), timeout=PATIENCE_MS)
            page.get_by_role("button", name="Start evaluation").click()
            wait_for_app(page)
            message = page.locator("[data-testid='stAlertContentSuccess']").first
            expect(message).to_contain_text(re.compile(r"Evaluation \d+ queued"))
            with Session(make_engine(app.database_url)) as session:
                queued = session.exec(select(Evaluation).where(Evaluation.status == "queued")).one()
                support = session.exec(select(Task).where(Task.name == SUPPORT_TASK)).one()
            assert (queued.task_id, queued.split) == (support.id, "test")  # the split the form showed
            expect(message).to_contain_text(f"Evaluation {queued.id} queued")
            expect(message).to_contain_text("on the test split")

            sidebar_select(page, "Task", DEMO_TASK)
            page.get_by_role("button", name="Promote to production…").click()
            wait_for_app(page)
            page.get_by_text("Promote version #2 to production?").wait_for()
            expect(page.get_by_text(re.compile("Against production"))).to_have_count(1)
            expect(page.get_by_text("Re-read the question before answering.").first).to_be_visible()  # the diff
            assert production_of(app.database_url, library_id) == first_id  # nothing moved yet
            screenshot(page, "promote_confirmation")
            page.get_by_role("button", name="Confirm: promote #2").click()
            wait_for_app(page)
            page.get_by_text(re.compile("production now points at version #2")).wait_for()
            assert production_of(app.database_url, library_id) == candidate_id
