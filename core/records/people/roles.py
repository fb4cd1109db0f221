"""Who may do what: a person's role as stored, the internal actors, and the checks every core function makes.

Sign-in is on as soon as the database holds one active user (`python -m core user add`). Until then the studio
serves a single local user who may do everything, which is what `make run` gives a person trying it on their own
machine. Roles are ordered: a labeller labels; a reviewer also decides operations, edits libraries and starts runs;
an admin also manages tasks, users and the `production` label. The checks live here and are called by the core
functions themselves, so a page, the CLI or a script cannot get around them.

A page acts only for the person `page_actor` names (the signed-in user, or without sign-in the typed name, never an
internal actor).
"""

from __future__ import annotations

from sqlmodel import Session, func, select

from core.domain.roles import ROLES
from core.errors import PermissionDenied
from storage import queries
from storage.tables import User

RANK = {role: rank for rank, role in enumerate(ROLES)}
# Internal actors: the engine itself ("auto", "system") and the command line, whose user already
# holds the database file. User names may not take these, and no page may act as one (page_actor).
SYSTEM_ACTORS = frozenset({"auto", "system", "cli", "gate"})
LOCAL_USER = "local"
# What a page acts as when nobody may act from it (not signed in, or a reserved name typed): every role
# check refuses it, so an action that skips the page's own check still writes nothing.
NOBODY = "(nobody)"
SIGN_IN_FIRST = "sign in first (this studio has user accounts, and this tab is not signed in)"


def sign_in_required(session: Session) -> bool:
    """True once any active user exists; before that the single local user does everything."""
    return bool(session.exec(select(func.count()).select_from(User).where(User.active)).one())


def role_of(session: Session, actor: str) -> str | None:
    """The actor's role: `admin` for internal actors and for everyone while sign-in is off; none for NOBODY."""
    if actor == NOBODY:
        return None
    if actor in SYSTEM_ACTORS or not sign_in_required(session):
        return "admin"
    user = queries.user_by_name(session, actor)
    return user.role if user is not None and user.active and user.role in RANK else None


def can(session: Session, actor: str, role: str) -> bool:
    have = role_of(session, actor)
    return have is not None and RANK[have] >= RANK[role]


def require_role(session: Session, actor: str, role: str, doing: str) -> None:
    """Raise PermissionDenied unless the actor has at least `role`; `doing` names the action."""
    if can(session, actor, role):
        return
    have = role_of(session, actor)
    if actor == NOBODY:
        raise PermissionDenied(f"nobody may act from this tab (sign in first, or type your own name in the "
                               f"sidebar); {doing} needs the {role} role")
    user = queries.user_by_name(session, actor)
    who = (f"{actor} is a {have}" if have
           else f"{actor} has no role yet (an admin gives one on People)" if user is not None and user.active
           else f"{actor!r} is not a signed-in user")
    raise PermissionDenied(f"{who}; {doing} needs the {role} role")


def admin_names(session: Session) -> list[str]:
    """The active admins, whom a person without a role is told to ask."""
    return list(session.exec(select(User.name).where(User.active, User.role == "admin").order_by(User.name)))


def is_reserved(name: str | None) -> bool:
    """Whether a name belongs to the studio itself (an internal actor or NOBODY), in any case or spacing."""
    cleaned = (name or "").strip()
    return cleaned.lower() in SYSTEM_ACTORS or cleaned == NOBODY


def page_actor(session: Session, signed_in: str | None, typed: str | None) -> str:
    """The person a page acts for, or PermissionDenied; pages ask this inside every action's callback.

    With sign-in on it is only the signed-in user, still active; a name typed in the sidebar counts for
    nothing. Without sign-in it is the typed name, never an internal actor's: a tab opened before sign-in
    was switched on must not act (as `cli`, say, which core treats as admin) after it was."""
    if sign_in_required(session):
        user = queries.user_by_name(session, signed_in) if signed_in and not is_reserved(signed_in) else None
        if user is None or not user.active:
            raise PermissionDenied(SIGN_IN_FIRST)
        return user.name
    name = (typed or "").strip() or LOCAL_USER
    if is_reserved(name):
        raise PermissionDenied(f"{name!r} is reserved for the studio itself; type your own name in the sidebar")
    return name
