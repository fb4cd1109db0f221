"""A conversation group on the Rollouts page in a real Chromium: the transcripts side by side, a model's
`<b>bold</b>` and `**stars**` shown literally (never as HTML or Markdown), a failed rule at its turn.

The evaluation is played beforehand with scripted replies (before Playwright starts: its event loop would stop
asyncio.run); no worker runs. The link opens the task and the evaluation (?task=...&evaluation=...).
"""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from sqlmodel import Session

from core.records.tasks import CONVERSATION_TASK
from storage import queries
from storage.db import make_engine
from tests.browser_support import browser_page, require_chromium, screenshot, studio, wait_for_app
from tests.test_ui_rollouts import CAREFUL, CARELESS, seeded_conversations

pytestmark = pytest.mark.browser


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

            one, two = first.bounding_box(), second.bounding_box()
            assert abs(one["y"] - two["y"]) < 5 and two["x"] - one["x"] > 300, (one, two)  # side by side

            # The model's markup is text: the code blocks hold it verbatim, and nothing made it bold.
            literal = main.locator("[data-testid='stCode']").filter(has_text="<b>bold</b> **stars**")
            assert literal.count() == 2  # the careful conversation's two agent turns
            assert CAREFUL in literal.first.inner_text()
            assert main.locator("b, strong", has_text="bold").count() == 0
            assert main.locator("strong, em", has_text="stars").count() == 0

            for label in ("Turn 1 · User", "Turn 2 · Agent", "Turn 5 · User"):
                assert main.get_by_text(label, exact=True).count() == 2
            failed = main.get_by_text("Rule “no card details” failed here")
            assert failed.count() == 1
            careless_turn = main.locator("[data-testid='stCode']").filter(has_text=CARELESS).first
            assert careless_turn.bounding_box()["y"] < failed.bounding_box()["y"]
            screenshot(page, "rollouts_conversation")
