"""Whether the studio's workers and their jobs are alive, read from their heartbeats.

Read by the pages, the progress estimates and the run controls as well as by the worker itself, so it sits
below core.jobs (which starts, claims and stops jobs) where every layer may read it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlmodel import Session, select

from core.settings import get_settings
from storage.statuses import JobStatus, WorkerStatus
from storage.tables import Worker as WorkerRow
from storage.tables import as_utc, utcnow


def stall_after() -> float:
    """Seconds without a heartbeat after which a running job counts as stalled (TFGRPO_STALL_AFTER_S)."""
    return get_settings().stall_after_s


def is_stale(heartbeat_at: datetime | None, now: datetime | None = None) -> bool:
    """True when a heartbeat is missing or older than the stall window."""
    if heartbeat_at is None:
        return True
    return (now or utcnow()) - as_utc(heartbeat_at) > timedelta(seconds=stall_after())


def job_health(status: str, heartbeat_at: datetime | None, now: datetime | None = None) -> str:
    """The status a person should see: `running` turns into `stalled` when its worker stopped beating."""
    if status == JobStatus.RUNNING and is_stale(heartbeat_at, now):
        return JobStatus.STALLED
    return status


def alive_workers(session: Session) -> list[WorkerRow]:
    rows = session.exec(select(WorkerRow).where(WorkerRow.status == WorkerStatus.RUNNING)).all()
    return [w for w in rows if not is_stale(w.heartbeat_at)]
