"""Shared fixtures: a real database per test (a SQLite file, or a PostgreSQL database when
TFGRPO_TEST_DATABASE_URL names a server), the demo task, and scripted model replies."""

from __future__ import annotations

import functools
import itertools
import json
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import streamlit as st
from cryptography.fernet import Fernet

import core.records.subscribers  # noqa: F401  (as every entry point: core/records/subscribers.py)
from core.models.gateway import Gateway
from core.records.tasks.demo_data import demo_rows
from core.records.tasks.demos import ensure_demo_task, ensure_demo_tasks
from core.settings import engine as settings_engine
from storage import db
from storage.db import make_engine

TEST_DATABASE_ENV = "TFGRPO_TEST_DATABASE_URL"
# Stored webhook secrets are encrypted (core.secrets): one key for the session and the processes it starts, so no
# test writes a key file into the project.
os.environ.setdefault("TFGRPO_SECRET_KEY", Fernet.generate_key().decode())


def _scan_installed_components_once() -> None:
    """Each new AppTest scans every installed distribution's metadata for Streamlit components (0.37 s: 106 s of
    the fast suite's 690 s under cProfile, for 292 AppTests); the installed packages do not change during a test
    session, so the first scan's answer serves the rest. A `streamlit run` process scans once at its start."""
    from streamlit.components.v2 import manifest_scanner

    manifest_scanner.scan_component_manifests = functools.cache(manifest_scanner.scan_component_manifests)


_scan_installed_components_once()


def pytest_configure(config):
    config.addinivalue_line("markers", "sqlite_only: the test needs SQLite by design (a file, PRAGMAs); it is "
                                       f"skipped when {TEST_DATABASE_ENV} puts the suite on PostgreSQL")
    config.addinivalue_line("markers", f"postgres: the test needs the PostgreSQL server of {TEST_DATABASE_ENV} "
                                       "(skipped without it, a failure in CI; `make test-sqlite` deselects it)")
    config.addinivalue_line("markers", "every_backend: a page test (AppTest) that also runs on PostgreSQL; the "
                                       "other page tests run on SQLite only (a page reaches the database only "
                                       "through core, whose database tests run on both)")


def runs_on_postgres(item) -> bool:
    """Whether a backend can change this test's outcome: it is given a database by the fixtures here
    (`postgres_databases` is in its closure) or is marked `postgres`. A page test (AppTest, the `app_db`
    fixture) counts only when marked `every_backend`: one test draws every page over seeded data on PostgreSQL,
    the others prove what a page shows, which the database under core does not change."""
    if item.get_closest_marker("postgres") is not None:
        return True
    fixtures = getattr(item, "fixturenames", ())
    if "app_db" in fixtures or "empty_app_db" in fixtures:
        return item.get_closest_marker("every_backend") is not None
    return "postgres_databases" in fixtures


def pytest_collection_modifyitems(config, items):
    """On PostgreSQL, run only the tests a database backend can change (`runs_on_postgres`). The rest ran
    unchanged in the SQLite suite just before: running them twice only cost CI time."""
    if not os.environ.get(TEST_DATABASE_ENV, "").strip():
        return
    skip = pytest.mark.skip(reason=f"sqlite_only: needs SQLite by design; runs in the SQLite suite, not with "
                                   f"{TEST_DATABASE_ENV}")
    kept, backend_free = [], []
    for item in items:
        if not runs_on_postgres(item):
            backend_free.append(item)
            continue
        if item.get_closest_marker("sqlite_only") is not None:
            item.add_marker(skip)
        kept.append(item)
    if backend_free:
        config.hook.pytest_deselected(items=backend_free)
        items[:] = kept


def server_url_for_tests():
    """TFGRPO_TEST_DATABASE_URL parsed (a PostgreSQL server URL whose role may CREATE DATABASE), or None."""
    raw = os.environ.get(TEST_DATABASE_ENV, "").strip()
    if not raw:
        return None
    from sqlalchemy.engine import make_url

    url = make_url(raw)
    if url.get_backend_name() != "postgresql":
        raise pytest.UsageError(f"{TEST_DATABASE_ENV} must be a PostgreSQL URL (postgresql+psycopg://...), "
                                f"not {url.drivername}")
    return url


