"""Insert-or-skip: rows with a natural key (a rollout, an advantage, an operation, a step) are written
with `INSERT ... ON CONFLICT DO NOTHING`, so a second writer of the same row leaves the first in place
instead of adding a duplicate or failing on the unique key. The caller reads back whichever row won."""

from __future__ import annotations

import functools
from typing import TypeVar

from sqlalchemy import Table, bindparam
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.orm import make_transient_to_detached
from sqlmodel import Session, SQLModel, select

from storage.fencing import fence
from storage.group_commit import committed

M = TypeVar("M", bound=SQLModel)
INSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


def insert_or_skip(session: Session, row: SQLModel) -> bool:
    """Insert `row` unless one with the same unique key exists; True when this row was inserted."""
    table = type(row).__table__
    insert = INSERTS.get(session.get_bind().dialect.name)
    if insert is None:  # another backend: a plain insert, which the unique key still guards
        session.add(row)
        session.flush()
        return True
    statement = insert(table).values(**_values(row)).on_conflict_do_nothing().returning(*table.primary_key.columns)
    return session.execute(statement).first() is not None  # rowcount is -1 on PostgreSQL with RETURNING


def inserted_or_stored(session: Session, row: M, **key) -> M:
    """`row` inserted unless one with the same natural `key` exists: then that one. An inserted row is returned
    as if read back (its id set, detached; a later session.add updates it), without the SELECT `stored` makes:
    a paper-scale run reads back 1,500 rollouts with their messages (0.5 s of CPU)."""
    dialect = session.get_bind().dialect.name
    if dialect not in INSERTS:
        return stored(session, type(row), **key) if not insert_or_skip(session, row) else row
    found = session.execute(_insert_once(type(row).__table__, dialect), _values(row)).first()
    return stored(session, type(row), **key) if found is None else _as_inserted(row, found[0])


def stored(session: Session, model: type[M], **key) -> M:
    """The row of `model` with these natural-key values (after an insert-or-skip)."""
    return session.exec(select(model).filter_by(**key)).one()


def _values(row: SQLModel) -> dict:
    """The row's column values for an INSERT; an id not yet given is left to the database."""
    return {c.name: getattr(row, c.name) for c in type(row).__table__.columns
            if not (c.primary_key and getattr(row, c.name) is None)}


def _as_inserted(row: M, row_id: int) -> M:
    """`row` as if read back after its INSERT: its id set and detached, so a later session.add updates it."""
    [primary] = type(row).__table__.primary_key.columns
    setattr(row, primary.name, row_id)
    make_transient_to_detached(row)
    return row


@functools.cache
def _insert_once(table: Table, dialect: str):
    [primary] = table.primary_key.columns
    return INSERTS[dialect](table).on_conflict_do_nothing().returning(primary)


def written_or_stored(engine: Engine, row: M, **key) -> M:
    """inserted_or_stored in a transaction of its own, through a connection instead of a Session: one compiled
    INSERT with the job's lease checked first in the same transaction, as a Session's flush checks it
    (storage.fencing). A paper-scale run writes 1,500 rollouts, and the Session's way cost twice the CPU."""
    dialect = engine.dialect.name
    if dialect not in INSERTS:
        with Session(engine, expire_on_commit=False) as session:
            found = inserted_or_stored(session, row, **key)
            session.commit()
            return found
    with engine.begin() as connection:
        fence(connection)
        found = connection.execute(_insert_once(type(row).__table__, dialect), _values(row)).first()
    return _inserted_or_found(engine, row, found, key)


def _inserted_or_found(engine: Engine, row: M, inserted, key: dict) -> M:
    """After an INSERT ... ON CONFLICT DO NOTHING RETURNING id: `row` as inserted, or the row another writer stored
    under the same natural `key` (nothing returned)."""
    if inserted is None:
        with Session(engine, expire_on_commit=False) as session:
            return stored(session, type(row), **key)
    return _as_inserted(row, inserted[0])


@functools.cache
def _update_by_id(table: Table, names: tuple[str, ...]):
    [primary] = table.primary_key.columns
    return table.update().where(primary == bindparam("_id")).values({name: bindparam(name) for name in names})


def update_by_id(engine: Engine, model: type[SQLModel], row_id: int, **values) -> None:
    """Set `values` on the row of `model` with this id in a transaction of its own: one compiled UPDATE through a
    connection, the job's lease checked first in the same transaction as a Session's flush checks it
    (storage.fencing), without loading the row (a rollout's summary: loading it read back its messages)."""
    table = model.__table__
    with engine.begin() as connection:
        fence(connection)
        connection.execute(_update_by_id(table, tuple(sorted(values))), {"_id": row_id, **values})


async def written_or_stored_together(engine: Engine, row: M, **key) -> M:
    """written_or_stored in a transaction shared with the writes the loop's other tasks ask for meanwhile
    (storage.group_commit), fenced the same way: a level's 500 rollouts are written as their replies arrive,
    together, and each rollout's own transaction was most of its write's cost."""
    dialect = engine.dialect.name
    if dialect not in INSERTS:
        return written_or_stored(engine, row, **key)
    statement, values = _insert_once(type(row).__table__, dialect), _values(row)
    found = await committed(engine, lambda connection: connection.execute(statement, values).first())
    return _inserted_or_found(engine, row, found, key)


async def updated_by_id_together(engine: Engine, model: type[SQLModel], row_id: int, **values) -> None:
    """update_by_id in a transaction shared with the loop's other writes (storage.group_commit), fenced the same
    way: a level's 500 summaries are set as their replies arrive, together."""
    statement = _update_by_id(model.__table__, tuple(sorted(values)))
    await committed(engine, lambda connection: connection.execute(statement, {"_id": row_id, **values}))
