"""A live studio for browser tests: `streamlit run` headless plus a worker on a temporary database,
and Debian's Chromium driven by Playwright.

Outside CI a machine without /usr/bin/chromium skips these tests with the reason; in CI (CI=1, set
by .ci/run) a missing browser is a failure, because `.ci/run` installs it.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "tests" / "artifacts"
# How long a browser test waits for what a page should show: a rerun takes under a second on a quiet machine, but
# make test runs the browser tests beside the fast suite on two cores, where a page took over 30 s in a full run.
PATIENCE_MS = 90_000
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def require_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing in CI: .ci/run should have installed Debian's chromium")
    pytest.skip(f"no {CHROMIUM} on this machine (apt-get install chromium); browser tests need it")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} not healthy after {timeout} s")


@dataclass
class Studio:
    url: str
    database_url: str
    logs: Path


@functools.cache
def demo_database() -> Path:
    """A SQLite file migrated and holding the demo tasks, as `python -m core demo` leaves it (the same core
    function), made once per test process: each studio starts from a copy instead of a 15 s subprocess.
    tests/test_cli.py checks the `demo` command itself."""
    from core.records.tasks.demos import ensure_demo_tasks
    from tests.conftest import settled_sqlite_file

    folder = tempfile.mkdtemp(prefix="tfgrpo-demo-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return settled_sqlite_file(Path(folder) / "demo.db", seed=ensure_demo_tasks)


@contextmanager
def studio(tmp_path: Path, *, worker: bool = True, extra_env: dict | None = None,
           port: int | None = None) -> Iterator[Studio]:
    """Streamlit (and a worker) on tmp_path/studio.db: a copy of the demo database, or a database a test seeded
    there first with the demo tasks added (as `python -m core demo` does); both stopped afterwards, their logs kept
    in tmp_path. `port` when the test must know it beforehand (a redirect address), else a free one."""
    if (tmp_path / "studio.db").exists():
        from core.records.tasks.demos import ensure_demo_tasks
        from tests.conftest import settled_sqlite_file

        settled_sqlite_file(tmp_path / "studio.db", seed=ensure_demo_tasks)
    else:
        shutil.copyfile(demo_database(), tmp_path / "studio.db")
    database_url = f"sqlite:///{tmp_path / 'studio.db'}"
    port = port or free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(ROOT), "TFGRPO_NO_AUTOWORKER": "1",
           "TFGRPO_WORKER_LOG": str(tmp_path / "worker.log"), **(extra_env or {})}
    procs = []
    logs = tmp_path
    with open(tmp_path / "streamlit.log", "w") as app_log, open(tmp_path / "worker.log", "w") as worker_log:
        if worker:
            procs.append(subprocess.Popen([sys.executable, "-m", "core", "worker", "--poll", "0.5"], cwd=ROOT,
                                          env=env, stdout=worker_log, stderr=subprocess.STDOUT))
        app = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "streamlit_app.py", "--server.headless",
                                "true", "--server.port", str(port), "--server.address", "127.0.0.1",
                                "--browser.gatherUsageStats", "false"], cwd=ROOT, env=env, stdout=app_log,
                               stderr=subprocess.STDOUT)
        procs.append(app)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, app)
            yield Studio(url=url, database_url=database_url, logs=logs)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()


@contextmanager
def browser_page(width: int = 1400, height: int = 1700):
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=PATIENCE_MS)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(PATIENCE_MS)
            yield page
        finally:
            browser.close()


def wait_for_app(page) -> None:
    """Until the page's title is drawn and Streamlit has finished running the script.

    The app's own run state (`data-test-script-state` on stApp) turns to `rerunRequested` as soon as a
    widget changes, before the status widget shows anything, so a check right after a click cannot pass
    on the old page: on a busy machine the status widget alone let tests read a page not yet redrawn.
    Elements of the previous run stay in the page, marked stale, until the new run has drawn past them; a
    widget that moved (a form below a table that grew) is then there twice, so stale elements must be gone."""
    page.wait_for_selector("[data-testid='stMain'] h1", timeout=PATIENCE_MS)
    page.wait_for_function(
        "() => { const app = document.querySelector('[data-testid=\"stApp\"]');"
        " const state = app && app.getAttribute('data-test-script-state');"
        " if (['running', 'rerunRequested', 'stopRequested'].includes(state)) return false;"
        " if (document.querySelector('[data-testid=\"stElementContainer\"][data-stale=\"true\"]')) return false;"
        " const w = document.querySelector('[data-testid=\"stStatusWidget\"]');"
        " return !w || !(w.innerText.includes('Running') || w.innerText.includes('Stop')); }",
        timeout=PATIENCE_MS)
    page.wait_for_timeout(300)


# What has the keyboard's focus, for a failure's message: tag and first line of its text, value or label.
FOCUSED = """() => { const el = document.activeElement;
    const text = (el && (el.innerText || el.value || el.getAttribute('aria-label'))) || '';
    return el ? `${el.tagName} ${text.trim().split('\\n')[0]}` : ''; }"""


def expect_focus_in(page, css: str) -> None:
    """Until the keyboard's focus is on the element `css` or inside it (awaited: a Tab's focus can move on
    while the page redraws); a failure names what has the focus instead."""
    from playwright.sync_api import expect

    try:
        expect(page.locator(f"{css}:focus-within")).to_have_count(1)
    except AssertionError as error:
        raise AssertionError(f"the focus is not in {css} but on {page.evaluate(FOCUSED)!r}") from error


def expect_address(page, query: dict[str, str]) -> None:
    """Until the page's address holds exactly these query parameters, in any order; a failure names the address."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function("wanted => { const q = new URLSearchParams(location.search);"
                               " return [...q.keys()].length === Object.keys(wanted).length"
                               " && Object.entries(wanted).every(([k, v]) => q.get(k) === v); }", arg=query)
    except PlaywrightTimeout as error:
        raise AssertionError(f"the address is {page.url}, not the query {query}") from error


def expect_stored(read, expected, timeout_s: float = PATIENCE_MS / 1000):
    """Until `read()` returns `expected`: what a click stores is awaited like what it shows, since the click's
    rerun may not have reached the server yet when the page reads idle (a fresh-clone CI run under load)."""
    deadline = time.monotonic() + timeout_s
    while (found := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    assert found == expected, f"stored {found!r}, not {expected!r}, after {timeout_s:.0f} s"


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
