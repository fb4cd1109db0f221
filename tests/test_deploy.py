"""A team's deploy steps (issue 43): `python -m core migrate` brings a new database to the newest revision and
leaves one already there as it is (on SQLite, and on PostgreSQL with TFGRPO_TEST_DATABASE_URL); with
TFGRPO_MIGRATE_ON_START=0 a process refuses a database behind the code instead of migrating it; the API's
/v1/health says whether the database answers and /v1/ready whether its schema is the code's."""

from __future__ import annotations

import os

import pytest
from alembic import command
from alembic.config import Config
from fastapi.testclient import TestClient

from api.app import create_app
from core.cli import main
from core.errors import InvalidInput
from core.settings import engine as settings_engine
from core.settings import get_settings
from storage.db import MIGRATIONS_DIR, database_revision, get_engine, make_engine, newest_revision

BEHIND = "0015"


def upgrade_to(url: str, revision: str) -> None:
    """A database as an older release left it: migrated up to `revision` only."""
    engine = make_engine(url, migrate=False)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)
    engine.dispose()


def revision_of(url: str) -> str | None:
    engine = make_engine(url, migrate=False)
    try:
        return database_revision(engine)
    finally:
        engine.dispose()


def migrate_twice(url: str, capsys) -> None:
    """`migrate` on a database, then again: the first brings it to the newest revision, the second does nothing."""
    assert main(["--db", url, "migrate", "--check"]) == 1
    assert "behind the newest" in capsys.readouterr().out
    assert main(["--db", url, "migrate"]) == 0
    assert f"to {newest_revision()}" in capsys.readouterr().out
    assert revision_of(url) == newest_revision()
    assert main(["--db", url, "migrate"]) == 0
    assert "the newest; nothing to do" in capsys.readouterr().out
    assert main(["--db", url, "migrate", "--check"]) == 0


def test_migrate_brings_a_new_database_to_the_newest_revision_and_leaves_it_there(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'new.db'}"
    migrate_twice(url, capsys)


@pytest.fixture
def no_migration_on_start(monkeypatch):
    monkeypatch.setenv("TFGRPO_MIGRATE_ON_START", "0")
    get_settings.cache_clear()
    get_engine.cache_clear()
    yield
    get_settings.cache_clear()
    get_engine.cache_clear()


def test_with_migration_on_start_off_a_process_refuses_a_database_behind_until_migrate_runs(
        tmp_path, capsys, no_migration_on_start):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade_to(url, BEHIND)
    with pytest.raises(InvalidInput, match=f"at schema revision {BEHIND} and this code needs .*python -m core migrate"):
        settings_engine(url)
    assert revision_of(url) == BEHIND  # nothing was migrated behind the team's back
    assert main(["--db", url, "user", "list"]) == 2  # a command says the same, as a usage error
    assert "python -m core migrate" in capsys.readouterr().err
    assert main(["--db", url, "migrate"]) == 0
    assert settings_engine(url) is not None and revision_of(url) == newest_revision()


def test_with_migration_on_start_on_a_process_migrates_as_before(tmp_path, monkeypatch):
    monkeypatch.delenv("TFGRPO_MIGRATE_ON_START", raising=False)
    get_settings.cache_clear()
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade_to(url, BEHIND)
    settings_engine(url)
    assert revision_of(url) == newest_revision()


def test_health_says_whether_the_database_answers_and_ready_whether_its_schema_is_current(tmp_path, engine):
    assert TestClient(create_app(engine)).get("/v1/health").json() == {"status": "ok", "database": "reachable"}
    ready = TestClient(create_app(engine)).get("/v1/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"

    down = make_engine("postgresql+psycopg://studio:pa55word@127.0.0.1:1/studio", migrate=False)
    health = TestClient(create_app(down)).get("/v1/health")
    assert health.status_code == 503 and health.json()["database"] == "unreachable"
    assert "OperationalError" in health.json()["error"] and "pa55word" not in health.text
    assert TestClient(create_app(down)).get("/v1/ready").status_code == 503

    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade_to(url, BEHIND)
    behind = make_engine(url, migrate=False)
    answer = TestClient(create_app(behind)).get("/v1/ready")
    assert answer.status_code == 503
    assert answer.json()["schema"] == BEHIND and "python -m core migrate" in answer.json()["error"]
    assert TestClient(create_app(behind)).get("/v1/health").status_code == 200  # alive, just not ready
    behind.dispose()


@pytest.mark.postgres
def test_migrate_on_a_new_postgresql_database_and_on_one_at_the_head(postgres_databases, capsys):
    if postgres_databases is None:
        if os.environ.get("CI"):
            pytest.fail("TFGRPO_TEST_DATABASE_URL is not set in CI: .ci/run starts PostgreSQL and sets it")
        pytest.skip("no PostgreSQL server: set TFGRPO_TEST_DATABASE_URL to run this")
    name = postgres_databases.create_empty()
    try:
        migrate_twice(postgres_databases.url(name), capsys)
    finally:
        postgres_databases.drop(name)
