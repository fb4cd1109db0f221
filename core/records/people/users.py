"""People: adding a user, changing their role, switching them off, setting a password (admin only, audited).

The first active user switches sign-in on (core.records.people.roles). A person who signs in through the team's OpenID
Connect provider is added by the email the provider verifies, without a password (core.records.people.oidc finds them by
it the first time). Passwords are hashed in core.records.people.passwords, checked at sign-in in core.records.people.sign_in.
"""

from __future__ import annotations

import re

from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select

from core.domain.roles import PERSON_ROLES
from core.errors import InvalidInput, NotFound
from core.records.people.passwords import MIN_LENGTH, hash_password
from core.records.people.roles import LOCAL_USER, SYSTEM_ACTORS, is_reserved, require_role, sign_in_required
from storage import queries
from storage.db import session_scope
from storage.tables import AuditEvent, User

# A user name: letters, digits and . _ @ + - (so an email with a tag in its local part, ann+ops@team.example, is
# a name of its own, distinct from ann@team.example). No spaces or parentheses: the studio's own actors have those.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")
_EMAIL = re.compile(r"^[^@\s]{1,64}@[A-Za-z0-9.-]{1,190}\.[A-Za-z]{2,}$")


def valid_name(name: str) -> bool:
    """Whether `name` may be a user's name (what validate_new_user says, without saying it)."""
    return bool(_NAME.match(name or ""))


def validate_new_user(name: str, role: str, password: str | None) -> None:
    """A new user's name and role, and their password unless `password` is None (a person who signs in only
    through the provider: the name is then their email)."""
    if not valid_name(name):
        raise InvalidInput("a user name is 1-64 letters, digits, or . _ @ + - and starts with a letter or digit")
    if is_reserved(name) or name.lower() == LOCAL_USER:
        raise InvalidInput(f"{name!r} is reserved for the studio itself; choose another name")
    if role not in PERSON_ROLES:
        raise InvalidInput(f"unknown role {role!r}; use one of {', '.join(PERSON_ROLES)}")
    if password is None:
        if not _EMAIL.match(name):
            raise InvalidInput(f"{name!r} is not an email address: a person who signs in through the provider is "
                               "added by the email the provider verifies")
    elif len(password) < MIN_LENGTH:
        raise InvalidInput(f"the password must be at least {MIN_LENGTH} characters")


def add_user(engine: Engine, name: str, role: str, password: str | None, actor: str = "cli") -> User:
    """Create a user (the first one switches sign-in on); only an admin may add users.

    With `password` None the user is a person who signs in through the OpenID Connect provider, named and
    found by their email (stored in lower case), with no password."""
    name = (name or "").strip()
    if password is None:
        name = name.lower()
    validate_new_user(name, role, password)
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "adding users")
        if queries.user_by_name(session, name) is not None or (password is None and by_email(session, name)):
            raise InvalidInput(f"a user named {name!r} exists already")
        if role != "admin" and actor not in SYSTEM_ACTORS and not sign_in_required(session):
            raise InvalidInput("the first user turns sign-in on, so it must be an admin (or nobody could manage users)")
        user = User(name=name, role=role, password_hash="" if password is None else hash_password(password),
                    email=name if password is None else None, created_by=actor)
        session.add(user)
        session.flush()
        session.add(AuditEvent(actor=actor, action="user.add", object_type="user", object_id=user.id,
                               after={"name": name, "role": role,
                                      "sign_in": "provider" if password is None else "password"}))
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
            if role not in PERSON_ROLES:
                raise InvalidInput(f"unknown role {role!r}; use one of {', '.join(PERSON_ROLES)}")
            user.role = role
        if active is not None:
            user.active = active
        if password is not None:
            if len(password) < MIN_LENGTH:
                raise InvalidInput(f"the password must be at least {MIN_LENGTH} characters")
            user.password_hash = hash_password(password)
        session.add(user)
        after = {"role": user.role, "active": user.active, **({"password": "changed"} if password else {})}
        session.add(AuditEvent(actor=actor, action="user.update", object_type="user", object_id=user.id,
                               before=before, after=after))
        return user


def by_email(session: Session, email: str) -> User | None:
    """The user who is known by this email (stored in lower case), if any."""
    return session.exec(select(User).where(User.email == email.lower())).first()


def _active_admins(session: Session) -> int:
    return session.exec(select(func.count()).select_from(User).where(User.active, User.role == "admin")).one()
