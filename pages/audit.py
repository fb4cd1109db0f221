"""Audit log: every state change the studio records (who, what, when, to which object, before and after).

Read-only, so every role sees it. Filters narrow the query in the database; the free-text filter over
the before/after JSON runs here on what the query returned. Actors and JSON values may be user-written,
so they appear only in the table and as code (ui.display), never as Markdown, and the CSV download
is spreadsheet-safe. Core never records passwords.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time, timedelta

import pandas as pd
import streamlit as st
from sqlmodel import Session

from core.records.library.audit_names import object_names
from storage import queries
from storage.tables import AuditEvent
from ui.common import DATETIME, engine, run_page
from ui.display import csv_download, show_long, table

ACTOR_KEY, GROUP_KEY, ACTION_KEY, TYPE_KEY = "audit_actor", "audit_group", "audit_action", "audit_type"
OBJECT_KEY, DATES_KEY, CONTAINS_KEY, LIMIT_KEY = "audit_object_id", "audit_dates", "audit_contains", "audit_limit"
EVENT_KEY = "audit_event"


def compact(value: dict | list | None) -> str:
    return "" if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def pretty(value: dict | list | None) -> str:
    return "(nothing)" if value is None else json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True,
                                                        default=str)


def contains(event: AuditEvent, needle: str) -> bool:
    """Case-insensitive match of the free text against the event's before and after JSON."""
    needle = needle.casefold()
    return needle in compact(event.before).casefold() or needle in compact(event.after).casefold()


def keep_offered(key: str, options: list[str]) -> None:
    """Drop remembered multiselect choices that are no longer offered (a narrower action group)."""
    if key in st.session_state:
        st.session_state[key] = [v for v in st.session_state[key] if v in options]


def date_bounds(chosen: tuple | list | date | None) -> tuple[datetime | None, datetime | None]:
    """The chosen days as [first day 00:00 UTC, the day after the last); one day chosen means that day onward."""
    days = list(chosen) if isinstance(chosen, (tuple, list)) else [chosen] if chosen else []
    if not days:
        return None, None
    since = datetime.combine(days[0], time.min, tzinfo=UTC)
    until = datetime.combine(days[-1] + timedelta(days=1), time.min, tzinfo=UTC) if len(days) > 1 else None
    return since, until


def filters(facets: dict[str, list[str]]) -> dict:
    """Draw the filter widgets; return the query's keyword arguments and the free-text filter."""
    groups = sorted({action.split(".", 1)[0] for action in facets["actions"]})
    first, second, third = st.columns(3)
    keep_offered(ACTOR_KEY, facets["actors"])
    actors = first.multiselect("Person", facets["actors"], key=ACTOR_KEY, placeholder="everyone")
    keep_offered(GROUP_KEY, groups)
    chosen_groups = second.multiselect("Action group", groups, key=GROUP_KEY, placeholder="every group",
                                       help="The part before the dot: run, operation, user, label, ...")
    actions = [a for a in facets["actions"] if not chosen_groups or a.split(".", 1)[0] in chosen_groups]
    keep_offered(ACTION_KEY, actions)
    chosen_actions = third.multiselect("Action", actions, key=ACTION_KEY, placeholder="every action")
    first, second, third = st.columns(3)
    keep_offered(TYPE_KEY, facets["object_types"])
    types = first.multiselect("Object type", facets["object_types"], key=TYPE_KEY, placeholder="every type")
    object_id = second.number_input("Object id", min_value=0, value=None, step=1, key=OBJECT_KEY,
                                    placeholder="any")
    days = third.date_input("Dates (UTC)", value=[], key=DATES_KEY, help="One day, or a first and a last day.")
    first, second = st.columns([3, 1])
    needle = first.text_input("Before or after contains", key=CONTAINS_KEY,
                              help="Case-insensitive text searched in the before and after JSON.")
    limit = second.number_input("Newest events to fetch", min_value=1, max_value=100_000, value=500, step=100,
                                key=LIMIT_KEY)
    since, until = date_bounds(days)
    return {"query": {"actor": actors, "action_prefix": chosen_actions or chosen_groups, "object_type": types,
                      "object_id": None if object_id is None else int(object_id), "since": since, "until": until,
                      "limit": int(limit)},
            "contains": needle.strip()}


def show_event(event: AuditEvent, name: str) -> None:
    st.caption("Event")
    when = f"{event.created_at:%Y-%m-%d %H:%M:%S}" if event.created_at else "–"
    show_long(f"event {event.id} · {event.action} · {name} · by {event.actor} · {when} UTC",
              f"audit_{event.id}_event")
    before, after = st.columns(2)
    with before:
        st.caption("Before")
        show_long(pretty(event.before), f"audit_{event.id}_before", language="json")
    with after:
        st.caption("After")
        show_long(pretty(event.after), f"audit_{event.id}_after", language="json")


def page() -> None:
    st.title("Audit log")
    st.caption("Every state change the studio records, newest first. Times are UTC. Passwords are never recorded.")
    with Session(engine()) as session:
        facets = queries.audit_facets(session)
        if not facets["actions"]:
            st.info("Nothing has been recorded yet.")
            return
        chosen = filters(facets)
        events = queries.audit_events(session, **chosen["query"])
        names = object_names(session, events)
        session.expunge_all()
    fetched = len(events)
    if chosen["contains"]:
        events = [event for event in events if contains(event, chosen["contains"])]
    count = f"{len(events)} {'event' if len(events) == 1 else 'events'}"
    more = " (the newest that match; fetch more to look further back)" if fetched >= chosen["query"]["limit"] else ""
    st.caption(count + more)
    if not events:
        st.info("No event matches these filters.")
        return
    frame = pd.DataFrame([{"id": e.id, "when": e.created_at, "actor": e.actor, "action": e.action,
                           "object": names[e.id], "before": compact(e.before), "after": compact(e.after)}
                          for e in events])
    table(frame, column_config={"when": DATETIME}, key="audit_table")
    csv_download(frame, "Download CSV", "audit.csv", "audit_download")
    by_id = {event.id: event for event in events}
    ids = list(by_id)
    if st.session_state.get(EVENT_KEY) not in ids:
        st.session_state.pop(EVENT_KEY, None)
    chosen_id = st.selectbox("Show one event", ids, key=EVENT_KEY,
                             format_func=lambda i: f"event {i} · {by_id[i].action} · {names[i]}")
    show_event(by_id[chosen_id], names[chosen_id])


run_page(page)
