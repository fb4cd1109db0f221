"""Sign-in through a real OpenID Connect provider (issue 43): `oidc-provider-mock` from PyPI runs on a free loopback
port, the studio is configured for it by environment (TFGRPO_OIDC_*), and Chromium signs in with Streamlit's
st.login. A person an administrator added gets the role the administrator gave; a person from another domain is
refused with whom to ask; an email the provider has not verified is refused; sign-out ends the sign-in (and the
audit log names the provider's identity); a provider that does not answer gets a clear message on the sign-in page.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from sqlmodel import Session, select

from core.records.people.users import add_user
from storage.db import make_engine
from storage.tables import AuditEvent
from tests.browser_support import (
    ROOT,
    browser_page,
    demo_database,
    free_port,
    require_chromium,
    screenshot,
    studio,
    wait_for_app,
)
from ui.sign_in import ATTEMPT_COOKIE

pytestmark = pytest.mark.browser

ADMIN_GIVEN = "ana@team.example"  # an administrator made her a reviewer
STRANGER = "zed@elsewhere.example"  # from a domain the studio does not admit
UNVERIFIED = "uma@team.example"  # the provider does not vouch for her email
NEWCOMER = "noa@team.example"  # from the admitted domain, not added by anyone: no role until an admin gives one


def _wait_for(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"oidc-provider-mock exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def _set_claims(base: str, sub: str, claims: dict) -> None:
    """oidc-provider-mock's own route for the claims a subject signs in with."""
    request = urllib.request.Request(f"{base}/users/{sub}", data=json.dumps(claims).encode(), method="PUT",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 204


def _provider_sign_in(page, sub: str) -> None:
    """On the provider's own form: type the subject and authorize (it then sends the browser back)."""
    page.locator("input[name='sub']").fill(sub)
    page.get_by_role("button", name="Authorize").click()


def test_people_sign_in_through_a_real_openid_connect_provider(tmp_path: Path):
    require_chromium()
    from playwright.sync_api import expect

    provider_port = free_port()
    provider_url = f"http://127.0.0.1:{provider_port}"
    provider = subprocess.Popen([sys.executable, "-m", "oidc_provider_mock", "--port", str(provider_port)],
                                cwd=ROOT, stdout=open(tmp_path / "provider.log", "w"), stderr=subprocess.STDOUT)
    try:
        _wait_for(f"{provider_url}/.well-known/openid-configuration", provider)
        _set_claims(provider_url, "ana-sub", {"email": ADMIN_GIVEN, "email_verified": True})
        _set_claims(provider_url, "zed-sub", {"email": STRANGER, "email_verified": True})
        _set_claims(provider_url, "uma-sub", {"email": UNVERIFIED, "email_verified": False})
        _set_claims(provider_url, "noa-sub", {"email": NEWCOMER, "email_verified": True})

        shutil.copyfile(demo_database(), tmp_path / "studio.db")
        database_url = f"sqlite:///{tmp_path / 'studio.db'}"
        seeded = make_engine(database_url)
        add_user(seeded, "boss", "admin", "a-long-secret-1", actor="cli")  # the first administrator
        add_user(seeded, ADMIN_GIVEN, "reviewer", None, actor="boss")  # a person of the provider, by email
        seeded.dispose()

        port = free_port()
        env = {"TFGRPO_OIDC_METADATA_URL": f"{provider_url}/.well-known/openid-configuration",
               "TFGRPO_OIDC_CLIENT_ID": "studio", "TFGRPO_OIDC_CLIENT_SECRET": "client-secret-for-the-test",
               "TFGRPO_OIDC_COOKIE_SECRET": "a-cookie-secret-of-at-least-32-characters",
               "TFGRPO_OIDC_REDIRECT_URI": f"http://127.0.0.1:{port}/oauth2callback",
               "TFGRPO_OIDC_ALLOWED_DOMAINS": "team.example"}
        with studio(tmp_path, worker=False, extra_env=env, port=port) as app, browser_page() as page:
            button = page.get_by_role("button", name=f"Sign in with 127.0.0.1:{provider_port}")
            page.goto(app.url)
            expect(button).to_be_visible()

            # the person an administrator made a reviewer signs in and is a reviewer
            button.click()
            _provider_sign_in(page, "ana-sub")
            sidebar = page.get_by_test_id("stSidebar")
            expect(sidebar.get_by_text(f"{ADMIN_GIVEN} (reviewer)")).to_be_visible()
            expect(sidebar.get_by_text(f"Signed in through 127.0.0.1:{provider_port}")).to_be_visible()
            wait_for_app(page)
            screenshot(page, "oidc_signed_in")

            # sign-out ends the provider's sign-in: the provider's end-of-session page, then the studio's sign-in
            sidebar.get_by_role("button", name="Sign out").click()
            page.get_by_role("button", name="End session").click()
            expect(button).to_be_visible()
            expect(page.get_by_text(f"{ADMIN_GIVEN} (reviewer)")).to_have_count(0)
            page.goto(app.url)  # a new visit is not signed in either: the cookie is gone
            expect(button).to_be_visible()
            wait_for_app(page)
            expect(page.get_by_text("Nobody was signed in")).to_have_count(0)  # her sign-in went well

            # a person from another domain is refused and told whom to ask
            button.click()
            _provider_sign_in(page, "zed-sub")
            expect(page.get_by_text(f"{STRANGER} is not a person of this studio; ask boss")).to_be_visible()
            expect(page.get_by_test_id("stSidebar")).to_have_count(0)
            page.get_by_role("button", name="Sign out of the provider").click()
            page.get_by_role("button", name="End session").click()
            expect(button).to_be_visible()

            # an email the provider has not verified is refused, even from an admitted domain
            button.click()
            _provider_sign_in(page, "uma-sub")
            expect(page.get_by_text(f"has not verified the email {UNVERIFIED}")).to_be_visible()
            expect(page.get_by_test_id("stSidebar")).to_have_count(0)
            screenshot(page, "oidc_refused")
            page.get_by_role("button", name="Sign out of the provider").click()
            page.get_by_role("button", name="End session").click()
            expect(button).to_be_visible()

            # a new person from the admitted domain gets the configured role, none: a page that says whom to ask
            button.click()
            _provider_sign_in(page, "noa-sub")
            expect(page.get_by_role("heading", name="No role yet")).to_be_visible()
            expect(page.get_by_text(f"You are signed in as {NEWCOMER}, but you have no role")).to_be_visible()
            expect(page.get_by_text("on the People page: boss")).to_be_visible()
            expect(page.get_by_test_id("stSidebar")).to_have_count(0)
            page.get_by_role("button", name="Sign out").click()
            page.get_by_role("button", name="End session").click()
            expect(button).to_be_visible()

            # the person cancels at the provider (Streamlit comes back without a word, as for a token for another
            # audience): the sign-in page says nobody was signed in and why that may be
            button.click()
            page.get_by_role("button", name="Deny").click()
            expect(page.get_by_text("Nobody was signed in: the provider's answer was refused")).to_be_visible()
            # said once: the page's script forgets the attempt's cookie; a reload before that script ran (a loaded
            # machine) would rightly say it again, so the test waits for the cookie to be gone
            page.wait_for_function(f"() => !document.cookie.includes('{ATTEMPT_COOKIE}=1')")
            page.reload()
            expect(button).to_be_visible()
            expect(page.get_by_text("Nobody was signed in")).to_have_count(0)

            # the provider down: the button says so and the page stays, with the studio's own accounts
            provider.terminate()
            provider.wait(timeout=10)
            button.click()
            expect(page.get_by_text(f"The sign-in provider at 127.0.0.1:{provider_port} does not answer")).to_be_visible()
            expect(page.get_by_role("button", name="Sign in", exact=True)).to_be_visible()

        engine = make_engine(database_url, migrate=False)
        with Session(engine) as session:
            events = list(session.exec(select(AuditEvent).where(AuditEvent.action.like("user.sign%"))))
            added = list(session.exec(select(AuditEvent).where(AuditEvent.action == "user.add")))
        signed_in = [e for e in events if e.action == "user.sign_in" and e.actor == ADMIN_GIVEN]
        assert signed_in and signed_in[0].after["subject"] == "ana-sub" and signed_in[0].after["issuer"] == provider_url
        assert any(e.action == "user.sign_out" and e.actor == ADMIN_GIVEN and e.after == {"via": "provider"}
                   for e in events)
        refused = {e.after["email"]: e.after["reason"] for e in events if e.action == "user.sign_in_refused"}
        assert set(refused) == {STRANGER, UNVERIFIED}
        assert any(e.after["name"] == NEWCOMER and e.after["role"] == "none" and e.actor == "(provider)" for e in added)
        engine.dispose()
    finally:
        if provider.poll() is None:
            provider.terminate()
            provider.wait(timeout=10)
