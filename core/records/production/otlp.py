"""OTLP spans stored as production traces, beside the client's: the same Trace rows, so labelling, harvest and
the A/B split read them through core/records/production/traces.py exactly as they read the client's.

Which task a span belongs to: the task its ingest key is bound to (a span naming another task is refused),
else its `tfgrpo.task` attribute (on the span or its resource), else its resource's `service.name` as mapped
on the Production page (`map_service`). A span that maps to no task is held (core/records/production/otlp_held.py) and
lands in the task when its service is mapped; a model call with no message read is held to be shown. Which
version served it: `tfgrpo.version_id` (the id the API served) or `tfgrpo.version` (its number) or
`tfgrpo.label`, found as a library fetch finds it (core/records/production/serving.py `served_version`, whose number or
`latest` is read by the one version lookup, core/records/library/versions.py `resolve_version`), else the one
version of the library whose prompt block its system instructions contain, else none: stored and shown as
"unknown version", never guessed.

What a request may store is bounded: its spans (TFGRPO_OTLP_MAX_SPANS), the bytes it adds
(TFGRPO_INGEST_REQUEST_MAX_BYTES, 413) and its key's bytes per day (TFGRPO_INGEST_KEY_DAILY_BYTES, 429); a
resource is stored once by hash and referred to from each span, so a large resource costs its size once.
A request's accepted and held spans are written in one transaction.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace

from sqlalchemy import delete, insert, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from core.domain.otlp_depth import count_spans
from core.domain.otlp_spans import PROTOBUF, Decoded, SpanTrace, decode_spans, parse_request
from core.errors import BodyTooLarge, InvalidInput, NotFound, OutsideTask
from core.records.keys.api_keys import KeyUse, key_scope
from core.records.library.versions import export_version
from core.records.people.roles import require_role
from core.records.production import otlp_held
from core.records.production.ab_experiments import stamp_rows
from core.records.production.ingest import Ingested, IngestLimits, charge_request, retried, unstored
from core.records.production.rules import label_status
from core.records.production.serving import served_version
from core.records.production.traces import THUMBS
from core.records.tasks.lookup import get_library, get_task
from storage.db import session_scope
from storage.tables import (
    ApiCounter,
    AuditEvent,
    Library,
    LibraryVersion,
    OtlpHeldSpan,
    OtlpService,
    Task,
    Trace,
)

OTHER = "otlp:other"  # ApiCounter: spans that held no model call (not traces)
RECOGNISED_VERSIONS = 200  # the newest versions of a library whose blocks a system prompt is compared with
NO_SERVICE = otlp_held.NO_SERVICE


def age_held_spans(engine: Engine, now: datetime | None = None) -> None:
    """The held spans' bound applied to every sender, in its own short transaction (the worker's pass)."""
    limits = IngestLimits.configured()
    with session_scope(engine) as session:
        otlp_held.prune_everywhere(session, limits.held_per_service, limits.held_hours, now or datetime.now(UTC))


def ingest_request(engine: Engine, body: bytes, kind: str, key: KeyUse | None = None,
                   limits: IngestLimits | None = None) -> Ingested:
    """An OTLP request body (protobuf or JSON) read and stored: a request over the span cap is refused before any
    span is decoded (its spans counted cheaply: core.domain.otlp_depth.count_spans), so it costs milliseconds, not
    the seconds its decoding would (issue 61, item 5)."""
    limits = limits or IngestLimits.configured()
    counted = count_spans(body, "protobuf" if kind == PROTOBUF else "json")
    if counted > limits.max_spans:
        raise BodyTooLarge(f"the request holds {counted} spans; one request may hold at most {limits.max_spans} "
                           "(TFGRPO_OTLP_MAX_SPANS)")
    return ingest_spans(engine, decode_spans(parse_request(body, kind)), key, limits)


def ingest_spans(engine: Engine, decoded: Decoded, key: KeyUse | None = None,
                 limits: IngestLimits | None = None) -> Ingested:
    """Store the decoded spans' traces and hold the rest (see the module's note); a span that cannot be placed
    is refused, the rest are written together. A request over a bound is refused whole: BodyTooLarge (413) or
    QuotaExceeded (429). A concurrent retry of the same spans meets the unique key and is tried again."""
    limits = limits or IngestLimits.configured()
    if decoded.total > limits.max_spans:
        raise BodyTooLarge(f"the request holds {decoded.total} spans; one request may hold at most "
                           f"{limits.max_spans} (TFGRPO_OTLP_MAX_SPANS)")
    return retried(lambda: _ingest(engine, decoded, key, limits))


def _ingest(engine: Engine, decoded: Decoded, key: KeyUse | None, limits: IngestLimits) -> Ingested:
    result = Ingested(refused=list(decoded.refused), other=decoded.other)
    with session_scope(engine) as session:
        services = {row.service_name: row for row in session.exec(select(OtlpService))}
        placed, waiting = [], []
        places: dict = {}
        for span in decoded.traces:
            try:
                task, library, version, how = _place(session, span, services, places, key)
            except _Unmapped:
                waiting.append(span)
                continue
            except (NotFound, InvalidInput, OutsideTask) as exc:
                result.refused.append({"position": span.position, "span_id": span.span_id, "reason": str(exc)})
                if isinstance(exc, OutsideTask):
                    result.outside_task = exc
                continue
            placed.append((span, task, library, version, how))
        hashes, written = otlp_held.store_resources(
            session, [span.resource for span in [*decoded.traces, *decoded.unreadable]])
        new, result.duplicates = unstored(session, ((task.id, span.client_id, (span, task, library, version, how))
                                                    for span, task, library, version, how in placed))
        received = datetime.now(UTC)
        rows = [_row(span, task, library, version, how, key.id if key else None, received,
                     hashes.get(id(span.resource))) for span, task, library, version, how in new]
        held = _held_rows(session, [(span, otlp_held.UNMAPPED) for span in waiting]
                          + [(span, otlp_held.UNREADABLE) for span in decoded.unreadable], key, received, hashes)
        charge_request(session, written + sum(len(json.dumps(row, default=str)) for row in [*rows, *held]), key,
                       limits)
        if rows:
            session.execute(insert(Trace), stamp_rows(session, rows))
        if held:
            session.execute(insert(OtlpHeldSpan), held)
            otlp_held.prune(session, {(row["service"], row["api_key_id"]) for row in held}, limits.held_per_service,
                            limits.held_hours, received)
        result.stored, result.held = len(rows), len(held)
        if decoded.other:
            _count(session, OTHER, decoded.other, time.time())
    result.refused.sort(key=lambda problem: problem["position"])
    return result


def _held_rows(session: Session, spans: list[tuple[SpanTrace, str]], key: KeyUse | None, received: datetime,
               hashes: dict[int, str]) -> list[dict]:
    already = otlp_held.held_ids(session, {span.client_id for span, _ in spans})
    rows = []
    for span, reason in spans:
        if span.client_id not in already:
            already.add(span.client_id)
            rows.append(otlp_held.held_row(span, reason, hashes.get(id(span.resource)), key.id if key else None,
                                           received))
    return rows


class _Unmapped(InvalidInput):
    def __init__(self, service: str) -> None:
        self.service = service
        super().__init__(f"it names no task (tfgrpo.task) and service {service!r} is not mapped to one; map it on "
                         "the Production page")


def _place(session: Session, span: SpanTrace, services: dict[str, OtlpService],
           cache: dict, key: KeyUse | None = None) -> tuple[Task, Library, LibraryVersion | None, str]:
    """The span's task, library and version, and how the version was known (attribute, system instructions,
    unknown). Spans that name the same place are resolved once per request."""
    where = (span.task, None if span.task else span.service, span.library, span.version_id, span.version,
             span.label)
    if where not in cache:
        try:
            cache[where] = _named_place(session, span, services, key)
        except (NotFound, InvalidInput, OutsideTask) as exc:
            cache[where] = exc
    found = cache[where]
    if isinstance(found, Exception):
        raise found
    task, library, version = found
    if version is not None:
        return task, library, version, "attribute"
    if span.system:
        version = recognise_version(session, task, library, span.system, cache)
        if version is not None:
            return task, library, version, "system instructions"
    return task, library, None, "unknown"


def _named_place(session: Session, span: SpanTrace, services: dict[str, OtlpService],
                 key: KeyUse | None = None) -> tuple[Task, Library, LibraryVersion | None]:
    mapped = services.get(span.service or "")
    if key is not None and key.task_id is not None:
        task_name, library_name = key_scope(session, key, span.task, span.library)
        task = get_task(session, task_name)
        library_name = library_name or (mapped.library if mapped and mapped.task_id == task.id else "default")
    elif span.task:
        task = get_task(session, span.task)
        library_name = span.library or (mapped.library if mapped and mapped.task_id == task.id else "default")
    elif mapped is not None:
        task = session.get(Task, mapped.task_id)
        library_name = span.library or mapped.library
    else:
        raise _Unmapped(span.service or NO_SERVICE)
    if span.version_id is None and span.version is None and not span.label:
        library = get_library(session, task, library_name)
        return task, library, None
    named = ({"version_id": span.version_id} if span.version_id is not None
             else {"version": span.version} if span.version is not None else {"label": span.label})
    found = served_version(session, task.name, library_name, **named)
    return found.task, found.library, found.version


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def recognise_version(session: Session, task: Task, library: Library, system: str,
                      cache: dict | None = None) -> LibraryVersion | None:
    """The one version of `library` whose prompt block (as the API serves it) the system instructions contain,
    or None when none does or several different versions would (never a guess): of several whose blocks are
    found, the longest block wins when it is one version's alone. Only the whole library's block is recognised:
    a top_k selection's block differs per query."""
    cache = {} if cache is None else cache
    if ("blocks", library.id) not in cache:
        versions = session.exec(select(LibraryVersion).where(LibraryVersion.library_id == library.id)
                                .order_by(col(LibraryVersion.number).desc()).limit(RECOGNISED_VERSIONS))
        cache[("blocks", library.id)] = [(_normal(block), version) for version in versions
                                         if (block := export_version(version.experiences or [], "prompt", task=task))]
    text = _normal(system)
    matches = [(len(block), version) for block, version in cache[("blocks", library.id)] if block in text]
    if not matches:
        return None
    longest = max(length for length, _ in matches)
    best = [version for length, version in matches if length == longest]
    return best[0] if len(best) == 1 else None




