"""How long a sign-in lasts and how it ends (issue 43), in the app (AppTest): a password sign-in older than
TFGRPO_SESSION_HOURS is forgotten and the sign-in page says why; a fresh one goes on; signing out is audited; a
provider configured by environment but missing a secret is said on the sign-in page, naming the variable."""

from __future__ import annotations

import time

import pytest
from sqlmodel import Session, select

from core.records.people.users import add_user
from core.settings import get_settings
from storage.tables import AuditEvent
from tests.ui_support import run_app
from ui.common import AUTH_KEY
from ui.sign_in import SINCE_KEY, VIA_KEY, expired, token_expired

PASSWORD = "a-long-secret-1"


@pytest.fixture
def hours(monkeypatch):
    monkeypatch.setenv("TFGRPO_SESSION_HOURS", "2")
    get_settings.cache_clear()
    yield 2
    get_settings.cache_clear()


def test_a_sign_in_lasts_the_configured_hours(hours):
    now = 1_000_000.0
    assert not expired(now - 2 * 3600 + 5, now) and expired(now - 2 * 3600 - 5, now) and not expired(None, now)


def test_an_expired_password_sign_in_is_forgotten_and_the_page_says_why(app_engine, hours):
    add_user(app_engine, "ada", "admin", PASSWORD)
    fresh = run_app(session_state={AUTH_KEY: "ada", VIA_KEY: "password", SINCE_KEY: time.time() - 3600})
    assert [t.value for t in fresh.title] != ["Sign in"]
    old = run_app(session_state={AUTH_KEY: "ada", VIA_KEY: "password", SINCE_KEY: time.time() - 3 * 3600})
    assert [t.value for t in old.title] == ["Sign in"]
    assert any("Your sign-in is older than 2 hours; sign in again." in w.value for w in old.warning)
    assert AUTH_KEY not in old.session_state


def test_signing_out_is_audited(app_engine):
    add_user(app_engine, "ada", "admin", PASSWORD)
    at = run_app(session_state={AUTH_KEY: "ada", VIA_KEY: "password", SINCE_KEY: time.time()})
    at.button(key="sign_out").click().run()
    assert [t.value for t in at.title] == ["Sign in"]
    with Session(app_engine) as session:
        [event] = session.exec(select(AuditEvent).where(AuditEvent.action == "user.sign_out")).all()
    assert (event.actor, event.after) == ("ada", {"via": "password"})


def test_a_provider_configured_without_its_secrets_is_said_on_the_sign_in_page(app_engine, monkeypatch):
    from ui.sign_in import configure_provider

    add_user(app_engine, "ada", "admin", PASSWORD)
    monkeypatch.setenv("TFGRPO_OIDC_METADATA_URL", "https://id.team.example/.well-known/openid-configuration")
    monkeypatch.setenv("TFGRPO_OIDC_CLIENT_ID", "studio")
    monkeypatch.delenv("TFGRPO_OIDC_CLIENT_SECRET", raising=False)
    monkeypatch.delenv("TFGRPO_OIDC_COOKIE_SECRET", raising=False)
    get_settings.cache_clear()
    configure_provider.clear()
    try:
        at = run_app()
        assert [t.value for t in at.title] == ["Sign in"]
        shown = [e.value.replace("\\_", "_") for e in at.error]  # Markdown source: plain() escapes the underscores
        assert any("set TFGRPO_OIDC_CLIENT_SECRET, TFGRPO_OIDC_COOKIE_SECRET" in text for text in shown), shown
        assert at.text_input(key="sign_in_name") is not None  # the studio's own accounts still work
    finally:
        get_settings.cache_clear()
        configure_provider.clear()


@pytest.fixture
def provider(monkeypatch):
    """A provider configured, as ui.sign_in sees it (the real flow runs in tests/test_browser_oidc.py)."""
    import ui.sign_in as sign_in

    monkeypatch.setattr(sign_in, "provider_on", lambda: True)
    monkeypatch.setattr(sign_in, "provider_problem", lambda: None)
    monkeypatch.setattr(sign_in, "metadata_url", lambda: "https://id.team.example/.well-known/openid-configuration")


