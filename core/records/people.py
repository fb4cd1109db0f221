"""People and permissions: users with hashed passwords, roles, and the checks core functions make.

Sign-in is on as soon as the database holds one active user (`python -m core user add`). Until
then the studio serves a single local user who may do everything, which is what `make run` gives
a person trying it on their own machine. Roles are ordered: a labeller labels; a reviewer also
decides operations, edits libraries and starts runs; an admin also manages tasks, users and the
`production` label. The checks live here and are called by the core functions themselves, so a
page, the CLI or a script cannot get around them.

A page acts only for the person `page_actor` names (the signed-in user, or without sign-in the typed
name, never an internal actor). Sign-in attempts are counted before the password is checked, in one
transaction at a time, and a name or client that keeps failing waits a little longer each time (a
capped back-off, not a long lock a stranger could impose).

A person may also sign in through the team's OpenID Connect provider (provider_sign_in): the studio keeps their
role, keyed by the provider's issuer and subject, found the first time by the email the provider verified. An
administrator adds such a person by email without a password (`python -m core user add EMAIL --role R
--provider`, or the People page); a new person from an allowed domain gets the configured role (by default none:
signed in, allowed nothing, told whom to ask), anyone else is refused, and so is an email the provider has not
verified. Every sign-in and refusal is in the audit log with the provider's identity.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, delete, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select

from core.domain.roles import NO_ROLE, PERSON_ROLES, ROLES
from core.errors import InvalidInput, NotFound, PermissionDenied, SignInLocked, SignInRefused
from storage import queries
from storage.db import session_scope
from storage.statuses import SignInOutcome
from storage.tables import AuditEvent, SignInAttempt, User, as_utc, utcnow

RANK = {role: rank for rank, role in enumerate(ROLES)}
# Internal actors: the engine itself ("auto", "system") and the command line, whose user already
# holds the database file. User names may not take these, and no page may act as one (page_actor).
SYSTEM_ACTORS = frozenset({"auto", "system", "cli", "gate"})
LOCAL_USER = "local"
FAILED_SIGN_IN_ACTOR = "(sign-in)"  # no user name has parentheses
# What a page acts as when nobody may act from it (not signed in, or a reserved name typed): every role
# check refuses it, so an action that skips the page's own check still writes nothing.
NOBODY = "(nobody)"
SIGN_IN_FIRST = "sign in first (this studio has user accounts, and this tab is not signed in)"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_EMAIL = re.compile(r"^[^@\s]{1,64}@[A-Za-z0-9.-]{1,190}\.[A-Za-z]{2,}$")
PROVIDER_ACTOR = "(provider)"  # who adds a new person from an allowed domain: the provider's sign-in itself

# scrypt's cost: N=2^17, r=8, p=1 (OWASP's password storage guidance) takes ~0.4 s and 128 MiB per hash.
# Hashes made with other figures still verify and are remade with these at the next sign-in.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**17, 8, 1
_MAX_N, _MAX_R, _MAX_P = 2**20, 32, 16  # a stored hash asking for more is refused, not allowed to take GiBs
# At most this many hashes at once per process: a burst of sign-ins waits instead of taking all the memory.
_HASHING = threading.BoundedSemaphore(2)

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


def hash_password(password: str) -> str:
    """A salted scrypt hash at today's cost, as `scrypt$N$r$p$salt$digest` (the figures travel with it)."""
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    """scrypt with room for its memory (128·r·N bytes: hashlib's default limit of 32 MiB is too small for N=2^17)."""
    with _HASHING:
        return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=32,
                              maxmem=2 * 128 * r * (n + p + 2))


