"""Models: the model connections of this studio, where models are served and how they are reached.

A connection is an OpenAI-compatible server's address (vLLM, SGLang, Ollama, llama.cpp's server, LM Studio,
a company gateway) or a litellm provider, with the NAME of the environment variable that holds its key:
the key itself is never stored or shown. Tasks, runs and evaluations then pick `<connection>/<model>`.
Test makes one short call and shows the latency and the reply, or the exact error with the masked address.
Each connection shows the models its server lists (its /models, kept a few minutes: core.models.connections),
which every model picker offers; Refresh models asks the servers again.
Admins add and remove connections; everything goes through core.records.models.connections.
"""

from __future__ import annotations

import json

import streamlit as st
from sqlmodel import Session

from core.records.models.connections import (
    KINDS,
    add_connection,
    describe,
    list_connections,
    remove_connection,
    try_connection,
)
from core.records.models.options import connection_listings
from ui.common import (
    Flash,
    Outcome,
    allowed,
    context,
    engine,
    plain,
    refresh_models,
    role_note,
    run_action,
    run_page,
)
from ui.display import table
from ui.messages import message_markdown

FLASH = Flash("models_flash")
KIND_NAMES = {"openai": "OpenAI-compatible server (base URL)", "litellm": "litellm provider"}
ADD = {name: f"models_add_{name}" for name in ("name", "kind", "base_url", "provider", "key_env", "params")}


def add() -> None:
    """The Add connection button's callback."""
    state = st.session_state
    text = str(state.get(ADD["params"]) or "").strip()
    try:
        params = json.loads(text) if text else None
    except ValueError:
        FLASH.set("add", Outcome(False, f"The default parameters are not JSON: {text!r}; nothing was saved."))
        return
    name = str(state.get(ADD["name"]) or "").strip()
    run_action(FLASH, "add", add_connection, engine(), name, state.get(ADD["kind"]), actor=context().reviewer,
               base_url=str(state.get(ADD["base_url"]) or "").strip() or None,
               provider=str(state.get(ADD["provider"]) or "").strip() or None,
               key_env=str(state.get(ADD["key_env"]) or "").strip() or None, params=params,
               success=f"Connection {name} added: models are {name}/<model>")


def test(name: str) -> None:
    """The Test button's callback: one short call; its outcome is shown beside the connection."""
    model = str(st.session_state.get(f"models_test_model_{name}") or "").strip()
    result = run_action(FLASH, f"test_{name}", try_connection, engine(), name, model)
    if result is not None:
        FLASH.set(f"test_{name}", Outcome(result.ok, plain(result.words())))  # the model's reply, as typed


def remove(name: str) -> None:
    run_action(FLASH, f"test_{name}", remove_connection, engine(), name, context().reviewer,
               success=f"Connection {name} removed")


def add_form() -> None:
    st.subheader("Add a connection", anchor=False)
    FLASH.show("add")
    if not allowed("admin"):
        role_note("admin", "adding model connections")
        return
    with st.form("models_add_form"):
        left, right = st.columns(2)
        left.text_input("Name (models are then NAME/<model>)", key=ADD["name"], placeholder="my-vllm")
        right.radio("Kind", list(KINDS), format_func=KIND_NAMES.get, key=ADD["kind"], horizontal=True)
        left.text_input("Base URL (OpenAI-compatible server)", key=ADD["base_url"],
                        placeholder="http://127.0.0.1:8000/v1")
        right.text_input("Provider (litellm kind)", key=ADD["provider"], placeholder="openai, anthropic, deepseek")
        left.text_input("Key variable (the NAME of the environment variable; empty: no key)", key=ADD["key_env"],
                        placeholder="VLLM_API_KEY")
        right.text_input("Default parameters (JSON, optional)", key=ADD["params"], placeholder='{"temperature": 0.2}')
        st.form_submit_button("Add connection", type="primary", on_click=add)


def connection_rows() -> None:
    with Session(engine()) as session:
        rows = [describe(row) for row in list_connections(session)]
        listings = {listing.connection: listing for listing in connection_listings(session)}
    st.subheader("Connections", anchor=False)
    if not rows:
        st.caption("No connection yet: models are the embedded ones (local/...) and litellm providers whose key "
                   "is set. Add one below to reach a server of your own.")
        return
    # A plain "-" would show as "'-" (a spreadsheet-safe cell: ui.display); a connection without a key
    # variable needs no key, which the cell says.
    table([{**row, "defaults": json.dumps(row["defaults"]), "key set here": {True: "yes", False: "NO",
                                                                                 None: "not needed"}[row["key set here"]]}
           for row in rows], key="models_table")
    st.button("Refresh models", key="models_refresh", icon=":material/refresh:", on_click=refresh_models,
              help="Ask every connection's server for the models it serves now (kept a few minutes otherwise).")
    for row in rows:
        name = row["name"]
        with st.container(border=True):
            st.markdown(f"**{name}**")
            listing = listings.get(name)
            if listing is not None:
                st.caption(plain(f"Models served (every model picker offers them as {name}/<model>): ")
                           + message_markdown(listing.words().removeprefix(f"{name}: ")))
            FLASH.show(f"test_{name}")
            left, middle, right = st.columns([3, 1, 1], vertical_alignment="bottom")
            left.text_input("Model to try", key=f"models_test_model_{name}", placeholder="the server's model name")
            middle.button("Test", key=f"models_test_{name}", on_click=test, args=(name,))
            if allowed("admin"):
                right.button("Remove", key=f"models_remove_{name}", on_click=remove, args=(name,))


def page() -> None:
    st.title("Models")
    st.caption("Where models are served. A model is written `<connection>/<model>` wherever one is chosen "
               "(tasks, runs, evaluations); keys stay in the environment of the app and the worker.")
    connection_rows()
    add_form()
    st.caption("The embedded models (local/qwen2.5-coder-0.5b, local/smollm2-135m) need no connection.")


run_page(page)
