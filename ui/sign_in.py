"""Sign-in through the team's OpenID Connect provider with Streamlit's own st.login / st.user / st.logout.

Streamlit reads the provider from the `[auth]` section of .streamlit/secrets.toml (redirect_uri, cookie_secret,
client_id, client_secret, server_metadata_url). A team that configures by environment sets TFGRPO_OIDC_METADATA_URL,
TFGRPO_OIDC_CLIENT_ID, TFGRPO_OIDC_REDIRECT_URI and the secrets TFGRPO_OIDC_CLIENT_SECRET and
TFGRPO_OIDC_COOKIE_SECRET; when no secrets file holds an `[auth]` section, configure_provider hands those to
Streamlit's secrets at the app's start (merge_programmatic_secrets, what `st.App(secrets=...)` does), so the
client secret is never written to a file. Streamlit keeps who signed in in a signed cookie; the studio maps the
ID token's issuer, subject and verified email to its own person and role (core.records.people.oidc.provider_sign_in),
and ends a sign-in older than TFGRPO_SESSION_HOURS.
"""

from __future__ import annotations

import json
import time
import urllib.parse

import httpx
import streamlit as st
from sqlmodel import Session

from core.errors import InvalidInput, SignInRefused
from core.records.people.oidc import NewPeople, ProviderIdentity, provider_sign_in
from core.records.people.roles import admin_names
from core.records.people.sign_in import record_sign_out
from core.settings import engine, get_settings, secret
from ui.common import AUTH_KEY, plain

VIA_KEY = "auth_via"  # "password" or "provider": how this tab's person signed in
SINCE_KEY = "auth_since"  # when (epoch seconds) this tab's password sign-in happened
NOTE_KEY = "auth_note"  # why the sign-in page is shown again (expired, refused, the provider down)
REFUSED_SUBJECT_KEY = "auth_refused_subject"  # the provider identity refused in this tab, not asked again
PROBE_TIMEOUT_S = 5.0
# Set in the browser just before it goes to the provider, cleared when the studio has seen how it came back. Streamlit's
# callback returns to the studio without a word when it refuses the provider's answer (a token for another audience, a
# bad signature) or the person cancelled at the provider; this cookie is how the sign-in page knows to say so.
ATTEMPT_COOKIE = "tfgrpo_provider_attempt"
GO_KEY = "_go_to_provider"
ATTEMPT_SEEN_KEY = "_provider_attempt_seen"
CAME_BACK_EMPTY = ("nobody was signed in: the provider's answer was refused (for example a token issued for another "
                   "client, or one not signed with the provider's published keys), or the sign-in was cancelled at "
                   "the provider. Nothing was changed; the app's log says which")


def provider_from_environment() -> dict | None:
    """The `[auth]` section the environment describes, or None when it names no provider; InvalidInput when it
    names one but lacks a part (which one is said)."""
    settings = get_settings()
    if not settings.oidc_metadata_url and not settings.oidc_client_id:
        return None
    section = {"server_metadata_url": settings.oidc_metadata_url, "client_id": settings.oidc_client_id,
               "client_secret": secret("TFGRPO_OIDC_CLIENT_SECRET"),
               "cookie_secret": secret("TFGRPO_OIDC_COOKIE_SECRET"),
               "redirect_uri": settings.oidc_redirect_uri or "http://localhost:8501/oauth2callback"}
    variables = {"server_metadata_url": "TFGRPO_OIDC_METADATA_URL", "client_id": "TFGRPO_OIDC_CLIENT_ID",
                 "client_secret": "TFGRPO_OIDC_CLIENT_SECRET", "cookie_secret": "TFGRPO_OIDC_COOKIE_SECRET"}
    missing = [variable for key, variable in variables.items() if not section[key]]
    if missing:
        raise InvalidInput("sign-in through the provider is half configured: set " + ", ".join(missing))
    return section


def _file_section() -> dict:
    """The `[auth]` section of the secrets file(s), {} when there is none."""
    try:
        return dict(st.secrets.get("auth", {}))
    except Exception:  # noqa: BLE001  (no secrets file at all: Streamlit raises)
        return {}


FILE_KEYS = ("server_metadata_url", "client_id", "client_secret", "cookie_secret", "redirect_uri")


def file_section_problem(section: dict) -> str | None:
    """Why an `[auth]` section of .streamlit/secrets.toml cannot be used, or None; checked as the environment's
    parts are, so a section without cookie_secret (Streamlit then makes one per process: everyone is signed out
    silently at the next restart) is refused with the key it lacks."""
    missing = [key for key in FILE_KEYS if not section.get(key)]
    if not missing:
        return None
    return ("sign-in through the provider is half configured: the [auth] section of .streamlit/secrets.toml "
            "lacks " + ", ".join(missing))