class PostgresDatabases:
    """One template database migrated once per session; each test gets `CREATE DATABASE ... TEMPLATE` of it,
    dropped at teardown (WITH (FORCE): a worker process or an engine a test left open does not block it).

    Cloning and dropping cost the server ~0.1 s a test, so a thread does both beside the tests: it keeps
    AHEAD clones ready and drops the used ones while the next test runs."""

    AHEAD = 2

    def __init__(self, server) -> None:
        from sqlalchemy import create_engine, pool

        self.server = server
        # Durability is not wanted from throwaway databases: commits do not wait for the disk.
        options = " ".join(filter(None, [server.query.get("options", ""), "-c synchronous_commit=off"]))
        self.base = server.update_query_dict({"options": options})
        self.admin = create_engine(self.base.set(database=server.database or "postgres"),
                                   poolclass=pool.NullPool, isolation_level="AUTOCOMMIT")
        self.prefix = f"tfgrpo_test_{os.getpid()}"
        self.template = f"{self.prefix}_template"
        self.counter = itertools.count(1)
        self._drop(self.template)
        self._execute(f'CREATE DATABASE "{self.template}"')
        engine = make_engine(self.url(self.template))
        engine.dispose()  # the template must have no connection while it is cloned
        self._ready: queue.Queue[str] = queue.Queue()
        self._used: queue.Queue[str] = queue.Queue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="postgres-test-databases", daemon=True)
        self._thread.start()

    def url(self, name: str) -> str:
        return self.base.set(database=name).render_as_string(hide_password=False)

    def _execute(self, sql: str) -> None:
        with self.admin.connect() as connection:
            connection.exec_driver_sql(sql)

    def _drop(self, name: str) -> None:
        """Drop, retrying while an autovacuum worker holds the database: PostgreSQL 15 refuses a role that
        is not in pg_signal_backend the right to terminate one ("must be a member of the role whose process
        is being terminated"), and the worker is gone a moment later."""
        from sqlalchemy.exc import ProgrammingError

        for attempt in itertools.count():
            try:
                self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                return
            except ProgrammingError as error:
                if "role whose process is being terminated" not in str(error) or attempt >= 50:
                    raise
                time.sleep(0.2)

    def _clone(self) -> str:
        name = f"{self.prefix}_{next(self.counter)}"
        self._drop(name)
        self._execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return name

    def _work(self) -> None:
        try:
            while not self._stop.is_set():
                self._wake.clear()
                if self._ready.qsize() < self.AHEAD:
                    self._ready.put(self._clone())
                elif not self._used.empty():
                    self._drop(self._used.get())
                else:
                    self._wake.wait(0.5)
        except BaseException as error:  # noqa: BLE001  (handed to the test that waits for a database)
            self._error = error

    def create(self) -> str:
        """The name of a fresh clone of the template, this caller's own until it calls drop()."""
        while True:
            try:
                name = self._ready.get(timeout=0.2)
            except queue.Empty:
                if self._error is not None or not self._thread.is_alive():
                    raise RuntimeError("could not clone the PostgreSQL test template") from self._error
                continue
            self._wake.set()
            return name

    def create_empty(self) -> str:
        """The name of a new database with no tables (for tests of migrating one)."""
        name = f"{self.prefix}_empty_{next(self.counter)}"
        self._drop(name)
        self._execute(f'CREATE DATABASE "{name}"')
        return name

    def drop(self, name: str) -> None:
        """Drop a database of create() or create_empty() (beside the next test, by the thread)."""
        self._used.put(name)
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=60)
        for pending in (self._ready, self._used):
            while not pending.empty():
                self._drop(pending.get())
        self._drop(self.template)
        self.admin.dispose()


@pytest.fixture(scope="session", autouse=True)
def model_servers_of_this_session(request) -> Iterator[None]:
    """The model tests share one embedded-model server per model for the whole session (the first call
    starts it, core.models.model_server; apps and workers the tests start find the same one), and the
    session stops what it started, so no server outlives the suite. A session without model tests stops
    nothing: `make test` runs the model tests in a session beside it, and their server is not its own."""
    from core.models import model_server
    from core.models.local_model import MODELS

    if not any(item.get_closest_marker("model") for item in request.session.items):
        yield
        return
    before = {name: model_server.read_record(name) for name in MODELS}
    yield
    for name in MODELS:
        record = model_server.read_record(name)
        if record is not None and (before[name] is None or before[name].supervisor_pid != record.supervisor_pid):
            model_server.stop(name)


@pytest.fixture(scope="session")
def postgres_databases() -> Iterator[PostgresDatabases | None]:
    """The PostgreSQL server of TFGRPO_TEST_DATABASE_URL ready to hand out migrated databases, or None."""
    server = server_url_for_tests()
    if server is None:
        yield None
        return
    databases = PostgresDatabases(server)
    yield databases
    databases.close()


