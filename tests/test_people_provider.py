"""People of the team's OpenID Connect provider (issue 43): the studio keeps their roles, keyed by the provider's
issuer and subject and found the first time by the verified email; a new person from an allowed domain gets the
configured role (none by default), anyone else and an unverified email are refused with whom to ask, each in the
audit log with the provider's identity. API keys per person carry at most that person's role, asked at every
request. The browser side, against a real provider, is tests/test_browser_oidc.py."""

from __future__ import annotations

import itertools
import time

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from api.app import create_app
from core.errors import InvalidInput, PermissionDenied, SignInRefused
from core.records.keys.api_keys import create_key
from core.records.library.versions import import_library, set_label
from core.records.people.oidc import NewPeople, ProviderIdentity, provider_sign_in
from core.records.people.roles import require_role, role_of
from core.records.people.sign_in import authenticate
from core.records.people.users import add_user, update_user
from core.records.tasks.demos import DEMO_TASK
from storage.tables import AuditEvent, User

ISSUER = "https://id.team.example"
TEAM = NewPeople(domains=("team.example",))
ISSUED = itertools.count(int(time.time()))


def who(sub: str, email: str | None, verified: bool = True, issuer: str = ISSUER, iat: int | None = None,
        ) -> ProviderIdentity:
    """A fresh sign-in (an ID token of its own, issued a second after the last) unless `iat` names one."""
    return ProviderIdentity.from_claims({"iss": issuer, "sub": sub, "email": email, "email_verified": verified,
                                         "iat": next(ISSUED) if iat is None else iat})


def events(engine, action: str) -> list[AuditEvent]:
    with Session(engine) as session:
        return list(session.exec(select(AuditEvent).where(AuditEvent.action == action).order_by(AuditEvent.id)))


@pytest.fixture
def team(engine):
    """An admin with a password, and a reviewer an admin added by email for the provider."""
    add_user(engine, "boss", "admin", "a-long-secret-1", actor="cli")
    add_user(engine, "Ana@Team.example", "reviewer", None, actor="boss")
    return engine


def test_a_person_added_by_email_signs_in_with_the_role_an_admin_gave_and_is_then_known_by_subject(team):
    user = provider_sign_in(team, who("ana-1", "ana@team.example"), TEAM)
    assert (user.name, user.role, user.subject, user.issuer) == ("ana@team.example", "reviewer", "ana-1", ISSUER)
    # the provider changes her email later: she is still herself, by issuer and subject
    again = provider_sign_in(team, who("ana-1", "ana.b@team.example", verified=False), TEAM)
    assert again.name == "ana@team.example" and again.role == "reviewer"
    audit = events(team, "user.sign_in")
    assert [e.actor for e in audit] == ["ana@team.example"] * 2
    assert audit[0].after == {"via": "provider", "issuer": ISSUER, "subject": "ana-1", "email": "ana@team.example",
                              "email_verified": True}


def test_a_person_from_another_domain_is_refused_with_whom_to_ask_and_nothing_is_added(team):
    with pytest.raises(SignInRefused, match="zed@elsewhere.example is not a person of this studio; ask boss"):
        provider_sign_in(team, who("zed-1", "zed@elsewhere.example"), TEAM)
    with Session(team) as session:
        assert session.exec(select(User).where(User.name == "zed@elsewhere.example")).first() is None
    refused = events(team, "user.sign_in_refused")
    assert refused[-1].actor == "(sign-in)" and refused[-1].after["subject"] == "zed-1"


def test_an_unverified_email_is_refused_even_from_an_allowed_domain_or_for_a_known_person(team):
    for sub, email in (("uma-1", "uma@team.example"), ("someone-else", "ana@team.example")):
        with pytest.raises(SignInRefused, match=f"has not verified the email {email}"):
            provider_sign_in(team, who(sub, email, verified=False), TEAM)
    with Session(team) as session:
        ana = session.exec(select(User).where(User.name == "ana@team.example")).one()
        assert ana.subject is None  # an unverified claim to her email did not take her account
    assert len(events(team, "user.sign_in_refused")) == 2


def test_an_email_already_bound_to_another_subject_is_refused(team):
    provider_sign_in(team, who("ana-1", "ana@team.example"), TEAM)
    with pytest.raises(SignInRefused, match="belongs to another identity"):
        provider_sign_in(team, who("impostor", "ana@team.example"), TEAM)


def test_a_new_person_from_an_allowed_domain_gets_the_configured_role_none_by_default(team):
    newcomer = provider_sign_in(team, who("noa-1", "noa@team.example"), TEAM)
    assert newcomer.role == "none"
    with Session(team) as session:
        assert role_of(session, "noa@team.example") is None
        with pytest.raises(PermissionDenied, match="noa@team.example has no role yet"):
            require_role(session, "noa@team.example", "labeler", "labeling")
    update_user(team, "noa@team.example", "boss", role="labeler")  # an admin gives her one
    with Session(team) as session:
        assert role_of(session, "noa@team.example") == "labeler"
    labellers = NewPeople(domains=("@team.example",), role="labeler")
    assert provider_sign_in(team, who("leo-1", "leo@team.example"), labellers).role == "labeler"
    added = events(team, "user.add")[-1]
    assert added.actor == "(provider)" and added.after["domain"] == "team.example"