@st.cache_resource(show_spinner=False)
def configure_provider() -> str:
    """Once per app process: where the provider's configuration comes from ("file", "environment", or "" for
    none). The environment's is handed to Streamlit only when no secrets file has an `[auth]` section."""
    file_section = _file_section()
    if any(file_section.get(key) for key in FILE_KEYS):
        problem = file_section_problem(file_section)
        if problem:
            raise InvalidInput(problem)
        return "file"
    section = provider_from_environment()
    if section is None:
        return ""
    from streamlit.runtime.secrets import secrets_singleton

    secrets_singleton.merge_programmatic_secrets({"auth": section})
    return "environment"


def provider_problem() -> str | None:
    """Why the provider's configuration cannot be used (said on the sign-in page), or None."""
    try:
        configure_provider()
    except InvalidInput as exc:
        return str(exc)
    return None


def provider_on() -> bool:
    """Whether sign-in through the provider is offered."""
    try:
        return bool(configure_provider())
    except InvalidInput:
        return False


def metadata_url() -> str:
    return str(_file_section().get("server_metadata_url") or "")


def provider_host() -> str:
    """The provider's host, as the button and the messages name it."""
    return urllib.parse.urlsplit(metadata_url()).netloc or "the provider"


def _logged_in() -> bool:
    try:
        return bool(st.user.is_logged_in)
    except Exception:  # noqa: BLE001  (no browser session: AppTest, a page imported by a test)
        return False


def expired(since: float | None, now: float | None = None) -> bool:
    """Whether a sign-in made at `since` (epoch seconds) is older than TFGRPO_SESSION_HOURS."""
    if since is None:
        return False
    return (now if now is not None else time.time()) - since > get_settings().session_hours * 3600


def token_expired(issued: object, now: float | None = None) -> bool:
    """Whether an ID token issued at `issued` (its `iat` claim) is too old to go on with; a token that says no
    issue time has no age to measure and never lasts (it would otherwise never expire)."""
    if not isinstance(issued, int | float) or isinstance(issued, bool):
        return True
    return expired(float(issued), now)


def person_from_provider() -> str | None:
    """If Streamlit holds a provider sign-in for this browser: the studio's person for it (signed in to this tab,
    AUTH_KEY), else None with NOTE_KEY saying why (refused, expired). Asked while nobody is signed in."""
    if not provider_on() or not _logged_in():
        return None
    claims = st.user.to_dict()
    try:
        identity = ProviderIdentity.from_claims(claims)
    except InvalidInput as exc:
        st.session_state[NOTE_KEY] = str(exc)
        return None
    if token_expired(claims.get("iat")):
        st.session_state[NOTE_KEY] = (f"your sign-in through {provider_host()} is older than "
                                      f"{get_settings().session_hours:g} hours; sign in again")
        return None
    if st.session_state.get(REFUSED_SUBJECT_KEY) == (identity.issuer, identity.subject):
        return None  # refused in this tab already: the note says why, and the audit log has it once
    settings = get_settings()
    new_people = NewPeople(domains=tuple(settings.oidc_allowed_domains.split(",")), role=settings.oidc_new_person_role)
    try:
        user = provider_sign_in(engine(), identity, new_people)
    except SignInRefused as exc:
        st.session_state[REFUSED_SUBJECT_KEY] = (identity.issuer, identity.subject)
        st.session_state[NOTE_KEY] = str(exc)
        return None
    st.session_state[AUTH_KEY], st.session_state[VIA_KEY] = user.name, "provider"
    st.session_state.pop(NOTE_KEY, None)
    return user.name


def probe_provider() -> str | None:
    """Why the provider cannot sign anyone in right now (its metadata does not answer, or not as OpenID
    Connect metadata), or None; asked before st.login sends the browser there."""
    url = metadata_url()
    try:
        response = httpx.get(url, timeout=PROBE_TIMEOUT_S, follow_redirects=True)
        response.raise_for_status()
        metadata = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        return f"the sign-in provider at {provider_host()} does not answer ({type(exc).__name__}: {str(exc)[:160]})"
    if not isinstance(metadata, dict) or not metadata.get("authorization_endpoint"):
        return f"the sign-in provider at {provider_host()} answered without OpenID Connect metadata"
    return None


def go_to_provider() -> None:
    """The button's callback: to the provider if it answers (from the run that follows: _send_to_provider), else
    say why and stay here (nothing is lost)."""
    problem = probe_provider()
    if problem is not None:
        st.session_state[NOTE_KEY] = problem + "; try again later, or sign in with a studio account"
        return
    st.session_state.pop(NOTE_KEY, None)
    st.session_state.pop(REFUSED_SUBJECT_KEY, None)
    st.session_state[GO_KEY] = True


def _script(code: str) -> None:
    """Fixed code run in the page (as ui's remember_name does); values reach it only as JSON strings with `<`
    escaped, so nothing becomes markup."""
    st.html(f"<script>{code}</script>", unsafe_allow_javascript=True)