def _row(span: SpanTrace, task: Task, library: Library, version: LibraryVersion | None, how: str,
         key_id: int | None, received: datetime, resource_hash: str | None) -> dict:
    """The trace's row as column values, for one INSERT of the whole request (an ORM object per span costs
    more than the database does at 1,000 spans)."""
    otlp = {"trace_id": span.trace_id, "span_id": span.span_id, "name": span.name, "scope": span.scope,
            "scope_version": span.scope_version, "service": span.service, "model": span.model,
            "provider": span.provider, "input_tokens": span.input_tokens, "output_tokens": span.output_tokens,
            "latency_ms": span.latency_ms, "conversation_id": span.conversation_id, "version_from": how,
            "attributes": span.attributes, "resource_hash": resource_hash}
    row = {"task_id": task.id, "client_id": span.client_id, "library_id": library.id,
           "version_id": version.id if version is not None else None,
           "served_label": span.label if how == "attribute" else None, "input": span.input, "output": span.output,
           "turns": span.turns, "score": span.score, "thumbs": THUMBS.get(span.thumbs or ""),
           "comment": span.comment, "segment": span.segment, "user_id": span.user_id,
           "meta": {"source": "otlp", "otlp": otlp}, "api_key_id": key_id,
           "created_at": span.end, "received_at": received, "label_status": None, "label_value": None,
           "labelled_by": None, "sample_id": None}
    row["label_status"] = label_status(task.production_rules, SimpleNamespace(**row))  # the client's traces' rule
    return row


