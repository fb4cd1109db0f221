"""Names and model text never load anything (issue 12): a Markdown image in a task name, a label, a sample
and a model's reply must show as text on every page, not make the visitor's browser fetch the image.

The images point at an HTTP server this test runs; after Chromium has opened the pages, the server
must have received no request.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.sync_api import expect

from core.grpo.training import RunSettings, create_run, execute_run
from core.models.gateway import Gateway
from core.records.library.versions import import_library, set_label
from core.records.tasks.samples import add_dataset
from core.records.tasks.task_io import TaskSettings, save_task
from storage.db import make_engine
from storage.statuses import GateRule
from tests.browser_support import browser_page, require_chromium, screenshot, studio, wait_for_app
from tests.conftest import ScriptedModel, default_replies

pytestmark = pytest.mark.browser
PAGES = ("", "tasks", "library", "rollouts", "review", "labeling", "evaluate", "audit")


@contextmanager
def image_server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on a free local port: its base URL and the paths it was asked for."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802  (http.server's name)
            asked.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def seed(database_url: str, base: str) -> str:
    """A task (the first, so the sidebar's), whose name, label, data, library and run outputs hold images."""
    def image(what: str) -> str:
        return f"![{what}]({base}/{what}.png)"

    engine = make_engine(database_url)
    try:
        name = f"Task {image('task')}"
        save_task(engine, TaskSettings(name=name, instructions=f"Answer. {image('instructions')}",
                                       reward_method="exact"), "cli")
        rows = [{"id": f"s{n}", "query": f"What is {n}+{n}? {image('query')}", "reference": str(2 * n)}
                for n in range(1, 5)]
        add_dataset(engine, name, "\n".join(json.dumps(r) for r in rows).encode(), "data.jsonl", actor="cli")
        import_library(engine, name, f"- Check the sum twice before answering. {image('experience')}",
                       f"{image('file')}.md")
        set_label(engine, name, "latest", f"label {image('label')}", "cli")
        run_id = create_run(engine, name, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2,
                                                      validation_size=0, gate=GateRule.OFF))
        model = ScriptedModel({**default_replies(), "rollout": f"{image('reply')} The answer: 2",
                               "summary": f"Summary {image('summary')}"})
        execute_run(engine, run_id, gateway=Gateway(engine, concurrency=2, mock=model, backoff_s=0.001))
        return name
    finally:
        engine.dispose()


def test_markdown_images_in_names_and_outputs_are_never_fetched(tmp_path: Path):
    require_chromium()
    with image_server() as (base, asked):
        name = seed(f"sqlite:///{tmp_path / 'studio.db'}", base)
        with studio(tmp_path, worker=False) as app, browser_page() as page:
            for path in PAGES:
                page.goto(f"{app.url}/{path}")
                wait_for_app(page)
                if path == "tasks":
                    page.get_by_role("tab", name="Data").click()
                    wait_for_app(page)
                page.wait_for_timeout(500)  # time for an image request to arrive
                screenshot(page, f"names-{path or 'overview'}")
                assert asked == [], (path, asked)
                expect(page.locator("[data-testid='stException']"), f"an error on /{path}").to_have_count(0)
                if path == "":
                    page.get_by_text(f"{name} · default", exact=True).wait_for()  # the heading, as typed
