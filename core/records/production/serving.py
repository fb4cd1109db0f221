"""A library version as a live agent fetches it: by label (`production`) or by its number, with a validator.

The HTTP API (the `api` package) is a thin face over this: the same lookup rules as the CLI's `export`,
and an ETag that changes exactly when what the agent would put in its prompt changes, so a client can
revalidate cheaply and keep its cached copy otherwise. A library whose selection is `top_k` shows each query
only some entries: `served_selection` returns the entries chosen for one query, by the same function
(core.domain.selection.select_entries) that chose them for every rollout the studio trained and evaluated.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.domain.library import kind_of
from core.domain.selection import Selection, scored_entries
from core.errors import InvalidInput, NotFound
from core.records.evaluation.figures import read_evaluation_report
from core.records.keys.api_keys import KeyUse, key_scope, within_key_task
from core.records.library import versions
from core.records.library.promotion import production_version
from core.records.library.selection import selection_of
from core.records.library.versions import PRODUCTION, export_version
from core.records.people.roles import require_role
from core.records.production.ab_changes import split_changed
from core.records.production.ab_experiments import CANDIDATE, MIN_SHARE, served_arm
from core.records.tasks.lookup import get_library, get_task
from storage import queries
from storage.db import session_scope
from storage.tables import AuditEvent, Evaluation, Library, LibraryVersion, Task


@dataclass(frozen=True)
class ServedLibrary:
    """What an agent needs of a version: its id and number, the label it was asked by, its experience
    texts and the rendered system-prompt block; `etag` identifies exactly that content."""

    task: str
    library: str
    version_id: int
    number: int
    label: str | None
    experiences: list[str]
    prompt: str
    arm: str | None = None  # with an A/B split: the label whose version served this user
    # How the library chooses each prompt's entries ({mode, k}): under `top_k` an agent asks the selection
    # route for its query's entries instead of putting `prompt` (the whole library) in its system prompt.
    selection: dict = field(default_factory=lambda: Selection().as_dict())
    # Each entry with its id and kind (lesson or worked example), in library order; `experiences` is their texts.
    entries: tuple[dict, ...] = ()
    note: str | None = None  # why this version was served when no label named it (Resolved.note)

    @property
    def etag(self) -> str:
        body = json.dumps([self.version_id, self.experiences, self.prompt, self.selection], ensure_ascii=False)
        return '"' + hashlib.sha256(body.encode()).hexdigest()[:32] + '"'

    def as_dict(self) -> dict:
        return {"task": self.task, "library": self.library, "version_id": self.version_id, "number": self.number,
                "label": self.label, "experiences": self.experiences, "entries": list(self.entries),
                "prompt": self.prompt, "arm": self.arm, "selection": self.selection,
                **({"note": self.note} if self.note else {})}


@dataclass(frozen=True)
class ServedSelection:
    """The entries of a version chosen for one query: `entries` ({id, text, score}, in prompt order; the score
    is BM25's, None under `all`), their texts and the prompt block built from them, the version and label
    they come from, and the selection that chose them. `etag` identifies exactly that content."""

    task: str
    library: str
    version_id: int
    number: int
    label: str | None
    query: str
    selection: dict
    entries: list[dict]
    prompt: str
    arm: str | None = None
    note: str | None = None  # as ServedLibrary.note

    @property
    def experiences(self) -> list[str]:
        return [entry["text"] for entry in self.entries]

    @property
    def entry_ids(self) -> list[str]:
        return [entry["id"] for entry in self.entries]

    @property
    def etag(self) -> str:
        body = json.dumps([self.version_id, self.selection, self.entry_ids, self.prompt], ensure_ascii=False)
        return '"' + hashlib.sha256(body.encode()).hexdigest()[:32] + '"'

    def as_dict(self) -> dict:
        return {"task": self.task, "library": self.library, "version_id": self.version_id, "number": self.number,
                "label": self.label, "arm": self.arm, "query": self.query, "selection": self.selection,
                "entries": self.entries, "experiences": self.experiences, "prompt": self.prompt,
                **({"note": self.note} if self.note else {})}


@dataclass(frozen=True)
class Resolved:
    """The rows a request names: its task, library and version, the label that led there and the A/B arm."""

    task: Task
    library: Library
    version: LibraryVersion
    label: str | None
    arm: str | None = None
    note: str | None = None  # why this version, when it is not what the request named (no production yet)


def first_version_note(library: Library) -> str:
    return (f"no version of library {library.name!r} is labelled production yet: this is version #1, the library's "
            "first (empty); promote a version to serve it here")


def served_version(session: Session, task_name: str, library_name: str = "default", *, label: str | None = None,
                   version_id: int | None = None, user_id: str | None = None, version: str | None = None,
                   name_others: bool = True) -> Resolved:
    """The version of `library_name` that `label` points at (default `production`), or `version` as a person names
    it, its number ("12" or "#12") or `latest`, read by the one lookup core.records.library.versions.resolve_version (an id
    given as a number is refused), or, for a machine that holds it (a trace naming the version that served it), its
    database id `version_id`; NotFound names what is missing, InvalidInput a request that asks for more than one.

    With an A/B split on the library and a `user_id`, a request for `production` is served the split's
    label for a stable share of users (the same user always gets the same arm) and says which in `arm`.
    The library fetch and trace ingest both resolve through here."""
    if sum(given is not None for given in (label, version_id, version)) > 1:
        raise InvalidInput("ask for a label or a version, not both")
    task = get_task(session, task_name, name_others=name_others)
    library = get_library(session, task, library_name)
    if version is not None:
        named = versions.resolve_version(session, task, version, library_name, labels=False)
        if named is None:
            raise NotFound(f"library {library_name!r} of task {task.name!r} has no version yet")
        return Resolved(task, library, named, None)
    if version_id is not None:
        version = session.get(LibraryVersion, version_id)
        if version is None or version.library_id != library.id:
            raise NotFound(f"library {library_name!r} of task {task.name!r} has no version {version_id}")
        return Resolved(task, library, version, None)
    arm = ab_arm(library, label or PRODUCTION, user_id)
    label = arm or label or PRODUCTION
    found = queries.label_by_name(session, library.id, label)
    if found is None and label == PRODUCTION:  # a fresh library: its agents run on its first, empty version
        first = production_version(session, library)
        if first is not None:
            return Resolved(task, library, first, None, arm, note=first_version_note(library))
    if found is None:
        raise NotFound(f"library {library_name!r} of task {task.name!r} has no label {label!r}")
    return Resolved(task, library, session.get(LibraryVersion, found.version_id), label, arm)


def served_library(session: Session, task_name: str, library_name: str = "default", *, label: str | None = None,
                   version: str | None = None, user_id: str | None = None,
                   key: KeyUse | None = None) -> ServedLibrary:
    """What an agent fetches of the version `served_version` finds (`version`: its number or latest); a key bound
    to a task reads only that task (OutsideTask)."""
    task_name, library_name = key_scope(session, key, task_name, library_name, doing="reads")
    found = served_version(session, task_name, library_name, label=label, version=version, user_id=user_id,
                           name_others=key is None)
    served = _served(found.task, found.library, found.version, found.label, arm=found.arm)
    return replace(served, note=found.note) if found.note else served


def served_selection(session: Session, task_name: str, library_name: str = "default", *, query: str,
                     label: str | None = None, version: str | None = None,
                     user_id: str | None = None, key: KeyUse | None = None) -> ServedSelection:
    """The entries of the version `served_version` finds that the library's selection shows for `query`: the
    same entries, in the same order, as a rollout of that query was shown in a training run or an evaluation
    made under this selection (core.grpo.rollouts.stored_rollout calls the same select function)."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidInput("give the query to choose entries for (query=...)")
    task_name, library_name = key_scope(session, key, task_name, library_name, doing="reads")
    found = served_version(session, task_name, library_name, label=label, version=version, user_id=user_id,
                           name_others=key is None)
    selection = selection_of(found.library)
    chosen = scored_entries(found.version.experiences or [], query, selection)
    entries = [{"id": str(entry.get("id")), "text": entry["text"], "kind": kind_of(entry),
                "score": None if score is None else round(score, 6)} for entry, score in chosen]
    return ServedSelection(task=found.task.name, library=found.library.name, version_id=found.version.id,
                           number=found.version.number, label=found.label, query=query,
                           selection=selection.as_dict(), entries=entries,
                           prompt=export_version([entry for entry, _score in chosen], "prompt", task=found.task),
                           arm=found.arm, note=found.note)


def served_evaluation(engine: Engine, evaluation_id: int, key: KeyUse | None = None) -> dict:
    """An evaluation's report as the API gives it (GET /v1/evaluations/N); a key bound to a task reads only that
    task's evaluations (OutsideTask)."""
    with Session(engine) as session:
        evaluation = session.get(Evaluation, evaluation_id)
        if evaluation is not None:
            within_key_task(session, key, evaluation.task_id, f"evaluation {evaluation_id}")
    return read_evaluation_report(engine, evaluation_id)


def ab_arm(library: Library, label: str, user_id: str | None) -> str | None:
    """The label that serves this user under the library's A/B split, or None when no split applies."""
    if label != PRODUCTION or not library.ab_label:
        return None
    arm = served_arm(library.id, library.ab_share, user_id)
    return library.ab_label if arm == CANDIDATE else arm


def set_ab_split(engine: Engine, task_name: str, library_name: str, label: str | None, share: float,
                 actor: str) -> None:
    """Serve `label`'s version to a `share` of users in place of production (None or share 0 ends the
    split); an admin's decision, as moving production is. Each change ends the running A/B experiment and starts the
    next one while the split is on (core/records/production/ab_experiments.py)."""
    if label is not None and share and not MIN_SHARE <= share <= 1 - MIN_SHARE:
        raise InvalidInput(f"the A/B share is the fraction of users served the candidate, from {MIN_SHARE} to "
                           f"{1 - MIN_SHARE} (0 ends the split): the verdict's error rate is measured over that "
                           "range (bench/ab_peeking.py)")
    if label == PRODUCTION:
        raise InvalidInput("the A/B label is the candidate served beside production, not production itself")
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "splitting production traffic")
        task = get_task(session, task_name)
        library = get_library(session, task, library_name)
        if label and share and queries.label_by_name(session, library.id, label) is None:
            raise NotFound(f"library {library_name!r} of task {task.name!r} has no label {label!r}")
        before = {"label": library.ab_label, "share": library.ab_share}
        library.ab_label, library.ab_share = (label, share) if label and share else (None, None)
        session.add(library)
        session.add(AuditEvent(actor=actor, action="library.ab_split", object_type="library", object_id=library.id,
                               before=before, after={"label": library.ab_label, "share": library.ab_share}))
        split_changed(session, library, before, actor)


def _served(task: Task, library: Library, version: LibraryVersion, label: str | None,
            arm: str | None = None) -> ServedLibrary:
    experiences = version.experiences or []
    return ServedLibrary(task=task.name, library=library.name, version_id=version.id, number=version.number,
                         label=label, experiences=[e["text"] for e in experiences],
                         prompt=export_version(experiences, "prompt", task=task), arm=arm,
                         selection=selection_of(library).as_dict(),
                         entries=tuple({"id": str(e.get("id")), "text": e["text"], "kind": kind_of(e)}
                                       for e in experiences))
