"""How long does each page take to render with a big run in the database?

Seeds a fresh SQLite file with one run of 5,000 rollouts (100 queries x G=5 x 10 epochs, 100 steps,
with summaries, advantages, operations, one version per step and a ledger row per call) plus two
evaluations, then renders every page with Streamlit's AppTest and prints the time of each page's
first render (the page script only; the app's own first run, which migrates the database, is
timed separately). The target is under 2 s per page. The Production page is timed over production traces
(`--traces`, 5,000 by default: a mix of sent scores, thumbs, labels and judge scores over 30 days, some waiting for
a person) on the demo task's `production` version.

    PYTHONPATH=. .venv/bin/python bench/page_render.py [--rollouts 5000] [--traces 5000] [--repeat 3] [--keep PATH]
        [--browser] [--pages production,...] [--database PATH]

`--database` times an already seeded file (seeded by --keep) instead of seeding one: the same file can then be timed
by an older checkout's copy of this script, for a before and after.

With --browser it also serves the seeded database with `streamlit run` and times, in Debian's
Chromium, from navigating to each page's URL until its script has finished and the page is drawn.

With --busy a worker trains a small run on the embedded model the whole time (timing starts once its
first model call is answered), with --model-threads llama.cpp threads (default: the studio's setting,
cores minus one): the pages must stay fast while a run works.

    PYTHONPATH=. .venv/bin/python bench/page_render.py --browser --busy --model-threads 2   # every core
    PYTHONPATH=. .venv/bin/python bench/page_render.py --browser --busy                     # cores minus one
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["overview", "train", "rollouts", "review", "library", "evaluate", "labeling", "tasks", "people", "audit",
         "production"]
LOREM = ("First I read the question carefully and list each quantity with its unit. Then I decide which "
         "operation the question asks for, compute it step by step, and check the result against the story. ")


def seed(url: str, rollouts: int, group: int = 5, batch: int = 10) -> dict:
    """A run as a real one would leave it; returns what was written."""
    from core.grpo.training import RunSettings, create_run, run_counters
    from core.records.library.versions import create_version
    from core.records.tasks.demos import DEMO_TASK, ensure_demo_task
    from core.records.tasks.lookup import ensure_library
    from storage import queries
    from storage.db import make_engine, session_scope
    from storage.tables import Advantage, Evaluation, LLMCall, Operation, Rollout, Run, Step

    engine = make_engine(url)
    task = ensure_demo_task(engine)
    rng = random.Random(0)
    with session_scope(engine) as session:
        sample_ids = [s.id for s in queries.samples(session, task.id, "train")]
        test_ids = [s.id for s in queries.samples(session, task.id, "test")]
    epochs = max(1, rollouts // (len(sample_ids) * group))
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=epochs, batch_size=batch, group_size=group,
                                                       review_mode="manual"), created_by="bench")
    counts = {"rollouts": 0, "steps": 0, "calls": 0, "versions": 0, "operations": 0}
    with session_scope(engine) as session:
        run = session.get(Run, run_id)
        library = ensure_library(session, task)
        version = queries.latest_version(session, library.id)
        experiences: list[dict] = []
        n_exp = 0
        for epoch in range(epochs):
            for b in range(0, len(sample_ids), batch):
                ids = sample_ids[b:b + batch]
                step = Step(run_id=run_id, epoch=epoch, batch_index=b // batch, sample_ids=ids, status="completed",
                            version_before_id=version.id, reward_mean=rng.random(), reward_std=0.4)
                session.add(step)
                session.flush()
                for sid in ids:
                    rewards = [float(rng.random() < 0.6) for _ in range(group)]
                    for g, reward in enumerate(rewards):
                        text = LOREM * 3 + f"so the answer is \\boxed{{{rng.randint(1, 99)}}}"
                        session.add(Rollout(step_id=step.id, sample_id=sid, group_index=g, response=text,
                                            final_answer=str(rng.randint(1, 99)), reward=reward,
                                            reward_source="verifier", reward_detail="math-verify",
                                            summary=LOREM, tokens_in=400, tokens_out=250, latency_ms=900,
                                            messages=[{"role": "system", "content": LOREM * 2},
                                                      {"role": "user", "content": "question"},
                                                      {"role": "assistant", "content": text}]))
                        session.add(LLMCall(run_id=run_id, stage="rollout", model="local/x", cache_key=f"r{rng.random()}",
                                            response=text, tokens_in=400, tokens_out=250))
                        session.add(LLMCall(run_id=run_id, stage="summary", model="local/x", cache_key=f"s{rng.random()}",
                                            response=LOREM, tokens_in=600, tokens_out=80))
                        counts["rollouts"] += 1
                        counts["calls"] += 2
                    session.add(Advantage(step_id=step.id, sample_id=sid, status="ok" if len(set(rewards)) > 1
                                          else "skipped", text=LOREM, proposals=["Check the units first."]))
                n_exp += 1
                new = {"id": f"E{n_exp}", "text": f"Experience number {n_exp}: re-read what the question asks."}
                experiences = [*experiences[-29:], new]
                session.add(Operation(step_id=step.id, run_id=run_id, op="ADD", text=new["text"], rationale=LOREM,
                                      status="applied"))
                counts["operations"] += 1
                version = create_version(session, library, experiences, parent_id=version.id, source="run",
                                         created_by="bench", run_id=run_id, step_id=step.id)
                step.version_after_id = version.id
                session.add(step)
                counts["steps"] += 1
                counts["versions"] += 1
        run.status, run.current_version_id = "completed", version.id
        run.progress = {"steps_total": counts["steps"], "rollouts_total": counts["rollouts"]}
        session.add(run)
    with session_scope(engine) as session:
        run = session.get(Run, run_id)
        run.progress = {**run.progress, **run_counters(session, run)}
        session.add(run)
        for version_id in (None, version.id):
            ev = Evaluation(task_id=task.id, version_id=version_id, split="test", k=4, status="completed",
                            model="local/x", n=len(test_ids), mean_at_k=0.6, pass_at_k=0.8,
                            metrics={"mean_at_k_ci": [0.5, 0.7], "pass_at_k_ci": [0.7, 0.9], "errors": 0})
            session.add(ev)
            session.flush()
            for sid in test_ids:
                for g in range(4):
                    session.add(Rollout(evaluation_id=ev.id, sample_id=sid, group_index=g, response=LOREM,
                                        final_answer="3", reward=float(rng.random() < 0.6), reward_source="verifier"))
    engine.dispose()
    return counts


def seed_traces(url: str, count: int, days: int = 30) -> int:
    """`count` production traces on the demo task's `production` version, written in batches by one INSERT each."""
    from sqlalchemy import insert

    from core.records.library.versions import import_library, set_label
    from core.records.tasks.demos import DEMO_TASK
    from storage import queries
    from storage.db import make_engine, session_scope
    from storage.tables import Trace

    engine = make_engine(url)
    version = import_library(engine, DEMO_TASK, "- Re-read the question.\n- Check the units.", "bench.md",
                             actor="system")
    set_label(engine, DEMO_TASK, str(version.number), "production", "system")
    rng = random.Random(1)
    now = time.time()
    with session_scope(engine) as session:
        task = queries.task_by_name(session, DEMO_TASK)
        for start in range(0, count, 5000):
            rows = []
            for i in range(start, min(count, start + 5000)):
                kind = rng.random()
                rows.append({
                    "task_id": task.id, "client_id": f"bench-{i}", "library_id": version.library_id,
                    "version_id": version.id, "served_label": "production", "input": f"question {i}: " + LOREM[:120],
                    "output": LOREM[:200], "turns": None, "meta": {}, "segment": rng.choice(["a", "b", None]),
                    "user_id": f"user-{i % 900}", "score": round(rng.random(), 2) if kind < 0.4 else None,
                    "thumbs": rng.choice([1, -1]) if 0.4 <= kind < 0.6 else None,
                    "label_value": 0.75 if 0.6 <= kind < 0.65 else None,
                    "judge_status": "scored" if 0.65 <= kind < 0.8 else None,
                    "judge_score": 0.5 if 0.65 <= kind < 0.8 else None,
                    "label_status": "needed" if kind > 0.95 else None,
                    "created_at": datetime.fromtimestamp(now - rng.random() * days * 86400, UTC),
                    "received_at": datetime.fromtimestamp(now, UTC)})
            session.execute(insert(Trace), rows)
    engine.dispose()
    return count


