"""Notifications: the webhooks that tell a team's tools when a person is needed (core/records/notifications/webhooks.py).

An administrator adds a receiver (its URL, the events it hears, its signing secret shown once), sends it a
test, reads the delivery log (status, response code, attempts) and replays a failed delivery. Workers send the
deliveries; this page only writes intent, through the same core functions as `python -m core webhook`.
"""

from __future__ import annotations

import uuid

import streamlit as st
from sqlmodel import Session

from core.domain.webhooks import EVENTS
from core.records.notifications.webhooks import (
    add_endpoint,
    deliveries,
    describe,
    dismiss_given_up,
    endpoint_names,
    endpoints,
    given_up_notice,
    remove_endpoint,
    replay,
    secrets_problem,
    send_test,
)
from core.settings import get_settings
from storage.statuses import DeliveryStatus
from ui.common import Flash, Outcome, allowed, context, engine, plain, role_note, run_action, run_page
from ui.display import table

FLASH = Flash("notifications_flash")
ADD = {name: f"notifications_add_{name}" for name in ("name", "url", "events", "secret_env")}
REPLAY_KEY = "notifications_replay"
PRESS_KEY = "notifications_test_press_{}"  # one token per drawn Test button: a press sent twice sends one test


def add() -> None:
    """The Add webhook button's callback: the new secret is shown once, beside the form, and nowhere after."""
    state = st.session_state
    name = str(state.get(ADD["name"]) or "").strip()
    result = run_action(FLASH, "add", add_endpoint, engine(), name, str(state.get(ADD["url"]) or ""),
                        context().reviewer, events=list(state.get(ADD["events"]) or []),
                        secret_env=str(state.get(ADD["secret_env"]) or "").strip() or None)
    if result is None:
        return
    view, secret = result
    said = (f"Webhook {plain(view.name)} added. Its signing secret, shown this once (keep it where the receiver "
            f"verifies): `{secret}`" if secret else
            f"Webhook {plain(view.name)} added; it signs with the secret in the environment variable "
            f"{plain(view.secret_from.removeprefix('env '))}.")
    FLASH.set("add", Outcome(True, said))
    for key in (ADD["name"], ADD["url"], ADD["secret_env"]):
        state[key] = ""


def test(name: str, press: str) -> None:
    """The Test button's callback: `press` is the token the button was drawn with, so a double click (two
    callbacks of one drawing) sends one test; the token is renewed for the next drawing."""
    st.session_state[PRESS_KEY.format(name)] = uuid.uuid4().hex
    row = run_action(FLASH, f"endpoint_{name}", send_test, engine(), name, context().reviewer, press=press)
    if row is not None:
        FLASH.set(f"endpoint_{name}", Outcome(row.status == "delivered", plain(f"Test: {describe(row)}.")))


def remove(name: str) -> None:
    run_action(FLASH, "endpoints", remove_endpoint, engine(), name, context().reviewer,
               success=f"Webhook {name} removed")


def replay_chosen() -> None:
    chosen = st.session_state.get(REPLAY_KEY)
    if chosen is not None:
        run_action(FLASH, "log", replay, engine(), int(chosen), context().reviewer,
                   report=lambda row: f"Delivery {row.id} queued (a replay of {chosen}); a worker sends it.")


def endpoint_rows() -> None:
    st.subheader("Webhooks", anchor=False)
    FLASH.show("endpoints")
    with Session(engine()) as session:
        rows = endpoints(session)
    if not rows:
        st.caption("No webhook yet: add one below, or `python -m core webhook add NAME URL`.")
        return
    for row in rows:
        with st.container(border=True):
            left, middle, right = st.columns([5, 1, 1], vertical_alignment="center")
            left.markdown(f"**{plain(row.name)}** · {plain(row.url)} · {plain(', '.join(row.events) or 'every event')}"
                          f" · secret {plain(row.secret_from)}")
            press = st.session_state.setdefault(PRESS_KEY.format(row.name), uuid.uuid4().hex)
            middle.button("Test", key=f"notifications_test_{row.name}", on_click=test, args=(row.name, press),
                          help="Send a signed test message now and show what the receiver answered.")
            right.button("Remove", key=f"notifications_remove_{row.name}", on_click=remove, args=(row.name,))
            FLASH.show(f"endpoint_{row.name}")


