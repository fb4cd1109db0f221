"""What every page shares: the page skeleton, the sidebar context (task, library, reviewer), the outcome
of an action, safe text display, the worker.

Every page file has the same shape, a prologue and a call:

    def page() -> None:
        st.title("Review")
        ctx, task = require_task()   # stops the page with a hint when no task is chosen
        ...                          # reads through storage.queries, changes through run_action(core...)

    run_page(page)

Not a page itself, so not in pages/ (whose every file Streamlit would list as a page: ui/__init__.py).
Holds display helpers only; state changes go through `core`.
"""

from __future__ import annotations

import functools
import getpass
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import streamlit as st
from sqlalchemy.engine import Engine
from sqlmodel import Session
from streamlit.runtime.scriptrunner import get_script_run_ctx

import core.records.subscribers  # noqa: F401  (a label moved on a page is heard: core/records/subscribers.py)
from core.domain.library import EXAMPLE, kind_of
from core.errors import PermissionDenied, StudioError
from core.jobs.worker import ensure_worker
from core.records.models.options import ModelOption, connection_listings, model_options, option_names
from core.records.people.roles import LOCAL_USER, NOBODY, can, is_reserved, page_actor
from core.records.people.sign_in import client_key
from core.records.review.labeling import Labelled
from core.records.runs.workers import job_health
from core.records.tasks.task_io import TaskSettings
from core.settings import engine as settings_engine
from core.settings import get_settings
from storage import queries
from storage.tables import Task
from ui.messages import escaped, message_markdown, message_text

# The task and library selectboxes are bound to the URL under these keys (?task=...&library=...), so a reload
# or a shared link opens the same context.
TASK_KEY, LIBRARY_KEY, REVIEWER_KEY = "task", "library", "ctx_reviewer"
NAME_COOKIE = "tfgrpo_name"  # the typed acting name, remembered by the browser across reloads (no sign-in)
URL_WRITTEN_KEY = "_url_written"
AUTH_KEY = "auth_user"  # the signed-in user's name; set only by sign-in (streamlit_app.py, ui/sign_in.py)
REFUSED_KEY = "action_refused"  # why the last action was refused; the sign-in page shows it
DATETIME = st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss")
SCORE = st.column_config.NumberColumn(format="%.3f")
ENTRY_SCRIPT = Path(__file__).resolve().parent.parent / "streamlit_app.py"
_IN_STUDIO: ContextVar[bool] = ContextVar("studio_frame", default=False)


@contextmanager
def studio_frame() -> Iterator[None]:
    """streamlit_app.py runs the chosen page inside this, after drawing the sidebar: see run_page."""
    token = _IN_STUDIO.set(True)
    try:
        yield
    finally:
        _IN_STUDIO.reset(token)


def run_page(page: Callable[[], None]) -> None:
    """Draw a page inside the studio (sidebar, navigation); the last line of every page file.

    A folder called `pages/` beside streamlit_app.py makes Streamlit start every server process (and
    every AppTest run) in its legacy multipage mode, in which a URL such as /review runs pages/review.py
    on its own (streamlit/runtime/pages_manager.py sets the mode when a `pages` folder exists;
    scriptrunner/script_runner.py then runs `_mpa_v1` instead of the entry script). The mode ends for
    good, for every session, at the first st.navigation call ("As soon as any session of your app
    executes the st.navigation command, your app will ignore the pages/ directory", st.navigation's
    documentation), so a deep link opened first after a restart meets it. A page run that way runs
    streamlit_app.py in its place, as Streamlit itself does for the app's root URL in that mode: its
    st.navigation call ends the legacy mode and routes to this same page (both modes know it by its URL
    path), drawn with the sidebar. Outside a Streamlit run (a test importing the page) it draws nothing.
    The legacy mode's own list of the pages/ files is hidden (.streamlit/config.toml, tests/test_cold_sidebar.py).
    """
    if not st.runtime.exists():
        return
    if _IN_STUDIO.get():
        page()
        for key in (OPEN_ADDRESS_KEY, OPEN_CONTEXT_KEY):  # a drawn page has taken what it shows of them
            st.session_state.pop(key, None)
        return
    code = compile(ENTRY_SCRIPT.read_text(encoding="utf-8"), str(ENTRY_SCRIPT), "exec")
    exec(code, {"__name__": "__main__", "__file__": str(ENTRY_SCRIPT)})  # noqa: S102  (our own entry script)


