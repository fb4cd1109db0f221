"""A conversation group on the Rollouts page in a real Chromium: the transcripts side by side, a model's
`<b>bold</b>` and `**stars**` shown literally (never as HTML or Markdown), a failed rule at its turn.

The evaluation is played beforehand with scripted replies (before Playwright starts: its event loop would stop
asyncio.run); no worker runs. The link opens the task and the evaluation (?task=...&evaluation=...).
"""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect
from sqlmodel import Session

from core.records.tasks.demos import CONVERSATION_TASK
from storage import queries
from storage.db import make_engine
from tests.browser_support import browser_page, require_chromium, screenshot, studio, wait_for_app
from tests.test_ui_rollouts import CAREFUL, CARELESS, seeded_conversations

pytestmark = pytest.mark.browser

# Layout has no `expect` assertion, so it is awaited by a predicate over the elements' boxes (a, b), polled by the
# browser until it holds: a read once could measure a page still being laid out.
SIDE_BY_SIDE = """([a, b]) => { const one = a.getBoundingClientRect(), two = b.getBoundingClientRect();
    return Math.abs(one.y - two.y) < 5 && two.x - one.x > 300; }"""
ABOVE = "([a, b]) => a.getBoundingClientRect().y < b.getBoundingClientRect().y"


def expect_layout(page, predicate: str, first, second, what: str) -> None:
    """Until `predicate` holds over the two located elements; a failure gives both boxes."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(predicate, arg=[first.element_handle(), second.element_handle()])
    except PlaywrightTimeout as error:
        raise AssertionError(f"not {what}: {first.bounding_box()} and {second.bounding_box()}") from error


def test_a_conversation_group_shows_side_by_side_with_model_text_literal(tmp_path):
    require_chromium()
    with studio(tmp_path, worker=False) as app:
        engine = make_engine(app.database_url)
        eval_id = seeded_conversations(engine)
        with Session(engine) as session:
            [group] = queries.rollout_groups(session, evaluation_id=eval_id)
            rollouts = queries.evaluation_sample_rollouts(session, eval_id, group["sample_id"])
        engine.dispose()
        assert len(rollouts) == 2
        with browser_page() as page:
            page.goto(f"{app.url}/rollouts?{urlencode({'task': CONVERSATION_TASK, 'evaluation': eval_id})}")
            wait_for_app(page)
            main = page.locator("[data-testid='stMain']")
            first = main.get_by_text("Conversation 0", exact=True)
            second = main.get_by_text("Conversation 1", exact=True)
            first.wait_for(timeout=60_000)
            wait_for_app(page)

            expect_layout(page, SIDE_BY_SIDE, first, second, "side by side")

            # The model's markup is text: the code blocks hold it verbatim, and nothing made it bold.
            literal = main.locator("[data-testid='stCode']").filter(has_text="<b>bold</b> **stars**")
            expect(literal).to_have_count(2)  # the careful conversation's two agent turns
            expect(literal.first).to_contain_text(CAREFUL)
            expect(main.locator("b, strong", has_text="bold")).to_have_count(0)
            expect(main.locator("strong, em", has_text="stars")).to_have_count(0)

            for label in ("Turn 1 · User", "Turn 2 · Agent", "Turn 5 · User"):
                expect(main.get_by_text(label, exact=True), label).to_have_count(2)
            failed = main.get_by_text("Rule “no card details” failed here")
            expect(failed).to_have_count(1)
            careless_turn = main.locator("[data-testid='stCode']").filter(has_text=CARELESS).first
            expect_layout(page, ABOVE, careless_turn, failed, "the careless turn above its failed rule")
            screenshot(page, "rollouts_conversation")
