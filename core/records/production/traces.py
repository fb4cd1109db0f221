"""Production traces: what live agents send back through the API, how they are watched, and how the
failures among them become training data again.

A batch is checked whole before anything is written: one trace naming another task's version, a label
the library does not have, or a score outside [0, 1] refuses the batch with the trace's position and id,
and nothing is stored. A trace's `id` is the sender's; a task keeps each id once, so a retry is harmless.

A trace's score, for every statistic here, is a person's label when it has one, else the score the agent
sent, else its thumbs (up 1, down 0), else the task's judge's sure verdict (core/records/production/scoring.py);
a trace with none of them is unscored.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from core.domain.datasets import SampleRow
from core.errors import (
    BatchRefused,
    InvalidInput,
    NotFound,
    describe_errors,
    describe_validation,
)
from core.records.keys.api_keys import KeyUse, key_scope
from core.records.people.roles import require_role
from core.records.production.ab_experiments import Stamps, stamp
from core.records.production.ingest import Ingested, IngestLimits, charge_request, retried, unstored
from core.records.production.rules import check_rules, label_status
from core.records.production.scores import score_column, score_source, thumbs_word, trace_score
from core.records.production.scoring import require_scorable, with_start
from core.records.production.serving import served_version
from core.records.tasks.lookup import get_task
from core.records.tasks.samples import add_samples
from storage import queries
from storage.db import session_scope
from storage.statuses import LabelStatus
from storage.tables import AuditEvent, Library, LibraryVersion, Sample, Task, Trace, as_utc

MAX_BATCH = 100
MAX_TEXT = 100_000
THUMBS = {"up": 1, "down": -1}
OTEL_TRACE_ID = re.compile(r"[0-9a-fA-F]{32}")  # a trace sent over OTLP is stored as `<trace id>:<span id>`


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str = Field(pattern="^(user|agent)$")
    text: str = Field(max_length=MAX_TEXT)


class TraceIn(BaseModel):
    """One trace as an agent posts it (the API's request body item, with its constraints)."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=128, description="the sender's id; posting it again stores nothing")
    task: str = Field(min_length=1, max_length=200)
    library: str = Field(default="default", min_length=1, max_length=200)
    version_id: int | None = Field(default=None, description="the version that served this interaction")
    label: str | None = Field(default=None, max_length=100, description="or the label the agent fetched by")
    input: str = Field(min_length=1, max_length=MAX_TEXT)
    output: str | None = Field(default=None, max_length=MAX_TEXT)
    turns: list[Turn] | None = Field(default=None, max_length=200)
    score: float | None = Field(default=None, ge=0.0, le=1.0)
    thumbs: str | None = Field(default=None, pattern="^(up|down)$")
    comment: str | None = Field(default=None, max_length=5000)
    segment: str | None = Field(default=None, max_length=100)
    user_id: str | None = Field(default=None, max_length=200)
    metadata: dict = Field(default_factory=dict)
    created_at: datetime | None = None

    @model_validator(mode="after")
    def _names_a_version(self) -> TraceIn:
        if self.version_id is None and not self.label:
            raise ValueError("give version_id or label: the version that served this trace")
        return self


class TraceUpdate(BaseModel):
    """Feedback that arrives after its trace (a thumbs-down a minute later): the fields given replace the
    stored ones (null clears one); the fields left out stay."""

    model_config = ConfigDict(extra="forbid")
    task: str = Field(min_length=1, max_length=200)
    score: float | None = Field(default=None, ge=0.0, le=1.0)
    thumbs: str | None = Field(default=None, pattern="^(up|down)$")
    comment: str | None = Field(default=None, max_length=5000)

    def changes(self) -> dict:
        """The stored fields this update sets, as stored (thumbs as 1 or -1)."""
        given = self.model_dump(exclude_unset=True, exclude={"task"})
        if "thumbs" in given:
            given["thumbs"] = THUMBS.get(given["thumbs"] or "")
        return given


class TraceBatch(BaseModel):
    traces: list[TraceIn] = Field(min_length=1, max_length=MAX_BATCH)


def parse_batch(payload: object) -> list[TraceIn]:
    """A request body as traces, or InvalidInput naming the first problem (a batch over MAX_BATCH too)."""
    if isinstance(payload, dict) and isinstance(payload.get("traces"), list) and len(payload["traces"]) > MAX_BATCH:
        raise InvalidInput(f"a batch holds at most {MAX_BATCH} traces; this one has {len(payload['traces'])}")
    try:
        return TraceBatch.model_validate(payload).traces
    except ValidationError as exc:
        by_trace: dict[int, list[dict]] = defaultdict(list)
        for error in exc.errors():
            loc = error.get("loc", ())
            if len(loc) >= 2 and loc[0] == "traces" and isinstance(loc[1], int):
                by_trace[loc[1]].append({**error, "loc": loc[2:]})
            else:  # the body as a whole (no "traces" list): no trace to name
                raise InvalidInput(describe_validation(exc)) from None
        items = payload["traces"]
        raise BatchRefused([{"position": index + 1, "id": _sender_id(items[index]), "reason": describe_errors(errors)}
                            for index, errors in sorted(by_trace.items())]) from None


def _sender_id(item: object) -> str | None:
    value = item.get("id") if isinstance(item, dict) else None
    return value if isinstance(value, str) else None


def ingest_traces(engine: Engine, traces: list[TraceIn], key: KeyUse | None = None) -> Ingested:
    """Store a batch of traces (Ingested). All are resolved first; one that cannot be refuses the whole batch
    with InvalidInput naming it, and nothing is written. Two posts of the same id at once (a client retrying while
    its first post is still in flight) meet at the unique key: the loser's transaction runs again and finds the id
    stored (core.records.production.ingest.retried)."""
    return retried(lambda: _ingest(engine, traces, key))


def _ingest(engine: Engine, traces: list[TraceIn], key: KeyUse | None) -> Ingested:
    with session_scope(engine) as session:
        resolved, problems = [], []
        cache: dict[tuple, tuple[Task, Library, LibraryVersion, str | None]] = {}
        for position, trace in enumerate(traces, start=1):
            try:
                where = (trace.task, trace.library, trace.version_id, trace.label)
                if where not in cache:
                    cache[where] = _resolve(session, trace, key)
                resolved.append((trace, *cache[where]))
            except (NotFound, InvalidInput) as exc:
                problems.append({"position": position, "id": trace.id, "reason": str(exc)})
        if problems:
            raise BatchRefused(problems)
        new, duplicates = unstored(session, ((task.id, trace.id, (trace, task, library, version, label))
                                             for trace, task, library, version, label in resolved))
        result, stamps, size = Ingested(duplicates=duplicates), Stamps.new(), 0
        for trace, task, library, version, label in new:
            row = stamp(session, _row(trace, task, library, version, label, key), stamps)
            session.add(row)
            if row.ab_experiment_id is not None and row.ab_excluded:
                result.outside_experiment.append({"id": trace.id, "reason": row.ab_excluded})
            result.stored += 1
            size += len(trace.model_dump_json())
        charge_request(session, size, key, IngestLimits.configured())  # the OTLP route's allowance too
        return result


def _resolve(session: Session, trace: TraceIn,
             key: KeyUse | None = None) -> tuple[Task, Library, LibraryVersion, str | None]:
    """The trace's task, library and version as a library fetch finds them (a bound key's task and library,
    core.records.keys.api_keys.key_scope); the label it named is kept."""
    task_name, library_name = key_scope(session, key, trace.task,
                                        trace.library if "library" in trace.model_fields_set else None)
    found = served_version(session, task_name, library_name or "default", version_id=trace.version_id,
                           label=trace.label if trace.version_id is None else None)
    return found.task, found.library, found.version, trace.label




def _row(trace: TraceIn, task: Task, library: Library, version: LibraryVersion, label: str | None,
         key: KeyUse | None) -> Trace:
    row = Trace(task_id=task.id, client_id=trace.id, library_id=library.id, version_id=version.id, served_label=label,
                input=trace.input, output=trace.output,
                turns=[turn.model_dump() for turn in trace.turns] if trace.turns is not None else None,
                score=trace.score, thumbs=THUMBS.get(trace.thumbs or ""), comment=trace.comment,
                segment=trace.segment, user_id=trace.user_id, meta=trace.metadata,
                api_key_id=key.id if key is not None else None)
    if trace.created_at is not None:
        row.created_at = trace.created_at if trace.created_at.tzinfo else trace.created_at.replace(tzinfo=UTC)
    row.label_status = label_status(task.production_rules, row)
    return row


def update_trace(engine: Engine, client_id: str, update: TraceUpdate, key: KeyUse | None = None) -> bool:
    """Add or change a stored trace's score, thumbs or comment, by the sender's id; True when something
    changed. Idempotent: the same update again changes nothing and writes nothing. A change is audited,
    and the task's labelling rules are applied again (a trace now scored under `below` goes to people);
    harvest reads the score as it is when it runs. An OpenTelemetry trace id (32 hex digits) that is no sender's
    id updates every span stored of that trace (core/records/production/otlp.py)."""
    changes = update.changes()
    with session_scope(engine) as session:
        task = get_task(session, key_scope(session, key, update.task, None)[0])
        found = list(session.exec(select(Trace).where(Trace.task_id == task.id, Trace.client_id == client_id)))
        if not found and OTEL_TRACE_ID.fullmatch(client_id):  # an OTel trace id: every span stored of that trace
            found = list(session.exec(select(Trace).where(Trace.task_id == task.id,
                                                          Trace.client_id.startswith(f"{client_id.lower()}:"))))
        if not found:
            raise NotFound(f"task {task.name!r} has no trace {client_id!r} (post it before updating it)")
        changed = False
        for trace in found:
            before = {name: getattr(trace, name) for name in changes}
            if before == changes:
                continue
            for name, value in changes.items():
                setattr(trace, name, value)
            if trace.label_status != LabelStatus.DONE:
                trace.label_status = label_status(task.production_rules, trace)
            session.add(trace)
            session.add(AuditEvent(actor=f"(api key {key.name})" if key is not None else "system",
                                   action="trace.update", object_type="trace", object_id=trace.id, before=before,
                                   after=changes))
            changed = True
        return changed


# --- the task's rules: which traces go to people ------------------------------------------------------






def set_rules(engine: Engine, task_name: str, rules: dict, actor: str) -> dict:
    """Change which production traces go to people (an admin's decision); later traces follow them."""
    rules = check_rules(rules)
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "changing a task's production rules")
        task = get_task(session, task_name)
        rules = with_start(task.production_rules or {}, rules)
        require_scorable(task, rules)
        before, task.production_rules = task.production_rules, rules
        session.add(task)
        session.add(AuditEvent(actor=actor, action="task.production_rules", object_type="task", object_id=task.id,
                               before=before, after=rules))
    return rules


