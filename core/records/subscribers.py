"""The subjects that react to the library's announcements, wired in one place: importing this module registers
each handler on its hook (core/records/library/events.py). Every entry point imports it before it serves anyone
(the command line, the HTTP API, the pages' shared module, the tests), and a label move refuses to run unheard
(events.label_moved raises when nothing is registered), so no path can move a label and skip ending an A/B
experiment or sending its webhook."""

from __future__ import annotations

from core.records.notifications import events as _notifications
from core.records.production import ab_changes as _production

SUBSCRIBERS = (_production.end_on_label_move, _notifications.notify_label_moved)