def _parameters(stored: str) -> tuple[int, int, int, bytes, str] | None:
    """N, r, p, salt and digest of a stored hash; None for anything that is not a sane scrypt hash."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        n, r, p, raw_salt = int(n), int(r), int(p), bytes.fromhex(salt)
    except (ValueError, TypeError, AttributeError):
        return None
    sane = scheme == "scrypt" and 1 < n <= _MAX_N and n & (n - 1) == 0 and 0 < r <= _MAX_R and 0 < p <= _MAX_P
    return (n, r, p, raw_salt, digest) if sane and raw_salt and digest else None


def check_password(password: str, stored: str) -> bool:
    """Whether `password` matches the stored hash, whatever scrypt figures it was made with."""
    found = _parameters(stored)
    if found is None:
        return False
    n, r, p, salt, digest = found
    try:
        got = _scrypt(password, salt, n, r, p)
    except ValueError:  # OpenSSL could not run it (e.g. no memory): no match, counted as a failure
        return False
    return hmac.compare_digest(got.hex(), digest)


def needs_rehash(stored: str) -> bool:
    """Whether a hash was made with other scrypt figures than today's (it is remade at the next sign-in)."""
    found = _parameters(stored)
    return found is None or found[:3] != (SCRYPT_N, SCRYPT_R, SCRYPT_P)


def _dummy_hash() -> str:
    """A hash no password matches, at today's cost: an unknown name takes as long to refuse as a wrong password."""
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${'00' * 16}${'00' * 32}"


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


def validate_new_user(name: str, role: str, password: str | None) -> None:
    """A new user's name and role, and their password unless `password` is None (a person who signs in only
    through the provider: the name is then their email)."""
    if not _NAME.match(name or ""):
        raise InvalidInput("a user name is 1-64 letters, digits, or . _ @ - and starts with a letter or digit")
    if is_reserved(name) or name.lower() == LOCAL_USER:
        raise InvalidInput(f"{name!r} is reserved for the studio itself; choose another name")
    if role not in PERSON_ROLES:
        raise InvalidInput(f"unknown role {role!r}; use one of {', '.join(PERSON_ROLES)}")
    if password is None:
        if not _EMAIL.match(name):
            raise InvalidInput(f"{name!r} is not an email address: a person who signs in through the provider is "
                               "added by the email the provider verifies")
    elif len(password) < 8:
        raise InvalidInput("the password must be at least 8 characters")


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
        if queries.user_by_name(session, name) is not None or (password is None and _by_email(session, name)):
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


def admin_names(session: Session) -> list[str]:
    """The active admins, whom a person without a role is told to ask."""
    return list(session.exec(select(User.name).where(User.active, User.role == "admin").order_by(User.name)))


def _by_email(session: Session, email: str) -> User | None:
    return session.exec(select(User).where(User.email == email.lower())).first()


# --- sign-in through the OpenID Connect provider ----------------------------------------------------------------


@dataclass(frozen=True)
class ProviderIdentity:
    """Who the provider says signed in: the ID token's issuer and subject, and the email with whether the
    provider verified it."""

    issuer: str
    subject: str
    email: str | None
    email_verified: bool

    @classmethod
    def from_claims(cls, claims: Mapping) -> ProviderIdentity:
        """From the ID token's claims (st.user); InvalidInput without an issuer and a subject."""
        issuer, subject = str(claims.get("iss") or "").strip(), str(claims.get("sub") or "").strip()
        if not issuer or not subject:
            raise InvalidInput("the provider's answer names no issuer or subject; nobody was signed in")
        email = str(claims.get("email") or "").strip().lower() or None
        verified = claims.get("email_verified")
        return cls(issuer=issuer[:300], subject=subject[:300], email=email and email[:254],
                   email_verified=verified is True or str(verified).lower() == "true")

    def words(self) -> str:
        """How the audit log and a refusal name the identity."""
        return f"{self.email or 'no email'} (subject {self.subject} at {self.issuer})"

    def audit(self) -> dict:
        return {"via": "provider", "issuer": self.issuer, "subject": self.subject, "email": self.email,
                "email_verified": self.email_verified}