def add_form() -> None:
    st.subheader("Add a webhook", anchor=False)
    FLASH.show("add")
    with st.form("notifications_add_form"):
        left, right = st.columns(2)
        left.text_input("Name", key=ADD["name"], placeholder="team-chat")
        right.text_input("URL (http or https; a chat tool's incoming webhook works)", key=ADD["url"],
                         placeholder="https://hooks.example.com/services/...")
        st.multiselect("Events (none chosen: every event)", list(EVENTS), key=ADD["events"],
                       format_func=lambda name: f"{name}: {EVENTS[name]}")
        st.text_input("Secret variable (optional: the NAME of an environment variable holding a whsec_ secret; "
                      "empty: the studio makes one and shows it once)", key=ADD["secret_env"])
        st.form_submit_button("Add webhook", type="primary", on_click=add)


def dismiss() -> None:
    run_action(FLASH, "log", dismiss_given_up, engine(), context().reviewer,
               report=lambda count: f"Dismissed the notice of {count} given-up deliveries (the log keeps them).")


def delivery_log() -> None:
    st.subheader("Delivery log", anchor=False)
    FLASH.show("log")
    with Session(engine()) as session:
        rows = deliveries(session, limit=100)
        names = endpoint_names(session)
        notice = given_up_notice(session)
    if notice:
        left, right = st.columns([5, 1], vertical_alignment="center")
        left.warning(plain(notice), icon=":material/notifications_off:")
        right.button("Dismiss", key="notifications_dismiss", on_click=dismiss)
    if not rows:
        st.caption("Nothing sent yet.")
        return
    table([{"id": row.id, "webhook": names.get(row.endpoint_id, "?"), "event": row.event_type, "status": row.status,
            "code": row.last_code, "attempts": row.attempts, "what happened": describe(row),
            "text": row.payload.get("text", ""), "raised": f"{row.created_at:%Y-%m-%d %H:%M:%S}"} for row in rows],
          key="notifications_log")
    failed = [row.id for row in rows if row.status == DeliveryStatus.FAILED]  # newest first
    if failed:
        left, right = st.columns([3, 1], vertical_alignment="bottom")
        left.selectbox("Failed delivery to send again (same webhook-id, after the webhook's other deliveries)",
                       failed, key=REPLAY_KEY)
        right.button("Replay", key="notifications_replay_button", on_click=replay_chosen)


def page() -> None:
    st.title("Notifications")
    st.caption("Webhooks tell your team's tools when a person is needed: a step awaits review, labels wait, a "
               "dispute needs a decision, an evaluation ended, a run failed or stalled, production moved. Each is "
               "signed by the Standard Webhooks scheme and carries a link to the exact page, run and step.")
    if not allowed("admin"):
        role_note("admin", "configuring notifications")
        return
    settings = get_settings()
    allowed_inside = settings.webhook_allowlist.strip() or "none"
    st.caption(f"Links start with {plain(settings.app_url)} (TFGRPO_APP_URL). Receivers must have public addresses; "
               f"internal ones admitted (TFGRPO_WEBHOOK_ALLOWLIST): {plain(allowed_inside)}. A receiver has "
               f"{settings.webhook_timeout_s:g} s to answer; a delivery is retried on Standard Webhooks' schedule and "
               f"given up after {settings.webhook_max_attempts} attempts. Workers send the deliveries.")
    problem = secrets_problem(engine())
    if problem:
        st.error(plain(problem))
    endpoint_rows()
    add_form()
    delivery_log()


run_page(page)