def test_a_switched_off_person_is_refused_and_new_people_may_not_become_admins(team):
    update_user(team, "ana@team.example", "boss", active=False)
    with pytest.raises(SignInRefused, match="switched off"):
        provider_sign_in(team, who("ana-1", "ana@team.example"), TEAM)
    with pytest.raises(InvalidInput, match="new person's role"):
        NewPeople(domains=("team.example",), role="admin")


def test_a_provider_answer_without_issuer_or_subject_is_refused():
    with pytest.raises(InvalidInput, match="no issuer or subject"):
        ProviderIdentity.from_claims({"email": "a@team.example", "email_verified": True})


def test_a_provider_person_has_no_password_and_is_added_only_by_an_email(team):
    assert authenticate(team, "ana@team.example", "") is None
    with pytest.raises(InvalidInput, match="not an email address"):
        add_user(team, "carl", "labeler", None, actor="boss")
    with pytest.raises(InvalidInput, match="exists already"):
        add_user(team, "ANA@team.example", "labeler", None, actor="boss")


# --- API keys per person -----------------------------------------------------------------------------------------


@pytest.fixture
def served(team, demo_task):
    version = import_library(team, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(team, DEMO_TASK, str(version.number), "production", "system")
    return version


def test_a_key_for_a_person_may_not_be_made_above_their_role(team):
    add_user(team, "lab@team.example", "labeler", None, actor="boss")
    with pytest.raises(InvalidInput, match="lab@team.example is a labeler; an ingest key needs a reviewer"):
        create_key(team, "agent", "ingest", "boss", person="lab@team.example", any_task=True)
    with pytest.raises(InvalidInput, match="nobody@team.example is not an active user"):
        create_key(team, "agent", "read", "boss", person="nobody@team.example")
    assert create_key(team, "agent", "read", "boss", person="lab@team.example").role == "read"


def test_the_api_refuses_a_key_above_its_persons_role_at_every_request(team, served):
    key = create_key(team, "ana's agent", "ingest", "boss", person="ana@team.example", any_task=True)
    api = TestClient(create_app(team), headers={"Authorization": f"Bearer {key.secret}"})
    trace = {"id": "t-1", "task": DEMO_TASK, "version_id": served.id, "input": "What is 1 + 1?", "output": "2"}
    assert api.post("/v1/traces", json={"traces": [trace]}).status_code == 200

    update_user(team, "ana@team.example", "boss", role="labeler")  # the person's role drops below the key's
    refused = api.post("/v1/traces", json={"traces": [{**trace, "id": "t-2"}]})
    assert refused.status_code == 403
    assert refused.json()["error"] == ("API key \"ana's agent\" acts for ana@team.example: ana@team.example is a "
                                       "labeler; an ingest key needs a reviewer or above, so posting traces is refused")
    assert api.get(f"/v1/tasks/{DEMO_TASK}/libraries/default").status_code == 200  # reading is within a labeler's

    update_user(team, "ana@team.example", "boss", active=False)
    assert api.get(f"/v1/tasks/{DEMO_TASK}/libraries/default").status_code == 403
    denied = events(team, "api.denied")
    assert len(denied) == 2 and all(e.actor == "(api key ana's agent)" for e in denied)


def test_an_id_token_without_an_issue_time_is_refused():
    with pytest.raises(InvalidInput, match="iat"):
        ProviderIdentity.from_claims({"iss": ISSUER, "sub": "ana-1", "email": "ana@team.example",
                                      "email_verified": True})


def test_a_sign_in_is_audited_once_however_often_its_pages_load(team):
    """Every page load of a signed-in tab asks provider_sign_in with the same ID token; the audit counts sign-ins
    (issue 51: 53 events for 9 sign-ins before)."""
    first = who("ana-1", "ana@team.example")
    for _ in range(5):
        provider_sign_in(team, first, TEAM)
    assert len(events(team, "user.sign_in")) == 1
    provider_sign_in(team, who("ana-1", "ana@team.example"), TEAM)  # a new sign-in: a new token
    assert len(events(team, "user.sign_in")) == 2


def test_one_issuer_and_subject_is_one_person_even_when_two_first_sign_ins_race(team):
    import threading

    from sqlalchemy.exc import IntegrityError

    start, names, errors = threading.Barrier(2), [], []

    def sign_in() -> None:
        start.wait(timeout=10)
        try:
            names.append(provider_sign_in(team, who("new-7", "new@team.example"), TEAM).name)
        except Exception as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=sign_in) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors and names == ["new@team.example"] * 2
    with Session(team) as session:
        bound = session.exec(select(User).where(User.issuer == ISSUER, User.subject == "new-7")).all()
        assert len(bound) == 1
        session.add(User(name="someone-else", role="labeler", issuer=ISSUER, subject="new-7"))
        with pytest.raises(IntegrityError):  # the database itself holds the rule, whatever the code's timing
            session.commit()


def test_a_plus_in_an_emails_local_part_is_a_person_of_their_own(team):
    add_user(team, "ana+ops@team.example", "labeler", None, actor="boss")
    with Session(team) as session:
        names = set(session.exec(select(User.name)).all())
    assert {"ana@team.example", "ana+ops@team.example"} <= names
