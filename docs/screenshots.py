"""Take the manual's pictures (docs/screenshots/*.png) in Debian's Chromium: one of every page of the studio
and of the moments people need to see (MOMENTS), from studios seeded with scripted model replies: runs waiting
for review (three proposed operations; worked examples; a gate's line), a library version evaluated against
production (Promote's confirmation open), support replies waiting for labels, production traces, a model
connection, and, in a second studio with sign-in on, disputed labels, the people and the audit log.

    make screenshots      # about two minutes; no model is loaded

The seeding reuses the browser tests' own helpers, so the pictures show what the tests check.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = ROOT / "docs" / "screenshots"

# Pictures of a moment rather than of a page: the tour page that shows each (tests/test_docs_pictures.py).
MOMENTS = {"worked-example": "review", "gate-line": "review", "promotion-guard": "evaluate", "dispute": "labeling"}
SUPPORT_REPLY = ("Thanks for writing in. I have sent a password reset link to the address on your account; "
                 "it is valid for 30 minutes. If it does not arrive, check the spam folder and reply here.")


def seed_labels(database_url: str) -> None:
    """Support replies scored by people on a 1-5 scale, two queries x G=2, waiting for labels."""
    from sqlmodel import select

    from core.grpo.training import RunSettings, create_run, execute_run
    from core.records.tasks.demos import SUPPORT_TASK
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
    """Open `url` and photograph it (after `before`, which sets up the moment)."""
    page.goto(url)
    _photograph(page, name, before, f"{name}: {url}")


def shoot_in_app(page, link: str, name: str, *, before=None) -> None:
    """Open a page by the sidebar's link (a signed-in session does not survive a new URL) and photograph it."""
    page.locator("[data-testid='stSidebarNav']").get_by_role("link", name=link, exact=True).click()
    _photograph(page, name, before, f"{name}: the {link} page")


def _photograph(page, name: str, before, said: str) -> None:
    from tests.browser_support import wait_for_app

    wait_for_app(page)
    if before is not None:
        before(page)
        wait_for_app(page)
    page.screenshot(path=str(OUT / f"{name}.png"), full_page=False)
    print(said)


def seed_production(database_url: str) -> None:
    """A week of traces from a live agent on the production version."""
    from datetime import UTC, datetime, timedelta

    from core.records.library.versions import import_library, set_label
    from core.records.production.traces import TraceIn, ingest_traces
    from core.records.tasks.demos import DEMO_TASK
    from storage.db import make_engine

    engine = make_engine(database_url)
    production = import_library(engine, DEMO_TASK, "- Re-read the question before answering.", "a.md",
                                actor="system")
    set_label(engine, DEMO_TASK, str(production.number), "production", "system", reason="the pictures' production version")
    now = datetime.now(UTC)
    traces = [TraceIn(id=f"web-{day}-{i}", task=DEMO_TASK, version_id=production.id, segment="web",
                      user_id=f"u{i}", input=f"A shop sold {3 + i} boxes of {day + 4} pens. How many pens?",
                      output=f"{(3 + i) * (day + 4)}", score=(0.4 + 0.08 * day + 0.1 * (i % 3)) % 1,
                      created_at=now - timedelta(days=6 - day)) for day in range(7) for i in range(4)]
    ingest_traces(engine, traces)


def seed_webhook(database_url: str) -> None:
    """A team chat's webhook, added before the runs so their events are queued for it (the picture's receiver
    is a closed port on this machine, so its log shows a retry waiting)."""
    import os

    from core.records.notifications.webhooks import add_endpoint
    from core.settings import get_settings
    from storage.db import make_engine

    os.environ["TFGRPO_WEBHOOK_ALLOWLIST"] = "127.0.0.1"
    get_settings.cache_clear()
    add_endpoint(make_engine(database_url), "team-chat", "http://127.0.0.1:9/hooks/team-chat", "system")


def deliver_once(database_url: str) -> None:
    from core.records.notifications.webhooks import deliver_due
    from storage.db import make_engine

    deliver_due(make_engine(database_url))


