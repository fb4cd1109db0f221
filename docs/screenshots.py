"""Take the README's screenshots (docs/screenshots/*.png) in Debian's Chromium, from a studio seeded with
scripted model replies: a run waiting for review with three proposed operations, a library version
evaluated against production (Promote's confirmation open), and support replies waiting for labels.

    PYTHONPATH=. .venv/bin/python docs/screenshots.py      # about a minute; no model is loaded

The seeding reuses the browser tests' own helpers, so the pictures show what the tests check.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = ROOT / "docs" / "screenshots"
SUPPORT_REPLY = ("Thanks for writing in. I have sent a password reset link to the address on your account; "
                 "it is valid for 30 minutes. If it does not arrive, check the spam folder and reply here.")


def seed_labels(database_url: str) -> None:
    """Support replies scored by people on a 1-5 scale, two queries x G=2, waiting for labels."""
    from sqlmodel import select

    from core.grpo.training import RunSettings, create_run, execute_run
    from core.records.tasks import SUPPORT_TASK
    from storage.db import make_engine, session_scope
    from storage.tables import Task
    from tests.ui_support import scripted_gateway

    engine = make_engine(database_url)
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == SUPPORT_TASK)).one()
        task.reward_method, task.reward_settings = "human", {"scale": "1-5"}
        session.add(task)
    run_id = create_run(engine, SUPPORT_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2),
                        created_by="cli")
    _model, gateway = scripted_gateway(engine, rollout=SUPPORT_REPLY)
    assert execute_run(engine, run_id, gateway=gateway).status == "awaiting_labels"


def shoot(page, url: str, name: str, *, before=None) -> None:
    from tests.browser_support import wait_for_app

    page.goto(url)
    wait_for_app(page)
    if before is not None:
        before(page)
        wait_for_app(page)
    page.screenshot(path=str(OUT / f"{name}.png"), full_page=False)
    print(f"{name}: {url}")


def main() -> None:
    from core.records.tasks import SUPPORT_TASK
    from tests.browser_support import browser_page, studio
    from tests.test_browser_context import seed_promotion
    from tests.test_browser_review import waiting_review

    OUT.mkdir(parents=True, exist_ok=True)
    with studio(Path(tempfile.mkdtemp()), worker=False) as app:
        run_id = waiting_review(app.database_url)
        seed_promotion(app.database_url)
        seed_labels(app.database_url)
        support = SUPPORT_TASK.replace(" ", "+")
        with browser_page(width=1400, height=1100) as page:
            shoot(page, app.url, "overview")
            shoot(page, f"{app.url}/train?run={run_id}", "train")
            shoot(page, f"{app.url}/review?run={run_id}", "review")
            shoot(page, f"{app.url}/rollouts?run={run_id}", "rollouts")
            shoot(page, f"{app.url}/library", "library")
            shoot(page, f"{app.url}/evaluate", "evaluate", before=lambda p: (
                p.get_by_role("button", name="Promote to production…").click(),
                p.get_by_text("Confirm: promote").first.scroll_into_view_if_needed()))
            shoot(page, f"{app.url}/labeling?task={support}", "labeling")
            shoot(page, f"{app.url}/tasks", "tasks", before=lambda p: p.get_by_role("tab", name="Test the reward").click())


if __name__ == "__main__":
    main()