@dataclass(frozen=True)
class NewPeople:
    """What the configuration lets a person the studio does not know yet: the email domains whose people are
    let in, and the role they get (NO_ROLE by default)."""

    domains: tuple[str, ...] = ()
    role: str = NO_ROLE

    def __post_init__(self) -> None:
        if self.role not in PERSON_ROLES or self.role == "admin":
            raise InvalidInput(f"a new person's role must be one of none, labeler, reviewer, not {self.role!r}")

    def admits(self, email: str) -> bool:
        domain = email.rsplit("@", 1)[-1]
        return any(domain == allowed.lower().strip().lstrip("@") for allowed in self.domains if allowed.strip())


def provider_sign_in(engine: Engine, identity: ProviderIdentity, new_people: NewPeople) -> User:
    """The studio's person for an identity the provider signed in, or SignInRefused saying why and whom to ask.

    Found by issuer and subject, else (the first time) by the verified email, whose user then records them. A
    person the studio does not know is added with the configured role if their verified email's domain is
    allowed. The sign-in, or the refusal, is audited with the provider's identity."""
    with session_scope(engine) as session:
        user, reason = _provider_person(session, identity, new_people)
        if user is not None:
            session.add(AuditEvent(actor=user.name, action="user.sign_in", object_type="user", object_id=user.id,
                                   after=identity.audit()))
            return user
        admins = ", ".join(admin_names(session)) or "an administrator"
    with session_scope(engine) as session:
        session.add(AuditEvent(actor=FAILED_SIGN_IN_ACTOR, action="user.sign_in_refused", object_type="user",
                               after={**identity.audit(), "reason": reason}))
    raise SignInRefused(f"{reason}; ask {admins} to add you on the People page")


def _provider_person(session: Session, identity: ProviderIdentity, new_people: NewPeople) -> tuple[User | None, str]:
    """The user for `identity` (adding a new person from an allowed domain), else None and the reason."""
    user = session.exec(select(User).where(User.issuer == identity.issuer, User.subject == identity.subject)).first()
    if user is None:
        if identity.email is None:
            return None, f"the provider signed in {identity.words()}, whom this studio does not know"
        if not identity.email_verified:
            return None, f"the provider has not verified the email {identity.email}, so the studio cannot go by it"
        user = _by_email(session, identity.email)
        if user is not None and user.subject is not None:
            return None, (f"{identity.email} belongs to another identity of the provider than {identity.words()}")
        if user is None:
            if not new_people.admits(identity.email):
                return None, f"{identity.email} is not a person of this studio"
            if queries.user_by_name(session, identity.email) is not None or not _NAME.match(identity.email):
                return None, f"{identity.email} cannot be added by its email: a user of that name exists already"
            user = User(name=identity.email, role=new_people.role, password_hash="", email=identity.email,
                        created_by=PROVIDER_ACTOR)
            session.add(user)
            session.flush()
            session.add(AuditEvent(actor=PROVIDER_ACTOR, action="user.add", object_type="user", object_id=user.id,
                                   after={"name": user.name, "role": user.role, "sign_in": "provider",
                                          "domain": identity.email.rsplit("@", 1)[-1]}))
        user.issuer, user.subject = identity.issuer, identity.subject
        session.add(user)
    if not user.active:
        return None, f"{user.name} is switched off in this studio"
    return user, ""


def record_sign_out(engine: Engine, name: str, via: str) -> None:
    """Write the sign-out into the audit log (`via`: password or provider)."""
    with session_scope(engine) as session:
        user = queries.user_by_name(session, name)
        session.add(AuditEvent(actor=name, action="user.sign_out", object_type="user",
                               object_id=user.id if user else None, after={"via": via}))


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
    stored = user.password_hash if user is not None else _dummy_hash()
    ok = check_password(password or "", stored) and user is not None and user.active
    new_hash = hash_password(password) if ok and needs_rehash(stored) else None
    _settle_attempt(engine, attempt_id, name, user, ok, stored, new_hash)
    return user if ok else None


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