def label_trace(engine: Engine, trace_id: int, value: float, actor: str) -> None:
    """A person's score for a production trace; it counts as the trace's score from now on."""
    if not 0 <= value <= 1:
        raise InvalidInput("a label is a score from 0 to 1")
    with session_scope(engine) as session:
        require_role(session, actor, "labeler", "labelling production traces")
        trace = session.get(Trace, trace_id)
        if trace is None:
            raise NotFound(f"there is no trace {trace_id}")
        trace.label_value, trace.labelled_by, trace.label_status = value, actor, LabelStatus.DONE
        session.add(trace)
        session.add(AuditEvent(actor=actor, action="trace.label", object_type="trace", object_id=trace_id,
                               after={"value": value}))


# --- watching production ---------------------------------------------------------------------------








def trace_output(trace: Trace) -> str:
    """What the agent answered: its output, else the conversation as `role: text` lines."""
    return trace.output or "\n".join(f"{turn['role']}: {turn['text']}" for turn in trace.turns or [])


@dataclass(frozen=True)
class TraceFilter:
    """Which of a task's traces a reader wants, as the Production page's filters and `harvest` give them:
    `sender_id` and `user_id` match exactly, `thumbs` is up, down or none, `comment` is a piece of the comment
    (any case), `max_score` compares the score that counts (core.records.production.scores)."""

    version_id: int | None = None
    segment: str | None = None
    since: datetime | None = None
    max_score: float | None = None
    labelled_only: bool = False
    sender_id: str | None = None
    user_id: str | None = None
    thumbs: str | None = None
    comment: str | None = None

    def where(self, task_id: int) -> list:
        """The filter as SQL conditions on Trace, every one in the database (nothing is filtered after loading)."""
        found = [Trace.task_id == task_id]
        if self.version_id is not None:
            found.append(Trace.version_id == self.version_id)
        if self.segment:
            found.append(Trace.segment == self.segment)
        if self.sender_id:
            found.append(Trace.client_id == self.sender_id.strip())
        if self.user_id:
            found.append(Trace.user_id == self.user_id.strip())
        if self.thumbs:
            found.append(Trace.thumbs.is_(None) if self.thumbs == "none" else Trace.thumbs == THUMBS[self.thumbs])
        if self.comment:
            found.append(func.lower(Trace.comment).contains(self.comment.strip().lower()))
        if self.since is not None:
            found.append(Trace.created_at >= self.since)
        if self.labelled_only:
            found.append(Trace.label_value.is_not(None))
        if self.max_score is not None:
            found.append(score_column() <= self.max_score)
        return found


