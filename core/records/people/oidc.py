"""Sign-in through the team's OpenID Connect provider: the studio keeps each person's role, keyed by the provider's
issuer and subject, found the first time by the email the provider verified.

An administrator adds such a person by email without a password (`python -m core user add EMAIL --role R
--provider`, or the People page); a new person from an allowed domain gets the configured role (by default none:
signed in, allowed nothing, told whom to ask), anyone else is refused, and so is an email the provider has not
verified, and an ID token without an issue time (its sign-in could never expire). One (issuer, subject) is one
person: a unique index holds that when two first sign-ins arrive at once, and the one that loses the race is
signed in as the person the other bound. Every sign-in (once per ID token, however often its pages are loaded)
and every refusal is in the audit log with the provider's identity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import or_, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from core.domain.roles import NO_ROLE, PERSON_ROLES
from core.errors import InvalidInput, SignInRefused
from core.records.people.roles import admin_names
from core.records.people.sign_in import FAILED_SIGN_IN_ACTOR
from core.records.people.users import by_email, valid_name
from storage import queries
from storage.db import session_scope
from storage.tables import AuditEvent, User

PROVIDER_ACTOR = "(provider)"  # who adds a new person from an allowed domain: the provider's sign-in itself
NO_ISSUE_TIME = ("the provider's ID token carries no issue time (iat), so the studio could not tell when this "
                 "sign-in ends; nobody was signed in")


@dataclass(frozen=True)
class ProviderIdentity:
    """Who the provider says signed in: the ID token's issuer and subject, the email with whether the provider
    verified it, and when the token was issued (epoch seconds: a sign-in is counted, and expires, by it)."""

    issuer: str
    subject: str
    email: str | None
    email_verified: bool
    issued_at: int

    @classmethod
    def from_claims(cls, claims: Mapping) -> ProviderIdentity:
        """From the ID token's claims (st.user); InvalidInput without an issuer, a subject or an issue time."""
        issuer, subject = str(claims.get("iss") or "").strip(), str(claims.get("sub") or "").strip()
        if not issuer or not subject:
            raise InvalidInput("the provider's answer names no issuer or subject; nobody was signed in")
        issued = claims.get("iat")
        if isinstance(issued, bool) or not isinstance(issued, int | float) or issued != issued:
            raise InvalidInput(NO_ISSUE_TIME)
        email = str(claims.get("email") or "").strip().lower() or None
        verified = claims.get("email_verified")
        return cls(issuer=issuer[:300], subject=subject[:300], email=email and email[:254],
                   email_verified=verified is True or str(verified).lower() == "true", issued_at=int(issued))

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
    allowed. A sign-in is audited once per ID token (its issue time), a refusal each time, with the provider's
    identity. A first sign-in that loses a race to another of the same identity (the unique index refuses its
    write) looks again and finds the person the other bound."""
    for last_try in (False, True):
        try:
            with session_scope(engine) as session:
                user, reason = _provider_person(session, identity, new_people)
                if user is not None:
                    _audit_sign_in(session, user, identity)
                    return user
                admins = ", ".join(admin_names(session)) or "an administrator"
            break
        except IntegrityError:
            if last_try:
                raise
    with session_scope(engine) as session:
        session.add(AuditEvent(actor=FAILED_SIGN_IN_ACTOR, action="user.sign_in_refused", object_type="user",
                               after={**identity.audit(), "reason": reason}))
    raise SignInRefused(f"{reason}; ask {admins} to add you on the People page")


def bound_user(session: Session, identity: ProviderIdentity) -> User | None:
    """The person this issuer and subject signed in as before, if any."""
    return session.exec(select(User).where(User.issuer == identity.issuer, User.subject == identity.subject)).first()


def _audit_sign_in(session: Session, user: User, identity: ProviderIdentity) -> None:
    """Write `user.sign_in` unless this ID token's sign-in is written already: every page load of a signed-in
    browser asks again, and only the first of them (one conditional UPDATE, so two at once write once) counts."""
    session.flush()
    first = session.exec(update(User).where(
        User.id == user.id, or_(User.provider_iat.is_(None), User.provider_iat != identity.issued_at))
        .values(provider_iat=identity.issued_at)).rowcount
    if first:
        session.add(AuditEvent(actor=user.name, action="user.sign_in", object_type="user", object_id=user.id,
                               after=identity.audit()))


def _provider_person(session: Session, identity: ProviderIdentity, new_people: NewPeople) -> tuple[User | None, str]:
    """The user for `identity` (adding a new person from an allowed domain), else None and the reason."""
    user = bound_user(session, identity)
    if user is None:
        if identity.email is None:
            return None, f"the provider signed in {identity.words()}, whom this studio does not know"
        if not identity.email_verified:
            return None, f"the provider has not verified the email {identity.email}, so the studio cannot go by it"
        user = by_email(session, identity.email)
        if user is not None and _bound_to(user, identity):
            return _active(user)  # a first sign-in of the same identity bound it a moment ago
        if user is not None and user.subject is not None:
            return None, (f"{identity.email} belongs to another identity of the provider than {identity.words()}")
        if user is None:
            if not new_people.admits(identity.email):
                return None, f"{identity.email} is not a person of this studio"
            if not valid_name(identity.email):
                return None, f"{identity.email} cannot be a user name here (a user name is 1-64 letters, digits, or " \
                             ". _ @ + -), so it cannot be added by its email"
            named = queries.user_by_name(session, identity.email)
            if named is not None and _bound_to(named, identity):
                return _active(named)  # a first sign-in of the same identity added it a moment ago
            if named is not None:
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
    return _active(user)


def _bound_to(user: User, identity: ProviderIdentity) -> bool:
    return (user.issuer, user.subject) == (identity.issuer, identity.subject)


def _active(user: User) -> tuple[User | None, str]:
    if not user.active:
        return None, f"{user.name} is switched off in this studio"
    return user, ""
