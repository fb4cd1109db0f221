"""A conversation task's scenarios stored as its samples, and splits assigned by persona.

A scenario is kept in the Sample table so that runs, evaluations, splits and comparisons treat a
conversation task like any other: `query` is the user's opening message, `reference` the goal, and
`meta` holds the persona and the scenario's must / must-not rules. Splitting by persona (some personas
only in test) is how a team checks that a library helps with people it never trained on.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.domain.datasets import SPLITS, scenario_rows
from core.domain.personas import Persona, Scenario, parse_scenarios
from core.errors import InvalidInput
from core.records.people.roles import require_role
from core.records.tasks.lookup import get_task
from core.records.tasks.samples import add_samples
from core.records.tasks.task_io import task_personas
from storage import queries
from storage.db import session_scope
from storage.tables import AuditEvent, Sample, Task

CONVERSATION = "conversation"


def is_conversation(task: Task) -> bool:
    return (task.kind or "single") == CONVERSATION


def check_task_kind(session: Session, task: Task) -> None:
    """Refuse a job whose task cannot be played as it is set up: a conversation task needs personas and the
    rubric reward (or people), and the rubric reward scores only conversations."""
    if is_conversation(task):
        if task.reward_method not in ("rubric", "human"):
            raise InvalidInput(f"task {task.name!r} is a conversation task; score it with the rubric reward "
                               f"(or human), not {task.reward_method!r}")
        if not task_personas(session, task.id):
            raise InvalidInput(f"task {task.name!r} has no personas; add them on the Tasks page or with "
                               "`python -m core task personas`")
    elif task.reward_method == "rubric":
        raise InvalidInput(f"task {task.name!r}: the rubric reward scores conversations; make it a conversation "
                           "task or choose another reward")


def persona_name(sample: Sample) -> str:
    """The name of the persona a scenario names ("" for a sample that is not a scenario)."""
    return str((sample.meta or {}).get("persona") or "")


def scenario_of(sample: Sample) -> Scenario:
    """The scenario a conversation task's sample holds."""
    meta = sample.meta or {}
    return Scenario(persona=persona_name(sample), opening=sample.query, goal=sample.reference or "-",
                    must=list(meta.get("must") or []), must_not=list(meta.get("must_not") or []))


def persona_of(sample: Sample, personas: dict[str, Persona]) -> Persona:
    """The persona a scenario names; InvalidInput when the task no longer has it (its personas were replaced)."""
    name = persona_name(sample)
    persona = personas.get(name.casefold())
    if persona is None:
        raise InvalidInput(f"sample {sample.external_id}: persona {name!r} is not one of the task's personas")
    return persona


def personas_by_name(session: Session, task: Task) -> dict[str, Persona]:
    return {persona.name.casefold(): persona for persona in task_personas(session, task.id)}


def segment_sample_ids(session: Session, task: Task, segment: str | None) -> set[int] | None:
    """The ids of the task's scenarios whose persona is in `segment`; None (no restriction) without one."""
    if segment is None:
        return None
    personas = personas_by_name(session, task)
    return {s.id for s in queries.samples(session, task.id) if segment_of(s, personas) == segment}


def segment_of(sample: Sample, personas: dict[str, Persona]) -> str | None:
    """The segment of the scenario's persona, or None (a single-reply task, or an unknown persona)."""
    persona = personas.get(persona_name(sample).casefold())
    return persona.segment if persona else None


def _checked_names(names: list[str], personas: list[Persona]) -> frozenset[str]:
    known = {persona.name.casefold() for persona in personas}
    unknown = [name for name in names if name.casefold() not in known]
    if unknown:
        raise InvalidInput(f"unknown persona(s) {', '.join(map(repr, unknown))}; the task has "
                           f"{', '.join(persona.name for persona in personas) or 'no personas'}")
    return frozenset(name.casefold() for name in names)


def add_scenarios(engine: Engine, task_name: str, data: bytes, filename: str, *, test_personas: list[str] = (),
                  default_split: str = "train", actor: str = "cli") -> tuple[int, int]:
    """Check a whole scenarios file against the task's personas, then add its new scenarios: (added, already
    present). Scenarios of `test_personas` are held out for test."""
    if default_split not in SPLITS:
        raise InvalidInput(f"unknown split {default_split!r}; use one of {', '.join(SPLITS)}")
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "adding scenarios to a task")
        task = get_task(session, task_name)
        if not is_conversation(task):
            raise InvalidInput(f"task {task.name!r} is not a conversation task; scenarios need personas")
        personas = task_personas(session, task.id)
        scenarios = parse_scenarios(data, filename, personas)
        rows = scenario_rows(scenarios, test_personas=_checked_names(list(test_personas), personas),
                             default_split=default_split)
        added = add_samples(session, task, rows)
        session.add(AuditEvent(actor=actor, action="task.add_data", object_type="task", object_id=task.id,
                               after={"file": filename, "scenarios": len(rows), "added": added,
                                      "test_personas": sorted(test_personas)}))
        return added, len(rows) - added


def split_by_persona(engine: Engine, task_name: str, test_personas: list[str], actor: str = "cli") -> dict[str, int]:
    """Put every scenario of `test_personas` in test and every other scenario in train (validation stays as
    it is): the held-out personas are never seen in training. Returns scenarios per split."""
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "changing a task's splits")
        task = get_task(session, task_name)
        held = _checked_names(test_personas, task_personas(session, task.id))
        counts: dict[str, int] = defaultdict(int)
        for sample in queries.samples(session, task.id):
            if sample.split != "validation":
                persona = persona_name(sample).casefold()
                split = "test" if persona in held else "train"
                if split != sample.split:
                    sample.split = split
                    session.add(sample)
            counts[sample.split] += 1
        session.add(AuditEvent(actor=actor, action="task.split_by_persona", object_type="task", object_id=task.id,
                               after={"test_personas": sorted(test_personas), "splits": dict(counts)}))
        return dict(counts)


def persona_splits(session: Session, task: Task) -> dict[str, dict[str, int]]:
    """For each persona name, its scenarios per split (what the Tasks page shows)."""
    table: dict[str, dict[str, int]] = {persona.name: {} for persona in task_personas(session, task.id)}
    for sample in queries.samples(session, task.id):
        name = persona_name(sample)
        table.setdefault(name, {})
        table[name][sample.split] = table[name].get(sample.split, 0) + 1
    return table