def time_pages(repeat: int, pages: list[str]) -> list[tuple[str, list[float]]]:
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from storage import db

    results = []
    app = str(ROOT / "streamlit_app.py")
    start = time.perf_counter()
    at = AppTest.from_file(app, default_timeout=120)
    at.run()
    results.append(("app start (migrate, sidebar, overview)", [time.perf_counter() - start]))
    for page in pages:
        times = []
        for _ in range(repeat):
            at = AppTest.from_file(app, default_timeout=120)
            at.run()
            at.switch_page(f"pages/{page}.py")
            start = time.perf_counter()
            at.run()
            times.append(time.perf_counter() - start)
            if at.exception:
                raise SystemExit(f"{page}: {at.exception[0].value}")
            if not at.sidebar.selectbox or at.sidebar.selectbox[0].value is None:
                raise SystemExit(f"{page}: rendered without the sidebar's task")
        results.append((page, times))
    db.get_engine.cache_clear()
    st.cache_resource.clear()
    return results


def time_in_browser(url: str, repeat: int, pages: list[str]) -> list[tuple[str, list[float]]]:
    import subprocess
    import tempfile as tf

    from tests.browser_support import browser_page, free_port, wait_for_app, wait_healthy

    port = free_port()
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    log = open(Path(tf.mkdtemp()) / "streamlit.log", "w")  # noqa: SIM115  (closed below)
    app = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "streamlit_app.py", "--server.headless", "true",
                            "--server.port", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    results = []
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, app)
        with browser_page() as page:
            page.goto(base)
            wait_for_app(page)
            for name in pages:
                times = []
                for _ in range(repeat):
                    start = time.perf_counter()
                    page.goto(f"{base}/{'' if name == 'overview' else name}")
                    wait_for_app(page)
                    times.append(time.perf_counter() - start - 0.3)  # wait_for_app's settling pause
                results.append((name, times))
            for name in pages:  # a click in the sidebar's navigation: what moving between pages costs
                times = []
                for _ in range(repeat):
                    page.goto(f"{base}/{'' if name == 'audit' else 'audit'}")
                    wait_for_app(page)
                    start = time.perf_counter()
                    page.locator("[data-testid='stSidebarNav']").get_by_role(
                        "link", name=name.capitalize(), exact=True).click()
                    page.locator("[data-testid='stMain'] h1", has_text=name.capitalize()).first.wait_for()
                    wait_for_app(page)
                    times.append(time.perf_counter() - start - 0.3)
                results.append((f"{name} (click)", times))
    finally:
        app.terminate()
        app.wait(timeout=20)
        log.close()
    return results


