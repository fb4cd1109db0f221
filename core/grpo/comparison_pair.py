"""Which two evaluations a comparison of A and B uses, and on which model, said in words.

A comparison is only fair on one model, and only worth its cost when it reuses what was already measured: the
newest finished evaluations of A and B that match on split, k and query limit (and the library's entry
selection) and were made on one model are reused. Where no such pair exists, the missing side is evaluated on
the model a person chose last for the task (core.records.models.options.chosen_model), never on a model nobody
chose (the embedded one, after a team's work on a connection's).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.domain.selection import Selection
from core.errors import DuplicateJob, NotFound
from core.grpo.evaluation import create_evaluation
from core.records.library.selection import selection_of
from core.records.library.versions import resolve_version
from core.records.models.options import chosen_model
from core.records.tasks.lookup import get_task
from storage import queries
from storage.statuses import JobStatus
from storage.tables import Evaluation, Library, Task


@dataclass(frozen=True)
class ComparisonPair:
    """The evaluations of A and B to compare, the model both were (or will be) made on, and what was chosen and
    why, as the CLI says it."""

    ids: tuple[int, int]
    model: str
    words: str
    created: tuple[int, ...] = ()


def evaluation_ref(ref: str) -> int | None:
    """The evaluation id `e12` or `eval:12` names, else None (a version reference)."""
    text = str(ref).strip().lower()
    for prefix in ("eval:", "e"):
        if text.startswith(prefix) and text[len(prefix):].isascii() and text[len(prefix):].isdigit():
            return int(text[len(prefix):])
    return None


def _finished_by_model(session: Session, task: Task, ref: str, library_name: str, *, split: str, k: int,
                       limit: int | None) -> dict[str, int]:
    """For a version reference: each model's newest completed evaluation of that version with this split, k,
    query limit and the library's current entry selection, one library for every query. For `e12`: that one."""
    given = evaluation_ref(ref)
    if given is not None:
        ev = session.get(Evaluation, given)
        if ev is None or ev.task_id != task.id:
            raise NotFound(f"no evaluation {given} of task {task.name!r}")
        return {ev.model: ev.id}
    version = resolve_version(session, task, ref, library_name)
    selection = selection_of(session.get(Library, version.library_id) if version else None)
    found: dict[str, int] = {}
    for ev in queries.evaluations(session, task.id):  # newest first
        if (ev.version_id == (version.id if version else None) and (ev.split, ev.k, ev.limit) == (split, k, limit)
                and ev.status == JobStatus.COMPLETED and not ev.routes
                and (version is None or Selection.from_dict(ev.selection).shows_same(selection))):
            found.setdefault(ev.model, ev.id)
    return found


def comparison_pair(engine: Engine, task_name: str, a: str, b: str, *, split: str = "test", k: int = 1,
                    limit: int | None = None, model: str | None = None, library_name: str = "default",
                    created_by: str = "cli") -> ComparisonPair:
    """The evaluations to compare A and B with (each a version reference or an evaluation as `e12`): the newest
    finished pair on one model (`model` if given), else the missing side queued on `model`, the model of a side
    given as an evaluation, or the model a person chose last (chosen_model). One identical to a queued or running
    evaluation is that one."""
    with Session(engine) as session:
        task = get_task(session, task_name)
        sides = [_finished_by_model(session, task, ref, library_name, split=split, k=k, limit=limit)
                 for ref in (a, b)]
        fixed = [evaluation_ref(ref) is not None for ref in (a, b)]
        common = [name for name in sides[0] if name in sides[1] and (model is None or name == model)]
        if common:
            best = max(common, key=lambda name: max(sides[0][name], sides[1][name]))
            ids = (sides[0][best], sides[1][best])
            return ComparisonPair(ids, best, f"reusing evaluations {ids[0]} (A) and {ids[1]} (B), both finished on "
                                             f"model {best} with split {split}, k={k}"
                                             + (f", {limit} queries" if limit else ""))
        if model:
            reason = "as --model chose"
        elif any(fixed):
            model = next(iter(sides[0] if fixed[0] else sides[1]))
            reason = "the model of the evaluation given"
        else:
            start = chosen_model(session, task)
            model, reason = start.model, start.reason
    ids, created = [], []
    for ref, found, given in zip((a, b), sides, fixed, strict=True):
        if given or model in found:
            ids.append(found.get(model) or next(iter(found.values())))
            continue
        try:
            new_id = create_evaluation(engine, task_name, ref, split=split, k=k, limit=limit, model=model,
                                       created_by=created_by, library_name=library_name)
        except DuplicateJob as exc:
            new_id = exc.existing_id
        ids.append(new_id)
        created.append(new_id)
    words = (f"no finished evaluations of A and B on one model match split {split}, k={k}"
             + (f", {limit} queries" if limit else "") + f"; evaluating on {model} ({reason})")
    return ComparisonPair((ids[0], ids[1]), model, words, tuple(created))