@dataclass
class Context:
    """The task, library and person the sidebar has chosen; every page works within it."""

    task: str | None
    library: str
    reviewer: str


def default_reviewer() -> str:
    """The name the sidebar starts with: the account's login name, unless that is one of the studio's own."""
    try:
        name = getpass.getuser() or LOCAL_USER
    except Exception:  # noqa: BLE001  (no user database in some containers)
        return LOCAL_USER
    return LOCAL_USER if is_reserved(name) else name


def acting_person() -> str:
    """Who this tab acts for, asked anew from core.records.people.roles.page_actor; raises PermissionDenied when nobody may.

    Button callbacks run before streamlit_app.py's sign-in gate, so every action asks this itself."""
    with Session(engine()) as session:
        return page_actor(session, st.session_state.get(AUTH_KEY),
                          st.session_state.get(REVIEWER_KEY) or default_reviewer())


def refusal() -> str | None:
    """Why this tab may not act right now (not signed in, switched off, a reserved name), or None."""
    try:
        acting_person()
    except PermissionDenied as exc:
        return str(exc)
    return None


def refused() -> Outcome | None:
    """The outcome of an action this tab may not take right now ("Nothing was done: sign in first"), or None."""
    reason = refusal()
    if reason is None:
        return None
    st.session_state[REFUSED_KEY] = reason
    return Outcome(False, "Nothing was done: " + plain(reason) + ".")


def checks_sign_in(action: Callable[..., Outcome]) -> Callable[..., Outcome]:
    """For a page action that returns an Outcome instead of going through run_action: it asks again, when
    called, whether this tab may act at all, and does nothing but say why not."""
    @functools.wraps(action)
    def checked(*args: Any, **kwargs: Any) -> Outcome:
        return refused() or action(*args, **kwargs)
    return checked


def sign_in_client() -> str:
    """The client the sign-in back-off counts: the browser's address, else this tab (core.records.people.sign_in.client_key)."""
    try:
        ip = st.context.ip_address
    except Exception:  # noqa: BLE001  (no browser connection)
        ip = None
    run = get_script_run_ctx(suppress_warning=True)
    return client_key(ip if isinstance(ip, str) else None, run.session_id if run else None)  # AppTest: a mock


def context() -> Context:
    """The sidebar's choices and who acts: the signed-in user with sign-in on, else the typed name.

    When nobody may act the person is core.records.people.roles.NOBODY, whom every role check refuses."""
    try:
        person = acting_person()
    except PermissionDenied:
        person = NOBODY
    return Context(task=st.session_state.get(TASK_KEY), library=st.session_state.get(LIBRARY_KEY) or "default",
                   reviewer=person)


class Current(NamedTuple):
    """What a page that works on a task needs: the sidebar's choices and the task's row."""

    ctx: Context
    task: Task


def current_task(ctx: Context) -> Task | None:
    """The sidebar's task row, if it exists."""
    with Session(engine()) as session:
        return queries.task_by_name(session, ctx.task) if ctx.task else None


def require_task() -> Current:
    """The sidebar's context and task; with no task, say what to do (with a link to Tasks) and stop the page."""
    ctx = context()
    task = current_task(ctx)
    if task is None:
        st.info("No task is chosen. Pick one in the sidebar, or create one on the Tasks page.")
        st.page_link("pages/tasks.py", label="Open Tasks", icon=":material/edit_note:")
        st.stop()
    return Current(ctx, task)


def engine() -> Engine:
    return settings_engine()


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


