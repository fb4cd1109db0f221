"""A library version as a live agent fetches it: by label (`production`) or by id, with a validator.

The HTTP API (the `api` package) is a thin face over this: the same lookup rules as the CLI's `export`,
and an ETag that changes exactly when what the agent would put in its prompt changes, so a client can
revalidate cheaply and keep its cached copy otherwise.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from sqlmodel import Session

from core.errors import InvalidInput, NotFound
from core.records.tasks import get_task
from core.records.versions import export_version
from storage import queries
from storage.models import Library, LibraryVersion


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

    @property
    def etag(self) -> str:
        body = json.dumps([self.version_id, self.experiences, self.prompt], ensure_ascii=False)
        return '"' + hashlib.sha256(body.encode()).hexdigest()[:32] + '"'

    def as_dict(self) -> dict:
        return {"task": self.task, "library": self.library, "version_id": self.version_id, "number": self.number,
                "label": self.label, "experiences": self.experiences, "prompt": self.prompt}


def served_library(session: Session, task_name: str, library_name: str = "default", *, label: str | None = None,
                   version_id: int | None = None) -> ServedLibrary:
    """The version of `library_name` that `label` points at (default `production`), or version `version_id`
    of that library; NotFound names what is missing, InvalidInput a request that asks for both."""
    if label is not None and version_id is not None:
        raise InvalidInput("ask for a label or a version, not both")
    task = get_task(session, task_name)
    library = queries.library_by_name(session, task.id, library_name)
    if library is None:
        raise NotFound(f"task {task.name!r} has no library {library_name!r}")
    if version_id is not None:
        version = session.get(LibraryVersion, version_id)
        if version is None or version.library_id != library.id:
            raise NotFound(f"library {library_name!r} of task {task.name!r} has no version {version_id}")
    else:
        label = label or "production"
        found = queries.label_by_name(session, library.id, label)
        if found is None:
            raise NotFound(f"library {library_name!r} of task {task.name!r} has no label {label!r}")
        version = session.get(LibraryVersion, found.version_id)
    return _served(task.name, library, version, label)


def _served(task_name: str, library: Library, version: LibraryVersion, label: str | None) -> ServedLibrary:
    experiences = version.experiences or []
    return ServedLibrary(task=task_name, library=library.name, version_id=version.id, number=version.number,
                         label=label, experiences=[e["text"] for e in experiences],
                         prompt=export_version(experiences, "prompt"))
