"""The Library page names what it shows (issue 50): after Add experience every version picker (the text, the
diff, the label and the export) shows the new version, the download is named after it, and Move label moves
the label to the version its picker shows.

A browser: the bug was the browser keeping a picker's old choice while the server had reset it to the newest
version, which AppTest (no browser state) cannot show.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect
from sqlmodel import Session

from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.db import make_engine
from tests.browser_support import browser_page, require_chromium, screenshot, studio, wait_for_app

pytestmark = pytest.mark.browser

LESSON_TEXT = "Write the unit beside every number before adding anything up."


def library_state(database_url: str) -> tuple[int, dict[str, int]]:
    """The newest version's number and each label's version number."""
    with Session(make_engine(database_url)) as session:
        task = queries.task_by_name(session, DEMO_TASK)
        library = queries.library_by_name(session, task.id, "default")
        numbers = {v.id: v.number for v in queries.versions(session, library.id)}
        return (queries.latest_version(session, library.id).number,
                {label.name: numbers[label.version_id] for label in queries.labels(session, library.id)})


def picker(page, key: str):
    """The version a picker shows (its combobox's value)."""
    return page.locator(f".st-key-{key}").get_by_role("combobox")


def test_every_picker_follows_to_the_version_add_experience_created(tmp_path):
    require_chromium()
    with studio(tmp_path, worker=False) as app:
        before, _labels = library_state(app.database_url)
        with browser_page() as page:
            page.goto(f"{app.url}/library")
            wait_for_app(page)
            for key in ("lib_text_version", "lib_export_version", "lib_label_version"):
                expect(picker(page, key)).to_have_value(f"#{before}")
            page.locator(".st-key-lib_add_text textarea").fill(LESSON_TEXT)
            page.get_by_role("button", name="Add experience").click()
            new = before + 1
            expect(page.get_by_text(f"Created version #{new}.").first).to_be_visible()
            wait_for_app(page)
            assert library_state(app.database_url)[0] == new
            for key in ("lib_text_version", "lib_diff_to", "lib_export_version", "lib_label_version"):
                expect(picker(page, key)).to_have_value(f"#{new}")
            expect(picker(page, "lib_diff_from")).to_have_value(f"#{before}")
            with page.expect_download() as download:
                page.locator(".st-key-lib_export_download button").click()
            assert download.value.suggested_filename.endswith(f"-v{new}.md")
            screenshot(page, "library_follows_new_version")

            page.locator(".st-key-lib_label_name input").fill("candidate")
            page.locator(".st-key-lib_label_name input").press("Enter")
            wait_for_app(page)
            page.get_by_role("button", name="Move label").click()
            expect(page.get_by_text(f"now points at version #{new}").first).to_be_visible()
    assert library_state(app.database_url)[1]["candidate"] == new
