"""Sign-in against an attacker (issue 12): who a page may act for, the back-off, and the cost of a hash.

A page acts only for the signed-in user (sign-in on) or the typed name (sign-in off), never for an
internal actor such as `cli`, and asks again inside every action, because button callbacks run before the
app's sign-in gate. Attempts are counted before the password is checked, one transaction at a time, so
parallel guesses cannot slip past the limit; the wait that follows is short and capped, so a stranger
cannot shut a person out; passwords are hashed with scrypt at N=2^17 and older hashes are remade.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from sqlmodel import Session, select

from core.errors import PermissionDenied, SignInLocked
from core.records.people import passwords, roles, sign_in
from core.records.people.passwords import check_password, hash_password
from core.records.people.roles import page_actor
from core.records.people.sign_in import authenticate
from core.records.people.users import add_user, update_user
from storage.tables import Operation, SignInAttempt, User
from tests.ui_support import run_app, seeded_run
from ui.common import AUTH_KEY, REVIEWER_KEY

PASSWORD = "a-long-secret-1"
STRANGER, OWNER = "ip:203.0.113.9", "ip:198.51.100.4"
CHEAP_N = 2**10
ADD_NAME, ADD_ROLE, ADD_PASSWORD, ADD_REPEAT = "people_add_name", "people_add_role", "people_add_pw", "people_add_pw2"


@pytest.fixture
def cheap(monkeypatch):
    """scrypt at N=2^10, for tests about something other than its cost (N=2^17 takes ~0.4 s a hash)."""
    monkeypatch.setattr(passwords, "SCRYPT_N", CHEAP_N)


class Clock:
    """core.records.people.sign_in's clock, moved by hand: back-off tests wait minutes without sleeping."""

    def __init__(self) -> None:
        self.now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(sign_in, "utcnow", fake)
    return fake


def wait_of(exc: SignInLocked) -> timedelta:
    """The wait a SignInLocked message names ("try again in 30 seconds", "... in 5 minutes")."""
    found = re.search(r"try again in (\d+) (second|minute)", str(exc))
    assert found, str(exc)
    return timedelta(**{f"{found[2]}s": int(found[1])})


def users(engine) -> dict[str, User]:
    with Session(engine) as session:
        rows = {u.name: u for u in session.exec(select(User))}
        session.expunge_all()
    return rows


# --- who a page acts for --------------------------------------------------------------------------


@pytest.mark.parametrize("typed", ["cli", "system", "auto", "gate", " CLI ", "Auto", roles.NOBODY])
def test_internal_names_are_refused_as_typed_names(engine, typed):
    with Session(engine) as session:
        assert page_actor(session, None, "ana") == "ana"
        assert page_actor(session, None, "  ") == roles.LOCAL_USER
        with pytest.raises(PermissionDenied, match="reserved for the studio itself"):
            page_actor(session, None, typed)
        assert not roles.can(session, roles.NOBODY, "labeler")  # what a refused page acts as


def test_with_sign_in_on_only_the_signed_in_active_user_acts(engine, cheap):
    add_user(engine, "ada", "admin", PASSWORD)
    add_user(engine, "rex", "reviewer", PASSWORD, actor="ada")
    with Session(engine) as session:
        assert page_actor(session, "rex", "cli") == "rex"  # the typed name counts for nothing
        for signed_in in (None, "", "cli", "system", "nobody-here"):
            with pytest.raises(PermissionDenied, match="sign in first"):
                page_actor(session, signed_in, "cli")
    update_user(engine, "rex", "ada", active=False)
    with Session(engine) as session, pytest.raises(PermissionDenied, match="sign in first"):
        page_actor(session, "rex", None)


def submit_new_user(at, name: str, role: str | None = None) -> None:
    """Fill the People page's Add user form (the role left as it is when None) and press Add user."""
    at.text_input(key=ADD_NAME).input(name)
    if role is not None:
        at.selectbox(key=ADD_ROLE).set_value(role)
    at.text_input(key=ADD_PASSWORD).input(PASSWORD)
    at.text_input(key=ADD_REPEAT).input(PASSWORD)
    [submit] = [b for b in at.button if b.label == "Add user"]
    submit.click().run()


def test_a_stale_tab_named_cli_cannot_add_an_admin_once_sign_in_is_on(app_engine, cheap):
    at = run_app(page="pages/people.py", session_state={REVIEWER_KEY: "ana"})
    assert [b for b in at.button if b.label == "Add user"]  # drawn while sign-in was off
    add_user(app_engine, "ada", "admin", PASSWORD, actor="cli")  # elsewhere: sign-in goes on

    at.session_state[REVIEWER_KEY] = "cli"
    submit_new_user(at, "eve", "admin")

    assert not at.exception, [e.value for e in at.exception]
    assert list(users(app_engine)) == ["ada"]
    assert [t.value for t in at.title] == ["Sign in"]
    assert any("sign in first" in w.value for w in at.warning)


