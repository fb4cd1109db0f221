"""OTLP spans stored as production traces, beside the client's: the same Trace rows, so labelling, harvest and
the A/B split read them through core/records/traces.py exactly as they read the client's.

Which task a span belongs to: its `tfgrpo.task` attribute (on the span or its resource), else its resource's
`service.name` as mapped on the Production page (`map_service`). A span that maps to no task is refused in the
answer's partial success and counted per service (`unmapped_services`), never dropped unseen. Which version
served it: `tfgrpo.version_id` (the id the API served) or `tfgrpo.version` (its number) or `tfgrpo.label`,
else the one version of the library whose prompt block its system instructions contain, else none: stored
and shown as "unknown version", never guessed. A request's accepted spans are written in one transaction.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace

from sqlalchemy import insert, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from core.domain.otlp_spans import Decoded, SpanTrace
from core.errors import InvalidInput, NotFound
from core.records.api_keys import KeyUse
from core.records.people import require_role
from core.records.tasks import get_task
from core.records.traces import THUMBS, needs_label
from core.records.versions import export_version
from storage import queries
from storage.db import session_scope
from storage.statuses import LabelStatus
from storage.tables import ApiCounter, AuditEvent, Library, LibraryVersion, OtlpService, Task, Trace

UNMAPPED = "otlp:unmapped:"  # ApiCounter name prefix: spans of a service that maps to no task
OTHER = "otlp:other"  # ApiCounter: spans that held no model call (not traces)
RECOGNISED_VERSIONS = 200  # the newest versions of a library whose blocks a system prompt is compared with
NO_SERVICE = "(no service.name)"


@dataclass
class Ingested:
    """What a request's spans became: stored traces, retries already stored, refused spans
    ({position, span_id, reason}) and spans with no model call."""

    stored: int = 0
    duplicates: int = 0
    refused: list[dict] = field(default_factory=list)
    other: int = 0

    def message(self) -> str:
        """The partial success's message: every refused span's reason (the first few), and the other spans."""
        parts = [f"span {p['position']}" + (f" ({p['span_id']})" if p.get("span_id") else "") + f": {p['reason']}"
                 for p in self.refused[:5]]
        if len(self.refused) > 5:
            parts.append(f"and {len(self.refused) - 5} more refused")
        if self.other:
            parts.append(f"{self.other} span(s) held no model call with a user message and were not stored")
        return "; ".join(parts)


def ingest_spans(engine: Engine, decoded: Decoded, key: KeyUse | None = None) -> Ingested:
    """Store the decoded spans' traces (see the module's note); a span that cannot be placed is refused, the
    rest are written together. A concurrent retry of the same spans meets the unique key and is tried again."""
    try:
        return _ingest(engine, decoded, key)
    except IntegrityError:
        return _ingest(engine, decoded, key)


def _ingest(engine: Engine, decoded: Decoded, key: KeyUse | None) -> Ingested:
    result = Ingested(refused=list(decoded.refused), other=decoded.other)
    with session_scope(engine) as session:
        services = {row.service_name: row for row in session.exec(select(OtlpService))}
        unmapped: dict[str, int] = {}
        placed = []
        places: dict = {}
        for span in decoded.traces:
            try:
                task, library, version, how = _place(session, span, services, places)
            except _Unmapped as exc:
                unmapped[exc.service] = unmapped.get(exc.service, 0) + 1
                result.refused.append({"position": span.position, "span_id": span.span_id, "reason": str(exc)})
                continue
            except (NotFound, InvalidInput) as exc:
                result.refused.append({"position": span.position, "span_id": span.span_id, "reason": str(exc)})
                continue
            placed.append((span, task, library, version, how))
        known = _known(session, placed)
        rows, received = [], datetime.now(UTC)
        for span, task, library, version, how in placed:
            if (task.id, span.client_id) in known:
                result.duplicates += 1
                continue
            known.add((task.id, span.client_id))
            rows.append(_row(span, task, library, version, how, key, received))
        if rows:
            session.execute(insert(Trace), rows)
        result.stored = len(rows)
        now = time.time()
        for service, count in unmapped.items():
            _count(session, UNMAPPED + service[:250], count, now)
        if decoded.other:
            _count(session, OTHER, decoded.other, now)
    result.refused.sort(key=lambda problem: problem["position"])
    return result


class _Unmapped(InvalidInput):
    def __init__(self, service: str) -> None:
        self.service = service
        super().__init__(f"it names no task (tfgrpo.task) and service {service!r} is not mapped to one; map it on "
                         "the Production page")


def _place(session: Session, span: SpanTrace, services: dict[str, OtlpService],
           cache: dict) -> tuple[Task, Library, LibraryVersion | None, str]:
    """The span's task, library and version, and how the version was known (attribute, system instructions,
    unknown). Spans that name the same place are resolved once per request."""
    where = (span.task, None if span.task else span.service, span.library, span.version_id, span.version_number,
             span.label)
    if where not in cache:
        try:
            cache[where] = _named_place(session, span, services)
        except (NotFound, InvalidInput) as exc:
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


def _named_place(session: Session, span: SpanTrace,
                 services: dict[str, OtlpService]) -> tuple[Task, Library, LibraryVersion | None]:
    mapped = services.get(span.service or "")
    if span.task:
        task = get_task(session, span.task)
        library_name = span.library or (mapped.library if mapped and mapped.task_id == task.id else "default")
    elif mapped is not None:
        task = session.get(Task, mapped.task_id)
        library_name = span.library or mapped.library
    else:
        raise _Unmapped(span.service or NO_SERVICE)
    library = queries.library_by_name(session, task.id, library_name)
    if library is None:
        raise NotFound(f"task {task.name!r} has no library {library_name!r}")
    if span.version_id is not None:
        version = session.get(LibraryVersion, span.version_id)
        if version is None or version.library_id != library.id:
            raise NotFound(f"library {library.name!r} of task {task.name!r} has no version id {span.version_id}")
        return task, library, version
    if span.version_number is not None:
        version = session.exec(select(LibraryVersion).where(LibraryVersion.library_id == library.id,
                                                            LibraryVersion.number == span.version_number)).first()
        if version is None:
            raise NotFound(f"library {library.name!r} of task {task.name!r} has no version #{span.version_number}")
        return task, library, version
    if span.label:
        found = queries.label_by_name(session, library.id, span.label)
        if found is None:
            raise NotFound(f"library {library.name!r} of task {task.name!r} has no label {span.label!r}")
        return task, library, session.get(LibraryVersion, found.version_id)
    return task, library, None


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


def _known(session: Session, placed: list) -> set[tuple[int, str]]:
    by_task: dict[int, set[str]] = {}
    for span, task, *_ in placed:
        by_task.setdefault(task.id, set()).add(span.client_id)
    known = set()
    for task_id, ids in by_task.items():
        rows = session.exec(select(Trace.client_id).where(Trace.task_id == task_id, col(Trace.client_id).in_(ids)))
        known |= {(task_id, client_id) for client_id in rows}
    return known


def _row(span: SpanTrace, task: Task, library: Library, version: LibraryVersion | None, how: str,
         key: KeyUse | None, received: datetime) -> dict:
    """The trace's row as column values, for one INSERT of the whole request (an ORM object per span costs
    more than the database does at 1,000 spans)."""
    otlp = {"trace_id": span.trace_id, "span_id": span.span_id, "name": span.name, "scope": span.scope,
            "scope_version": span.scope_version, "service": span.service, "model": span.model,
            "provider": span.provider, "input_tokens": span.input_tokens, "output_tokens": span.output_tokens,
            "latency_ms": span.latency_ms, "conversation_id": span.conversation_id, "version_from": how,
            "attributes": span.attributes, "resource": span.resource}
    row = {"task_id": task.id, "client_id": span.client_id, "library_id": library.id,
           "version_id": version.id if version is not None else None,
           "served_label": span.label if how == "attribute" else None, "input": span.input, "output": span.output,
           "turns": span.turns, "score": span.score, "thumbs": THUMBS.get(span.thumbs or ""),
           "comment": span.comment, "segment": span.segment, "user_id": span.user_id,
           "meta": {"source": "otlp", "otlp": otlp}, "api_key_id": key.id if key is not None else None,
           "created_at": span.end, "received_at": received, "label_status": None, "label_value": None,
           "labelled_by": None, "sample_id": None}
    # the same rule the client's traces meet (traces.needs_label reads score, thumbs and the sender's id)
    if needs_label(task.production_rules or {}, SimpleNamespace(**row)):
        row["label_status"] = LabelStatus.NEEDED
    return row


def _count(session: Session, name: str, count: int, now: float) -> None:
    changed = session.exec(update(ApiCounter).where(ApiCounter.name == name)
                           .values(value=ApiCounter.value + count, updated_at=now)).rowcount
    if changed != 1:
        session.add(ApiCounter(name=name, value=float(count), updated_at=now))


# --- the Production page: where traces come from, services to tasks -----------------------------------


def unmapped_services(session: Session) -> list[dict]:
    """Services whose spans named no task since they were last mapped, with the count refused, most first."""
    rows = session.exec(select(ApiCounter).where(col(ApiCounter.name).startswith(UNMAPPED)))
    return sorted(({"service": row.name[len(UNMAPPED):], "refused spans": int(row.value)} for row in rows),
                  key=lambda row: (-row["refused spans"], row["service"]))


def other_spans(session: Session) -> int:
    """Spans received that held no model call (an HTTP client's span, a tool's): counted, not stored."""
    row = session.get(ApiCounter, OTHER)
    return int(row.value) if row is not None else 0


def service_map(session: Session) -> list[dict]:
    """The services mapped to tasks: service, task, library."""
    tasks = {task.id: task.name for task in session.exec(select(Task))}
    return [{"service": row.service_name, "task": tasks.get(row.task_id, "?"), "library": row.library}
            for row in session.exec(select(OtlpService).order_by(OtlpService.service_name))]


def map_service(engine: Engine, service: str, task_name: str, library: str, actor: str) -> None:
    """Store spans of `service` (its resource's service.name) under a task's library from now on; an admin's
    decision, audited. Its count of refused spans is cleared (they were refused; a retry of them is stored)."""
    service = service.strip()
    if not service or len(service) > 250:
        raise InvalidInput("a service name is 1 to 250 characters (its resource's service.name)")
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "mapping an OpenTelemetry service to a task")
        task = get_task(session, task_name)
        if queries.library_by_name(session, task.id, library) is None:
            raise NotFound(f"task {task.name!r} has no library {library!r}")
        row = session.get(OtlpService, service)
        before = None if row is None else {"task_id": row.task_id, "library": row.library}
        row = row or OtlpService(service_name=service, task_id=task.id, created_by=actor)
        row.task_id, row.library = task.id, library
        session.add(row)
        counter = session.get(ApiCounter, UNMAPPED + service)
        if counter is not None:
            session.delete(counter)
        session.add(AuditEvent(actor=actor, action="otlp.map_service", object_type="task", object_id=task.id,
                               before=before, after={"service": service, "library": library}))