def _count(session: Session, name: str, count: int, now: float) -> None:
    changed = session.exec(update(ApiCounter).where(ApiCounter.name == name)
                           .values(value=ApiCounter.value + count, updated_at=now)).rowcount
    if changed != 1:
        session.add(ApiCounter(name=name, value=float(count), updated_at=now))


# --- the Production page: where traces come from, services to tasks -----------------------------------


def span_detail(session: Session, trace: Trace) -> dict | None:
    """An OTLP trace's span as received (ids, scope, model, tokens, attributes) with its resource read back
    from where it is stored once; None for a trace the client sent."""
    otlp = (trace.meta or {}).get("otlp")
    if not isinstance(otlp, dict):
        return None
    if "resource_hash" in otlp:
        otlp = {**otlp, "resource": otlp_held.resource_of(session, otlp["resource_hash"])}
    return otlp


def other_spans(session: Session) -> int:
    """Spans received that held no model call (an HTTP client's span, a tool's): counted, not stored."""
    row = session.get(ApiCounter, OTHER)
    return int(row.value) if row is not None else 0


def service_map(session: Session) -> list[dict]:
    """The services mapped to tasks: service, task, library."""
    tasks = {task.id: task.name for task in session.exec(select(Task))}
    return [{"service": row.service_name, "task": tasks.get(row.task_id, "?"), "library": row.library}
            for row in session.exec(select(OtlpService).order_by(OtlpService.service_name))]