def url_choice(key: str, param: str, options: list[int]) -> None:
    """Before an id selectbox (run, step, evaluation): the id a to-do button opened this page on
    (follow_open_request), else a `?param=id` the URL brought (a reload, a shared link, an edited address),
    becomes the choice, unless it is what this session wrote there itself.

    Ids are not bound with Streamlit's `bind="query-params"`, which stores the option's label, and a run's
    label changes with its status; here the URL holds the plain id."""
    raw = (st.session_state.get(OPEN_ADDRESS_KEY) or {}).pop(param, None) or st.query_params.get(param)
    written = st.session_state.setdefault(URL_WRITTEN_KEY, {})
    if raw is None or raw == written.get(param) or not (raw.isascii() and raw.isdigit()) or int(raw) not in options:
        return
    st.session_state[key] = int(raw)
    written[param] = raw


def show_in_url(param: str, value: int | None) -> None:
    """After the selectbox: the choice into the address bar, so reloading or sharing it opens the same thing."""
    written = st.session_state.setdefault(URL_WRITTEN_KEY, {})
    if value is None:
        st.query_params.pop(param, None)
        written.pop(param, None)
        return
    if st.query_params.get(param) != str(value):
        st.query_params[param] = str(value)
    written[param] = str(value)


def id_select(label: str, ids: list[int], key: str, param: str, *, default: int | None = None, where: Any = None,
              **kwargs: Any) -> int | None:
    """A selectbox of ids (runs, steps, evaluations) kept in the URL as ?param=id: a reload or a shared link
    opens the same one. `default` is chosen when neither the URL nor this session chose; `where` is the
    container to draw in (default: the page)."""
    keep_valid_choice(key, ids)
    url_choice(key, param, ids)
    if default in ids:
        st.session_state.setdefault(key, default)
    if key in st.session_state:  # pinned: the browser names the choice by its label, which changes with a status
        st.session_state[key] = st.session_state[key]  # or a count, and a label it no longer finds reset the box
    chosen = (where or st).selectbox(label, ids, key=key, **kwargs)
    show_in_url(param, chosen)
    return chosen


def keep_valid_choice(key: str, options: list) -> None:
    """Forget a remembered choice that is no longer offered (another task, a deleted row)."""
    if key in st.session_state and st.session_state[key] not in options:
        del st.session_state[key]


