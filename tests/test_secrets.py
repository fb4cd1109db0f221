"""Secrets stay out of what is stored and shown, and importing the studio makes no outside request."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from sqlmodel import Session

from core.errors import InvalidInput
from core.grpo.training import create_run
from core.models.gateway import Gateway
from core.records.runs.settings import RunSettings
from core.secrets import API_BASE_ENV, has_credentials, mask_url, resolve_api_base
from storage.db import describe_url, scrub_url
from storage.tables import Run
from tests.conftest import ScriptedModel
from tests.ui_support import ROOT

MSG = [{"role": "user", "content": "What is 2+2?"}]
WITH_CREDENTIALS = "https://alice:hunter2-pw@llm.example.com:8443/v1?api-key=sk-secret-1&region=eu"


def test_credentials_in_a_url_are_masked():
    masked = mask_url(WITH_CREDENTIALS)
    assert masked == "https://***@llm.example.com:8443/v1?api-key=***&region=eu"
    assert "hunter2" not in masked and "sk-secret" not in masked and "alice" not in masked
    assert mask_url("http://localhost:8000/v1") == "http://localhost:8000/v1"
    assert has_credentials(WITH_CREDENTIALS) and not has_credentials("http://localhost:8000/v1")
    assert mask_url(None) is None
    for plain_url in ("http://LocalHost:8000/v1", "http://h/v1?q=a%20b", "http://h/v1#x"):  # kept as given
        assert mask_url(plain_url) == plain_url and not has_credentials(plain_url)


def test_a_run_stores_its_api_base_masked(engine, demo_task):
    run_id = create_run(engine, demo_task.name, RunSettings.build(api_base=WITH_CREDENTIALS, epochs=1))
    with Session(engine) as session:
        stored = session.get(Run, run_id).settings
    assert stored["api_base"] == mask_url(WITH_CREDENTIALS)
    assert "hunter2" not in json.dumps(stored) and "sk-secret" not in json.dumps(stored)


def test_a_masked_api_base_is_called_with_the_full_url_from_the_environment():
    masked = mask_url(WITH_CREDENTIALS)
    with pytest.raises(InvalidInput, match=API_BASE_ENV):
        resolve_api_base(masked, "")  # STUDIO_API_BASE unset
    with pytest.raises(InvalidInput):
        resolve_api_base(masked, "https://bob:other@elsewhere.example.com/v1")  # another endpoint's full URL
    assert resolve_api_base(masked, WITH_CREDENTIALS) == WITH_CREDENTIALS
    assert resolve_api_base("http://localhost:8000/v1") == "http://localhost:8000/v1"


def test_a_reply_from_one_endpoint_never_answers_for_another(engine):
    model = ScriptedModel({"rollout": "4"})
    first = Gateway(engine, mock=model, api_base="http://one.example.com/v1")
    second = Gateway(engine, mock=model, api_base="http://two.example.com/v1")
    call = {"stage": "rollout", "model": "openai/gpt-4o-mini", "messages": MSG}
    assert not asyncio.run(first.complete(**call)).cache_hit
    assert asyncio.run(first.complete(**call)).cache_hit
    assert not asyncio.run(second.complete(**call)).cache_hit
    assert len(model.calls) == 2


def test_pages_see_the_database_driver_and_host_only():
    url = "postgresql+psycopg://bob:pa%25ss@db.example.com:5432/grpo?sslkey=/secret/key"
    shown = describe_url(url)
    assert shown == "postgresql+psycopg on db.example.com:5432"
    assert describe_url("sqlite:////srv/private/dir/studio.db") == "sqlite file studio.db"
    assert describe_url("bob:pw@nowhere") == "an unreadable DATABASE_URL"
    message = scrub_url("could not connect to postgresql+psycopg://bob:pa%ss@db.example.com/grpo (pa%ss)", url)
    assert "pa%ss" not in message and "bob" not in message


# Imports every core module and reads litellm's price list under an audit hook that refuses sockets: the
# studio runs offline (the price list ships with litellm; LITELLM_LOCAL_MODEL_COST_MAP is set by `core`).
OFFLINE_PROBE = """
import importlib, pkgutil, socket, sys
attempts = []
def hook(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname"):
        attempts.append(f"{event} {args[1:] if event == 'socket.connect' else args[:2]}")
        raise OSError("network blocked by the test")
sys.addaudithook(hook)
import core
for module in pkgutil.iter_modules(core.__path__):
    if module.name == "__main__":
        continue
    importlib.import_module(f"core.{module.name}")
import litellm
assert litellm.model_cost.get("gpt-4o-mini"), "the bundled price list is loaded"
from core.models.gateway import _cost
print("ATTEMPTS", attempts)
"""


def test_importing_the_studio_makes_no_outside_request():
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", OFFLINE_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ATTEMPTS []" in done.stdout, done.stdout[-2000:]


def test_the_database_error_page_shows_neither_the_url_nor_its_password(app_db, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from core.records.tasks import demos as tasks
    from tests.ui_support import APP

    url = "postgresql+psycopg://bob:hunter2-db-pw@db.example.com:5432/grpo"
    monkeypatch.setenv("DATABASE_URL", url)
    from core.settings import get_settings

    get_settings.cache_clear()

    def unreachable(_engine):  # an error that echoes its URL, as some drivers and parsers do
        raise RuntimeError(f"cannot reach {url} (password hunter2-db-pw)")

    monkeypatch.setattr(tasks, "ensure_demo_tasks", unreachable)
    import ui.common  # noqa: F401  (imported now, it binds the real engine(); only the app's own use is patched)

    monkeypatch.setattr("core.settings.engine", lambda: None)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    shown = " ".join([e.value for e in at.error] + [c.value for c in at.code])
    assert "Cannot open the database" in shown and "db.example.com" in shown
    assert "hunter2" not in shown and "bob" not in shown


def test_the_cli_stores_a_credentialed_api_base_masked_and_says_what_a_worker_needs(tmp_path, capsys, monkeypatch):
    from core.cli import main
    from core.records.tasks.demos import DEMO_TASK
    from storage.db import get_engine

    monkeypatch.setenv(API_BASE_ENV, "")  # recorded, so the value the CLI sets is undone after the test
    monkeypatch.delenv(API_BASE_ENV)
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert main(["--db", url, "demo"]) == 0
    code = main(["--db", url, "train", "--task", DEMO_TASK, "--queue", "--model", "openai/gpt-4o-mini",
                 "--api-base", WITH_CREDENTIALS])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"stored as {mask_url(WITH_CREDENTIALS)}; the worker needs {API_BASE_ENV}" in err
    assert "hunter2" not in out + err
    with Session(get_engine(url)) as session:
        assert session.get(Run, 1).settings["api_base"] == mask_url(WITH_CREDENTIALS)