def seed_connection(database_url: str) -> None:
    """A model connection to an OpenAI-compatible server (not reached: the picture shows the form)."""
    from core.records.models.connections import add_connection
    from storage.db import make_engine

    add_connection(make_engine(database_url), "team-vllm", "openai", actor="system",
                   base_url="http://vllm.internal:8000/v1", key_env="TEAM_VLLM_KEY")


def seed_example_and_gate(database_url: str) -> tuple[int, int]:
    """Two more runs waiting for review: one whose step proposes worked examples (their cards show the rollout
    each came from), one whose validation gate measured its step (the gate's line above the operations)."""
    from storage.db import make_engine
    from tests.conftest import mixed_rollouts
    from tests.test_ui_worked_examples import right_example
    from tests.ui_support import seeded_run

    engine = make_engine(database_url)
    examples = seeded_run(engine, "manual", settings={"examples": True, "gate": "off"}, rollout=mixed_rollouts(),
                          example=right_example)
    gated = seeded_run(engine, "manual")
    return examples, gated


def main() -> None:
    from core.records.tasks.demos import SUPPORT_TASK
    from storage.db import make_engine
    from tests.browser_support import browser_page, studio, wait_for_app
    from tests.test_browser_context import seed_promotion
    from tests.test_browser_labeling import disputed_rollouts
    from tests.test_browser_review import waiting_review

    OUT.mkdir(parents=True, exist_ok=True)
    with studio(Path(tempfile.mkdtemp()), worker=False) as app:
        seed_webhook(app.database_url)
        run_id = waiting_review(app.database_url)
        seed_promotion(app.database_url)
        seed_labels(app.database_url)
        seed_production(app.database_url)
        seed_connection(app.database_url)
        examples_run, gated_run = seed_example_and_gate(app.database_url)
        deliver_once(app.database_url)
        support = SUPPORT_TASK.replace(" ", "+")
        with browser_page(width=1400, height=1100) as page:
            shoot(page, app.url, "overview")
            shoot(page, f"{app.url}/train?run={run_id}", "train")
            shoot(page, f"{app.url}/review?run={run_id}", "review")
            shoot(page, f"{app.url}/review?run={examples_run}", "worked-example", before=lambda p: (
                p.get_by_text("Compressed from output").first.scroll_into_view_if_needed()))
            shoot(page, f"{app.url}/review?run={gated_run}", "gate-line", before=lambda p: (
                p.get_by_text("validation,").first.scroll_into_view_if_needed()))
            shoot(page, f"{app.url}/rollouts?run={run_id}", "rollouts")
            shoot(page, f"{app.url}/library", "library")
            shoot(page, f"{app.url}/evaluate", "evaluate")
            shoot(page, f"{app.url}/evaluate", "promotion-guard", before=lambda p: (
                p.get_by_role("button", name="Promote to production…").click(),
                p.get_by_text("Confirm: promote").first.scroll_into_view_if_needed()))
            shoot(page, f"{app.url}/labeling?task={support}", "labeling")
            shoot(page, f"{app.url}/production", "production")
            shoot(page, f"{app.url}/models", "models")
            shoot(page, f"{app.url}/notifications", "notifications")
            shoot(page, f"{app.url}/tasks", "tasks", before=lambda p: p.get_by_role("tab", name="Test the reward").click())
    # People, Audit and a dispute need accounts: a second studio where sign-in is on, photographed as an admin.
    # A signed-in session lasts as long as the tab's, so this part moves by the sidebar's links, never by a URL.
    with studio(Path(tempfile.mkdtemp()), worker=False) as app:
        from core.records.people.users import add_user

        disputed_rollouts(app.database_url)
        add_user(make_engine(app.database_url), "ada", "admin", "ada-password")
        with browser_page(width=1400, height=1100) as page:
            page.goto(app.url)
            wait_for_app(page)
            page.get_by_label("User name").fill("ada")
            page.get_by_role("textbox", name="Password").fill("ada-password")
            page.get_by_role("button", name="Sign in").click()
            wait_for_app(page)
            shoot_in_app(page, "Labeling", "dispute", before=lambda p: p.get_by_role("tab", name="Agreement").click())
            shoot_in_app(page, "People", "people")
            shoot_in_app(page, "Audit", "audit")

if __name__ == "__main__":
    main()
