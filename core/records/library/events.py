"""What the library announces: a label moved. Subjects above it (production's A/B experiments, notifications)
register a handler here instead of being called by the library, so the library knows nothing of them.

A handler runs inside the move's transaction, before its audit event is written, so what it writes (an
experiment ended, a webhook in the outbox) commits with the move or not at all, and what it adds to
`record` (an experiment's verdict) lands in the move's audit record. Handlers are registered when their
module is imported: core/records/subscribers.py imports them all, every entry point imports it, and a move with
no handler registered is refused rather than left unheard.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlmodel import Session

from core.errors import StudioError
from storage.tables import LibraryVersion


@dataclass(frozen=True)
class LabelMoved:
    """A label of a library now points at `version`. `before` is the label's previous place (version id and
    number) or None; `record` is the move's audit record, which a handler may add to."""

    session: Session
    version: LibraryVersion
    name: str
    before: dict | None
    actor: str
    record: dict


LabelHandler = Callable[[LabelMoved], None]
_HANDLERS: list[LabelHandler] = []


def on_label_moved(handler: LabelHandler) -> LabelHandler:
    """Register `handler` for every label move (a decorator); registering one twice keeps one."""
    if handler not in _HANDLERS:
        _HANDLERS.append(handler)
    return handler


def label_moved(event: LabelMoved) -> None:
    """Tell every registered handler, in the order they registered."""
    if not _HANDLERS:
        raise StudioError("a label moved with no subscriber registered: import core.records.subscribers at the "
                          "entry point (the A/B experiments and the webhooks would not hear of it)")
    for handler in _HANDLERS:
        handler(event)


def label_handlers() -> tuple[LabelHandler, ...]:
    return tuple(_HANDLERS)