def reward_text(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


def experience_lines(experiences: list[dict]) -> str:
    """A version's experiences as plain text, one `[E3] text` line each; a worked example is marked as one
    (the agent reads examples apart from the lessons)."""
    return "\n".join(f"[{exp.get('id', '?')}] {'(worked example) ' if kind_of(exp) == EXAMPLE else ''}"
                     f"{exp.get('text', '')}" for exp in experiences)


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
    message = ensure_worker(engine(), get_settings().database_url)
    if message.startswith("started"):
        st.toast(message)


def plain(text: str) -> str:
    """Text for a Markdown element (st.error, st.info): core messages quote names and file content,
    which must show as typed, never as emphasis, links or math."""
    return escaped(text)


@dataclass
class Outcome:
    """What an action did, shown once as an alert beside the section that caused it.

    `message` is ours, written as Markdown (anything quoted from outside goes through plain()); `detail` is
    text from a file or the database (core's error text), shown verbatim below it.
    """

    ok: bool
    message: str
    detail: str = ""


def failed(exc: Exception, message: str = "") -> Outcome:
    """An action's failure: our `message` with core's error text as its detail; without one, core's text alone."""
    on_purpose = isinstance(exc, StudioError | LookupError | ValueError | PermissionError)
    text = str(exc) if on_purpose else f"{type(exc).__name__}: {exc}"
    return Outcome(False, message, detail=message_text(text)) if message else Outcome(False, message_markdown(text))


def show_outcome(outcome: Outcome) -> None:
    (st.success if outcome.ok else st.error)(outcome.message)
    if outcome.detail:
        show_text(outcome.detail)


@dataclass(frozen=True)
class Flash:
    """A page's outcomes, kept in session state from the action (a button's callback, which runs before
    the page is drawn) until its section draws and shows it, once."""

    key: str

    def set(self, section: str, outcome: Outcome) -> None:
        st.session_state.setdefault(self.key, {})[section] = outcome

    def show(self, section: str) -> None:
        outcome = st.session_state.get(self.key, {}).pop(section, None)
        if outcome is not None:
            show_outcome(outcome)


Said = str | Callable[[Any], str] | None


def run_action(flash: Flash, section: str, action: Callable[..., Any], *args: Any, success: Said = None,
               report: Said = None, failure: str = "", **kwargs: Any) -> Any:
    """Call a core function for a button (in its callback); its outcome is shown on the run that follows.

    Returns the function's result, or None if it raised: core wrote nothing, and `flash.show(section)`
    shows the error (`failure` over core's text when given, else core's text). On success, `success`
    (text, or a function of the result) is a toast, for a change the redrawn page shows anyway, and
    `report` an alert beside the section, for a result the page does not show; with neither, nothing.
    First it asks again whether this tab may act at all (it runs before the app's sign-in gate): if not,
    nothing is called and the reason ("sign in first") is shown, on the sign-in page too.
    """
    no = refused()
    if no is not None:
        flash.set(section, no)
        return None
    try:
        result = action(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001  (every failure is shown; core rolled its transaction back)
        flash.set(section, failed(exc, failure))
        return None
    if success is not None:
        st.toast(success(result) if callable(success) else success)
    if report is not None:
        flash.set(section, Outcome(True, report(result) if callable(report) else report))
    return result


LABEL_TAB_KEY = "label_tab"  # the Labeling page's tabs, bound to the URL as ?label_tab=Agreement (pages/labeling.py)
OPEN_REQUEST_KEY = "_open_request"  # the page and address a to-do button asked for (open_in_context)
OPEN_ADDRESS_KEY = "_open_address"  # that address, until the page it opened has drawn (follow_open_request)
OPEN_CONTEXT_KEY = "_open_context"  # the task and library it asked for, until then too (keep_open_context)


def open_in_context(page: str, task: str, library: str | None = None, params: dict[str, int] | None = None,
                    state: dict[str, Any] | None = None) -> None:
    """For a button's callback: open `page` on this task and library, with `params` (?run=, ?step=) in the
    address and `state` (e.g. a tab) in the session, as a link to that view opens it; the page whose button
    it was calls follow_open_request first thing.

    The sidebar's task and library are bound to the URL, so a link's ?task= loses against the session's
    choice and st.switch_page may not carry them: they are set here, before the sidebar draws. The ids go in
    the address; forgetting that this session wrote them there lets the page's id_select take them (a
    session that had shown run 3 before would otherwise ignore ?run=3 and fall back to its default). The
    switch itself waits for the page run (follow_open_request): in a callback the pages are not known yet."""
    asked = {TASK_KEY: task} if library is None else {TASK_KEY: task, LIBRARY_KEY: library}
    st.session_state.update(asked)
    st.session_state[OPEN_CONTEXT_KEY] = asked
    st.session_state.update(state or {})
    written = st.session_state.setdefault(URL_WRITTEN_KEY, {})
    for param in params or {}:
        written.pop(param, None)
    st.session_state[OPEN_REQUEST_KEY] = (page, {param: str(value) for param, value in (params or {}).items()})


def keep_open_context() -> None:
    """Before the sidebar's task and library draw: the ones a button opened this page on (open_in_context),
    until that page has drawn. The switch's rerun can carry the browser's widget values from before the click,
    and a widget value from the browser beats the session's; a first visit's Quick trial once trained the
    sidebar's first task instead of the shop demo (CI, tests/test_browser_first_visit.py). A value the code
    sets in this run beats both."""
    st.session_state.update(st.session_state.get(OPEN_CONTEXT_KEY) or {})


def follow_open_request() -> None:
    """Switch to the page an open_in_context button asked for, if one did (the sidebar has drawn its task).

    The address is also kept in the session until that page has drawn, and its id selectboxes read it first
    (url_choice). On a busy machine the page once opened on the sidebar's defaults instead of the row's run and
    step: the switch's rerun can be merged with another pending one, such as the sidebar's timed fragment, and
    a merged rerun takes the later request's query string (streamlit/runtime/scriptrunner_utils/
    script_requests.py), which the browser sent from the old address. Which path lost it was not proven; the
    kept address does not depend on it."""
    request = st.session_state.pop(OPEN_REQUEST_KEY, None)
    if request is not None:
        page, params = request
        st.session_state[OPEN_ADDRESS_KEY] = dict(params)
        st.switch_page(page, query_params=params)


# --- model pickers --------------------------------------------------------------------------------------------

MODEL_MEMORY_KEY = "_models_chosen"  # "<picker key>@<task id>" -> the model last chosen there (kept across pages)
MODEL_OWNER_KEY = "_models_owner"  # picker key -> the task id its widget's value belongs to


def offered_models(task: Task | TaskSettings | None) -> list[ModelOption]:
    """What every model picker offers, in order, with where each came from (core.records.models.options)."""
    with Session(engine()) as session:
        return model_options(session, task)


def refresh_models() -> None:
    """The Refresh button's callback: every connection's server is asked for its models again."""
    with Session(engine()) as session:
        connection_listings(session, refresh=True)


def restore_model(key: str, task_id: int | None, start: str) -> None:
    """Before a model picker is drawn (or read): its widget holds what was last chosen on it for this task, else
    `start`. Streamlit drops a widget's state when its page is left, and the same key kept across a task switch
    would hold another task's model: neither a page switch nor a finished job puts another model there."""
    state = st.session_state
    owners = state.setdefault(MODEL_OWNER_KEY, {})
    if key not in state or owners.get(key, task_id) != task_id:
        state[key] = state.get(MODEL_MEMORY_KEY, {}).get(f"{key}@{task_id}") or start
    owners[key] = task_id


def choose_model(key: str, task_id: int | None, model: str) -> None:
    """Put `model` in a model picker as a person's choice for this task (a hand-over from another page: the
    model a run learned with), so the picker keeps it as it keeps a choice made on it."""
    st.session_state[key] = model
    st.session_state.setdefault(MODEL_OWNER_KEY, {})[key] = task_id
    st.session_state.setdefault(MODEL_MEMORY_KEY, {})[f"{key}@{task_id}"] = model


def model_picker(where, label: str, key: str, options: list[ModelOption], *, task_id: int | None, start: str,
                 help: str, remember: bool = True, format_func: Callable[[Any], str] = str) -> str:
    """A model selectbox that lists `options` after its current value and takes a typed name too. It starts from
    what was last chosen on it for this task (restore_model), else `start`, and remembers its choice; with
    `remember` off (a form that edits what is stored) from `start` whenever its page is drawn anew."""
    if remember:
        restore_model(key, task_id, start)
    else:
        st.session_state.setdefault(key, start)
    value = where.selectbox(label, option_names(options, st.session_state[key]), key=key, accept_new_options=True,
                            format_func=format_func, help=help)
    if remember:
        st.session_state.setdefault(MODEL_MEMORY_KEY, {})[f"{key}@{task_id}"] = value
    return value


def models_note(key: str) -> None:
    """Under model pickers: where what they offer comes from (each connection's listing, its age or why it has
    none) and a Refresh button that asks the connections' servers again."""
    with Session(engine()) as session:
        listings = connection_listings(session)
    said = ("Connections' models: " + "; ".join(listing.words() for listing in listings) + ". ") if listings else \
        "No model connection yet (the Models page adds one: a vLLM, Ollama or llama.cpp server, a provider). "
    left, right = st.columns([5, 1], vertical_alignment="center")
    left.caption(message_markdown(f"Offered: the task's models, the studio's default, each connection's models as "
                                  f"its server lists them, the embedded models and providers whose key is set; a "
                                  f"name can be typed. {said}"))
    right.button("Refresh models", key=key, icon=":material/refresh:", on_click=refresh_models,
                 disabled=not listings, help="Ask every connection's server for the models it serves now.")
