"""What both doors of production traces share, the studio's JSON route (core.records.production.traces) and OTLP
(core.records.production.otlp): one result type, the request's bounds, the dedup by (task, sender's id) against what
is stored and within the request, the request's bytes charged to its key, and the transaction run again when another
writer stored one of its ids at the same moment. The doors differ only in how they read and place what arrives."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from core.errors import BodyTooLarge, Conflict
from core.records.keys.api_keys import KeyUse
from core.records.keys.limits import charge_stored
from core.settings import get_settings
from storage.tables import Trace

T = TypeVar("T")
ATTEMPTS = 3  # a request's transaction, run again while other writers store the same ids at the same moment


@dataclass
class Ingested:
    """What a request's traces became: stored, already stored (a retry), each stored trace a running A/B experiment
    does not count with why (`outside_experiment`), and for OTLP the refused spans ({position, span_id, reason}),
    the held ones (service not mapped yet, or messages unreadable) and the spans with no model call (`other`)."""

    stored: int = 0
    duplicates: int = 0
    outside_experiment: list[dict] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)
    other: int = 0
    held: int = 0
    outside_task: Exception | None = None  # a span a bound key named another task for (OTLP: audited by the route)

    def as_json(self) -> dict:
        """The JSON route's answer."""
        return {"stored": self.stored, "duplicates": self.duplicates, "outside_experiment": self.outside_experiment}

    def message(self) -> str:
        """OTLP's partial success message: every refused span's reason (the first few), and the other spans."""
        parts = [f"span {p['position']}" + (f" ({p['span_id']})" if p.get("span_id") else "") + f": {p['reason']}"
                 for p in self.refused[:5]]
        if len(self.refused) > 5:
            parts.append(f"and {len(self.refused) - 5} more refused")
        if self.other:
            parts.append(f"{self.other} span(s) held no model call with a user message and were not stored")
        if self.held:
            parts.append(f"{self.held} span(s) held, not yet traces: their service maps to no task yet (they land "
                         "when it is mapped) or their messages cannot be read; the Production page shows them")
        return "; ".join(parts)


@dataclass(frozen=True)
class IngestLimits:
    """What one request and one key may store (core/settings.py); tests pass their own."""

    max_spans: int
    request_bytes: int
    key_daily_bytes: int
    held_per_service: int
    held_hours: float

    @classmethod
    def configured(cls) -> IngestLimits:
        settings = get_settings()
        return cls(settings.otlp_max_spans, settings.ingest_request_max_bytes, settings.ingest_key_daily_bytes,
                   settings.otlp_held_per_service, settings.otlp_held_hours)


def retried(write: Callable[[], T]) -> T:
    """Run a request's transaction; when another writer stored one of its ids at the same moment (the unique key of
    (task, sender's id)), run it again, where it finds those ids stored. Past ATTEMPTS it is a Conflict (409) that
    asks for the request again, never a 500."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return write()
        except IntegrityError:
            if attempt == ATTEMPTS:
                raise Conflict(f"other requests stored these traces at the same moment {ATTEMPTS} times; send this "
                               "one again (what is stored by then counts as duplicates)") from None
    raise AssertionError("ATTEMPTS must be at least 1")


def unstored(session: Session, items: Iterable[tuple[int, str, T]]) -> tuple[list[T], int]:
    """The items (task id, sender's id, item) whose id the task has not stored and that no earlier item of the
    request repeats, in order, and how many were left out as duplicates."""
    items = list(items)
    by_task: dict[int, set[str]] = defaultdict(set)
    for task_id, client_id, _item in items:
        by_task[task_id].add(client_id)
    seen: set[tuple[int, str]] = set()
    for task_id, ids in by_task.items():
        rows = session.exec(select(Trace.client_id).where(Trace.task_id == task_id, Trace.client_id.in_(ids)))
        seen |= {(task_id, client_id) for client_id in rows}
    new = []
    for task_id, client_id, item in items:
        if (task_id, client_id) not in seen:
            seen.add((task_id, client_id))
            new.append(item)
    return new, len(items) - len(new)


def charge_request(session: Session, size: int, key: KeyUse | None, limits: IngestLimits) -> None:
    """Refuse a request that would store more than one request may (BodyTooLarge, 413), then count its bytes
    against its key's daily allowance in the same transaction (QuotaExceeded, 429)."""
    if size > limits.request_bytes:
        raise BodyTooLarge(f"the request would store {size} bytes; one request may store at most "
                           f"{limits.request_bytes} (TFGRPO_INGEST_REQUEST_MAX_BYTES)")
    if key is not None and size:
        charge_stored(session, key.id, key.name, size, limits.key_daily_bytes)
