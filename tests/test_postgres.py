"""PostgreSQL as a backend: a password that needs URL escapes connects, migrates, writes and reads, in this
process, through Alembic's own URL path and in a child process; the migrations build the models' schema
there too and 0008 folds duplicates there; and the pool settings of a server database.

The server tests (marked `postgres`) need TFGRPO_TEST_DATABASE_URL (a PostgreSQL URL whose role may CREATE
DATABASE). Outside CI they skip without it; in CI (CI=1, where .ci/run starts PostgreSQL and sets it) its
absence is a failure. `make test-sqlite` deselects them; the pool tests need no server and run with the
SQLite suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url
from sqlmodel import Session, SQLModel, select

from core.errors import InvalidInput
from core.records.tasks.demos import DEMO_TASK, ensure_demo_task
from core.records.tasks.lookup import get_task
from core.settings import database_pool, get_settings
from storage.db import (
    MIGRATIONS_DIR,
    describe_url,
    make_engine,
    migrate,
    pool_settings,
    scrub_url,
    url_with_password,
)
from storage.tables import Sample, Task

ROOT = Path(__file__).resolve().parent.parent
ESCAPED = "@%/:"


postgres = pytest.mark.postgres


@pytest.fixture
def server(postgres_databases):
    if postgres_databases is None:
        if os.environ.get("CI"):
            pytest.fail("TFGRPO_TEST_DATABASE_URL is not set in CI: .ci/run starts PostgreSQL and sets it")
        pytest.skip("no PostgreSQL server: set TFGRPO_TEST_DATABASE_URL=postgresql+psycopg://user:pw@host/postgres "
                    "(a role with CREATEDB) to run these")
    return postgres_databases


@pytest.fixture
def empty_database(server):
    """A new database with no tables (not the migrated template): the tests migrate it themselves."""
    name = server.create_empty()
    yield server.url(name)
    server.drop(name)


@postgres
def test_the_test_server_password_needs_url_escapes(server):
    """CI proves the escaping on a password holding every character a URL gives a meaning to."""
    password = server.server.password or ""
    if not set(ESCAPED) <= set(password):
        message = f"the password in TFGRPO_TEST_DATABASE_URL holds none of {ESCAPED!r} or only some"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    assert "%40" in server.url("x") and "%25" in server.url("x")


@postgres
def test_a_fresh_postgres_database_migrates_writes_and_reads(empty_database):
    engine = make_engine(empty_database)
    try:
        assert engine.dialect.name == "postgresql"
        assert set(SQLModel.metadata.tables) <= set(inspect(engine).get_table_names())
        ensure_demo_task(engine)
        with Session(engine) as session:
            task = get_task(session, DEMO_TASK)
            assert session.exec(select(Sample).where(Sample.task_id == task.id)).first() is not None
        # A second engine, built from the first one's URL, gets the real password (str(engine.url) masks it).
        assert "***" in str(engine.url)
        again = make_engine(url_with_password(engine), migrate=True)  # already at head: a no-op
        with Session(again) as session:
            assert session.exec(select(Task.name).where(Task.name == DEMO_TASK)).one() == DEMO_TASK
        again.dispose()
    finally:
        engine.dispose()


@postgres
def test_alembic_on_its_own_url_path_keeps_percent_escapes(empty_database):
    """Alembic given the URL (not a connection) must not %-interpolate the escaped password."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["url"] = empty_database
    command.upgrade(cfg, "head")
    engine = make_engine(empty_database, migrate=False)
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()