@dataclass(frozen=True)
class Mapped:
    """What mapping a service did to the spans held for it: landed as traces, already stored, refused."""

    landed: int
    duplicates: int
    refused: list[str]

    def words(self, service: str, task_name: str) -> str:
        text = f"Spans of {service!r} now go to {task_name!r}; {self.landed} held span(s) landed there"
        if self.duplicates:
            text += f", {self.duplicates} were stored already"
        if self.refused:
            text += f"; {len(self.refused)} could not be placed and were dropped ({self.refused[0]})"
        return text + "."


def map_service(engine: Engine, service: str, task_name: str, library: str, actor: str) -> Mapped:
    """Store spans of `service` (its resource's service.name) under a task's library from now on, and land the
    spans held for it there in the same transaction; an admin's decision, audited. A held span that cannot be
    placed (it names a version the library lacks) is dropped and said."""
    service = service.strip()
    if not service or len(service) > 250:
        raise InvalidInput("a service name is 1 to 250 characters (its resource's service.name)")
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "mapping an OpenTelemetry service to a task")
        task = get_task(session, task_name)
        get_library(session, task, library)
        row = session.get(OtlpService, service)
        before = None if row is None else {"task_id": row.task_id, "library": row.library}
        row = row or OtlpService(service_name=service, task_id=task.id, created_by=actor)
        row.task_id, row.library = task.id, library
        session.add(row)
        session.flush()
        mapped = _land_held(session, service, {service: row})
        session.add(AuditEvent(actor=actor, action="otlp.map_service", object_type="task", object_id=task.id,
                               before=before, after={"service": service, "library": library,
                                                     "landed": mapped.landed, "refused": len(mapped.refused)}))
        return mapped


def _land_held(session: Session, service: str, services: dict[str, OtlpService]) -> Mapped:
    held = otlp_held.take_held(session, service)
    placed, refused, cache = [], [], {}
    for row, span in held:
        try:
            placed.append((row, span, *_place(session, span, services, cache)))
        except (NotFound, InvalidInput) as exc:
            refused.append(f"span {span.span_id}: {exc}")
    new, duplicates = unstored(session, ((task.id, span.client_id, (held_row, span, task, library, version, how))
                                         for held_row, span, task, library, version, how in placed))
    rows = [_row(span, task, library, version, how, held_row.api_key_id, held_row.received_at,
                 held_row.span.get("resource_hash")) for held_row, span, task, library, version, how in new]
    if rows:
        session.execute(insert(Trace), stamp_rows(session, rows))
    if held:
        session.exec(delete(OtlpHeldSpan).where(col(OtlpHeldSpan.id).in_([row.id for row, _ in held])))
    return Mapped(len(rows), duplicates, refused)
