"""People and permissions: users with hashed passwords, roles, and the checks core functions make.

Sign-in is on as soon as the database holds one active user (`python -m core user add`). Until
then the studio serves a single local user who may do everything, which is what `make run` gives
a person trying it on their own machine. Roles are ordered: a labeller labels; a reviewer also
decides operations, edits libraries and starts runs; an admin also manages tasks, users and the
`production` label. The checks live here and are called by the core functions themselves, so a
page, the CLI or a script cannot get around them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import UTC, timedelta

from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select

from core.errors import InvalidInput, NotFound, PermissionDenied, SignInLocked
from storage import queries
from storage.db import session_scope
from storage.models import AuditEvent, User, utcnow

ROLES = ("labeler", "reviewer", "admin")
RANK = {role: rank for rank, role in enumerate(ROLES)}
# Internal actors: the engine itself ("auto", "system") and the command line, whose user already
# holds the database file. User names may not take these.
SYSTEM_ACTORS = frozenset({"auto", "system", "cli", "gate"})
LOCAL_USER = "local"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}
MAX_FAILURES = 5
LOCK_WINDOW = timedelta(minutes=10)


_DUMMY_HASH = "scrypt$16384$8$1$" + "00" * 16 + "$" + "00" * 32


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, dklen=32, **_SCRYPT)
    return f"scrypt${_SCRYPT['n']}${_SCRYPT['r']}${_SCRYPT['p']}${salt.hex()}${digest.hex()}"


def check_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        got = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt), dklen=32, n=int(n), r=int(r), p=int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got.hex(), digest)


def sign_in_required(session: Session) -> bool:
    """True once any active user exists; before that the single local user does everything."""
    return bool(session.exec(select(func.count()).select_from(User).where(User.active)).one())


def role_of(session: Session, actor: str) -> str | None:
    """The actor's role: `admin` for internal actors and for everyone while sign-in is off."""
    if actor in SYSTEM_ACTORS or not sign_in_required(session):
        return "admin"
    user = queries.user_by_name(session, actor)
    return user.role if user is not None and user.active else None


def can(session: Session, actor: str, role: str) -> bool:
    have = role_of(session, actor)
    return have is not None and RANK[have] >= RANK[role]


def require_role(session: Session, actor: str, role: str, doing: str) -> None:
    """Raise PermissionDenied unless the actor has at least `role`; `doing` names the action."""
    if can(session, actor, role):
        return
    have = role_of(session, actor)
    who = f"{actor} is a {have}" if have else f"{actor!r} is not a signed-in user"
    raise PermissionDenied(f"{who}; {doing} needs the {role} role")


def validate_new_user(name: str, role: str, password: str) -> None:
    if not _NAME.match(name or ""):
        raise InvalidInput("a user name is 1-64 letters, digits, or . _ @ - and starts with a letter or digit")
    if name in SYSTEM_ACTORS or name == LOCAL_USER:
        raise InvalidInput(f"{name!r} is reserved for the studio itself; choose another name")
    if role not in ROLES:
        raise InvalidInput(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
    if len(password or "") < 8:
        raise InvalidInput("the password must be at least 8 characters")


def add_user(engine: Engine, name: str, role: str, password: str, actor: str = "cli") -> User:
    """Create a user (the first one switches sign-in on); only an admin may add users."""
    validate_new_user(name, role, password)
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "adding users")
        if queries.user_by_name(session, name) is not None:
            raise InvalidInput(f"a user named {name!r} exists already")
        if role != "admin" and actor not in SYSTEM_ACTORS and not sign_in_required(session):
            raise InvalidInput("the first user turns sign-in on, so it must be an admin (or nobody could manage users)")
        user = User(name=name, role=role, password_hash=hash_password(password), created_by=actor)
        session.add(user)
        session.flush()
        session.add(AuditEvent(actor=actor, action="user.add", object_type="user", object_id=user.id,
                               after={"name": name, "role": role}))
        return user


def update_user(engine: Engine, name: str, actor: str, *, role: str | None = None, active: bool | None = None,
                password: str | None = None) -> User:
    """Change a user's role, switch them off or set a new password (admin only, audited without the hash)."""
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "managing users")
        user = queries.user_by_name(session, name)
        if user is None:
            raise NotFound(f"no user named {name!r}")
        before = {"role": user.role, "active": user.active}
        stays_admin = (role or user.role) == "admin" and (user.active if active is None else active)
        if user.role == "admin" and user.active and not stays_admin and _active_admins(session) == 1:
            raise InvalidInput(f"{name} is the last active admin; make another admin first")
        if role is not None:
            if role not in ROLES:
                raise InvalidInput(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
            user.role = role
        if active is not None:
            user.active = active
        if password is not None:
            if len(password) < 8:
                raise InvalidInput("the password must be at least 8 characters")
            user.password_hash = hash_password(password)
        session.add(user)
        after = {"role": user.role, "active": user.active, **({"password": "changed"} if password else {})}
        session.add(AuditEvent(actor=actor, action="user.update", object_type="user", object_id=user.id,
                               before=before, after=after))
        return user


def _active_admins(session: Session) -> int:
    return session.exec(select(func.count()).select_from(User).where(User.active, User.role == "admin")).one()


def _recent_failures(session: Session, name: str) -> int:
    """Failed sign-ins for this name in the lock window, counted since its last successful one."""
    since = utcnow() - LOCK_WINDOW
    last_ok = session.exec(select(func.max(AuditEvent.created_at)).where(
        AuditEvent.actor == name, AuditEvent.action == "user.sign_in")).one()
    if last_ok is not None:
        since = max(since, last_ok if last_ok.tzinfo else last_ok.replace(tzinfo=UTC))
    return session.exec(select(func.count()).select_from(AuditEvent).where(
        AuditEvent.actor == name, AuditEvent.action == "user.sign_in_failed", AuditEvent.created_at > since)).one()


def authenticate(engine: Engine, name: str, password: str) -> User | None:
    """The active user with this name and password, else None (the same answer for either mistake).

    After MAX_FAILURES failed attempts on one name within LOCK_WINDOW, SignInLocked is raised
    without checking the password, which makes guessing passwords slow."""
    name = (name or "").strip()[:64]
    with session_scope(engine) as session:
        if _recent_failures(session, name) >= MAX_FAILURES:
            minutes = int(LOCK_WINDOW.total_seconds() // 60)
            raise SignInLocked(f"too many failed sign-ins for this user name; try again in {minutes} minutes")
    with session_scope(engine) as session:
        user = queries.user_by_name(session, name)
        # An unknown name costs the same scrypt as a wrong password, so timing does not reveal user names.
        ok = check_password(password or "", user.password_hash if user else _DUMMY_HASH) and bool(user and user.active)
        session.add(AuditEvent(actor=name or "?", action="user.sign_in" if ok else "user.sign_in_failed",
                               object_type="user", object_id=user.id if user else None))
        return user if ok else None
