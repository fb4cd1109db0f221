"""What a library version covers of its task's train references (issue 44, item 3), as the Library page, `python -m
core versions` and the learning benchmark say it.

A train reference is covered when the entries its query would be shown (the library's own selection) include worked
examples that state every fact of it (core.domain.coverage). Names are the samples' own ids ("p03"), which a person
finds in the task's data; a task whose reward counts no facts has no coverage to show, and says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlmodel import Session

from core.domain.coverage import Coverage, coverage
from core.records.library.selection import selection_of
from storage import queries
from storage.tables import Library, LibraryVersion, Sample, Task


def version_coverage(session: Session, task: Task, library: Library, version: LibraryVersion | None,
                     train: Sequence[Sample] | None = None) -> Coverage:
    """Which of the task's train references the version's examples cover under the library's selection (the empty
    library: none). `train` is the task's train samples when the caller has already read them."""
    if train is None:
        train = queries.samples(session, task.id, "train")
    return coverage(version.experiences if version is not None else [],
                    [(sample.external_id, sample.query, sample.reference) for sample in train],
                    task.reward_method, task.reward_settings, selection_of(library))
