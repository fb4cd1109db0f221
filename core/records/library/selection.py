"""A library's entry selection as stored: read it, change it (audited), and say which entries a group was shown.

The choice itself is core.domain.selection's (pure); this module keeps the setting on the Library row, freezes
it into the jobs that run the agent (runs, evaluations: `frozen`), and reads back for the Rollouts page which
entries each rollout of a group was shown (its ids are stored on the rollout; the texts are the version's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.domain.selection import Selection
from core.records.people.roles import require_role
from core.records.tasks.lookup import get_library, get_task
from core.records.tasks.scenarios import personas_by_name, segment_of
from storage import queries
from storage.db import session_scope
from storage.tables import AuditEvent, Evaluation, Library, LibraryVersion, Rollout, Run, Sample, Step, Task


def selection_of(library: Library | None) -> Selection:
    """The selection a library row holds (`all` for no library: the empty library shows nothing anyway)."""
    if library is None:
        return Selection()
    return Selection.build(library.selection, library.selection_k)


def frozen(library: Library | None) -> dict:
    """The library's selection as a job stores it (Run.settings["selection"], Evaluation.selection)."""
    return selection_of(library).as_dict()


def library_selection(engine: Engine, task_name: str, library_name: str = "default") -> Selection:
    with Session(engine) as session:
        return selection_of(get_library(session, get_task(session, task_name), library_name))


def set_selection(engine: Engine, task_name: str, library_name: str, mode: str | None, k: int | None,
                  actor: str) -> Selection:
    """Choose how the library picks each prompt's entries: `all`, or `top_k` with k (1 to 30). A reviewer's
    change, as editing the library is: it changes what the agent sees in training, evaluation and production
    (the API's selection route), from the next run or evaluation on. Audited as `library.selection`; the first
    choice is recorded even when it keeps the stored value, so a library whose `all` a person chose is told
    apart from one that never chose (core.records.runs.defaults gives the latter `top_k` for worked examples)."""
    with session_scope(engine) as session:
        require_role(session, actor, "reviewer", "changing a library's selection")
        library = get_library(session, get_task(session, task_name), library_name)
        after = Selection.build(mode, selection_of(library).k if k is None else k)
        if after != selection_of(library) or not selection_chosen(session, library):
            adopt_selection(session, library, after, actor)
        return after


def selection_chosen(session: Session, library: Library | None) -> bool:
    """Whether the library's selection was ever chosen (an audited `library.selection`), by a person or by a
    run's default; a library that never chose shows `all`, the stored default."""
    return library is not None and library.id is not None and bool(queries.audit_events(
        session, action_prefix="library.selection", object_type="library", object_id=library.id, limit=1))


def adopt_selection(session: Session, library: Library, selection: Selection, actor: str,
                    reason: str | None = None) -> None:
    """Store `selection` on the library with its audit event (`reason`: why a default chose it)."""
    before = selection_of(library)
    library.selection, library.selection_k = str(selection.mode), selection.k
    session.add(library)
    session.flush()
    session.add(AuditEvent(actor=actor, action="library.selection", object_type="library", object_id=library.id,
                           before=before.as_dict(),
                           after={**selection.as_dict(), **({"reason": reason} if reason else {})}))


# ---------------------------------------------------------------------------------------------- what a group saw


@dataclass
class ShownEntries:
    """The entries a group of rollouts was shown: one row per entry (`id`, `entry` text, `shown to`: how many
    of the group's rollouts had it in their prompt), in prompt order, and the selection that chose them.
    `recorded` counts the rollouts that stored what they were shown (older rollouts did not)."""

    selection: Selection
    rows: list[dict] = field(default_factory=list)
    recorded: int = 0
    total: int = 0


def evaluation_frozen(session: Session, version: LibraryVersion | None, routes: dict | None) -> dict | None:
    """The selection an evaluation freezes when it is made: its version's library's (None for the empty library,
    which shows nothing), and with segment routes each routed version's own library's under "routes"."""
    if version is None and not routes:
        return None
    selection = frozen(session.get(Library, version.library_id)) if version is not None else Selection().as_dict()
    if routes:
        selection["routes"] = {str(vid): frozen(session.get(Library, session.get(LibraryVersion, vid).library_id))
                               for vid in sorted(set(routes.values()))}
    return selection


def library_for(sample: Sample, routes: dict | None, personas: dict, versions: dict[int, list[dict]],
                default: list[dict], selection: dict | None) -> tuple[list[dict], Selection]:
    """The entries a sample of an evaluation is played with and the selection that chooses among them: its
    segment's routed version with that library's selection, else the evaluation's own (`selection` is the
    evaluation's frozen dict, see `evaluation_frozen`)."""
    version_id = routes.get(segment_of(sample, personas) or "") if routes else None
    if version_id is None:
        return default, Selection.from_dict(selection)
    return versions[version_id], Selection.from_dict(((selection or {}).get("routes") or {}).get(str(version_id)))


def shown_entries(session: Session, task: Task, sample: Sample | None, rollouts: list[Rollout]) -> ShownEntries:
    """Which entries the rollouts of one query's group (a training step's or an evaluation's) were shown."""
    if not rollouts:
        return ShownEntries(Selection())
    entries, selection = _group_library(session, task, sample, rollouts[0])
    texts = {str(entry.get("id")): entry.get("text") for entry in entries}
    counts: dict[str, int] = {}
    recorded = [r for r in rollouts if r.shown_ids is not None]
    for rollout in recorded:
        for entry_id in rollout.shown_ids:
            counts[str(entry_id)] = counts.get(str(entry_id), 0) + 1
    rows = [{"id": entry_id, "entry": texts.get(entry_id) or "(not in the version the group ran with)",
             "shown to": count} for entry_id, count in counts.items()]
    return ShownEntries(selection, rows, len(recorded), len(rollouts))


def _group_library(session: Session, task: Task, sample: Sample | None,
                   rollout: Rollout) -> tuple[list[dict], Selection]:
    """The entries the group's agent chose from and the selection it used, as its step or evaluation ran it."""
    if rollout.step_id is not None:
        step = session.get(Step, rollout.step_id)
        before = session.get(LibraryVersion, step.version_before_id) if step.version_before_id else None
        run = session.get(Run, step.run_id)
        return (before.experiences if before else []), Selection.from_dict((run.settings or {}).get("selection"))
    ev = session.get(Evaluation, rollout.evaluation_id)
    version = session.get(LibraryVersion, ev.version_id) if ev.version_id else None
    default = ev.experiences if ev.experiences is not None else version.experiences if version else []
    if not ev.routes or sample is None:
        return default, Selection.from_dict(ev.selection)
    routed = {vid: session.get(LibraryVersion, vid).experiences for vid in set(ev.routes.values())}
    return library_for(sample, ev.routes, personas_by_name(session, task), routed, default, ev.selection)
