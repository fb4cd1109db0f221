"""A labeller in a real browser: signs in, labels three rollouts with the keyboard, and the run goes on.

The waiting run is made beforehand with scripted replies (so the test does not wait for the model to
write answers); from the labels on, everything is the live studio: Streamlit, the worker process and
Chromium. The labels differ, so the worker continues with the embedded model's summaries.
"""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from core.people import add_user
from core.tasks import DEMO_TASK
from core.training import RunSettings, create_run, execute_run
from storage.db import make_engine, session_scope
from storage.models import RewardLabel, Run, Task
from tests.browser_support import browser_page, require_chromium, screenshot, studio, wait_for_app
from tests.ui_support import scripted_gateway

pytestmark = pytest.mark.browser


def waiting_run(database_url: str) -> int:
    """A run of one query x G=3 on a human-labelled 1-5 scale, stopped at awaiting_labels."""
    engine = make_engine(database_url)
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        task.reward_method, task.reward_settings = "human", {"scale": "1-5"}
        session.add(task)
    add_user(engine, "lab", "labeler", "lab-password")
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=1, group_size=3, limit=1), created_by="cli")
    _model, gateway = scripted_gateway(engine)
    assert execute_run(engine, run_id, gateway=gateway).status == "awaiting_labels"
    return run_id


def status_of(database_url: str, run_id: int) -> str:
    with Session(make_engine(database_url)) as session:
        return session.get(Run, run_id).status


def test_a_labeller_signs_in_labels_three_rollouts_by_keyboard_and_the_run_continues(tmp_path):
    require_chromium()
    with studio(tmp_path) as app:
        run_id = waiting_run(app.database_url)  # before Playwright: its event loop would stop asyncio.run
        with browser_page() as page:
            label_and_watch(page, app, run_id)


def press_until(page, key: str, text: str, tries: int = 3) -> None:
    """Press a key until `text` shows: a shortcut is bound a moment after its button is drawn, and
    pressing a score key twice selects the same score."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(tries):
        page.keyboard.press(key)
        try:
            page.get_by_text(text).first.wait_for(timeout=5_000)
            return
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise


def label_and_watch(page, app, run_id: int) -> None:
    from playwright.sync_api import expect

    page.goto(app.url)
    page.get_by_label("User name").fill("lab")
    page.get_by_role("textbox", name="Password").fill("lab-password")
    page.get_by_role("button", name="Sign in").click()
    wait_for_app(page)
    page.get_by_role("link", name="Labeling").click()
    wait_for_app(page)
    page.get_by_text("3 waiting for you").first.wait_for()
    page.get_by_role("button", name="Submit and next").wait_for()
    wait_for_app(page)
    screenshot(page, "labeling")

    shown = []
    for left, key in ((2, "4"), (1, "1"), (0, "5")):
        caption = page.locator("[data-testid='stMain']").get_by_text("Rollout ").first
        shown.append(caption.inner_text())
        page.get_by_role("button", name="Submit and next").wait_for()  # the keys are bound once it is drawn
        page.get_by_text("Selected: none").first.wait_for()
        page.locator("h1").first.click()  # focus out of any input: keys go to the page
        press_until(page, key, f"Selected: {key}")
        page.keyboard.press("Enter")
        page.get_by_text(f"{left} waiting for you" if left else "Nothing waiting for you").first.wait_for()
        if left:  # under load the count can be redrawn before the rollout below it: wait for the next one
            expect(caption).not_to_have_text(shown[-1], timeout=30_000)
    page.get_by_text("Nothing waiting for you").first.wait_for()
    assert len(set(shown)) == 3, shown  # each Enter moved on to the next rollout
    with Session(make_engine(app.database_url)) as session:
        labels = session.exec(select(RewardLabel).order_by(RewardLabel.id)).all()
    assert [(label.labeler, label.value) for label in labels] == [("lab", 0.75), ("lab", 0.0), ("lab", 1.0)]

    for _ in range(120):  # the worker claims the run once its batch is labelled
        if status_of(app.database_url, run_id) not in ("awaiting_labels", "queued"):
            break
        page.wait_for_timeout(500)
    assert status_of(app.database_url, run_id) in ("running", "completed")
    page.get_by_role("link", name="Train").click()
    wait_for_app(page)
    page.get_by_text("Status:").first.wait_for()
    assert page.get_by_text("awaiting_labels").count() == 0
    screenshot(page, "train-after-labels")
