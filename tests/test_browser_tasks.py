"""Dataset upload on the Tasks page in a real browser (AppTest cannot drive st.file_uploader).

A file with a bad row is refused with its row named and nothing written; the fixed file is checked,
previewed and added; a file without a split column is split by the test hold-out share.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect
from sqlmodel import Session

from core.records.tasks.demos import SUPPORT_TASK
from storage import queries
from storage.db import make_engine
from tests.browser_support import browser_page, require_chromium, screenshot, studio, wait_for_app

pytestmark = pytest.mark.browser

GOOD = (b"id,query,rubric,channel,split\n"
        b"u1,My parcel is late by a week.,Apologises and gives the tracking page.,email,train\n"
        b"u2,Can I change my delivery address?,Explains how to change it before dispatch.,chat,test\n")
BAD = GOOD + b"u3,=HYPERLINK(\"http://x\"),Never shown.,chat,train\n"
UNSPLIT = b"id,query\n" + b"".join(f"v{i},Where is order {i}?\n".encode() for i in range(8))


def split_counts(database_url: str) -> dict[str, int]:
    with Session(make_engine(database_url)) as session:
        task = queries.task_by_name(session, SUPPORT_TASK)
        return queries.count_samples(session, task.id)


def sample_count(database_url: str) -> int:
    with Session(make_engine(database_url)) as session:
        task = queries.task_by_name(session, SUPPORT_TASK)
        return sum(queries.count_samples(session, task.id).values())


def upload(page, name: str, data: bytes) -> None:
    """Until the page is drawn for this very file: its header's columns listed and Check not yet pressed.

    Either sign alone can be left over from the previous file (the same header; a file added, so unchecked),
    and a check that passed on the old page let a later step meet the hold-out form twice, old and new."""
    page.locator("[data-testid='stFileUploaderDropzoneInput']").first.set_input_files(
        files=[{"name": name, "mimeType": "text/csv", "buffer": data}])
    header = data.split(b"\n", 1)[0].decode().replace(",", ", ")
    expect(page.locator("[data-testid='stCode'] code").filter(
        has_text=re.compile(f"^{re.escape(header)}$"))).to_have_count(1)
    wait_for_app(page)  # the previous run's copies gone, so each sign below is on the page once
    expect(page.get_by_text("Check the file to see a preview")).to_be_visible()


def test_an_uploaded_file_is_checked_previewed_and_added(tmp_path):
    require_chromium()
    with studio(tmp_path, worker=False) as app, browser_page() as page:
        before = sample_count(app.database_url)
        page.goto(f"{app.url}/tasks")
        wait_for_app(page)
        page.get_by_label("Task", exact=True).click()
        page.get_by_role("option", name=SUPPORT_TASK).click()
        wait_for_app(page)
        page.get_by_role("tab", name="Data").click()

        upload(page, "orders.csv", BAD)
        page.get_by_role("button", name="Check file").click()
        page.get_by_text("This file cannot be added (row 3)").wait_for()
        page.get_by_text("looks like a spreadsheet formula").first.wait_for()
        assert sample_count(app.database_url) == before

        upload(page, "orders.csv", GOOD)
        page.get_by_role("button", name="Check file").click()
        page.get_by_text("2 rows OK").wait_for()
        screenshot(page, "tasks-upload")
        page.get_by_role("button", name="Add 2 samples").click()
        page.get_by_text("Added 2 samples (0 already present)").wait_for()
        assert sample_count(app.database_url) == before + 2

        splits = split_counts(app.database_url)
        upload(page, "unsplit.csv", UNSPLIT)
        share = page.get_by_label("Hold out for test (%)")
        expect(share).to_have_count(1)
        share.fill("25")
        share.press("Enter")
        wait_for_app(page)
        page.get_by_role("button", name="Check file").click()
        page.get_by_text("8 rows OK: train 6 · test 2").wait_for()
        page.get_by_role("button", name="Add 8 samples").click()
        page.get_by_text("Added 8 samples (0 already present)").wait_for()
        after = split_counts(app.database_url)
        assert {split: after[split] - splits.get(split, 0) for split in after} == {"train": 6, "test": 2}
