"""The page skeleton and the display helpers shared by the pages."""

from __future__ import annotations

import math
import re

import pytest
from streamlit.testing.v1 import AppTest

from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.jobs.run_control import cancel_evaluation
from core.records.library.versions import import_library
from core.records.tasks.demos import DEMO_TASK, SUPPORT_TASK
from tests.browser_support import PATIENCE_MS, browser_page, require_chromium, studio, wait_for_app
from tests.ui_support import APP, markdown_texts, run_app, scripted_gateway, seeded_run
from ui.common import Outcome, failed, plain

NAVIGATION = ["Overview", "Train", "Rollouts", "Review", "Library", "Evaluate", "Labeling", "Production", "Tasks",
              "People", "Notifications", "Models", "Audit"]


def test_plain_keeps_markdown_and_html_from_core_messages_inert():
    message = "no task named '**boss** [click](http://x) <script>' `rm` $x$ under_score"
    escaped = plain(message)
    assert "**" not in escaped.replace("\\*", "") and "[click]" not in escaped and "<script>" not in escaped
    assert escaped.replace("\\", "") == message.replace("\\", "")  # nothing lost, only escaped


def test_a_failure_shows_core_text_alone_or_verbatim_under_our_message():
    assert failed(ValueError("no task named *x*")) == Outcome(False, plain("no task named *x*"))
    assert failed(LookupError("row 3: no query"), "Not saved; nothing was written.") == Outcome(
        False, "Not saved; nothing was written.", "row 3: no query")
    assert failed(RuntimeError("database is locked")).message == "RuntimeError: database is locked"


PAGE_TITLES = {"overview": "Overview", "train": "Train", "rollouts": "Rollouts", "review": "Review",
               "library": "Library", "evaluate": "Evaluate", "labeling": "Labeling", "production": "Production",
               "tasks": "Tasks", "people": "People", "models": "Models", "audit": "Audit log"}


@pytest.fixture
def seeded_studio(app_engine):
    """The demo tasks with a run awaiting review (rollouts, advantages, pending operations) and an evaluation."""
    seeded_run(app_engine, review_mode="manual")
    version = import_library(app_engine, DEMO_TASK, "- Re-read the question.", "lib.md").number
    evaluation_id = create_evaluation(app_engine, DEMO_TASK, str(version), k=1, limit=2, created_by="test")
    assert execute_evaluation(app_engine, evaluation_id, gateway=scripted_gateway(app_engine)[1]).status == "completed"
    return app_engine


@pytest.mark.every_backend
@pytest.mark.parametrize("page", PAGE_TITLES)
def test_every_page_draws_a_seeded_studio(seeded_studio, page):
    """Every page over a run, its operations and an evaluation, on each database backend (the PostgreSQL run
    keeps this test of the page tests: the others show what a page does, which the backend under core does not
    change)."""
    at = run_app(f"pages/{page}.py")
    assert [t.value for t in at.title] == [PAGE_TITLES[page]]


def unanswered_evaluations(engine) -> tuple[int, int]:
    """A failed evaluation (every model call failed: 0 answered) and one cancelled during its first call."""
    version = import_library(engine, DEMO_TASK, "- Check the units of the answer.", "units.md").number
    failed_id = create_evaluation(engine, DEMO_TASK, str(version), k=2, limit=2, created_by="test")
    _model, gateway = scripted_gateway(engine, rollout=RuntimeError("503 Service Unavailable"))
    gateway.max_retries = 0
    assert execute_evaluation(engine, failed_id, gateway=gateway).metrics["answered"] == 0
    cancelled_id = create_evaluation(engine, DEMO_TASK, str(version), k=2, limit=2, created_by="test")

    asked = []

    def cancel_then_answer(messages):
        if not asked:
            asked.append(cancel_evaluation(engine, cancelled_id, "test"))
        return "so \\boxed{0}"

    _model, gateway = scripted_gateway(engine, rollout=cancel_then_answer)
    assert execute_evaluation(engine, cancelled_id, gateway=gateway).status == "cancelled"
    return failed_id, cancelled_id


NO_VALUE = re.compile(r"\b(None|nan|NaN|NaT|inf)\b")


def no_value_cells(frame) -> list[tuple[str, object]]:
    """(column, cell) of every cell that would show a missing value as a word (None, nan, NaT) or an infinity."""
    found = []
    for column in frame.columns:
        for value in frame[column].tolist():
            missing = value is None or (isinstance(value, float) and not math.isfinite(value))
            if missing or (isinstance(value, str) and NO_VALUE.search(value)) or str(value) == "NaT":
                found.append((column, value))
    return found


@pytest.mark.parametrize("page", PAGE_TITLES)
def test_no_page_shows_none_or_nan_where_a_figure_is_missing(seeded_studio, page):
    """Every page over the seeded studio plus a failed evaluation (0 answered) and a cancelled one: no table cell
    is empty-as-None or NaN, and no text on the page says None, nan or inf."""
    unanswered_evaluations(seeded_studio)
    at = run_app(f"pages/{page}.py", session_state={"ctx_reviewer": "alice"})
    cells = {f"table {index}": no_value_cells(df.value) for index, df in enumerate(at.dataframe)}
    assert not {name: found for name, found in cells.items() if found}
    texts = [*markdown_texts(at), *(m.value for m in at.metric), *(m.label for m in at.metric),
             *(str(option) for box in at.selectbox for option in box.options)]
    assert not [text for text in texts if NO_VALUE.search(str(text))]


def test_a_page_opened_first_is_drawn_inside_the_studio(app_engine):
    """A deep link opened first after a restart: Streamlit's legacy `pages/` mode (which every AppTest run
    starts in) runs pages/review.py alone, and the page hands over to streamlit_app.py (run_page)."""
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.switch_page("pages/review.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Review"]
    assert [box.label for box in at.sidebar.selectbox] == ["Task", "Library"]


@pytest.mark.browser
def test_a_deep_link_opened_first_after_a_start_shows_the_page_in_the_studio(tmp_path):
    require_chromium()
    from playwright.sync_api import expect

    with studio(tmp_path, worker=False) as app, browser_page() as page:
        page.goto(f"{app.url}/tasks")  # the server's first request
        wait_for_app(page)
        expect(page.locator("[data-testid='stMain'] h1")).to_have_text(["Tasks"])
        # titles, not the files of pages/ (each link's text is its icon's name, then its page's title)
        expect(page.locator("[data-testid='stSidebarNav'] a")).to_have_text(
            [re.compile(rf"^[a-z_]*{re.escape(title)}$") for title in NAVIGATION], timeout=PATIENCE_MS)
        expect(page.locator("[role='dialog']")).to_have_count(0)  # no "Page not found"

        task_box = page.get_by_label("Task", exact=True)  # the sidebar of that first run works
        task_box.click()
        page.get_by_role("option", name=SUPPORT_TASK).click()
        page.wait_for_function(  # the chosen task's settings, as the server drew them (the old form gone)
            "name => { const boxes = [...document.querySelectorAll(\"input[aria-label='Name']\")];"
            " return boxes.length === 1 && boxes[0].value === name; }", arg=SUPPORT_TASK, timeout=PATIENCE_MS)
        expect(task_box).to_have_value(SUPPORT_TASK)
