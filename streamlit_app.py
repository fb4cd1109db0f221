"""Entry point of the studio: `streamlit run streamlit_app.py`.

It sets up the page, makes sure the database holds the demo task, draws the shared sidebar (task,
library, reviewer, database, worker) and hands over to the page chosen in the navigation. Pages
live in `pages/`, one file each, ending in `run_page(page)`; add a new one to PAGES.
"""

from __future__ import annotations

import json
import urllib.parse

import streamlit as st
from sqlmodel import Session

from core.api_probe import api_status
from core.domain.sandbox import harden_process
from core.errors import PermissionDenied, SignInLocked
from core.jobs.worker import worker_summary
from core.records.people.roles import role_of, sign_in_required
from core.records.people.sign_in import authenticate
from core.records.tasks.demos import ensure_demo_tasks
from core.settings import configure_scoring, engine, get_settings
from storage import queries
from storage.db import describe_url, scrub_url
from ui.common import (
    AUTH_KEY,
    LIBRARY_KEY,
    NAME_COOKIE,
    REFUSED_KEY,
    REVIEWER_KEY,
    TASK_KEY,
    Flash,
    Outcome,
    acting_person,
    default_reviewer,
    keep_open_context,
    keep_valid_choice,
    plain,
    refusal,
    sign_in_client,
    studio_frame,
)
from ui.sign_in import (
    NOTE_KEY,
    VIA_KEY,
    finish_sign_out,
    no_role_page,
    password_signed_in,
    person_from_provider,
    provider_host,
    provider_on,
    provider_section,
    session_ended,
    settle_attempt,
    show_note,
    sign_out,
)

SIGN_IN = Flash("sign_in_flash")
NAME_WRITTEN_KEY = "_name_cookie_written"
NAME_KEY = "acting_name"
PAGES = [
    st.Page("pages/overview.py", title="Overview", icon=":material/dashboard:", default=True),
    st.Page("pages/train.py", title="Train", icon=":material/model_training:"),
    st.Page("pages/rollouts.py", title="Rollouts", icon=":material/view_column:"),
    st.Page("pages/review.py", title="Review", icon=":material/rate_review:"),
    st.Page("pages/library.py", title="Library", icon=":material/library_books:"),
    st.Page("pages/evaluate.py", title="Evaluate", icon=":material/leaderboard:"),
    st.Page("pages/labeling.py", title="Labeling", icon=":material/label:"),
    st.Page("pages/production.py", title="Production", icon=":material/monitoring:"),
    st.Page("pages/tasks.py", title="Tasks", icon=":material/edit_note:"),
    st.Page("pages/people.py", title="People", icon=":material/group:"),
    st.Page("pages/notifications.py", title="Notifications", icon=":material/notifications:"),
    st.Page("pages/models.py", title="Models", icon=":material/hub:"),
    st.Page("pages/audit.py", title="Audit", icon=":material/history:"),
]


@st.cache_resource(show_spinner="Preparing the database…")
def prepare_database(url: str) -> int:
    """Migrate the database and create the built-in demo tasks, once per process and database URL."""
    return len(ensure_demo_tasks(engine()))


def signed_in_person() -> str | None:
    """With sign-in on, the signed-in user's name if still an active user; a removed or switched-off user
    is signed out (core.records.people.roles.page_actor decides, as it does inside every action)."""
    try:
        return acting_person()
    except PermissionDenied:
        st.session_state.pop(AUTH_KEY, None)
        return None


def sign_in() -> None:
    """The Sign in button's callback: with the right password, the run that follows draws the studio.

    core.records.people.sign_in's back-off counts the name and this browser's address (else its tab); the password field is
    emptied whatever the outcome, so a password never stays in the session."""
    name, password = st.session_state.get("sign_in_name", ""), st.session_state.get("sign_in_password", "")
    st.session_state["sign_in_password"] = ""
    try:
        user = authenticate(engine(), name, password, client=sign_in_client())
    except SignInLocked as exc:
        SIGN_IN.set("form", Outcome(False, plain(str(exc).capitalize() + ".")))
        return
    if user is None:
        SIGN_IN.set("form", Outcome(False, "Wrong user name or password."))
    else:
        password_signed_in(user.name)
        st.session_state.pop(REFUSED_KEY, None)
        st.session_state.pop(NOTE_KEY, None)


