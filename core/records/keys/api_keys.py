"""API keys for live agents: created and revoked by an admin, shown once, kept only as a hash.

A `read` key fetches libraries; an `ingest` key also posts production traces (an agent that logs its
traces also fetches its library, so ingest includes read). A request with no key, an unknown or revoked
key, or a key without the role gets `Unauthorized` or `PermissionDenied` and leaves an audit event, so
the Audit page shows who was turned away (an unknown key once a minute per address, a revoked one once a minute per
key, each with the count since the last).

A key may be made for a person (`person`): it then carries at most that person's role, asked at every request, so
a key made for a reviewer stops posting traces the moment the reviewer becomes a labeller, and stops working
when they are switched off (API_ROLE_NEEDS: a read key needs a labeller, an ingest key a reviewer).

An ingest key is bound when it is made: to a task (and a library), where every trace and span it sends is
stored whatever it names (a span naming another task is refused), or, only when the admin says so, to any
task (`any_task`: the trace or span, or the service map, decides). A key is never both, and never neither. A read
key may be bound to a task too; unbound, it reads every task. A bound key reads only its task, as it writes only
there (`key_scope`, `within_key_task`), and every refusal of a bound key is audited, one row a minute per key
(`audit_outside_task`).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from core.domain.roles import API_ROLE_NEEDS, API_ROLES
from core.errors import InvalidInput, NotFound, OutsideTask, PermissionDenied, Unauthorized
from core.records.keys.limits import API_ACTOR, audit_refusal
from core.records.people.roles import RANK as PERSON_RANK
from core.records.people.roles import require_role, role_of
from core.records.tasks.lookup import get_task
from storage import queries
from storage.db import session_scope
from storage.tables import ApiKey, AuditEvent, Task, as_utc, utcnow

RANK = {"read": 0, "ingest": 1}
KEY_PREFIX = "tfg_"
LAST_USED_EVERY = timedelta(seconds=60)  # a key's last-used time is written at most this often


@dataclass(frozen=True)
class NewKey:
    """A key as created: `secret` is the whole key, shown this once and never stored."""

    id: int
    name: str
    role: str
    secret: str


@dataclass(frozen=True)
class KeyUse:
    """Who is calling: the key's id, name and role once it was checked, and the person it acts for."""

    id: int
    name: str
    role: str
    person: str | None = None
    task_id: int | None = None  # an ingest key's task: everything it sends is stored there
    library: str | None = None  # and its library, if the admin bound one
    any_task: bool = False  # an ingest key the admin let write to any task


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_key(engine: Engine, name: str, role: str, actor: str, person: str | None = None, *,
               task: str | None = None, library: str | None = None, any_task: bool = False) -> NewKey:
    """A new key for `role`, acting for `person` if named; only an admin may make one. A key for a person may
    not be above their role (InvalidInput). An ingest key names its `task` (and `library`), or the admin sets
    `any_task` (see the module's note). The returned secret is the only copy."""
    name, person = (name or "").strip(), (person or "").strip() or None
    task, library = (task or "").strip() or None, (library or "").strip() or None
    if role == "ingest" and (task is None) == (not any_task):
        raise InvalidInput("an ingest key is bound to a task (--task) or, by an admin's choice, to any task "
                           "(--any-task): name one of the two; nothing was created")
    if role != "ingest" and any_task:
        raise InvalidInput("a read key reads every task unless it is bound to one (--task); --any-task is for "
                           "ingest keys; nothing was created")
    if library and not task:
        raise InvalidInput("a key's library is one of its task's: name the task too; nothing was created")
    if not name or len(name) > 100:
        raise InvalidInput("an API key needs a name of 1-100 characters (say which agent uses it)")
    if role not in API_ROLES:
        raise InvalidInput(f"unknown API key role {role!r}; use one of {', '.join(API_ROLES)}")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "creating API keys")
        if person is not None:
            problem = _above_person(session, person, role)
            if problem:
                raise InvalidInput(f"{problem}; nothing was created")
        bound = get_task(session, task) if task else None
        if bound is not None and library and queries.library_by_name(session, bound.id, library) is None:
            raise NotFound(f"task {bound.name!r} has no library {library!r}; nothing was created")
        key = ApiKey(name=name, role=role, prefix=secret[:12], key_hash=key_hash(secret), created_by=actor,
                     person=person, task_id=bound.id if bound else None, library=library, any_task=any_task)
        session.add(key)
        session.flush()
        session.add(AuditEvent(actor=actor, action="apikey.create", object_type="apikey", object_id=key.id,
                               after={"name": name, "role": role, "prefix": key.prefix, "person": person,
                                      "task": bound.name if bound else None, "library": library,
                                      "any_task": any_task}))
        return NewKey(id=key.id, name=name, role=role, secret=secret)


def key_scope(session: Session, key: KeyUse | None, task_name: str | None,
              library_name: str | None, *, doing: str = "writes") -> tuple[str | None, str | None]:
    """The task and library a write (or, `doing="reads"`, a read) by `key` goes to: the key's binding when it has
    one, whatever the request named (one naming another task or library is refused: OutsideTask, which the API
    audits), else what it named. The one check every keyed route shares."""
    if key is None or key.task_id is None:
        return task_name, library_name
    task = session.get(Task, key.task_id)
    if task is None:
        raise NotFound(f"API key {key.name!r} is bound to a task that no longer exists")
    if task_name and task_name != task.name:
        raise OutsideTask(f"API key {key.name!r} {doing} only in task {task.name!r}; this names task "
                          f"{task_name[:100]!r}", key.id, key.name)
    if key.library and library_name and library_name != key.library:
        raise OutsideTask(f"API key {key.name!r} {doing} only in library {key.library!r} of task {task.name!r}; "
                          f"this names library {library_name[:100]!r}", key.id, key.name)
    return task.name, key.library or library_name


