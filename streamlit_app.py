"""Entry point of the studio: `streamlit run streamlit_app.py`.

It sets up the page, makes sure the database holds the demo task, draws the shared sidebar (task,
library, reviewer, database, worker) and hands over to the page chosen in the navigation. Pages
live in `pages/`, one file each; add a new one to PAGES.
"""

from __future__ import annotations

import streamlit as st
from sqlmodel import Session

from core import config
from core.tasks import ensure_demo_task
from core.worker import alive_workers
from pages._common import LIBRARY_KEY, REVIEWER_KEY, TASK_KEY, default_reviewer
from storage import queries
from storage.db import database_url, describe_url, get_engine

PAGES = [
    st.Page("pages/overview.py", title="Overview", icon=":material/dashboard:", default=True),
    st.Page("pages/train.py", title="Train", icon=":material/model_training:"),
    st.Page("pages/rollouts.py", title="Rollouts", icon=":material/view_column:"),
    st.Page("pages/review.py", title="Review", icon=":material/rate_review:"),
    st.Page("pages/library.py", title="Library", icon=":material/library_books:"),
    st.Page("pages/evaluate.py", title="Evaluate", icon=":material/leaderboard:"),
    st.Page("pages/labeling.py", title="Labeling", icon=":material/label:"),
    st.Page("pages/tasks.py", title="Tasks", icon=":material/edit_note:"),
    st.Page("pages/people.py", title="People", icon=":material/group:"),
    st.Page("pages/audit.py", title="Audit", icon=":material/history:"),
]


@st.cache_resource(show_spinner="Preparing the database…")
def prepare_database(url: str) -> int:
    """Migrate the database and create the demo task, once per process and database URL."""
    return ensure_demo_task(get_engine()).id


def sidebar(url: str) -> None:
    """The context every page works in; choices live in st.session_state under the _common keys."""
    with Session(get_engine()) as session:
        tasks = [t.name for t in queries.list_tasks(session)]
        task = queries.task_by_name(session, st.session_state.get(TASK_KEY) or (tasks[0] if tasks else ""))
        libraries = [lib.name for lib in queries.libraries(session, task.id)] if task else []
        workers = alive_workers(session)
    with st.sidebar:
        if tasks:
            if st.session_state.get(TASK_KEY) not in tasks:
                st.session_state[TASK_KEY] = tasks[0]
            st.selectbox("Task", tasks, key=TASK_KEY)
        libraries = libraries or ["default"]
        if st.session_state.get(LIBRARY_KEY) not in libraries:
            st.session_state[LIBRARY_KEY] = "default" if "default" in libraries else libraries[0]
        st.selectbox("Library", libraries, key=LIBRARY_KEY)
        st.session_state.setdefault(REVIEWER_KEY, default_reviewer())
        st.text_input("Reviewing as", key=REVIEWER_KEY, help="Recorded with every decision you make here.")
        st.caption("Worker")
        if workers:
            st.code("\n".join(f"{w.id} · {w.current or 'idle'}" for w in workers), language=None, wrap_lines=True)
        else:
            st.code("none alive (queued work starts one)", language=None, wrap_lines=True)
        st.caption("Database")
        st.code(describe_url(url), language=None, wrap_lines=True)
        st.caption("Default model")
        st.code(config.default_model(), language=None, wrap_lines=True)


st.set_page_config(page_title="Training-Free GRPO studio", layout="wide")

url = database_url()
try:
    prepare_database(url)
except Exception as exc:  # a bad URL or an unreachable server: say so instead of a traceback
    st.error(f"Cannot open the database `{describe_url(url)}`. Check DATABASE_URL.")
    st.code(f"{type(exc).__name__}: {exc}", language=None, wrap_lines=True)
    st.stop()

sidebar(url)
st.navigation(PAGES).run()