def sign_in_page() -> None:
    """Shown instead of any page while sign-in is on and nobody is signed in: the provider's button (ui.sign_in)
    when one is configured, and the studio's own accounts."""
    st.title("Sign in")
    st.caption("This studio has user accounts. Ask an admin for one (People page, or `python -m core user add`).")
    refused = st.session_state.pop(REFUSED_KEY, None)
    if refused:
        st.warning(f"Nothing was done: {plain(refused)}.")
    settle_attempt()  # back from the provider with nobody signed in: show_note says so
    show_note()
    provider_section()
    SIGN_IN.show("form")
    with st.form("sign_in"):
        if provider_on():
            st.caption("Or with a studio account")
        st.text_input("User name", key="sign_in_name")
        st.text_input("Password", type="password", key="sign_in_password")
        st.form_submit_button("Sign in", type="primary" if not provider_on() else "secondary", on_click=sign_in)


def person_box(required: bool) -> None:
    """Who is acting: the signed-in user and role, or (no sign-in) the single local user's name."""
    if required:
        name = st.session_state[AUTH_KEY]
        with Session(engine()) as session:
            role = role_of(session, name)
        via = f" through {provider_host()}" if st.session_state.get(VIA_KEY) == "provider" else ""
        settle_attempt()  # back from the provider, signed in: its attempt's cookie is forgotten
        st.caption(f"Signed in{via}")
        st.code(f"{name} ({role})", language=None, wrap_lines=True)
        st.button("Sign out", on_click=sign_out, key="sign_out")
        return
    st.caption("No sign-in: single local user with every permission")
    if REVIEWER_KEY not in st.session_state:  # a new session (a reload), or Streamlit dropped the widget's state
        st.session_state[REVIEWER_KEY] = st.session_state.get(NAME_KEY) or remembered_name() or default_reviewer()
    st.session_state.setdefault(NAME_WRITTEN_KEY, remembered_name() or st.session_state[REVIEWER_KEY])
    name = st.text_input("Your name", key=REVIEWER_KEY,
                         help="Recorded with every decision and label you make here; this browser remembers it. "
                              "Add a user (People page, or `python -m core user add`) to require sign-in.")
    st.session_state[NAME_KEY] = name  # outside the widget's state, which a page switch may drop
    remember_name(name or "")
    reason = refusal()  # e.g. a name of the studio's own, such as `cli`: nothing can be done under it
    if reason:
        st.warning(plain(reason[:1].upper() + reason[1:]) + ".")


def remembered_name() -> str | None:
    """The name this browser typed last (its cookie), read when a session starts: after a reload too."""
    try:
        value = st.context.cookies.get(NAME_COOKIE)
    except Exception:  # noqa: BLE001  (no browser connection)
        return None
    if not isinstance(value, str):  # AppTest's context is a mock
        return None
    name = urllib.parse.unquote(value).strip()
    return name[:100] or None


def remember_name(name: str) -> None:
    """Write the name into this browser's cookie when it changed. The only script the studio runs in the page:
    fixed code, the name passed as a JSON string with `<` escaped, so no typed text becomes markup."""
    if st.session_state.get(NAME_WRITTEN_KEY) == name:
        return
    st.session_state[NAME_WRITTEN_KEY] = name
    literal = json.dumps(urllib.parse.quote(name, safe="")).replace("<", "\\u003c")
    st.html(f"<script>document.cookie = '{NAME_COOKIE}=' + {literal} + "
            "'; path=/; max-age=31536000; SameSite=Strict';</script>", unsafe_allow_javascript=True)