def test_a_stale_tab_named_cli_cannot_approve_once_sign_in_is_on(app_engine, cheap):
    run_id = seeded_run(app_engine, "manual")
    at = run_app(page="pages/review.py", session_state={REVIEWER_KEY: "ana"})
    assert "review_approve_all" in [b.key for b in at.button]
    add_user(app_engine, "ada", "admin", PASSWORD, actor="cli")

    at.session_state[REVIEWER_KEY] = "cli"
    at.button(key="review_approve_all").click().run()

    assert not at.exception, [e.value for e in at.exception]
    with Session(app_engine) as session:
        statuses = {op.status for op in session.exec(select(Operation).where(Operation.run_id == run_id))}
    assert statuses == {"pending"}
    assert [t.value for t in at.title] == ["Sign in"]


def test_a_typed_internal_name_cannot_act_without_sign_in(app_engine, cheap):
    at = run_app(page="pages/people.py", session_state={REVIEWER_KEY: "ana"})
    at.sidebar.text_input(key=REVIEWER_KEY).input("cli")
    submit_new_user(at, "eve")

    assert not at.exception, [e.value for e in at.exception]
    assert users(app_engine) == {}
    assert ["'cli' is reserved for the studio itself; type your own name in the sidebar."] == [
        w.value for w in at.sidebar.warning]
    assert not [b for b in at.button if b.label == "Add user"]  # nothing to do under that name


def test_a_signed_in_tab_still_acts(app_engine, cheap):
    add_user(app_engine, "ada", "admin", PASSWORD, actor="cli")
    at = run_app(page="pages/people.py", session_state={AUTH_KEY: "ada", REVIEWER_KEY: "cli"})
    submit_new_user(at, "lee", "labeler")

    assert not at.exception, [e.value for e in at.exception]
    assert users(app_engine)["lee"].created_by == "ada"


# --- counting attempts ----------------------------------------------------------------------------


@pytest.mark.parametrize("spread", ["one name", "one client, many names"])
def test_64_parallel_wrong_passwords_are_checked_at_most_as_often_as_allowed(engine, cheap, monkeypatch, spread):
    if engine.dialect.name == "sqlite":  # readers and the writer at once: WAL (PostgreSQL needs nothing)
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    add_user(engine, "ann", "admin", PASSWORD)
    checks: list[str] = []
    guard = threading.Lock()
    real_check = sign_in.check_password

    def counting_check(password: str, stored: str) -> bool:
        with guard:
            checks.append(password)
        time.sleep(0.05)  # the others arrive while this one is being checked
        return real_check(password, stored)

    monkeypatch.setattr(sign_in, "check_password", counting_check)
    start = threading.Barrier(64)

    def attempt(i: int) -> object:
        name, more = ("ann", {}) if spread == "one name" else (f"user{i}", {"client": STRANGER})
        start.wait()
        try:
            return authenticate(engine, name, "wrong-password", **more)  # one name: as the CLI calls it
        except SignInLocked:
            return "waits"

    with ThreadPoolExecutor(max_workers=64) as pool:
        results = list(pool.map(attempt, range(64)))

    allowed = sign_in.MAX_FAILURES if spread == "one name" else sign_in.CLIENT_MAX_FAILURES
    assert 1 <= len(checks) <= allowed
    assert results.count(None) == len(checks) and results.count("waits") == 64 - len(checks)


def test_the_wait_doubles_and_is_capped(engine, cheap, clock):
    add_user(engine, "ann", "admin", PASSWORD)
    for i in range(sign_in.MAX_FAILURES):
        assert authenticate(engine, "ann", "guess", client=f"ip:10.0.0.{i}") is None
    waits = []
    for i in range(6):  # a new client each time: only the name's back-off counts
        with pytest.raises(SignInLocked, match="for this user name") as refused:
            authenticate(engine, "ann", "guess", client=f"ip:10.1.0.{i}")
        waits.append(wait_of(refused.value))
        clock.advance(waits[-1])
        assert authenticate(engine, "ann", "guess", client=f"ip:10.2.0.{i}") is None
    assert waits == [timedelta(seconds=30), timedelta(minutes=1), timedelta(minutes=2), timedelta(minutes=4),
                     timedelta(minutes=5), timedelta(minutes=5)]