def _send_to_provider() -> None:
    """Mark the attempt in a short-lived cookie, then go to Streamlit's login route (what st.login does, in that
    order: st.login's own redirect could leave before the cookie is written)."""
    from streamlit.user_info import generate_login_redirect_url

    st.caption(f"Going to {plain(provider_host())}…")
    url = json.dumps(generate_login_redirect_url("default")).replace("<", "\\u003c")
    _script(f"document.cookie = '{ATTEMPT_COOKIE}=1; path=/; max-age=900; SameSite=Lax'; "
            f"(window.top || window).location.assign({url});")


def _attempt_cookie() -> bool:
    try:
        return st.context.cookies.get(ATTEMPT_COOKIE) == "1"
    except Exception:  # noqa: BLE001  (no browser connection)
        return False


def settle_attempt() -> None:
    """When this browser comes back from the provider: forget the attempt's cookie, and if nobody was signed in,
    say so on the sign-in page. Once per tab session (its cookies are read when it connects)."""
    if not _attempt_cookie() or st.session_state.get(ATTEMPT_SEEN_KEY):
        return
    st.session_state[ATTEMPT_SEEN_KEY] = True
    if not _logged_in() and not st.session_state.get(NOTE_KEY):
        st.session_state[NOTE_KEY] = CAME_BACK_EMPTY
    _script(f"document.cookie = '{ATTEMPT_COOKIE}=; path=/; max-age=0; SameSite=Lax';")


def provider_section() -> None:
    """On the sign-in page: the provider's button, what went wrong last, and the way out of a refused sign-in."""
    problem = provider_problem()
    if problem:
        st.error(plain(problem[:1].upper() + problem[1:]) + ".")
        return
    if not provider_on():
        return
    if st.session_state.pop(GO_KEY, None):
        _send_to_provider()
        return
    st.button(f"Sign in with {provider_host()}", key="sign_in_provider", type="primary", on_click=go_to_provider,
              icon=":material/login:")
    if _logged_in():
        st.caption(f"The provider signed this browser in as {plain(str(st.user.get('email') or st.user.get('sub')))}.")
        if st.button("Sign out of the provider", key="sign_out_provider"):
            st.session_state.pop(REFUSED_SUBJECT_KEY, None)
            st.logout()
    st.divider()


def no_role_page() -> None:
    """Shown to a signed-in person without a role: who they are and whom to ask."""
    name = st.session_state.get(AUTH_KEY)
    st.title("No role yet")
    settle_attempt()
    with Session(engine()) as session:
        admins = admin_names(session)
    st.info(f"You are signed in as {plain(str(name))}, but you have no role in this studio yet, so there is "
            "nothing you may do here. Ask an administrator to give you one on the People page: "
            f"{plain(', '.join(admins)) if admins else 'this studio has no active administrator'}.")
    st.button("Sign out", key="sign_out_no_role", on_click=sign_out)


def sign_out() -> None:
    """The Sign out button's callback: the audit log has it; a provider sign-in also ends at Streamlit's cookie
    (st.logout, from the run that follows, which may send the browser to the provider's end-of-session page)."""
    name, via = st.session_state.pop(AUTH_KEY, None), st.session_state.pop(VIA_KEY, "password")
    st.session_state.pop(SINCE_KEY, None)
    if name:
        record_sign_out(engine(), name, via)
    if via == "provider":
        st.session_state["_sign_out_provider"] = True


def finish_sign_out() -> None:
    """Early in every run: end Streamlit's provider sign-in when a Sign out button asked for it."""
    if st.session_state.pop("_sign_out_provider", None) and _logged_in():
        st.logout()


def password_signed_in(name: str) -> None:
    """After a password sign-in: this tab's person, since now."""
    st.session_state[AUTH_KEY], st.session_state[VIA_KEY], st.session_state[SINCE_KEY] = name, "password", time.time()


def session_ended() -> bool:
    """Whether this tab's sign-in has just ended on its own (then it is forgotten and NOTE_KEY says why): a
    password sign-in older than TFGRPO_SESSION_HOURS, a provider sign-in whose ID token was issued longer ago
    than that, or one whose Streamlit cookie is gone (signed out in another tab)."""
    via = st.session_state.get(VIA_KEY)
    if AUTH_KEY not in st.session_state or via is None:
        return False
    if via == "provider":
        if not _logged_in():
            reason = "you signed out of the provider"
        else:
            issued = st.user.to_dict().get("iat")
            reason = "" if not token_expired(issued) else \
                f"your sign-in through {provider_host()} is older than {get_settings().session_hours:g} hours" \
                if isinstance(issued, int | float) else f"your sign-in through {provider_host()} says no issue time"
    else:
        reason = f"your sign-in is older than {get_settings().session_hours:g} hours" \
            if expired(st.session_state.get(SINCE_KEY)) else ""
    if not reason:
        return False
    st.session_state.pop(AUTH_KEY, None)
    st.session_state.pop(VIA_KEY, None)
    st.session_state[NOTE_KEY] = reason + "; sign in again"
    return True


def show_note() -> None:
    """On the sign-in page: why it is shown again (a refusal, an expired sign-in, the provider down)."""
    note = st.session_state.get(NOTE_KEY)
    if note:
        st.warning(plain(note[:1].upper() + note[1:]) + ".")