def sidebar(url: str, required: bool) -> None:
    """The context every page works in: the task and library (bound to the URL's ?task= and ?library=, so a
    reload or a shared link opens the same ones), who acts, the worker, the database and the default model."""
    with Session(engine()) as session:
        tasks = [t.name for t in queries.list_tasks(session)]
    keep_open_context()
    with st.sidebar:
        task = None
        if tasks:
            keep_valid_choice(TASK_KEY, tasks)  # a task renamed or deleted meanwhile
            task = st.selectbox("Task", tasks, key=TASK_KEY, bind="query-params")
        with Session(engine()) as session:
            row = queries.task_by_name(session, task) if task else None
            libraries = [lib.name for lib in queries.libraries(session, row.id)] if row else []
        libraries = libraries or ["default"]
        keep_valid_choice(LIBRARY_KEY, libraries)
        st.selectbox("Library", libraries, key=LIBRARY_KEY, bind="query-params",
                     index=libraries.index("default") if "default" in libraries else 0)
        person_box(required)
        st.caption("Worker")
        worker_line()
        st.caption("HTTP API")
        st.code(api_line(get_settings().api_port), language=None, wrap_lines=True)
        st.caption("Database")
        st.code(describe_url(url), language=None, wrap_lines=True)
        st.caption("Default model (of new tasks)")
        st.code(get_settings().model, language=None, wrap_lines=True)
        if row is not None and {row.policy_model, row.learner_model} != {get_settings().model}:
            st.caption(f"This task's models (its runs' defaults): policy {row.policy_model}, "
                       f"learner {row.learner_model}")


@st.cache_data(ttl=15, show_spinner=False)
def api_line(port: int) -> str:
    """Whether the HTTP API answers, asked at most every 15 s (a short local request)."""
    return api_status(port)


@st.fragment(run_every=3)
def worker_line() -> None:
    """What the workers are doing, in words, redrawn on its own every few seconds."""
    with Session(engine()) as session:
        line = worker_summary(session)
    st.code(line, language=None, wrap_lines=True)


# An emoji icon is drawn by the browser; a :material: page icon as favicon would be fetched from a font CDN.
STUDIO = "Training-Free GRPO studio"
st.set_page_config(page_title=STUDIO, page_icon="🧪", layout="wide")


def tab_title(page: st.Page) -> None:
    """The browser tab names the page ("Review · Training-Free GRPO studio"): a page_title set once for the
    whole app would name every tab alike, so it is set again for the page the navigation chose."""
    st.set_page_config(page_title=f"{page.title} · {STUDIO}")


@st.cache_resource
def harden() -> None:
    """Once per app process: provider keys in its environment stay unreadable to other processes of the
    same user, and scores run under the configured limits."""
    harden_process()
    configure_scoring()


harden()

url = get_settings().database_url
try:
    prepare_database(url)
except Exception as exc:  # a bad URL or an unreachable server: say so instead of a traceback
    st.error(f"Cannot open the database `{describe_url(url)}`. Check DATABASE_URL.")
    st.code(scrub_url(f"{type(exc).__name__}: {exc}", url), language=None, wrap_lines=True)
    st.stop()

finish_sign_out()  # a Sign out button asked to end the provider's sign-in too
with Session(engine()) as _session:
    sign_in_on = sign_in_required(_session)
if sign_in_on:
    session_ended()  # an expired sign-in is forgotten here, and the sign-in page says why
    person = signed_in_person() or person_from_provider()
    if person is None:
        signing_in = st.navigation([st.Page(sign_in_page, title="Sign in", url_path="sign-in")], position="hidden")
        tab_title(signing_in)
        signing_in.run()
        st.stop()
    with Session(engine()) as _session:
        no_role = role_of(_session, person) is None
    if no_role:
        waiting = st.navigation([st.Page(no_role_page, title="No role yet", url_path="no-role")], position="hidden")
        tab_title(waiting)
        waiting.run()
        st.stop()
st.session_state.pop(REFUSED_KEY, None)  # the page's own section shows why an action was refused
# .streamlit/config.toml hides Streamlit's own page list, which the first run after a start shows (a raw list
# of pages/, the legacy multipage mode); the option would hide this navigation too, so it is shown from here on.
st.set_option("client.showSidebarNavigation", True)
# expanded: every page listed (past 10 Streamlit folds the rest under "View more"); before the sidebar, whose
# widgets then keep their ids in every run (run_page)
page = st.navigation(PAGES, expanded=True)
tab_title(page)
sidebar(url, sign_in_on)
with studio_frame():  # the page knows the sidebar is drawn (ui.common.run_page)
    page.run()
