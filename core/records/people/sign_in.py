"""Password sign-in with a back-off a stranger cannot turn into a long lock, and sign-out, both audited.

Sign-in attempts are counted before the password is checked, in one transaction at a time, and a name or client
that keeps failing waits a little longer each time (a capped back-off, not a long lock a stranger could impose).
"""

from __future__ import annotations

import hashlib
import math
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, delete, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select

from core.errors import SignInLocked
from core.records.people.passwords import check_password, dummy_hash, hash_password, needs_rehash
from storage import queries
from storage.db import session_scope
from storage.statuses import SignInOutcome
from storage.tables import AuditEvent, SignInAttempt, User, as_utc, utcnow

FAILED_SIGN_IN_ACTOR = "(sign-in)"  # no user name has parentheses

# Back-off: after MAX_FAILURES failed sign-ins on a name (since its last success, within FAILURE_WINDOW)
# the next attempt waits FIRST_WAIT after the last failure, doubling with every further failure up to
# MAX_WAIT, so a stranger cannot shut a person out for long. One client (address, else browser tab) gets
# CLIENT_MAX_FAILURES over all names, never reset by a success, and waits up to CLIENT_MAX_WAIT.
MAX_FAILURES = 5
CLIENT_MAX_FAILURES = 10
FAILURE_WINDOW = timedelta(hours=1)
FIRST_WAIT = timedelta(seconds=30)
MAX_WAIT = timedelta(minutes=5)
CLIENT_MAX_WAIT = timedelta(minutes=15)
# Key of the PostgreSQL advisory lock that sign-in bookkeeping takes (any constant bigint would do).
_SIGN_IN_LOCK = 0x7F61_7369_676E


def client_key(ip_address: str | None, session_id: str | None) -> str:
    """Who knocks, for the per-client back-off: the browser's address, else its tab (a hash of the session
    id, which is a secret that resumes a session and must not be stored)."""
    if ip_address:
        return f"ip:{ip_address}"[:80]
    if session_id:
        return "tab:" + hashlib.sha256(session_id.encode()).hexdigest()[:16]
    return ""


def authenticate(engine: Engine, name: str, password: str, client: str | None = None) -> User | None:
    """The active user with this name and password, else None (the same answer for either mistake).

    The attempt is written and counted in one transaction that sign-ins take one at a time, before the
    password is checked, so attempts made at the same moment count each other. While the name or the
    client (`client_key`; None from the command line) is backing off, SignInLocked is raised without
    checking the password. A hash made with older scrypt figures is remade at a successful sign-in."""
    name, client = (name or "").strip()[:64], (client or "")[:80]
    attempt_id, user = _claim_attempt(engine, name, client)
    stored = user.password_hash if user is not None else dummy_hash()
    ok = check_password(password or "", stored) and user is not None and user.active
    new_hash = hash_password(password) if ok and needs_rehash(stored) else None
    _settle_attempt(engine, attempt_id, name, user, ok, stored, new_hash)
    return user if ok else None


def record_sign_out(engine: Engine, name: str, via: str) -> None:
    """Write the sign-out into the audit log (`via`: password or provider)."""
    with session_scope(engine) as session:
        user = queries.user_by_name(session, name)
        session.add(AuditEvent(actor=name, action="user.sign_out", object_type="user",
                               object_id=user.id if user else None, after={"via": via}))