def within_key_task(session: Session, key: KeyUse | None, task_id: int, what: str) -> None:
    """Refuse (OutsideTask) a bound key's read of `what`, a thing of another task found by its id."""
    if key is None or key.task_id is None or task_id == key.task_id:
        return
    own = session.get(Task, key.task_id)
    raise OutsideTask(f"API key {key.name!r} reads only in task {own.name if own else key.task_id!r}; {what} is "
                      "not one of its", key.id, key.name)


def audit_outside_task(engine: Engine, refused: OutsideTask, where: str) -> bool:
    """Audit a bound key's refusal (`api.denied`), at most one row a minute per key with the count since the last,
    so a leaked key probing other tasks shows on the Audit page without filling it."""
    return audit_refusal(engine, f"key:{refused.key_id}", str(refused), where, actor=f"(api key {refused.key_name})",
                         object_type="apikey", object_id=refused.key_id)


def _above_person(session: Session, person: str, role: str) -> str:
    """Why a key with `role` may not act for `person` now (unknown, switched off, a lower role), or ''."""
    user = queries.user_by_name(session, person)
    if user is None or not user.active:
        return f"{person} is not an active user"
    have, need = role_of(session, person), API_ROLE_NEEDS[role]
    if have is None or PERSON_RANK[have] < PERSON_RANK[need]:
        article = "an" if role[0] in "aeiou" else "a"
        return f"{person} is {'a ' + have if have else 'without a role'}; {article} {role} key needs a {need} or above"
    return ""


def revoke_key(engine: Engine, key_id: int, actor: str) -> None:
    """Revoke a key for good; requests with it get 401 from then on."""
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "revoking API keys")
        key = session.get(ApiKey, key_id)
        if key is None:
            raise NotFound(f"there is no API key {key_id}")
        if key.revoked_at is not None:
            return
        key.revoked_at, key.revoked_by = utcnow(), actor
        session.add(key)
        session.add(AuditEvent(actor=actor, action="apikey.revoke", object_type="apikey", object_id=key.id,
                               before={"name": key.name, "role": key.role, "prefix": key.prefix}))


def key_writes_to(key: ApiKey, tasks: dict[int, str]) -> str:
    """Where a key writes, in words (the People page and `apikey list`): its task (and library), any task,
    or nothing (a read key)."""
    if key.task_id is not None:
        return tasks.get(key.task_id, f"task {key.task_id} (gone)") + (f" / {key.library}" if key.library else "")
    return "any task" if key.any_task else "-"


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.exec(select(ApiKey).order_by(ApiKey.id)))


def check_key(engine: Engine, secret: str | None, role: str, doing: str, where: str = "",
              address: str = "unknown") -> KeyUse:
    """The key behind `secret` if it may do what `role` allows; else Unauthorized (no, unknown or revoked
    key) or PermissionDenied (a read key asked to ingest). A refusal naming a key is audited each time;
    one without a known key is counted per client `address` and audited at most once a minute with the
    count, so a flood of made-up keys cannot fill the audit log. `where` names the request."""
    found = None
    if secret:
        with Session(engine) as session:
            found = session.exec(select(ApiKey).where(ApiKey.key_hash == key_hash(secret))).first()
    reason = ("no API key (send `Authorization: Bearer <key>`)" if not secret
              else "unknown API key" if found is None
              else f"API key {found.name!r} was revoked" if found.revoked_at is not None
              else None)
    if reason is not None:
        if found is None:  # nobody to name: counted per address, audited once a minute
            audit_refusal(engine, address, reason, where)
        else:  # a revoked key still in use: counted per key, audited once a minute with the count
            audit_refusal(engine, f"key:{found.id}:revoked", reason, where, actor=f"(api key {found.name})",
                          object_type="apikey", object_id=found.id)
        raise Unauthorized(reason)
    if RANK[found.role] < RANK[role]:
        reason = f"API key {found.name!r} is a {found.role} key; {doing} needs an {role} key"
        _denied(engine, found, reason, where)
        raise PermissionDenied(reason)
    if found.person is not None:
        with Session(engine) as session:
            problem = _above_person(session, found.person, role)
        if problem:
            reason = f"API key {found.name!r} acts for {found.person}: {problem}, so {doing} is refused"
            _denied(engine, found, reason, where)
            raise PermissionDenied(reason)
    _touch(engine, found)
    return KeyUse(id=found.id, name=found.name, role=found.role, person=found.person, task_id=found.task_id,
                  library=found.library, any_task=found.any_task)


def _denied(engine: Engine, key: ApiKey | None, reason: str, where: str) -> None:
    with session_scope(engine) as session:
        session.add(AuditEvent(actor=f"(api key {key.name})" if key is not None else API_ACTOR, action="api.denied",
                               object_type="apikey", object_id=key.id if key is not None else None,
                               after={"reason": reason, "request": where}))


def _touch(engine: Engine, key: ApiKey, now: datetime | None = None) -> None:
    """Keep the key's last-used time, written at most once a minute so busy agents cost no write per call."""
    now = now or utcnow()
    last = as_utc(key.last_used_at)
    if last is not None and now - last < LAST_USED_EVERY:
        return
    with session_scope(engine) as session:
        row = session.get(ApiKey, key.id)
        if row is not None:
            row.last_used_at = now
            session.add(row)