@postgres
def test_a_child_process_connects_with_the_escaped_password(empty_database):
    """The CLI in its own process on DATABASE_URL, as `make run` and a team's workers start: it migrates the
    empty database and loads the demo tasks, and prints no password."""
    env = {**os.environ, "DATABASE_URL": empty_database, "PYTHONPATH": str(ROOT), "TFGRPO_NO_AUTOWORKER": "1"}
    demo = subprocess.run([sys.executable, "-m", "core", "demo"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert DEMO_TASK in demo.stdout
    assert make_url(empty_database).password not in demo.stdout + demo.stderr
    engine = make_engine(empty_database, migrate=False)
    try:
        with Session(engine) as session:
            assert session.exec(select(Sample).where(Sample.task_id == get_task(session, DEMO_TASK).id)).first()
    finally:
        engine.dispose()


@postgres
def test_pages_and_errors_never_show_the_password(server):
    url = server.url("studio")
    password = make_url(url).password
    assert password not in describe_url(url) and describe_url(url).startswith("postgresql+psycopg on ")
    assert password not in scrub_url(f"could not connect to {url} (password {password})", url)


@postgres
def test_the_migrations_build_the_schema_the_models_declare_on_postgres(empty_database):
    """compare_metadata on PostgreSQL's own types (JSON, BOOLEAN, TIMESTAMP, partial unique indexes)."""
    from tests.test_migrations import differences

    engine = make_engine(empty_database)
    try:
        assert differences(engine) == []
    finally:
        engine.dispose()


@postgres
def test_0008_folds_duplicate_rows_on_postgres(empty_database):
    """A team database that unfenced workers filled with duplicates upgrades: the oldest row of each natural
    key stays, a label on a dropped rollout moves to the kept one, and the keys hold afterwards."""
    from sqlalchemy import insert
    from sqlalchemy.exc import IntegrityError

    from storage.tables import (
        Advantage,
        Library,
        LibraryVersion,
        Operation,
        RewardLabel,
        Rollout,
        Step,
        utcnow,
    )
    from tests.test_migrations import differences, upgrade_to

    engine = make_engine(empty_database, migrate=False)
    try:
        upgrade_to(engine, "0007")
        now = utcnow()
        with engine.begin() as connection:
            connection.execute(insert(Task.__table__).values(
                id=1, name="t", description="", instructions="solve", answer_format="", reward_method="math",
                reward_settings={}, policy_model="m", learner_model="m", judge_model="m", agent_mode="direct",
                created_at=now))
            connection.execute(insert(Sample.__table__).values(id=1, task_id=1, external_id="a", query="q",
                                                               split="train", meta={}))
            connection.execute(insert(Library.__table__).values(id=1, task_id=1, name="default", created_at=now))
            connection.execute(insert(LibraryVersion.__table__).values(
                id=1, library_id=1, number=1, experiences=[], source="initial", note="", created_by="system",
                created_at=now))
            connection.exec_driver_sql(
                "INSERT INTO run (id, task_id, library_id, kind, settings, status, progress, created_by, created_at)"
                " VALUES (1, 1, 1, 'train', '{}', 'completed', '{}', 'cli', '2026-01-01')")
            connection.execute(insert(Step.__table__).values(id=1, run_id=1, epoch=0, batch_index=0, sample_ids=[1],
                                                             status="completed", stats={}, created_at=now))
            for rollout_id, response in ((1, "first"), (2, "second"), (3, "third")):
                connection.execute(insert(Rollout.__table__).values(
                    id=rollout_id, step_id=1, sample_id=1, group_index=0, messages=[], response=response,
                    tokens_in=0, tokens_out=0, cost=0.0, latency_ms=0.0, labels_needed=0, judge_unsure=False,
                    created_at=now))
            connection.execute(insert(RewardLabel.__table__).values(id=1, rollout_id=3, value=1.0, comment="",
                                                                    labeler="ann", kind="label", created_at=now))
            for advantage_id in (1, 2):
                connection.execute(insert(Advantage.__table__).values(
                    id=advantage_id, step_id=1, sample_id=1, status="ok", proposals=[], created_at=now))
            for operation_id in (1, 2):
                connection.execute(insert(Operation.__table__).values(
                    id=operation_id, step_id=1, run_id=1, position=0, op="ADD", target_ids=[],
                    source_advantage_ids=[], status="applied", created_at=now))

        migrate(engine)

        assert differences(engine) == []
        with engine.connect() as connection:
            def rows(sql: str) -> list:
                return [tuple(row) for row in connection.exec_driver_sql(sql).fetchall()]

            assert rows("SELECT id, response FROM rollout") == [(1, "first")]
            assert rows("SELECT rollout_id FROM rewardlabel") == [(1,)]
            assert rows("SELECT id FROM advantage") == [(1,)]
            assert rows("SELECT id FROM operation") == [(1,)]
            assert connection.exec_driver_sql("SELECT lease FROM run").scalar() == 0
        with pytest.raises(IntegrityError), engine.begin() as connection:
            connection.execute(insert(Rollout.__table__).values(
                id=4, step_id=1, sample_id=1, group_index=0, messages=[], response="again", tokens_in=0,
                tokens_out=0, cost=0.0, latency_ms=0.0, labels_needed=0, judge_unsure=False, created_at=now))
    finally:
        engine.dispose()


# Pool settings: no server needed (an engine does not connect until it is used).

@pytest.fixture
def fresh_settings():
    """Settings read anew from the environment the test set, and forgotten after it."""
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


PG_URL = "postgresql+psycopg://studio:p%40ss%25w%2Frd%3A1@127.0.0.1:5432/studio"


def test_a_server_database_pools_5_plus_10_connections_recycled_after_30_minutes_by_default(monkeypatch, fresh_settings):
    for name in ("TFGRPO_DB_POOL_SIZE", "TFGRPO_DB_MAX_OVERFLOW", "TFGRPO_DB_POOL_RECYCLE_S"):
        monkeypatch.delenv(name, raising=False)
    engine = make_engine(PG_URL, migrate=False, **database_pool())
    assert (engine.pool.size(), engine.pool._max_overflow, engine.pool._recycle) == (5, 10, 1800)
    assert engine.url.password == "p@ss%w/rd:1"


def test_pool_settings_come_from_the_environment_or_the_arguments(monkeypatch, fresh_settings):
    monkeypatch.setenv("TFGRPO_DB_POOL_SIZE", "3")
    monkeypatch.setenv("TFGRPO_DB_MAX_OVERFLOW", " 0 ")
    monkeypatch.setenv("TFGRPO_DB_POOL_RECYCLE_S", "0")  # never
    engine = make_engine(PG_URL, migrate=False, **database_pool())
    assert (engine.pool.size(), engine.pool._max_overflow, engine.pool._recycle) == (3, 0, -1)
    assert pool_settings(pool_size=7, max_overflow=2, pool_recycle=60) == {"pool_size": 7, "max_overflow": 2,
                                                                           "pool_recycle": 60}


@pytest.mark.parametrize(("name", "value"), [("TFGRPO_DB_POOL_SIZE", "abc"), ("TFGRPO_DB_POOL_SIZE", "0"),
                                             ("TFGRPO_DB_POOL_SIZE", "2.5"), ("TFGRPO_DB_MAX_OVERFLOW", "-1"),
                                             ("TFGRPO_DB_POOL_RECYCLE_S", "-1"), ("TFGRPO_DB_POOL_RECYCLE_S", "1h")])
def test_a_bad_pool_setting_is_refused_by_name(monkeypatch, fresh_settings, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidInput, match=name):
        database_pool()


@pytest.mark.parametrize(("argument", "value"), [("pool_size", 0), ("pool_size", 2.5), ("max_overflow", -1),
                                                 ("pool_recycle", "1h")])
def test_a_bad_pool_argument_is_refused_by_name(argument, value):
    with pytest.raises(ValueError, match=f"{argument} must be a whole number of at least"):
        make_engine(PG_URL, migrate=False, **{argument: value})


def test_sqlite_ignores_the_pool_settings(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}", migrate=False, pool_size=0, pool_recycle="soon")
    engine.dispose()
