"""Results by kind of user, and a library per kind of user.

A conversation task's personas carry a segment (`resistant`, `at_risk`, ...). An evaluation's scores are
broken down per persona, per segment and per rubric criterion; two evaluations are compared per segment
with the same paired statistics as overall (a library that helps the verbose users and hurts the at-risk
ones must show it). A library may be bound to a segment; a segment-routed evaluation plays each scenario
with the library of its persona's segment and falls back to the default library, so "one library for all"
and "a library per segment" are compared on the same queries.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from statistics import mean

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from core.domain.metrics import is_answered, score_groups
from core.domain.personas import SEGMENT_PATTERN
from core.errors import InvalidInput, NotFound
from core.records.evaluation.comparison import Paired, paired
from core.records.library.versions import export_version
from core.records.tasks.lookup import ensure_library, get_task
from core.records.tasks.scenarios import is_conversation, persona_name, personas_by_name, segment_of
from storage import queries
from storage.db import session_scope
from storage.tables import (
    AuditEvent,
    Evaluation,
    Library,
    LibraryLabel,
    LibraryVersion,
    Rollout,
    Sample,
    Task,
)

UNKNOWN = "(no persona)"


def breakdown(session: Session, task: Task, rollouts: list[Rollout], samples: dict[int, Sample]) -> dict:
    """Per segment and per persona: n queries, Mean@k with its interval, Pass@k over the answered rollouts, and
    how many were left unscored (a failed call or a reward that could not be given is no wrong answer: it
    is counted apart, never as 0.0, as everywhere else, core.domain.metrics.is_answered); per criterion: the
    mean score in [0, 1] over the rollouts the judge scored. Empty for a task that is not a conversation task."""
    if not is_conversation(task):
        return {}
    personas = personas_by_name(session, task)
    by_segment: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    by_persona: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    unscored: dict[str, int] = defaultdict(int)  # rollouts without a reward to count, by segment
    unscored_persona: dict[str, int] = defaultdict(int)
    criteria: dict[str, list[float]] = defaultdict(list)
    persona_segment: dict[str, str] = {}
    for rollout in rollouts:
        sample = samples.get(rollout.sample_id)
        if sample is None:
            continue
        segment = segment_of(sample, personas) or UNKNOWN
        persona = persona_name(sample) or UNKNOWN
        persona_segment[persona] = segment
        if not is_answered(rollout):
            unscored[segment] += 1
            unscored_persona[persona] += 1
            continue
        by_segment[segment][sample.id].append(float(rollout.reward))
        by_persona[persona][sample.id].append(float(rollout.reward))
        for name, value in ((rollout.scores or {}).get("criteria") or {}).items():
            criteria[name].append(float(value))
    return {
        "segments": {segment: {**_summary(by_segment.get(segment, {})), "unscored": unscored.get(segment, 0)}
                     for segment in sorted(set(by_segment) | set(unscored))},
        "personas": {persona: {"segment": persona_segment[persona], **_summary(by_persona.get(persona, {})),
                               "unscored": unscored_persona.get(persona, 0)}
                     for persona in sorted(set(by_persona) | set(unscored_persona))},
        "criteria": {name: {"mean": mean(values), "n": len(values)} for name, values in sorted(criteria.items())},
    }


def _summary(groups: dict[int, list[float]]) -> dict:
    scored = score_groups(dict(groups))
    return {key: scored[key] for key in ("n", "mean_at_k", "mean_at_k_ci", "pass_at_k")}


def paired_by_segment(engine: Engine, a_id: int, b_id: int, *, seed: int = 0) -> dict[str, Paired]:
    """B - A per segment on the queries both evaluated (the paired statistics of core.records.evaluation.comparison)."""
    with Session(engine) as session:
        a, b = session.get(Evaluation, a_id), session.get(Evaluation, b_id)
        if a is None or b is None:
            raise NotFound(f"no evaluation {a_id if a is None else b_id}")
        task = session.get(Task, a.task_id)
        if not is_conversation(task):
            return {}
        personas = personas_by_name(session, task)
        rewards_a = queries.evaluation_rewards(session, a_id)
        rewards_b = queries.evaluation_rewards(session, b_id)
        samples = queries.samples_by_ids(session, sorted(set(rewards_a) | set(rewards_b)))
    segments: dict[str, list[int]] = defaultdict(list)
    for sample in samples:
        segments[segment_of(sample, personas) or UNKNOWN].append(sample.id)
    return {segment: paired({q: rewards_a[q] for q in ids if q in rewards_a},
                            {q: rewards_b[q] for q in ids if q in rewards_b}, k=a.k, seed=seed)
            for segment, ids in sorted(segments.items())}


def bind_library(engine: Engine, task_name: str, library_name: str, segment: str | None, actor: str = "cli") -> Library:
    """Bind a library (created if missing) to a segment, or unbind it with None. The default library serves
    everyone and is never bound; two libraries may not serve one segment (routing would be ambiguous)."""
    if segment is not None and not re.fullmatch(SEGMENT_PATTERN, segment):
        raise InvalidInput(f"segment {segment!r} must be a short tag like at_risk")
    with session_scope(engine) as session:
        task = get_task(session, task_name)
        if library_name == "default" and segment is not None:
            raise InvalidInput("the default library serves every segment; bind another library")
        known = {persona.segment for persona in personas_by_name(session, task).values()}
        if segment is not None and segment not in known:
            raise InvalidInput(f"task {task.name!r} has no persona in segment {segment!r}; its segments are "
                               f"{', '.join(sorted(known)) or 'none'}")
        library = ensure_library(session, task, library_name, actor=actor)
        other = session.exec(select(Library).where(Library.task_id == task.id, Library.segment == segment,
                                                   Library.id != library.id)).first() if segment else None
        if other is not None:
            raise InvalidInput(f"library {other.name!r} already serves segment {segment!r}; unbind it first")
        before = library.segment
        library.segment = segment
        session.add(library)
        session.add(AuditEvent(actor=actor, action="library.segment", object_type="library", object_id=library.id,
                               before={"segment": before}, after={"segment": segment}))
        return library


def segment_libraries(session: Session, task: Task) -> dict[str, Library]:
    return {library.segment: library for library in session.exec(
        select(Library).where(Library.task_id == task.id, Library.segment.is_not(None))).all()}


def route_versions(session: Session, task: Task, label: str = "production") -> dict[str, int]:
    """For each segment with a bound library, the version that serves it: the one labelled `label`, else
    its newest version."""
    routes = {}
    for segment, library in segment_libraries(session, task).items():
        labelled = session.exec(select(LibraryLabel).where(LibraryLabel.library_id == library.id,
                                                           LibraryLabel.name == label)).first()
        version = (session.get(LibraryVersion, labelled.version_id) if labelled is not None
                   else queries.latest_version(session, library.id))
        if version is not None:
            routes[segment] = version.id
    return routes


def experiences_for(sample: Sample, routes: dict | None, personas: dict, versions: dict[int, list[dict]],
                    default: list[dict]) -> list[dict]:
    """The experiences a scenario is played with: its segment's routed version, else the default."""
    if not routes:
        return default
    version_id = routes.get(segment_of(sample, personas) or "")
    return versions[version_id] if version_id is not None else default


def routed_export(session: Session, task: Task, default: LibraryVersion | None, fmt: str) -> str:
    """A segment-routed library as one JSON file a live agent can route by itself: the default version and,
    per segment with a bound library, the version that serves it (its production label, else its newest),
    each as experiences and the rendered system-prompt block in `fmt` (md or prompt)."""
    def entry(version: LibraryVersion | None) -> dict:
        experiences = version.experiences if version else []
        return {"version_id": version.id if version else None, "number": version.number if version else None,
                "experiences": [e["text"] for e in experiences],
                "text": export_version(experiences, fmt, task=task)}

    routes = route_versions(session, task)
    return json.dumps({"task": task.name, "route_by": "segment", "default": entry(default),
                       "segments": {segment: entry(session.get(LibraryVersion, version_id))
                                    for segment, version_id in sorted(routes.items())}},
                      ensure_ascii=False, indent=2) + "\n"
