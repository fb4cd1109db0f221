"""A first visit that leads (issue 14): in a real Chromium, the Overview says what the studio is, its Quick
trial button opens Train with the quick preset filled in, the estimate shows before Start, and Start queues
exactly that run.

The studio runs without a worker, so the run stays queued and the test reads its settings from the
database; no model is loaded.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect
from sqlmodel import Session, select

from core.records.tasks.demos import POLICY_TASK
from storage.db import make_engine
from storage.tables import Run, Task
from tests.browser_support import (
    PATIENCE_MS,
    browser_page,
    require_chromium,
    screenshot,
    studio,
    wait_for_app,
)

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def _chromium():
    require_chromium()


def queued_runs(database_url: str) -> list[Run]:
    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            return list(session.exec(select(Run)))
    finally:
        engine.dispose()


def task_name(database_url: str, task_id: int) -> str:
    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            return session.get(Task, task_id).name
    finally:
        engine.dispose()


def number_box(page, label: str):
    return page.get_by_label(label, exact=True)


def quick_trial_calls() -> int:
    """The quick trial's calls on the shop-policies demo (the embedded model's quick trial): 16 answers (direct
    mode), and with groups where every attempt failed learning from the reference every group may give a worked
    example until the run shows otherwise: 4; the embedded learner's defaults write no lessons (no summary,
    advantage or update)."""
    return 16 + 4


def test_a_first_visit_goes_from_what_this_is_to_a_queued_quick_trial(tmp_path):
    with studio(tmp_path, worker=False) as app, browser_page() as page:
        page.goto(app.url)
        wait_for_app(page)
        page.get_by_text("What this is", exact=True).wait_for()
        expect(page.get_by_text("A frozen model gets better")).to_have_count(1)
        for step in ("Quick trial", "Review", "Evaluate and compare"):
            expect(page.get_by_role("button", name=step, exact=True), step).to_have_count(1)
        screenshot(page, "first_visit_overview")

        page.get_by_role("button", name="Quick trial", exact=True).click()
        page.get_by_role("heading", name="Train").first.wait_for()
        wait_for_app(page)
        expect(page.get_by_text("The settings below are the quick trial.")).to_have_count(1)
        for label, value in {"Training queries limit (0 = all)": "4", "Group size (G)": "4", "Epochs": "1",
                             "Batch size": "4"}.items():
            expect(number_box(page, label), label).to_have_value(value)
        # waited for, not read once: a rerun still under way can show the estimate of a half-applied preset
        # (the limit already 4, the batch size not yet: 2 updates, 38 calls)
        estimate = page.locator("[data-testid='stMarkdownContainer']", has_text="Estimate:")
        expect(estimate).to_have_count(1, timeout=PATIENCE_MS)
        expect(estimate).to_contain_text(f"about {quick_trial_calls()} calls", timeout=PATIENCE_MS)
        screenshot(page, "first_visit")

        page.get_by_role("button", name="Start run").click()
        page.get_by_text("queued: 1st in line").first.wait_for()
        wait_for_app(page)
        screenshot(page, "first_visit_queued")

    (run,) = queued_runs(app.database_url)
    assert run.status == "queued"
    assert task_name(app.database_url, run.task_id) == POLICY_TASK  # the embedded model's quick trial task
    settings = run.settings
    assert settings["reference_when_all_fail"] is True
    assert (settings["examples"], settings["lessons"]) == (True, False)  # the embedded learner's defaults
    assert (settings["limit"], settings["group_size"], settings["epochs"]) == (4, 4, 1)
    assert (settings["batch_size"], settings["review_mode"], settings["gate"]) == (4, "manual", "off")
