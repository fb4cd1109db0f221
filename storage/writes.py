"""Insert-or-skip: rows with a natural key (a rollout, an advantage, an operation, a step) are written
with `INSERT ... ON CONFLICT DO NOTHING`, so a second writer of the same row leaves the first in place
instead of adding a duplicate or failing on the unique key. The caller reads back whichever row won."""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, SQLModel, select

M = TypeVar("M", bound=SQLModel)
INSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


def insert_or_skip(session: Session, row: SQLModel) -> bool:
    """Insert `row` unless one with the same unique key exists; True when this row was inserted."""
    table = type(row).__table__
    values = {c.name: getattr(row, c.name) for c in table.columns
              if not (c.primary_key and getattr(row, c.name) is None)}
    insert = INSERTS.get(session.get_bind().dialect.name)
    if insert is None:  # another backend: a plain insert, which the unique key still guards
        session.add(row)
        session.flush()
        return True
    statement = insert(table).values(**values).on_conflict_do_nothing().returning(*table.primary_key.columns)
    return session.execute(statement).first() is not None  # rowcount is -1 on PostgreSQL with RETURNING


def stored(session: Session, model: type[M], **key) -> M:
    """The row of `model` with these natural-key values (after an insert-or-skip)."""
    return session.exec(select(model).filter_by(**key)).one()