def start_busy_worker(url: str, threads: int | None, timeout: float = 600) -> tuple:
    """A worker on a queued run of the embedded model, once its first call is answered (the model is loaded
    and generating); returns the process and its log."""
    import subprocess

    from sqlmodel import Session, func, select

    from core.grpo.training import RunSettings, create_run
    from core.records.tasks.demos import DEMO_TASK
    from storage.db import make_engine
    from storage.tables import LLMCall

    engine = make_engine(url)
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=5, batch_size=4, group_size=4, limit=8, gate="off",
                                                       max_tokens=512, hold_flagged=False), created_by="bench")
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    if threads:
        env["TFGRPO_THREADS"] = str(threads)
    log = open(Path(tempfile.mkdtemp()) / "worker.log", "w")  # noqa: SIM115  (closed by stop_busy_worker)
    proc = subprocess.Popen([sys.executable, "-m", "core", "worker", "--poll", "0.3"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    start, answered = time.perf_counter(), 0
    while not answered and time.perf_counter() - start < timeout and proc.poll() is None:
        time.sleep(1)
        with Session(engine) as session:
            answered = session.exec(select(func.count()).select_from(LLMCall).where(
                LLMCall.run_id == run_id, LLMCall.cache_hit == False)).one()  # noqa: E712  (SQL)
    if not answered:
        raise SystemExit(f"the busy worker answered no call in {timeout:.0f} s; see {log.name}")
    print(f"run {run_id} in progress on the embedded model (worker pid {proc.pid}, model threads "
          f"{threads or 'default'} of {os.cpu_count()} cores); first call answered after "
          f"{time.perf_counter() - start:.0f} s")
    return proc, log


def stop_busy_worker(proc, log) -> None:
    proc.terminate()
    proc.wait(timeout=60)
    log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--traces", type=int, default=5000, help="production traces of the demo task")
    parser.add_argument("--keep", help="seed this SQLite file and keep it (to open it with `make run`)")
    parser.add_argument("--database", help="time this already seeded SQLite file; nothing is seeded")
    parser.add_argument("--pages", help="only these pages, comma-separated (default: every page)")
    parser.add_argument("--browser", action="store_true", help="also time each page in Chromium (needs it)")
    parser.add_argument("--busy", action="store_true", help="time the pages while a worker trains on the "
                        "embedded model")
    parser.add_argument("--model-threads", type=int, help="llama.cpp threads of the busy worker (TFGRPO_THREADS)")
    args = parser.parse_args()
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    os.environ["TFGRPO_NO_AUTOWORKER"] = "1"
    pages = args.pages.split(",") if args.pages else PAGES
    path = Path(args.database or args.keep or Path(tempfile.mkdtemp()) / "bench.db")
    url = f"sqlite:///{path.resolve()}"
    os.environ["DATABASE_URL"] = url
    if not args.database:
        start = time.perf_counter()
        counts = seed(url, args.rollouts)
        counts["traces"] = seed_traces(url, args.traces)
        print(f"seeded {path} in {time.perf_counter() - start:.1f} s: " + ", ".join(f"{v} {k}" for k, v in counts.items())
              + f"; file {path.stat().st_size / 1e6:.1f} MB")
    busy = start_busy_worker(url, args.model_threads) if args.busy else None
    try:
        print(f"\n| page | first render (s), median of {args.repeat} | max (s) |\n|---|---|---|")
        for page, times in time_pages(args.repeat, pages):
            print(f"| {page} | {statistics.median(times):.3f} | {max(times):.3f} |")
        if args.browser:
            print(f"\n| page | in Chromium: URL (or a click in the navigation) to drawn page (s), median of "
              f"{args.repeat} | max (s) |\n|---|---|---|")
            for page, times in time_in_browser(url, args.repeat, pages):
                print(f"| {page} | {statistics.median(times):.3f} | {max(times):.3f} |")
    finally:
        if busy:
            stop_busy_worker(*busy)


if __name__ == "__main__":
    main()