def _claim_attempt(engine: Engine, name: str, client: str) -> tuple[int, User | None]:
    """Record the attempt as pending and refuse it if the name or client must wait; returns its id and the user.

    On SQLite the INSERT is the transaction's first statement, which takes the database's single write lock
    (waiting for it under the busy timeout) with the newest snapshot; on PostgreSQL an advisory lock does the
    same. A refused attempt is rolled back: waiting out a back-off costs a stranger's retries nothing more."""
    with session_scope(engine) as session:
        if session.get_bind().dialect.name == "postgresql":
            session.exec(select(func.pg_advisory_xact_lock(_SIGN_IN_LOCK)))
        attempt = SignInAttempt(name=name, client=client, outcome=SignInOutcome.PENDING, created_at=utcnow())
        session.add(attempt)
        session.flush()
        now = utcnow()
        session.exec(delete(SignInAttempt).where(SignInAttempt.created_at < now - FAILURE_WINDOW))
        _refuse_while_backing_off(session, attempt, now)
        user = queries.user_by_name(session, name)
        session.expunge_all()
        return attempt.id, user


def _refuse_while_backing_off(session: Session, attempt: SignInAttempt, now: datetime) -> None:
    """Raise SignInLocked if the name's or the client's failures (pending attempts included) ask for a wait."""
    since = now - FAILURE_WINDOW
    last_ok = session.exec(select(func.max(SignInAttempt.created_at)).where(
        SignInAttempt.name == attempt.name, SignInAttempt.outcome == SignInOutcome.OK)).one()
    if last_ok is not None:
        since = max(since, as_utc(last_ok))
    wait = _backoff(session, SignInAttempt.name == attempt.name, since, attempt.id, MAX_FAILURES, MAX_WAIT, now)
    if wait:
        raise SignInLocked(f"too many failed sign-ins for this user name; try again in {_say(wait)}")
    if attempt.client:
        wait = _backoff(session, SignInAttempt.client == attempt.client, now - FAILURE_WINDOW, attempt.id,
                        CLIENT_MAX_FAILURES, CLIENT_MAX_WAIT, now)
        if wait:
            raise SignInLocked(f"too many failed sign-ins from this connection; try again in {_say(wait)}")


def _backoff(session: Session, whose: ColumnElement[bool], since: datetime, own_id: int, free: int, cap: timedelta,
             now: datetime) -> timedelta:
    """How long to wait: none for the first `free` failures, then FIRST_WAIT after the last one, doubling
    with each further failure up to `cap`."""
    count, last = session.exec(select(func.count(), func.max(SignInAttempt.created_at)).where(
        whose, SignInAttempt.outcome != SignInOutcome.OK, SignInAttempt.created_at > since, SignInAttempt.id != own_id)).one()
    if count < free or last is None:
        return timedelta(0)
    delay = min(FIRST_WAIT * 2 ** min(count - free, 30), cap)
    return max(as_utc(last) + delay - now, timedelta(0))


def _settle_attempt(engine: Engine, attempt_id: int, name: str, user: User | None, ok: bool, stored: str,
                    new_hash: str | None) -> None:
    """Record the outcome (and a remade hash) and write the audit event.

    Writes only, the first one first, so on SQLite it queues for the write lock rather than failing on a
    stale snapshot. The new hash replaces the old one only if nobody set another password meanwhile."""
    with session_scope(engine) as session:
        session.exec(update(SignInAttempt).where(SignInAttempt.id == attempt_id).values(outcome=SignInOutcome.OK if ok else SignInOutcome.FAILED))
        if new_hash is not None and user is not None:
            changed = session.exec(update(User).where(User.id == user.id, User.password_hash == stored)
                                   .values(password_hash=new_hash))
            if changed.rowcount:
                user.password_hash = new_hash
        # A failed attempt is not acted by the name typed (anyone may type "cli"): the typed name is its detail.
        session.add(AuditEvent(actor=name if ok else FAILED_SIGN_IN_ACTOR,
                               action="user.sign_in" if ok else "user.sign_in_failed", object_type="user",
                               object_id=user.id if user else None, after=None if ok else {"name": name[:64]}))


def _say(wait: timedelta) -> str:
    """A wait as a person reads it: seconds up to two minutes, then whole minutes (rounded up)."""
    seconds = max(1, math.ceil(wait.total_seconds()))
    if seconds < 120:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    return f"{math.ceil(seconds / 60)} minutes"
