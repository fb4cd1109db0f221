"""Tasks and their samples, including the built-in demo task."""

from __future__ import annotations

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core import config
from core.datasets import SampleRow, demo_rows, parse_dataset
from core.people import require_role
from core.versions import ensure_library
from storage import queries
from storage.db import session_scope
from storage.models import AuditEvent, Sample, Task

DEMO_TASK = "arithmetic word problems"
DEMO_INSTRUCTIONS = (
    "You are a careful math tutor. Solve the word problem step by step, checking each calculation."
)
DEMO_ANSWER_FORMAT = "End with the final numeric answer in \\boxed{}, for example \\boxed{42}."


class NotFound(LookupError):
    """A named thing (task, library, version, run) does not exist; the message names it."""


def get_task(session: Session, name: str) -> Task:
    task = queries.task_by_name(session, name)
    if task is None:
        known = ", ".join(t.name for t in queries.list_tasks(session)) or "none yet"
        raise NotFound(f"no task named {name!r} (tasks: {known})")
    return task


def add_samples(session: Session, task: Task, rows: list[SampleRow]) -> int:
    """Insert the rows whose id the task does not have yet; returns how many were new."""
    existing = {s.external_id for s in queries.samples(session, task.id)}
    new = [row for row in rows if row.external_id not in existing]
    for row in new:
        session.add(Sample(task_id=task.id, external_id=row.external_id, query=row.query, reference=row.reference,
                           rubric=row.rubric, split=row.split, meta=row.meta))
    return len(new)


def add_dataset(engine: Engine, task_name: str, data: bytes, filename: str, *, mapping: dict[str, str] | None = None,
                default_split: str = "train", actor: str = "cli") -> tuple[int, int]:
    """Validate a whole dataset file, then add its new rows to a task: (added, already present).

    The one path for the page, the CLI and scripts. A bad file raises DatasetError naming the row and
    the problem before anything is written; only an admin may change a task's data.
    """
    rows = parse_dataset(data, filename, mapping, default_split)
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "adding data to a task")
        task = get_task(session, task_name)
        added = add_samples(session, task, rows)
        session.add(AuditEvent(actor=actor, action="task.add_data", object_type="task", object_id=task.id,
                               after={"file": filename, "rows": len(rows), "added": added}))
        return added, len(rows) - added


def ensure_demo_task(engine: Engine, actor: str = "system") -> Task:
    """Create the demo task with its 100 train and 100 test problems, once."""
    with session_scope(engine) as session:
        task = queries.task_by_name(session, DEMO_TASK)
        if task is None:
            model = config.default_model()
            task = Task(
                name=DEMO_TASK,
                description="Grade-school arithmetic word problems from SVAMP and MAWPS MultiArith (MIT).",
                instructions=DEMO_INSTRUCTIONS,
                answer_format=DEMO_ANSWER_FORMAT,
                reward_method="math",
                policy_model=model,
                learner_model=model,
                judge_model=model,
            )
            session.add(task)
            session.flush()
            session.add(AuditEvent(actor=actor, action="task.create", object_type="task", object_id=task.id,
                                   after={"name": task.name}))
        add_samples(session, task, demo_rows())
        ensure_library(session, task, "default", actor=actor)
        return task