@pytest.fixture
def database_url(request, postgres_databases, migrated_db, tmp_path) -> Iterator[str]:
    """The URL of a fresh database at the newest revision, this test's own: a copy of the migrated SQLite
    file (already holding the demo task where the test asks for `demo_task`), or with TFGRPO_TEST_DATABASE_URL a
    clone of the PostgreSQL template."""
    if postgres_databases is None:
        template = request.getfixturevalue("demo_task_db") if "demo_task" in request.fixturenames else migrated_db
        yield copy_of_migrated_db(template, tmp_path / "studio.db")
        return
    name = postgres_databases.create()
    try:
        yield postgres_databases.url(name)
    finally:
        postgres_databases.drop(name)


@pytest.fixture(autouse=True)
def cheap_password_hashes(request, monkeypatch):
    """scrypt at N=2^10 in-process (N=2^17 costs ~0.4 s a hash); tests marked real_hash_cost keep the real one."""
    if request.node.get_closest_marker("real_hash_cost") is None:
        from core.records.people import passwords

        monkeypatch.setattr(passwords, "SCRYPT_N", 2**10)


@pytest.fixture
def jail():
    """Tests that run model-written code need the bubblewrap jail: outside CI a machine without it skips
    them with what to install; in CI (CI=1, where .ci/run installs bubblewrap) that is a failure."""
    import os

    from core.domain.sandbox import jail_status

    status = jail_status()
    if not status.available:
        if os.environ.get("CI"):
            pytest.fail(f"the code jail is missing in CI: {status.message}")
        pytest.skip(status.message)


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory) -> Path:
    """A SQLite file migrated to the newest revision once per session; each test gets a copy of it
    (running every migration per test was about half the fast suite's time)."""
    return settled_sqlite_file(tmp_path_factory.mktemp("template") / "migrated.db")


@pytest.fixture(scope="session")
def demo_db(migrated_db, tmp_path_factory) -> Path:
    """The migrated SQLite template with the built-in demo tasks in it, made once per session for the page
    tests: the app creates them at its start, which each AppTest would otherwise pay again."""
    path = tmp_path_factory.mktemp("template") / "demo.db"
    shutil.copyfile(migrated_db, path)
    return settled_sqlite_file(path, seed=ensure_demo_tasks)


@pytest.fixture(scope="session")
def demo_task_db(migrated_db, tmp_path_factory) -> Path:
    """The migrated SQLite template with the arithmetic demo task in it, for the tests that ask for `demo_task`:
    creating it (200 samples, the library, the audit row) cost each of some 700 tests 40 ms more than finding it."""
    path = tmp_path_factory.mktemp("template") / "demo-task.db"
    shutil.copyfile(migrated_db, path)
    return settled_sqlite_file(path, seed=ensure_demo_task)


def settled_sqlite_file(path: Path, *, seed: Callable | None = None) -> Path:
    """`path` migrated to the newest revision (with what `seed(engine)` adds: `ensure_demo_tasks` leaves it as
    `python -m core demo` does), its write-ahead log folded in, so that it is one complete file to copy."""
    engine = make_engine(f"sqlite:///{path}")
    if seed is not None:
        seed(engine)
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()  # the last connection closes: SQLite folds the WAL into the file and deletes it
    assert not Path(f"{path}-wal").exists(), "the template must be one complete file to copy"
    return path


def copy_of_migrated_db(template: Path, path: Path) -> str:
    """Copy the migrated template to `path`; returns its SQLAlchemy URL."""
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def engine(database_url):
    """A fresh, migrated database of this test's own (already at the newest revision: no upgrade).
    A child process or a second engine needs `url_with_password(engine)`: str(engine.url) masks it."""
    engine = make_engine(database_url, migrate=False)
    yield engine
    engine.dispose()


@pytest.fixture
def unreachable_model(monkeypatch) -> tuple[str, str]:
    """A model that passes the model check and whose every call fails at once: `openai/m` at a closed loopback
    port, with no retries (TFGRPO_MAX_RETRIES=0 here and in child processes started from this environment)."""
    import socket

    from core.settings import get_settings

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("TFGRPO_MAX_RETRIES", "0")
    get_settings.cache_clear()
    yield "openai/m", f"http://127.0.0.1:{port}/v1"
    get_settings.cache_clear()


@pytest.fixture
def demo_task(engine):
    return ensure_demo_task(engine)


