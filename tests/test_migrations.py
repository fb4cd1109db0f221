"""The Alembic migrations build exactly the schema that storage/tables.py declares.

compare_metadata reports what `alembic revision --autogenerate` would write: tables, columns, types
(compare_type, on by default since Alembic 1.12), nullability, indexes, unique constraints and foreign
keys. Server defaults are not compared (Alembic's default): 0002 and 0003 gave new NOT NULL columns a
server default to fill existing rows, and the models create every value in Python instead. Type
spellings need no filter: SQLModel's AutoString against the VARCHAR that SQLite reflects, or its
UTCDateTime against DATETIME, compare as equal.
"""

from __future__ import annotations

import sqlite3

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import JSON, Column, Integer, MetaData
from sqlmodel import Session, SQLModel

from storage import tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from storage.db import MIGRATIONS_DIR, make_engine, migrate


def differences(engine, metadata: MetaData = SQLModel.metadata) -> list:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return compare_metadata(context, metadata)


def upgrade_to(engine, revision: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)


def head() -> str:
    return ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def test_the_newest_revision_read_without_alembic_is_alembics_head():
    from storage.db import head_revision

    assert head_revision() == head()


def test_an_engine_migrates_a_database_behind_the_newest_revision_and_skips_one_at_it(tmp_path, monkeypatch):
    """make_engine asks Alembic only when alembic_version is not the newest revision (issue 37: importing Alembic
    cost every process about 0.2 s at its start)."""
    import storage.db

    url = f"sqlite:///{tmp_path / 'behind.db'}"
    upgrade_to(make_engine(url, migrate=False), "0014")
    calls = []
    monkeypatch.setattr(storage.db, "_migrate", lambda engine: calls.append(engine) or migrate(engine))
    behind = make_engine(url)
    with behind.connect() as connection:
        assert connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == head()
    assert calls == [behind]
    make_engine(url)
    assert calls == [behind]


