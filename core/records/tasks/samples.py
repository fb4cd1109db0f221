"""A task's samples: added from rows or from a whole dataset file, validated before anything is written."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.domain.datasets import (
    DatasetError,
    SampleRow,
    compare_with_stored,
    parse_dataset_file,
    split_counts,
)
from core.domain.regex_safety import pattern_problem
from core.records.people.roles import require_role
from core.records.tasks.lookup import get_task
from storage import queries
from storage.db import session_scope
from storage.tables import AuditEvent, Sample, Task


def check_reference_patterns(task: Task, rows: list[SampleRow]) -> None:
    """A regex task without a pattern of its own matches each sample's reference as the pattern: refuse one
    that can take exponential time, as the task's own pattern is refused (the scoring time limit is the
    last line, not the first)."""
    if task.reward_method != "regex" or (task.reward_settings or {}).get("pattern"):
        return
    for row in rows:
        problem = pattern_problem(row.reference or "")
        if problem:
            raise DatasetError(f"sample {row.external_id!r}: its reference is the regex pattern, and the {problem}")


def add_samples(session: Session, task: Task, rows: list[SampleRow]) -> int:
    """Insert the rows whose id the task does not have yet; returns how many were new."""
    existing = {s.external_id for s in queries.samples(session, task.id)}
    new = [row for row in rows if row.external_id not in existing]
    check_reference_patterns(task, new)
    for row in new:
        session.add(Sample(task_id=task.id, external_id=row.external_id, query=row.query, reference=row.reference,
                           rubric=row.rubric, split=row.split, meta=row.meta))
    return len(new)


@dataclass(frozen=True)
class DatasetAdded:
    """What adding a file did: rows added, rows not added as duplicates, and `notes`, the lines the page and
    the CLI show as they are: each duplicate found by its content, by row ("data row 3 is the same as
    sample q-… already stored", "line 4 is the same as line 1"; datasets.compare_with_stored)."""

    added: int
    already: int
    notes: list[str]


def add_dataset_file(engine: Engine, task_name: str, data: bytes, filename: str, *,
                     mapping: dict[str, str] | None = None, default_split: str = "train", actor: str = "cli",
                     test_share: float = 0.0, validation_share: float = 0.0) -> DatasetAdded:
    """Validate a whole dataset file, then add the rows the task does not hold yet.

    The one path for the page, the CLI and scripts. A bad file, or a row whose id the task holds with other
    content, raises DatasetError naming the row and the problem before anything is written; only an admin
    may change a task's data. A row without an id is known by its content (datasets.sample_id), so only a
    real duplicate is left out. The shares hold rows without a split out for test and validation
    (core.domain.datasets.hold_out); the audit event keeps them.
    """
    dataset = parse_dataset_file(data, filename, mapping, default_split, test_share=test_share,
                                 validation_share=validation_share)
    rows = dataset.rows
    after: dict = {"file": filename, "rows": len(rows) + len(dataset.repeats)}
    if test_share or validation_share:
        after |= {"test_share": test_share, "validation_share": validation_share, "splits": split_counts(rows)}
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "adding data to a task")
        task = get_task(session, task_name)
        compared = compare_with_stored(dataset, queries.samples(session, task.id))
        added = add_samples(session, task, compared.new)
        session.add(AuditEvent(actor=actor, action="task.add_data", object_type="task", object_id=task.id,
                               after={**after, "added": added}))
        return DatasetAdded(added, compared.already, compared.notes)


def add_dataset(engine: Engine, task_name: str, data: bytes, filename: str, *, mapping: dict[str, str] | None = None,
                default_split: str = "train", actor: str = "cli", test_share: float = 0.0,
                validation_share: float = 0.0) -> tuple[int, int]:
    """add_dataset_file, for scripts and tests that want only the counts: (added, already present)."""
    result = add_dataset_file(engine, task_name, data, filename, mapping=mapping, default_split=default_split,
                              actor=actor, test_share=test_share, validation_share=validation_share)
    return result.added, result.already
