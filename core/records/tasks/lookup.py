"""A task and its libraries by name: the lookups every subject starts from, with the NotFound a person reads, and the
creation of a task's library with its empty first version (a new task and an imported one get it the same way)."""

from __future__ import annotations

from sqlmodel import Session

from core.errors import NotFound
from storage import queries
from storage.tables import AuditEvent, Library, LibraryVersion, Task


def get_task(session: Session, name: str, *, name_others: bool = True) -> Task:
    """The task of that name, or NotFound; with `name_others` the message lists the tasks there are."""
    task = queries.task_by_name(session, name) if name else None
    if task is None:
        known = ", ".join(t.name for t in queries.list_tasks(session)) or "none yet"
        raise NotFound(f"no task named {name!r}" + (f" (tasks: {known})" if name_others else ""))
    return task


def get_library(session: Session, task: Task, name: str, *, hint: str = "") -> Library:
    """The task's library of that name, or NotFound saying which is missing (and `hint`, what to do)."""
    library = queries.library_by_name(session, task.id, name)
    if library is None:
        raise NotFound(f"task {task.name!r} has no library {name!r}" + (f"; {hint}" if hint else ""))
    return library

def ensure_library(session: Session, task: Task, name: str = "default", actor: str = "system") -> Library:
    """The task's library of that name, created with an empty first version if missing."""
    lib = queries.library_by_name(session, task.id, name)
    if lib is None:
        lib = Library(task_id=task.id, name=name)
        session.add(lib)
        session.flush()
        session.add(LibraryVersion(library_id=lib.id, number=1, experiences=[], source="initial",
                                   note="empty library", created_by=actor))
        session.add(AuditEvent(actor=actor, action="library.create", object_type="library", object_id=lib.id,
                               after={"task": task.name, "name": name}))
        session.flush()
    return lib
