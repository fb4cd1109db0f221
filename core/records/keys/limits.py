"""The HTTP API's shared limits, kept in the database so every API process counts against one allowance.

A key's request rate is a token bucket (`per_minute` requests, refilled evenly, so a short burst up to the
whole minute's allowance passes and a steady flood is held to the rate), spent by one conditional UPDATE:
the row lock (PostgreSQL) or the write lock (SQLite) makes two processes' requests take turns, so N
processes allow the rate in total. Refusals of requests without a usable key are counted per client
address and audited at most once a minute with their count, so a flood of bad keys cannot fill the audit log.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import case, delete, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

from core.errors import QuotaExceeded
from storage.db import session_scope
from storage.tables import ApiCounter, AuditEvent

AUDIT_EVERY_S = 60.0
API_ACTOR = "(api)"  # the audit actor of a request turned away before any key was known


def take_request(engine: Engine, key_id: int, per_minute: int, now: float | None = None) -> float | None:
    """Spend one request of the key's allowance: None when allowed, else the seconds until one is free."""
    now = time.time() if now is None else now
    rate = per_minute / 60.0
    name = f"key:{key_id}"
    refilled = ApiCounter.value + (now - ApiCounter.updated_at) * rate
    refilled = case((refilled > per_minute, float(per_minute)), else_=refilled)
    try:
        with session_scope(engine) as session:
            spent = session.exec(update(ApiCounter).where(ApiCounter.name == name, refilled >= 1.0)
                                 .values(value=refilled - 1.0, updated_at=now)).rowcount
            if spent == 1:
                return None
            row = session.get(ApiCounter, name)
            if row is None:  # the key's first request: a full bucket, less this one
                session.add(ApiCounter(name=name, value=per_minute - 1.0, updated_at=now))
                return None
            tokens = min(float(per_minute), row.value + (now - row.updated_at) * rate)
            return max(0.0, 1.0 - tokens) / rate
    except IntegrityError:  # another process created the bucket at the same moment: spend from it
        return take_request(engine, key_id, per_minute, now)


def audit_refusal(engine: Engine, address: str, reason: str, where: str, now: float | None = None, *,
                  actor: str = API_ACTOR, object_type: str = "address", object_id: int | None = None) -> bool:
    """Count a refused request from `address` (a client's address, or `key:ID` for a known key's refusals); once a
    minute per address, write one audit row with the refusals counted since the last one. True when this call
    wrote it."""
    now = time.time() if now is None else now
    name = f"refused:{address}"
    try:
        with session_scope(engine) as session:
            session.exec(update(ApiCounter).where(ApiCounter.name == name).values(value=ApiCounter.value + 1))
            row = session.get(ApiCounter, name)
            if row is None:
                session.add(ApiCounter(name=name, value=0.0, updated_at=now))
                count = 1
            else:
                count = int(row.value)  # read before the claim below changes it (and this object with it)
                claimed = session.exec(update(ApiCounter).where(ApiCounter.name == name,
                                                                ApiCounter.updated_at <= now - AUDIT_EVERY_S)
                                       .values(value=ApiCounter.value - count, updated_at=now)).rowcount
                if claimed != 1:
                    return False
            session.add(AuditEvent(actor=actor, action="api.denied", object_type=object_type, object_id=object_id,
                                   after={"reason": reason, "request": where, "address": address,
                                          "refusals": count, "since_s": AUDIT_EVERY_S}))
            return True
    except IntegrityError:
        return audit_refusal(engine, address, reason, where, now, actor=actor, object_type=object_type,
                             object_id=object_id)


def charge_stored(session: Session, key_id: int, key_name: str, stored_bytes: int, per_day: int,
                  now: float | None = None) -> None:
    """Count `stored_bytes` against the key's daily allowance inside the caller's transaction (so a request
    that fails later takes nothing), or QuotaExceeded (429) when they would pass `per_day`: a leaked or
    runaway ingest key can fill at most that much disk a day. The counter is per UTC day; earlier days' go."""
    now = time.time() if now is None else now
    day = datetime.fromtimestamp(now, UTC)
    prefix = f"stored:{key_id}:"
    name = prefix + day.strftime("%Y-%m-%d")
    charged = session.exec(update(ApiCounter).where(ApiCounter.name == name,
                                                    ApiCounter.value + stored_bytes <= per_day)
                           .values(value=ApiCounter.value + stored_bytes, updated_at=now)).rowcount
    if charged == 1:
        return
    row = session.get(ApiCounter, name)
    if row is None and stored_bytes <= per_day:
        session.exec(delete(ApiCounter).where(col(ApiCounter.name).startswith(prefix)))
        session.add(ApiCounter(name=name, value=float(stored_bytes), updated_at=now))
        session.flush()
        return
    used = int(row.value) if row is not None else 0
    tomorrow = datetime.combine(day.date() + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    raise QuotaExceeded(f"API key {key_name!r} has stored {used} bytes today; this request would add "
                        f"{stored_bytes} and a key may store {per_day} a day (TFGRPO_INGEST_KEY_DAILY_BYTES); "
                        "retry after midnight UTC", (tomorrow - day).total_seconds())