def test_the_migrations_build_the_schema_the_models_declare(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")

    assert differences(engine) == []


def test_a_model_column_changed_without_a_migration_is_reported(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    changed = MetaData()
    for table in SQLModel.metadata.tables.values():
        table.to_metadata(changed)
    changed.tables["evaluation"].c.progress.nullable = True
    changed.tables["sample"].c.split.type = Integer()
    changed.tables["task"].append_column(Column("notes", JSON, nullable=True))

    assert {_describe(diff) for diff in _flat(differences(engine, changed))} == {
        ("modify_nullable", "evaluation", "progress"),
        ("modify_type", "sample", "split"),
        ("add_column", "task", "notes"),
    }


def test_upgrading_a_filled_0003_database_keeps_its_rows_and_foreign_keys(tmp_path):
    """0004 rebuilds tables that other rows point at; SQLite must not refuse that, NULLs in JSON columns
    with a default become that default, and the engine enforces foreign keys again afterwards."""
    path = tmp_path / "old.db"
    engine = make_engine(f"sqlite:///{path}", migrate=False)
    upgrade_to(engine, "0003")
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO task (id, name, description, instructions, answer_format, reward_method,"
            " reward_settings, policy_model, learner_model, judge_model, agent_mode, created_at)"
            " VALUES (1, 't', '', 'solve', '', 'math', NULL, 'm', 'm', 'm', 'direct', '2026-01-01')")
        connection.exec_driver_sql("INSERT INTO library (id, task_id, name, created_at)"
                                   " VALUES (1, 1, 'default', '2026-01-01')")
        connection.exec_driver_sql(
            "INSERT INTO libraryversion (id, library_id, number, experiences, source, note, created_by,"
            " created_at) VALUES (1, 1, 1, NULL, 'initial', '', 'system', '2026-01-01')")
        connection.exec_driver_sql(
            "INSERT INTO auditevent (id, actor, action, object_type, \"before\", \"after\", created_at)"
            " VALUES (1, 'cli', 'create', 'task', 'null', '{\"name\": \"t\"}', '2026-01-01')")

    migrate(engine)

    assert differences(engine) == []
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT reward_settings FROM task").scalar() == "{}"
        assert connection.exec_driver_sql("SELECT experiences FROM libraryversion").scalar() == "[]"
        assert connection.exec_driver_sql("SELECT count(*) FROM library").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
    engine.dispose()
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT version_num FROM alembic_version").fetchall() == [(head(),)]


def _flat(diffs: list) -> list:
    """compare_metadata nests column modifications in lists, one per column."""
    return [item for diff in diffs for item in (diff if isinstance(diff, list) else [diff])]


def _describe(diff: tuple) -> tuple[str, str, str]:
    """(kind, table, column) of ("modify_...", schema, table, column, ...) or ("add_column", schema, table, Column)."""
    kind, _schema, table, column = diff[:4]
    return kind, table, column if isinstance(column, str) else column.name


def test_a_database_password_with_url_escapes_never_reaches_alembics_interpolation(tmp_path):
    """`%` in a URL-escaped password once crashed start-up inside Alembic's config parser."""
    from sqlalchemy import create_engine

    from storage.db import migrate

    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}?password=p%40ss%25word%2F%3A")
    migrate(engine)
    with engine.connect() as connection:
        assert connection.exec_driver_sql("select count(*) from alembic_version").scalar() == 1


def test_0008_folds_duplicate_rows_that_unfenced_workers_left_and_keeps_their_labels(tmp_path):
    """Before fencing, two workers could both write a group: 0008 keeps the oldest rollout, advantage and
    operation of each natural key, moves a label on a dropped rollout to the kept one, then adds the keys."""
    from sqlalchemy import insert

    from storage.tables import (
        Advantage,
        Library,
        LibraryVersion,
        Operation,
        RewardLabel,
        Rollout,
        Sample,
        Step,
        Task,
        utcnow,
    )

    engine = make_engine(f"sqlite:///{tmp_path / 'dup.db'}", migrate=False)
    upgrade_to(engine, "0007")
    now = utcnow()
    with engine.begin() as connection:
        connection.execute(insert(Task.__table__).values(id=1, name="t", description="", instructions="solve",
                                                         answer_format="", reward_method="math", reward_settings={},
                                                         policy_model="m", learner_model="m", judge_model="m",
                                                         agent_mode="direct", created_at=now))
        connection.execute(insert(Sample.__table__).values(id=1, task_id=1, external_id="a", query="q", split="train",
                                                           meta={}))
        connection.execute(insert(Library.__table__).values(id=1, task_id=1, name="default", created_at=now))
        connection.execute(insert(LibraryVersion.__table__).values(id=1, library_id=1, number=1, experiences=[],
                                                                   source="initial", note="", created_by="system",
                                                                   created_at=now))
        connection.exec_driver_sql(
            "INSERT INTO run (id, task_id, library_id, kind, settings, status, progress, created_by, created_at)"
            " VALUES (1, 1, 1, 'train', '{}', 'completed', '{}', 'cli', '2026-01-01')")
        connection.execute(insert(Step.__table__).values(id=1, run_id=1, epoch=0, batch_index=0, sample_ids=[1],
                                                         status="completed", stats={}, created_at=now))
        for rollout_id, response in ((1, "first"), (2, "second"), (3, "third")):
            connection.execute(insert(Rollout.__table__).values(
                id=rollout_id, step_id=1, sample_id=1, group_index=0, messages=[], response=response, tokens_in=0,
                tokens_out=0, cost=0.0, latency_ms=0.0, labels_needed=0, judge_unsure=False, created_at=now))
        connection.execute(insert(RewardLabel.__table__).values(id=1, rollout_id=3, value=1.0, comment="",
                                                                labeler="ann", kind="label", created_at=now))
        for advantage_id in (1, 2):
            connection.execute(insert(Advantage.__table__).values(id=advantage_id, step_id=1, sample_id=1, status="ok",
                                                                  proposals=[], created_at=now))
        for operation_id in (1, 2):
            connection.execute(insert(Operation.__table__).values(
                id=operation_id, step_id=1, run_id=1, position=0, op="ADD", target_ids=[], source_advantage_ids=[],
                status="applied", created_at=now))

    migrate(engine)

    assert differences(engine) == []
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT id, response FROM rollout").fetchall() == [(1, "first")]
        assert connection.exec_driver_sql("SELECT rollout_id FROM rewardlabel").fetchall() == [(1,)]
        assert connection.exec_driver_sql("SELECT id FROM advantage").fetchall() == [(1,)]
        assert connection.exec_driver_sql("SELECT id FROM operation").fetchall() == [(1,)]
        assert connection.exec_driver_sql("SELECT lease FROM run").scalar() == 0
        assert connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []


def test_0012_reads_existing_libraries_as_all_and_old_rollouts_as_unrecorded(tmp_path):
    """Libraries made before selections existed keep the paper's behaviour (every entry, k 3 kept for a later
    switch to top_k); rollouts and evaluations made before say nothing about what was shown (NULL), and both
    downgrade and upgrade again."""
    from sqlalchemy import text

    from core.domain.selection import Selection
    from core.records.library.selection import selection_of
    from storage.tables import Library

    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}", migrate=False)
    upgrade_to(engine, "0011")
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO task (id, name, description, instructions, answer_format, reward_method, reward_settings,"
            " policy_model, learner_model, judge_model, agent_mode, kind, simulator_model, max_turns,"
            " production_rules, created_at) VALUES (1, 't', '', 'solve', '', 'math', '{}', 'm', 'm', 'm', 'direct',"
            " 'single', '', 4, '{}', '2026-01-01')")
        connection.exec_driver_sql("INSERT INTO sample (id, task_id, external_id, query, split, meta)"
                                   " VALUES (1, 1, 'a', 'q', 'test', '{}')")
        connection.exec_driver_sql("INSERT INTO library (id, task_id, name, created_at) VALUES (1, 1, 'default',"
                                   " '2026-01-01')")
        connection.exec_driver_sql(
            "INSERT INTO rollout (id, sample_id, group_index, messages, tokens_in, tokens_out, cost, latency_ms,"
            " labels_needed, judge_unsure, created_at) VALUES (1, 1, 0, '[]', 0, 0, 0, 0, 0, 0, '2026-01-01')")

    migrate(engine)

    assert differences(engine) == []
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT selection, selection_k FROM library").one() == ("all", 3)
        assert connection.exec_driver_sql("SELECT shown_ids FROM rollout").scalar() is None
    with Session(engine) as session:
        assert selection_of(session.get(Library, 1)) == Selection(k=3)  # what 0012 gave libraries then
    upgrade_to(engine, "0012")  # already there: nothing to do
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, "0011")
        assert "selection" not in [row[1] for row in connection.execute(text("PRAGMA table_info(library)"))]
    migrate(engine)
    assert differences(engine) == []
