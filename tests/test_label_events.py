"""The library announces a label move instead of calling production and notifications (core/records/library/events.py):
both subjects are registered once every entry point imported core.records.subscribers, a move reaches each in its
transaction, and a move with nobody registered is refused rather than left unheard."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from core.errors import StudioError
from core.records.library import events
from core.records.library.versions import import_library, set_label
from core.records.notifications.events import notify_label_moved
from core.records.production.ab_changes import end_on_label_move
from core.records.tasks.demos import DEMO_TASK
from storage.tables import AuditEvent


def test_production_and_notifications_are_registered_on_the_hook():
    assert {end_on_label_move, notify_label_moved} <= set(events.label_handlers())


def test_a_move_reaches_every_handler_in_the_moves_transaction_and_its_record(engine, demo_task, monkeypatch):
    heard = []

    def listener(event: events.LabelMoved) -> None:
        heard.append((event.name, event.version.number, event.actor))
        event.record["heard"] = True

    monkeypatch.setattr(events, "_HANDLERS", [*events.label_handlers(), listener])
    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(version.number), "staging", "system")
    assert heard == [("staging", version.number, "system")]
    with Session(engine) as session:
        move = session.exec(select(AuditEvent).where(AuditEvent.action == "label.move")).one()
    assert move.after["heard"] is True  # a handler's addition lands in the move's audit record


def test_a_move_with_nobody_registered_is_refused_and_changes_nothing(engine, demo_task, monkeypatch):
    monkeypatch.setattr(events, "_HANDLERS", [])
    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    with pytest.raises(StudioError, match="no subscriber"):
        set_label(engine, DEMO_TASK, str(version.number), "staging", "system")
    with Session(engine) as session:
        assert session.exec(select(AuditEvent).where(AuditEvent.action == "label.move")).first() is None