def task_traces(session: Session, task_name: str, *, limit: int | None = None, offset: int = 0,
                **filters) -> list[Trace]:
    """A task's traces, newest first, filtered as TraceFilter says (its fields are the keywords), at most
    `limit` of them after `offset`, both applied by the database."""
    task = get_task(session, task_name)
    query = (select(Trace).where(*TraceFilter(**filters).where(task.id))
             .order_by(Trace.created_at.desc(), Trace.id.desc()).offset(offset))
    return list(session.exec(query.limit(limit) if limit is not None else query))


def any_trace(session: Session, task_id: int) -> bool:
    """Whether the task has any production trace (of a known version or not)."""
    return session.exec(select(Trace.id).where(Trace.task_id == task_id).limit(1)).first() is not None


def find_trace(session: Session, task_name: str, sender_id: str) -> Trace | None:
    """A task's trace by the id its sender gave it (what an engineer has in their own logs)."""
    task = get_task(session, task_name)
    return session.exec(select(Trace).where(Trace.task_id == task.id, Trace.client_id == sender_id)).first()




def trace_rows(traces: list[Trace], numbers: dict[int, int]) -> list[dict]:
    """One row per trace as the Production page lists them: what the sender gave (its id, user, segment,
    thumbs, score, comment, time) beside the version, the score that counts and the labelling status."""
    return [{"sender id": t.client_id, "time": as_utc(t.created_at).strftime("%Y-%m-%d %H:%M:%S"),
             "user": t.user_id, "segment": t.segment, "thumbs": thumbs_word(t), "sent score": t.score,
             "score": trace_score(t), "score by": score_source(t), "comment": t.comment,
             "version": version_name(t.version_id, numbers),
             "source": source_of(t), "label": t.label_status} for t in traces]