def signed_in_by_provider(issued: float, state: dict | None = None):
    """The app run with Streamlit's user as the provider's ID token left it, issued at `issued`."""
    from streamlit.testing.v1 import AppTest

    from tests.ui_support import APP

    at = AppTest.from_file(str(APP), default_timeout=60)
    at.user = {"is_logged_in": True, "iss": "https://id.team.example", "sub": "ana-1", "email": "ana@team.example",
               "email_verified": True, "iat": int(issued)}
    for key, value in (state or {}).items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_a_provider_sign_in_older_than_the_configured_hours_asks_again(app_engine, hours, provider):
    add_user(app_engine, "boss", "admin", PASSWORD)
    add_user(app_engine, "ana@team.example", "reviewer", None, actor="boss")
    fresh = signed_in_by_provider(time.time() - 3600)
    assert [t.value for t in fresh.title] != ["Sign in"]
    assert fresh.session_state[AUTH_KEY] == "ana@team.example" and fresh.session_state[VIA_KEY] == "provider"
    assert any(c.value == "ana@team.example (reviewer)" for c in fresh.sidebar.code)

    old = signed_in_by_provider(time.time() - 3 * 3600)
    assert [t.value for t in old.title] == ["Sign in"]
    assert any("older than 2 hours; sign in again" in w.value for w in old.warning)
    # a tab signed in earlier whose token has grown old meanwhile is signed out at its next run
    stale = signed_in_by_provider(time.time() - 3 * 3600, {AUTH_KEY: "ana@team.example", VIA_KEY: "provider"})
    assert [t.value for t in stale.title] == ["Sign in"] and AUTH_KEY not in stale.session_state


def test_an_id_token_without_an_issue_time_never_lasts(hours):
    now = 1_000_000.0
    assert token_expired(None, now) and token_expired("yesterday", now) and token_expired(True, now)
    assert not token_expired(now - 3600, now) and token_expired(now - 3 * 3600, now)


def test_a_tab_signed_in_by_a_token_without_an_issue_time_is_signed_out(app_engine, provider):
    """A token that says no issue time would otherwise keep its tab signed in for ever (issue 51)."""
    from streamlit.testing.v1 import AppTest

    from tests.ui_support import APP

    add_user(app_engine, "boss", "admin", PASSWORD)
    add_user(app_engine, "ana@team.example", "reviewer", None, actor="boss")
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.user = {"is_logged_in": True, "iss": "https://id.team.example", "sub": "ana-1", "email": "ana@team.example",
               "email_verified": True}
    at.session_state[AUTH_KEY], at.session_state[VIA_KEY] = "ana@team.example", "provider"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Sign in"] and AUTH_KEY not in at.session_state
    assert any("says no issue time" in w.value or "iat" in w.value for w in at.warning), [w.value for w in at.warning]


def test_a_secrets_file_without_cookie_secret_is_refused_like_the_environment(app_engine):
    """The file route is checked as the environment route is: an [auth] section without cookie_secret would let
    Streamlit make one per process, signing everyone out silently at the next restart (issue 51 item 9)."""
    from streamlit.testing.v1 import AppTest

    from tests.ui_support import APP
    from ui.sign_in import configure_provider

    add_user(app_engine, "ada", "admin", PASSWORD)
    configure_provider.clear()
    try:
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.secrets["auth"] = {"server_metadata_url": "https://id.team.example/.well-known/openid-configuration",
                              "client_id": "studio", "client_secret": "s3cret",
                              "redirect_uri": "http://localhost:8501/oauth2callback"}
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert [t.value for t in at.title] == ["Sign in"]
        shown = [e.value.replace("\\_", "_") for e in at.error]
        assert any("secrets.toml lacks cookie_secret" in text for text in shown), shown
        assert at.text_input(key="sign_in_name") is not None  # the studio's own accounts still work
    finally:
        configure_provider.clear()


def test_the_sign_in_secrets_file_is_never_committed():
    from pathlib import Path

    ignored = Path(__file__).resolve().parents[1].joinpath(".gitignore").read_text().splitlines()
    assert ".streamlit/secrets.toml" in ignored
