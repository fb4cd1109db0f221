"""Shared fixtures: a real SQLite file per test, the demo task, and scripted model replies."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import streamlit as st

from core.datasets import demo_rows
from core.gateway import Gateway
from core.settings import engine as settings_engine
from core.tasks import ensure_demo_task
from storage import db
from storage.db import make_engine


@pytest.fixture(autouse=True)
def cheap_password_hashes(request, monkeypatch):
    """scrypt at N=2^10 in-process (N=2^17 costs ~0.4 s a hash); tests marked real_hash_cost keep the real one."""
    if request.node.get_closest_marker("real_hash_cost") is None:
        from core import people

        monkeypatch.setattr(people, "SCRYPT_N", 2**10)


@pytest.fixture
def jail():
    """Tests that run model-written code need the bubblewrap jail: outside CI a machine without it skips
    them with what to install; in CI (CI=1, where .ci/run installs bubblewrap) that is a failure."""
    import os

    from core.sandbox import jail_status

    status = jail_status()
    if not status.available:
        if os.environ.get("CI"):
            pytest.fail(f"the code jail is missing in CI: {status.message}")
        pytest.skip(status.message)


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory) -> Path:
    """A SQLite file migrated to the newest revision once per session; each test gets a copy of it
    (running every migration per test was about half the fast suite's time)."""
    path = tmp_path_factory.mktemp("template") / "migrated.db"
    template = make_engine(f"sqlite:///{path}")
    with template.connect() as connection:
        connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    template.dispose()  # the last connection closes: SQLite folds the WAL into the file and deletes it
    assert not Path(f"{path}-wal").exists(), "the template must be one complete file to copy"
    return path


def copy_of_migrated_db(template: Path, path: Path) -> str:
    """Copy the migrated template to `path`; returns its SQLAlchemy URL."""
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def engine(migrated_db, tmp_path):
    """A fresh, migrated SQLite file of this test's own (already at the newest revision: no upgrade)."""
    return make_engine(copy_of_migrated_db(migrated_db, tmp_path / "studio.db"), migrate=False)


@pytest.fixture
def demo_task(engine):
    return ensure_demo_task(engine)


@pytest.fixture
def app_db(migrated_db, tmp_path, monkeypatch):
    """DATABASE_URL on a fresh SQLite file for the Streamlit app, with its per-process caches cleared."""
    from core.settings import get_settings
    from tests.ui_support import ROOT

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("DATABASE_URL", copy_of_migrated_db(migrated_db, tmp_path / "ui.db"))
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


def mixed_rollouts() -> Callable[[list[dict]], str]:
    """Rollout replies that alternate right and wrong per query, so every group of G >= 2 is mixed."""
    references = {row.query: row.reference for row in demo_rows()}
    seen: dict[str, int] = {}

    def reply(messages: list[dict]) -> str:
        query = messages[1]["content"]
        seen[query] = seen.get(query, 0) + 1
        answer = references[query] if seen[query] % 2 else "-12345"
        return f"Step by step... so the answer is \\boxed{{{answer}}}"

    return reply


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
