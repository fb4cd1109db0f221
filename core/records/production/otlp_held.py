"""OTLP spans held instead of refused: exporters do not retry a partial success, so a span whose service maps to
no task yet is kept (`unmapped`) until an admin maps the service (core/records/production/otlp.py `map_service` lands it),
and a model call whose messages the studio cannot read is kept to be shown (`unreadable`), never dropped unseen.

Held spans are bounded by count per sender, the API key and the service together, and by age
(TFGRPO_OTLP_HELD_PER_SERVICE, TFGRPO_OTLP_HELD_HOURS): past the bound the oldest of that key's spans of that service
go, so one key (a leaked one, or another team's exporter that keeps OpenTelemetry's default `service.name`) can never
displace what another key's exporter had held; the worker ages out every service's held spans, also of a service
that stopped sending (`prune_everywhere`). Each one dropped is counted per service (`otlp:dropped:<service>`), so the
Production page says how many were lost. A held span is shown to admins, and to the people of the task its key is
bound to (`visible_held`). A resource is stored once by the hash of its attributes.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime, timedelta

from sqlalchemy import delete, func, true, update
from sqlmodel import Session, col, select

from core.domain.otlp_spans import SpanTrace
from storage.tables import ApiCounter, ApiKey, OtlpHeldSpan, OtlpResource
from storage.writes import insert_or_skip

UNMAPPED, UNREADABLE = "unmapped", "unreadable"
DROPPED = "otlp:dropped:"  # ApiCounter name prefix: held spans dropped past the bound, per service
NO_SERVICE = "(no service.name)"


def resource_hash(attributes: dict) -> tuple[str, str]:
    """The resource's hash and its canonical JSON (sorted keys), the text that is stored once."""
    text = json.dumps(attributes, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest(), text


def store_resources(session: Session, resources: list[dict]) -> tuple[dict[int, str], int]:
    """Each distinct resource stored once (insert-or-skip by hash): its hash by the dict's id, and the bytes
    newly written (a resource already stored costs nothing again)."""
    hashes: dict[int, str] = {}
    written, seen = 0, set()
    for attributes in resources:
        if id(attributes) in hashes:
            continue
        digest, text = resource_hash(attributes)
        hashes[id(attributes)] = digest
        if digest in seen:
            continue
        seen.add(digest)
        if insert_or_skip(session, OtlpResource(hash=digest, attributes=attributes)):
            written += len(text)
    return hashes, written


def resource_of(session: Session, digest: str | None) -> dict:
    """A stored resource's attributes by hash ({} when none)."""
    row = session.get(OtlpResource, digest) if digest else None
    return dict(row.attributes) if row is not None else {}


def held_row(span: SpanTrace, reason: str, digest: str | None, key_id: int | None, received: datetime) -> dict:
    """The held span's row as column values: the span as read, its resource by hash."""
    return {"service": (span.service or NO_SERVICE)[:300], "reason": reason, "client_id": span.client_id,
            "span": {**span.held(), "resource_hash": digest, "why": span.unreadable}, "api_key_id": key_id,
            "received_at": received}


def held_ids(session: Session, client_ids: set[str]) -> set[str]:
    """Which of these spans are held already (a retried export holds nothing twice)."""
    if not client_ids:
        return set()
    return set(session.exec(select(OtlpHeldSpan.client_id).where(col(OtlpHeldSpan.client_id).in_(client_ids))))


def prune(session: Session, senders: set[tuple[str, int | None]], per_service: int, hours: float,
          now: datetime) -> None:
    """Drop held spans past the bound of each (service, API key) sender: older than `hours`, or beyond that key's
    newest `per_service` of that service; each one dropped is counted under its service."""
    for service, key_id in senders:
        sender = (OtlpHeldSpan.service == service,
                  col(OtlpHeldSpan.api_key_id).is_(None) if key_id is None else OtlpHeldSpan.api_key_id == key_id)
        gone = set(session.exec(select(OtlpHeldSpan.id).where(*sender,
                                                              OtlpHeldSpan.received_at < now - timedelta(hours=hours))))
        gone |= set(session.exec(select(OtlpHeldSpan.id).where(*sender)
                                 .order_by(col(OtlpHeldSpan.received_at).desc(), col(OtlpHeldSpan.id).desc())
                                 .offset(per_service)))
        if gone:
            session.exec(delete(OtlpHeldSpan).where(col(OtlpHeldSpan.id).in_(gone)))
            _count(session, DROPPED + service, len(gone))


def prune_everywhere(session: Session, per_service: int, hours: float, now: datetime) -> None:
    """The bound applied to every sender's held spans (the worker's pass), so a service that stopped sending still
    ages out."""
    senders = set(session.exec(select(OtlpHeldSpan.service, OtlpHeldSpan.api_key_id).distinct()))
    prune(session, senders, per_service, hours, now)


def visible_held(task_id: int | None, admin: bool):
    """The held spans a person may see: an admin every one; anyone else those sent by a key bound to `task_id`."""
    if admin:
        return true()
    bound = select(ApiKey.id).where(ApiKey.task_id == task_id)
    return col(OtlpHeldSpan.api_key_id).in_(bound)


def _count(session: Session, name: str, count: int) -> None:
    now = time.time()
    changed = session.exec(update(ApiCounter).where(ApiCounter.name == name)
                           .values(value=ApiCounter.value + count, updated_at=now)).rowcount
    if changed != 1:
        session.add(ApiCounter(name=name, value=float(count), updated_at=now))


def held_services(session: Session, task_id: int | None = None, admin: bool = True) -> list[dict]:
    """Per service: spans held waiting for a mapping, unreadable model calls held, and held spans dropped past
    the bound, most waiting first (the Production page's table); of the spans `visible_held` shows."""
    rows: dict[str, dict] = {}

    def row(service: str) -> dict:
        return rows.setdefault(service, {"service": service, "held (not mapped)": 0, "held (unreadable)": 0,
                                         "dropped past the bound": 0, "oldest": None})

    counts = session.exec(select(OtlpHeldSpan.service, OtlpHeldSpan.reason, func.count(),
                                 func.min(OtlpHeldSpan.received_at))
                          .where(visible_held(task_id, admin)).group_by(OtlpHeldSpan.service, OtlpHeldSpan.reason))
    for service, reason, count, oldest in counts:
        found = row(service)
        found["held (not mapped)" if reason == UNMAPPED else "held (unreadable)"] += count
        found["oldest"] = min(filter(None, (found["oldest"], oldest)), default=None)
    for counter in session.exec(select(ApiCounter).where(col(ApiCounter.name).startswith(DROPPED))):
        if admin or counter.name[len(DROPPED):] in rows:
            row(counter.name[len(DROPPED):])["dropped past the bound"] = int(counter.value)
    return sorted(rows.values(), key=lambda found: (-found["held (not mapped)"] - found["held (unreadable)"],
                                                    found["service"]))


def held_spans(session: Session, service: str | None = None, reason: str | None = None,
               limit: int = 50, *, task_id: int | None = None, admin: bool = True) -> list[OtlpHeldSpan]:
    """The newest held spans (of a service, of a reason), to show them with their attributes; of the spans
    `visible_held` shows."""
    query = (select(OtlpHeldSpan).where(visible_held(task_id, admin))
             .order_by(col(OtlpHeldSpan.received_at).desc(), col(OtlpHeldSpan.id).desc()))
    if service is not None:
        query = query.where(OtlpHeldSpan.service == service)
    if reason is not None:
        query = query.where(OtlpHeldSpan.reason == reason)
    return list(session.exec(query.limit(limit)))


def take_held(session: Session, service: str) -> list[tuple[OtlpHeldSpan, SpanTrace]]:
    """The spans held for `service` because it mapped to no task, read back, to land now that it does."""
    rows = session.exec(select(OtlpHeldSpan).where(OtlpHeldSpan.service == service,
                                                   OtlpHeldSpan.reason == UNMAPPED).order_by(OtlpHeldSpan.id))
    taken = []
    for row in rows:
        digest = (row.span or {}).get("resource_hash")
        taken.append((row, SpanTrace.from_held(row.span, resource_of(session, digest))))
    return taken
