"""How long do the command line, the HTTP API and the app take to start? (issues 35 and 37)

Times, as a person runs them, an empty Python start (`python -c pass`, the floor), `python -m core --help`,
a command that reads the database (`runs`, on a temporary SQLite file the demo tasks were loaded into
beforehand) and a worker that starts, finds the queue empty and exits (`worker --once`); then the two servers
on the same file (DATABASE_URL), each from its start until its health route answers 200, after which it is
stopped (SIGTERM, as Ctrl-C stops it): the HTTP API (`python -m api --port P`, until GET /v1/health) and the
app (`streamlit run streamlit_app.py --server.headless true --server.port P`, until /_stcore/health, which
answers before any page has run: the page's own imports come at the first visit). With `--browser`, the app
is also timed from its start until its first page is drawn in Chromium (/usr/bin/chromium through Playwright:
the Overview's title shown and the script finished), the browser itself started beforehand and not counted.
The app runs with TFGRPO_NO_AUTOWORKER=1, so no page starts a worker.

Each is run `--runs` times; the table gives the median, the fastest and the slowest wall time, and the load
average before and after, since on a busy machine every figure grows.

    PYTHONPATH=. .venv/bin/python bench/cli_start.py [--runs 5] [--browser]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
START_TIMEOUT_S = 300
# The first page is drawn: its title is on the page and Streamlit has finished running the script.
PAGE_DRAWN = ("() => { const app = document.querySelector('[data-testid=\"stApp\"]');"
              " const state = app && app.getAttribute('data-test-script-state');"
              " return !!document.querySelector('[data-testid=\"stMain\"] h1')"
              " && !['running', 'rerunRequested', 'stopRequested'].includes(state); }")


def wall_time(argv: list[str]) -> float:
    """Seconds from start to exit of one process; a failure stops the benchmark with its output."""
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}")
    return elapsed


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def server_times(argv: list[str], url: str, health: str, env: dict[str, str], log: Path,
                 then: Callable[[str], None] | None = None) -> list[float]:
    """Start a server that listens on `url`; seconds until `url + health` answers 200, and (given `then`,
    called with `url`) until `then` returns, both counted from the start. The server is stopped with SIGTERM
    afterwards (killed if it has not stopped 30 s later); a server that exits or never answers stops the
    benchmark with its log."""
    with open(log, "w") as output:
        started = time.perf_counter()
        server = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)
        try:
            while not answers(url + health):
                if server.poll() is not None or time.perf_counter() - started > START_TIMEOUT_S:
                    why = f"exited {server.returncode}" if server.returncode is not None else "never answered"
                    raise SystemExit(f"{' '.join(argv)} {why}:\n{log.read_text()}")
                time.sleep(0.05)
            times = [time.perf_counter() - started]
            if then is not None:
                then(url)
                times.append(time.perf_counter() - started)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
                print(f"note: {argv[1:4]} did not stop within 30 s of SIGTERM; killed", file=sys.stderr)
    return times


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command (default 5)")
    parser.add_argument("--browser", action="store_true", help=f"also time the app until its first page is drawn "
                        f"in Chromium ({CHROMIUM}, Playwright)")
    args = parser.parse_args()
    if args.browser and not Path(CHROMIUM).exists():
        raise SystemExit(f"--browser needs {CHROMIUM} (apt-get install chromium)")
    core = [sys.executable, "-m", "core"]
    with tempfile.TemporaryDirectory() as folder:
        database_url = f"sqlite:///{Path(folder) / 'studio.db'}"
        db = ["--db", database_url]
        wall_time(core + db + ["demo"])  # migrates the new file and loads the demo tasks: not timed
        commands = {"python -c pass": [sys.executable, "-c", "pass"],
                    "python -m core --help": core + ["--help"],
                    "python -m core runs": core + db + ["runs"],
                    "python -m core worker --once": core + db + ["worker", "--once"]}
        env = {**os.environ, "DATABASE_URL": database_url, "TFGRPO_NO_AUTOWORKER": "1"}
        env.pop("TFGRPO_DATABASE_URL", None)
        before = load()
        rows = [(name, [wall_time(argv) for _ in range(args.runs)]) for name, argv in commands.items()]
        api = []
        for _ in range(args.runs):
            port = free_port()
            api += server_times([sys.executable, "-m", "api", "--port", str(port)], f"http://127.0.0.1:{port}",
                                "/v1/health", env, Path(folder) / "api.log")
        rows.append(("python -m api (until /v1/health)", api))
        app_health, app_drawn = [], []
        with browser_session(args.browser) as draw:
            for _ in range(args.runs):
                port = free_port()
                times = server_times([sys.executable, "-m", "streamlit", "run", "streamlit_app.py",
                                      "--server.headless", "true", "--server.port", str(port),
                                      "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
                                     f"http://127.0.0.1:{port}", "/_stcore/health", env, Path(folder) / "app.log",
                                     then=draw)
                app_health.append(times[0])
                app_drawn += times[1:]
        rows.append(("streamlit run (until /_stcore/health)", app_health))
        if app_drawn:
            rows.append(("streamlit run (until a page is drawn)", app_drawn))
        after = load()
    print(f"{'command':<40}{'median s':>10}{'min s':>8}{'max s':>8}  ({args.runs} runs each)")
    for name, times in rows:
        print(f"{name:<40}{statistics.median(times):>10.2f}{min(times):>8.2f}{max(times):>8.2f}")
    print(f"load average (1, 5, 15 min): {before} before, {after} after; {os.cpu_count()} cores")


@contextmanager
def browser_session(wanted: bool) -> Iterator[Callable[[str], None] | None]:
    """Chromium started once (not timed): a function that opens a fresh page on the app's address and returns
    when its first page is drawn; None without --browser."""
    if not wanted:
        yield None
        return
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)

        def draw(url: str) -> None:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                page.goto(url, timeout=START_TIMEOUT_S * 1000)
                page.wait_for_function(PAGE_DRAWN, timeout=START_TIMEOUT_S * 1000, polling=50)
            finally:
                page.close()

        try:
            yield draw
        finally:
            browser.close()


if __name__ == "__main__":
    main()
