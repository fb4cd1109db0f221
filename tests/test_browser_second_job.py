"""No second job by accident, in a real Chromium (issue 41): Enter in the Evaluate form's k box submits the form,
and with the same evaluation already queued it queues nothing new; the page names the one to follow.

No worker runs, so the first evaluation stays queued.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect
from sqlmodel import Session, select

from storage.db import make_engine
from storage.tables import Evaluation
from tests.browser_support import PATIENCE_MS, browser_page, require_chromium, studio, wait_for_app

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def _chromium():
    require_chromium()


def evaluation_ids(database_url: str) -> list[int]:
    engine = make_engine(database_url, migrate=False)
    try:
        with Session(engine) as session:
            return [ev.id for ev in session.exec(select(Evaluation).order_by(Evaluation.id))]
    finally:
        engine.dispose()


def test_enter_in_the_k_box_queues_nothing_new_and_names_the_queued_evaluation(tmp_path):
    with studio(tmp_path, worker=False) as app, browser_page() as page:
        page.goto(app.url)
        wait_for_app(page)
        page.locator("[data-testid='stSidebarNav']").get_by_role("link", name="Evaluate", exact=True).click()
        wait_for_app(page)
        form = page.locator("[data-testid='stForm']").first
        form.get_by_role("button", name="Start evaluation").click()
        wait_for_app(page)
        queued = page.locator("[data-testid='stAlertContentSuccess']").filter(has_text=re.compile(r"Evaluation \d+ queued"))
        expect(queued).to_have_count(1, timeout=PATIENCE_MS)
        (first,) = evaluation_ids(app.database_url)

        k_box = form.get_by_role("spinbutton", name="k (samples per query)")
        k_box.click()
        k_box.press("Enter")  # submits the form: the same version, split, k and model again
        wait_for_app(page)
        refused = page.locator("[data-testid='stAlertContentError']").filter(has_text="nothing new was queued")
        expect(refused).to_have_count(1, timeout=PATIENCE_MS)
        expect(refused).to_contain_text(f"evaluation {first} of the same version, split, k and model is already "
                                        "queued")
        assert evaluation_ids(app.database_url) == [first]
