"""Entry point of the studio: `streamlit run streamlit_app.py`.

It sets up the page, makes sure the database holds the demo task, draws the shared sidebar and
hands over to the page chosen in the navigation. Pages live in `pages/`, one file each; add a new
one to PAGES.
"""

from __future__ import annotations

import streamlit as st

from core import config
from core.tasks import ensure_demo_task
from storage.db import database_url, describe_url, get_engine

PAGES = [
    st.Page("pages/overview.py", title="Overview", icon=":material/dashboard:", default=True),
]


@st.cache_resource(show_spinner="Preparing the database…")
def prepare_database(url: str) -> int:
    """Migrate the database and create the demo task, once per process and database URL."""
    return ensure_demo_task(get_engine()).id


st.set_page_config(page_title="Training-Free GRPO studio", layout="wide")

url = database_url()
with st.sidebar:
    st.caption("Database")
    st.code(describe_url(url), language=None, wrap_lines=True)
    st.caption("Default model")
    st.code(config.default_model(), language=None, wrap_lines=True)

try:
    prepare_database(url)
except Exception as exc:  # a bad URL or an unreachable server: say so instead of a traceback
    st.error(f"Cannot open the database `{describe_url(url)}`. Check DATABASE_URL.")
    st.code(f"{type(exc).__name__}: {exc}", language=None, wrap_lines=True)
    st.stop()

st.navigation(PAGES).run()