def version_name(version_id: int | None, numbers: dict[int, int]) -> str:
    """A trace's version as a person reads it: "#12", or "unknown version" (an OTLP span that named none)."""
    return "unknown version" if version_id is None else f"#{numbers.get(version_id, '?')}"


def source_of(trace: Trace) -> str:
    """Where a trace came from: "client", or "OTLP · <instrumentation scope>"."""
    otlp = (trace.meta or {}).get("otlp")
    return f"OTLP · {otlp.get('scope') or '(no scope)'}" if isinstance(otlp, dict) else "client"




# --- failures back into training -------------------------------------------------------------------


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def harvest(engine: Engine, task_name: str, actor: str, **filters) -> tuple[int, int]:
    """The traces TraceFilter(**filters) selects (the Production page's filters, all of them; the command line's
    --since, --max-score, --labelled-only) become train samples: (added, skipped as already present). A trace whose
    input a
    sample already has (ignoring case and spacing) is skipped; each new sample keeps its source trace id,
    and the trace points at its sample. A person's reference answer is not known, so the sample has none:
    judge or human rewards, or the no-ground-truth mode, score it."""
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "adding production traces to a task's data")
        task = get_task(session, task_name)
        chosen = [t for t in task_traces(session, task_name, **filters) if t.sample_id is None]
        existing = queries.samples(session, task.id)
        known = {_normal(s.query) for s in existing}
        names = {s.external_id for s in existing}
        rows, skipped = [], 0
        for trace in sorted(chosen, key=lambda t: t.id):
            if _normal(trace.input) in known:
                skipped += 1
                continue
            known.add(_normal(trace.input))
            name = f"trace-{trace.client_id}"  # the sender's id, as the Production page opens the trace by
            name = name if name not in names else f"{name}-{trace.id}"
            names.add(name)
            rows.append((trace, SampleRow(external_id=name, query=trace.input, reference=None,
                                          rubric=None, split="train",
                                          meta={"source_trace": trace.id, "trace_client_id": trace.client_id,
                                                "trace_score": trace_score(trace), "segment": trace.segment})))
        added = add_samples(session, task, [row for _, row in rows])
        session.flush()
        by_external = {s.external_id: s.id for s in session.exec(
            select(Sample).where(Sample.task_id == task.id, Sample.external_id.in_([r.external_id for _, r in rows])))}
        for trace, row in rows:
            trace.sample_id = by_external.get(row.external_id)
            session.add(trace)
        given = {name: value.isoformat() if isinstance(value, datetime) else value
                 for name, value in filters.items() if value not in (None, False, "")}
        session.add(AuditEvent(actor=actor, action="task.harvest", object_type="task", object_id=task.id,
                               after={"added": added, "skipped": skipped, "filters": given}))
        return added, skipped


def trace_scores(engine: Engine, task_name: str, sender_id: str, key: KeyUse | None = None) -> dict:
    """A trace's score and whose it is, by the sender's id (GET /v1/traces/{id}): what the user sent, a person's
    label, and the judge's verdict with its status, so an agent's side sees which score counts. A key bound to a
    task reads only that task's traces, as it writes only there (core.records.keys.api_keys.key_scope)."""
    with Session(engine) as session:
        task_name = key_scope(session, key, task_name, None, doing="reads")[0]
        get_task(session, task_name, name_others=False)
        trace = find_trace(session, task_name, sender_id)
        if trace is None:
            raise NotFound(f"task {task_name!r} has no trace {sender_id!r}")
        return {"id": trace.client_id, "score": trace_score(trace), "score_by": score_source(trace),
                "sent": {"score": trace.score, "thumbs": thumbs_word(trace), "comment": trace.comment},
                "label": trace.label_value,
                "judge": {"status": trace.judge_status, "score": trace.judge_score, "reason": trace.judge_detail},
                "label_status": trace.label_status}
