"""Fencing: a worker's writes for a job land only while it still holds the job's lease.

A claim gives the job a new lease generation (Run.lease / Evaluation.lease) and the worker a `Lease`
naming it. While the worker executes the job, the lease is the context's `current_lease`, and every
write made in that context (any session's flush, any UPDATE/DELETE/INSERT statement) first touches the
job's row on the condition that worker and generation still match, in the same transaction. When
another worker has taken the job over (it stalled, or a person pressed Resume), the touch matches no
row and the write raises `LeaseLost` instead of landing: a worker paused past the stall window and
woken writes nothing.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from sqlalchemy import event, text
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session


class LeaseLost(BaseException):  # noqa: N818  (a BaseException: `except Exception` in the engine must not swallow it)
    """This worker no longer holds the job: it stops at once, without writing anything more."""


@dataclass
class Lease:
    """A worker's hold on one job: the table, the job's id, the worker and the lease generation."""

    table: str  # "run" | "evaluation"
    job_id: int
    owner: str
    generation: int
    lost: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)

    def describe(self) -> str:
        return f"{self.table} {self.job_id} (lease {self.generation} of worker {self.owner})"

    def lose(self, why: str = "") -> LeaseLost:
        self.lost.set()
        return LeaseLost(f"{self.describe()} was taken over{': ' + why if why else ''}; this worker stops "
                         "without writing")


current_lease: ContextVar[Lease | None] = ContextVar("current_lease", default=None)


@contextmanager
def holding(lease: Lease | None):
    """Fence every write made in this context (and in tasks and threads started from it with a copy of
    the context, such as asyncio tasks and `asyncio.to_thread`) to `lease`."""
    token = current_lease.set(lease)
    try:
        yield lease
    finally:
        current_lease.reset(token)


def raise_if_lost() -> None:
    """Stop before spending anything (a model call) when the heartbeat already saw the lease go."""
    lease = current_lease.get()
    if lease is not None and lease.lost.is_set():
        raise lease.lose()


# Built once: every write of a job runs one, and text() parses its statement each time it is made.
TOUCH = {table: text(f"UPDATE {table} SET lease = lease WHERE id = :id AND worker_id = :owner AND lease = :generation")
         for table in ("run", "evaluation")}


_DRIVER_TOUCH: dict[tuple[str, str, str], tuple[str, tuple[str, ...] | None]] = {}


def _driver_touch(table: str, dialect: Dialect) -> tuple[str, tuple[str, ...] | None]:
    """TOUCH[table] in the driver's own SQL and parameter style (its parameter names in order for a positional
    style), compiled once per kind of database: run as driver SQL it skips SQLAlchemy's per-statement work, a third
    of the check's cost on a paper-scale run's 6,600 checks."""
    key = (table, dialect.name, dialect.paramstyle)
    if key not in _DRIVER_TOUCH:
        compiled = TOUCH[table].compile(dialect=dialect)
        order = tuple(compiled.positiontup) if compiled.positiontup is not None else None
        _DRIVER_TOUCH[key] = (compiled.string, order)
    return _DRIVER_TOUCH[key]


def check(connection, lease: Lease) -> None:
    """Touch the job's row on the lease's terms, in the caller's transaction; raise LeaseLost on no match.

    An UPDATE rather than a SELECT: it takes the row's lock (PostgreSQL) or the write lock (SQLite) until
    the transaction ends, so a claim by another worker waits for this write or comes after it."""
    if lease.table not in TOUCH:
        raise ValueError(f"no lease on table {lease.table!r}")
    sql, order = _driver_touch(lease.table, connection.dialect)
    values = {"id": lease.job_id, "owner": lease.owner, "generation": lease.generation}
    result = connection.exec_driver_sql(sql, tuple(values[name] for name in order) if order is not None else values)
    if result.rowcount != 1:
        raise lease.lose()


def fence(connection) -> None:
    """The current lease's check in a Core connection's transaction, for a write made without a Session (the
    ledger's insert, core/models/gateway.py); nothing when no lease is held."""
    lease = current_lease.get()
    if lease is not None:
        check(connection, lease)


@event.listens_for(Session, "before_flush")
def _fence_flush(session: Session, _flush_context, _instances) -> None:
    lease = current_lease.get()
    if lease is not None and (session.new or session.dirty or session.deleted):
        check(session.connection(), lease)


@event.listens_for(Session, "do_orm_execute")
def _fence_statement(state) -> None:
    lease = current_lease.get()
    if lease is not None and (state.is_update or state.is_delete or state.is_insert):
        check(state.session.connection(), lease)