def _app_database(postgres_databases, template: Path, tmp_path: Path, monkeypatch) -> Iterator:
    """DATABASE_URL on a fresh database for the Streamlit app (a copy of the SQLite `template`, or a PostgreSQL
    database with TFGRPO_TEST_DATABASE_URL), with its per-process caches cleared."""
    from core.settings import get_settings
    from tests.ui_support import ROOT

    monkeypatch.chdir(ROOT)
    name = None
    if postgres_databases is None:
        url = copy_of_migrated_db(template, tmp_path / "ui.db")
    else:
        name = postgres_databases.create()
        url = postgres_databases.url(name)
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("TFGRPO_NO_AUTOWORKER", "1")
    get_settings.cache_clear()  # settings are read once per process: read these two variables anew
    db.get_engine.cache_clear()
    st.cache_resource.clear()
    engine = settings_engine()
    yield engine
    engine.dispose()
    get_settings.cache_clear()
    db.get_engine.cache_clear()
    st.cache_resource.clear()
    if name is not None:
        postgres_databases.drop(name)


@pytest.fixture
def app_db(postgres_databases, demo_db, tmp_path, monkeypatch):
    """The app's database, on SQLite already holding the demo tasks the app creates at its start."""
    yield from _app_database(postgres_databases, demo_db, tmp_path, monkeypatch)


@pytest.fixture
def empty_app_db(postgres_databases, migrated_db, tmp_path, monkeypatch):
    """The app's database with no task at all, for what the app does on its first start."""
    yield from _app_database(postgres_databases, migrated_db, tmp_path, monkeypatch)


@pytest.fixture
def app_engine(app_db):
    """The app's database with the demo task in it."""
    ensure_demo_task(app_db)
    return app_db


AGENT_STAGES = ("gate", "attribution")


class ScriptedModel:
    """Replies by stage, recording every request it sees; a reply may be an exception to raise.

    `replies[stage]` is a string, a callable (messages) -> str | Exception, or a list consumed in order.
    """

    def __init__(self, replies: dict[str, object]) -> None:
        self.replies = replies
        self.calls: list[tuple[str, list[dict]]] = []

    def __call__(self, stage: str, messages: list[dict]) -> str | Exception:
        self.calls.append((stage, messages))
        # A gate's or an attribution's agent calls answer like rollouts unless a test scripts them apart.
        reply = self.replies[stage if stage in self.replies or stage not in AGENT_STAGES else "rollout"]
        if isinstance(reply, list):
            reply = reply.pop(0) if len(reply) > 1 else reply[0]
        if callable(reply) and not isinstance(reply, Exception):
            reply = reply(messages)
        return reply

    def count(self, stage: str) -> int:
        return sum(1 for s, _ in self.calls if s == stage)


def per_query(answer: Callable[[str, int], str]) -> Callable[[list[dict]], str]:
    """Rollout replies from `answer(query, n)`, n counting that query's attempts from 1."""
    seen: dict[str, int] = {}

    def reply(messages: list[dict]) -> str:
        query = messages[1]["content"]
        seen[query] = seen.get(query, 0) + 1
        return answer(query, seen[query])

    return reply


def mixed_rollouts() -> Callable[[list[dict]], str]:
    """Rollout replies that alternate right and wrong per query, so every group of G >= 2 is mixed."""
    references = {row.query: row.reference for row in demo_rows()}
    return per_query(lambda query, n: "Step by step... so the answer is "
                                      f"\\boxed{{{references[query] if n % 2 else '-12345'}}}")


def default_replies() -> dict[str, object]:
    return {
        "rollout": "I add the numbers. \\boxed{0}",
        "summary": "The attempt added the numbers and boxed the result.",
        "advantage": json.dumps({"analysis": "Better attempts re-read the question.",
                                 "experiences": ["Re-read the question to find which quantity it asks for."]}),
        "update": json.dumps({"operations": [
            {"op": "ADD", "ids": [], "text": "Re-read the question to find which quantity it asks for.",
             "rationale": "failed attempts answered the wrong quantity"}]}),
        "direct": json.dumps({"experiences": ["Write down each quantity with its unit.",
                                              "Check the final answer against the question."]}),
    }


@pytest.fixture
def scripted() -> Callable[..., tuple[ScriptedModel, Gateway]]:
    def make(engine, **overrides) -> tuple[ScriptedModel, Gateway]:
        model = ScriptedModel({**default_replies(), **overrides})
        return model, Gateway(engine, concurrency=4, mock=model, backoff_s=0.001)

    return make
