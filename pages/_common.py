"""What every page shares: the sidebar context (task, library, reviewer), safe text display, the worker.

Not a page itself (it is not in streamlit_app.PAGES). Holds display helpers only; state changes
go through `core`.
"""

from __future__ import annotations

import getpass
import re
from dataclasses import dataclass

import streamlit as st
from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.labeling import Labelled
from core.people import can
from core.worker import ensure_worker, job_health
from storage.db import database_url, get_engine

TASK_KEY, LIBRARY_KEY, REVIEWER_KEY = "ctx_task", "ctx_library", "ctx_reviewer"
AUTH_KEY = "auth_user"  # the signed-in user's name; set only by the sign-in form in streamlit_app.py
DATETIME = st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss")
SCORE = st.column_config.NumberColumn(format="%.3f")


def require_app() -> None:
    """Make sure this page runs inside streamlit_app.py (sidebar, navigation), never on its own.

    Because the folder is called `pages/`, Streamlit starts every process in its old multipage mode
    and, for a deep link such as /review opened first after a restart (and in AppTest reruns), runs
    the page file alone. st.navigation switches that mode off; this does it early and reruns, so the
    entry script draws the sidebar and routes to the same page.
    """
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()


@dataclass
class Context:
    """The task, library and person the sidebar has chosen; every page works within it."""

    task: str | None
    library: str
    reviewer: str


def default_reviewer() -> str:
    try:
        return getpass.getuser() or "local"
    except Exception:  # noqa: BLE001  (no user database in some containers)
        return "local"


def context() -> Context:
    """With sign-in on, the acting person is the signed-in user; without it, the name typed in the sidebar."""
    signed_in = st.session_state.get(AUTH_KEY)
    person = signed_in or (st.session_state.get(REVIEWER_KEY) or default_reviewer()).strip() or "local"
    return Context(task=st.session_state.get(TASK_KEY), library=st.session_state.get(LIBRARY_KEY) or "default",
                   reviewer=person)


def engine() -> Engine:
    return get_engine()


def allowed(role: str) -> bool:
    """Whether the person using the page has at least `role` (core checks again on every change)."""
    with Session(engine()) as session:
        return can(session, context().reviewer, role)


def role_note(role: str, doing: str) -> None:
    """Say why controls are missing, instead of leaving a person to guess."""
    st.info(f"{doing.capitalize()} needs the {role} role, which you do not have. An admin can change roles on People.")


def show_text(text: str | None, empty: str = "(empty)") -> None:
    """Model-written or user-written text, shown verbatim: never Markdown, never HTML."""
    st.code(text if text else empty, language=None, wrap_lines=True)


def show_trajectory(messages: list[dict]) -> None:
    """The agent's side of the conversation (after the system prompt and the query), each with its role."""
    turns = list(messages[2:]) if len(messages) >= 2 else list(messages)
    if not turns:
        st.caption("No model turn was recorded.")
    for message in turns:
        role = str(message.get("role", "?"))
        content = str(message.get("content", ""))
        if role == "user" and content.startswith("Code output:"):
            role = "user (tool output)"
        st.caption(role if role in ("assistant", "user", "user (tool output)", "system", "tool") else "message")
        show_text(content)


def keep_valid_choice(key: str, options: list) -> None:
    """Forget a remembered choice that is no longer offered (another task, a deleted row)."""
    if key in st.session_state and st.session_state[key] not in options:
        del st.session_state[key]


def reward_text(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


def experience_lines(experiences: list[dict]) -> str:
    """A version's experiences as plain text, one `[E3] text` line each."""
    return "\n".join(f"[{exp.get('id', '?')}] {exp.get('text', '')}" for exp in experiences)


def status_label(status: str, heartbeat_at=None) -> str:
    """A job's status as a person should read it: a running job whose worker stopped beating is `stalled`.

    Plain words, no emoji: a browser without an emoji font draws them as empty boxes."""
    return job_health(status, heartbeat_at)


def after_label(result: Labelled) -> None:
    """A label that completed a waiting step or evaluation queued it again: make sure a worker takes it."""
    if result.released:
        start_worker_if_needed()


def start_worker_if_needed() -> None:
    """Queued work needs a live worker: start one beside the app when none is beating."""
    message = ensure_worker(engine(), database_url())
    if message.startswith("started"):
        st.toast(message)


_MARKDOWN = re.compile(r"([\\`*_\[\]<>#|~$])")


def plain(text: str) -> str:
    """Text for a Markdown element (st.error, st.info): core messages quote names and file content,
    which must show as typed, never as emphasis, links or math."""
    return _MARKDOWN.sub(r"\\\1", str(text))


@dataclass
class Outcome:
    """What an action did: a message of ours, and optionally text from a file or the database (shown verbatim)."""

    ok: bool
    message: str
    detail: str = ""


@dataclass(frozen=True)
class Flash:
    """Outcomes set in a button's callback and shown once, where the section draws, on the next run."""

    key: str

    def set(self, section: str, outcome: Outcome) -> None:
        st.session_state.setdefault(self.key, {})[section] = outcome

    def show(self, section: str) -> None:
        outcome = st.session_state.get(self.key, {}).pop(section, None)
        if outcome is None:
            return
        (st.success if outcome.ok else st.error)(outcome.message)
        if outcome.detail:
            show_text(outcome.detail)


def run_action(action, *args, success: str | None = None, **kwargs):
    """Call a core function for a button; show its error as a message instead of a traceback."""
    try:
        result = action(*args, **kwargs)
    except (LookupError, ValueError, PermissionError) as exc:
        st.error(plain(str(exc)))
        return None
    except Exception as exc:  # noqa: BLE001  (e.g. AlreadyDecided, a locked database)
        st.error(plain(f"{type(exc).__name__}: {exc}"))
        return None
    if success:
        st.toast(success)
    return result