def test_a_strangers_failures_delay_the_real_user_only_briefly(engine, cheap, clock):
    add_user(engine, "ann", "admin", PASSWORD)
    failures = 0
    while failures < 30:  # a stranger guesses ann's password as often as it is let, for hours
        try:
            assert authenticate(engine, "ann", "guess", client=STRANGER) is None
            failures += 1
        except SignInLocked as exc:
            clock.advance(wait_of(exc))
    assert clock.now - Clock().now > timedelta(hours=2)

    try:  # ann, from her own browser, right after the stranger's latest failure
        user = authenticate(engine, "ann", PASSWORD, client=OWNER)
    except SignInLocked as exc:
        assert wait_of(exc) <= sign_in.MAX_WAIT <= timedelta(minutes=5)
        clock.advance(wait_of(exc))
        user = authenticate(engine, "ann", PASSWORD, client=OWNER)
    assert user is not None and user.name == "ann"


def test_one_client_trying_many_names_is_slowed_on_every_name(engine, cheap, clock):
    add_user(engine, "ann", "admin", PASSWORD)
    for i in range(sign_in.CLIENT_MAX_FAILURES):  # never more than one failure per name
        assert authenticate(engine, f"guess{i}", "guess", client=STRANGER) is None
    with pytest.raises(SignInLocked, match="from this connection") as refused:
        authenticate(engine, "ann", PASSWORD, client=STRANGER)
    assert timedelta(0) < wait_of(refused.value) <= sign_in.CLIENT_MAX_WAIT
    assert authenticate(engine, "ann", PASSWORD, client=OWNER).name == "ann"  # others are not slowed
    clock.advance(wait_of(refused.value))
    assert authenticate(engine, "ann", PASSWORD, client=STRANGER).name == "ann"


def test_a_tab_is_known_by_a_hash_of_its_session_not_the_session_itself():
    assert sign_in.client_key("203.0.113.9", "abc") == "ip:203.0.113.9"
    key = sign_in.client_key(None, "session-secret")
    assert key.startswith("tab:") and "session-secret" not in key
    assert sign_in.client_key(None, None) == ""


# --- the cost of a hash ---------------------------------------------------------------------------


@pytest.mark.real_hash_cost
def test_the_default_cost_is_n_2_17_and_an_old_hash_is_remade_at_sign_in(engine):
    assert (passwords.SCRYPT_N, passwords.SCRYPT_R, passwords.SCRYPT_P) == (2**17, 8, 1)
    salt = secrets.token_bytes(16)
    old = f"scrypt$16384$8$1${salt.hex()}${hashlib.scrypt(PASSWORD.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32).hex()}"
    with Session(engine) as session:  # a user from before issue 12, with an N=2^14 hash
        session.add(User(name="old", role="admin", password_hash=old))
        session.commit()

    assert authenticate(engine, "old", PASSWORD).name == "old"

    remade = users(engine)["old"].password_hash
    assert remade.startswith("scrypt$131072$8$1$") and remade != old
    assert check_password(PASSWORD, remade) and not passwords.needs_rehash(remade)
    assert authenticate(engine, "old", "wrong-password") is None


def test_an_unknown_name_costs_as_much_as_a_real_password(engine, cheap, monkeypatch):
    add_user(engine, "ann", "admin", PASSWORD)
    seen: list[str] = []
    real_check = sign_in.check_password
    monkeypatch.setattr(sign_in, "check_password", lambda password, stored: seen.append(stored) or real_check(
        password, stored))

    assert authenticate(engine, "nobody-here", PASSWORD) is None
    assert authenticate(engine, "ann", "wrong-password") is None

    dummy, real = (stored.split("$")[1:4] for stored in seen)
    assert dummy == real == [str(CHEAP_N), "8", "1"]
    assert hash_password(PASSWORD).split("$")[1:4] == real


def test_the_sign_in_form_counts_this_tab_and_clears_the_password(app_engine, cheap):
    add_user(app_engine, "lab", "labeler", PASSWORD)
    at = run_app()
    at.text_input(key="sign_in_name").input("lab")
    at.text_input(key="sign_in_password").input("wrong-password")
    at.button[0].click().run()

    assert [e.value for e in at.error] == ["Wrong user name or password."]
    assert at.text_input(key="sign_in_password").value == ""
    with Session(app_engine) as session:
        [attempt] = session.exec(select(SignInAttempt)).all()
    assert (attempt.name, attempt.outcome) == ("lab", "failed") and attempt.client.startswith("tab:")


def test_a_failed_sign_in_is_not_recorded_as_acted_by_the_name_typed(engine, cheap):
    from core.records.people.sign_in import FAILED_SIGN_IN_ACTOR
    from storage.tables import AuditEvent

    add_user(engine, "ann", "admin", PASSWORD)
    assert authenticate(engine, "cli", "guess-1234") is None
    with Session(engine) as session:
        [event] = session.exec(select(AuditEvent).where(AuditEvent.action == "user.sign_in_failed")).all()
    assert event.actor == FAILED_SIGN_IN_ACTOR and event.after == {"name": "cli"}
