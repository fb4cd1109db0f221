"""Task settings and task files: create, edit, export and import a task through one code path.

The Tasks page, the CLI and scripts all call these functions, so a setting that one of them accepts
the others accept too, and every change is checked for the admin role and written to the audit log.
An import is validated completely before the first row is written: a bad file changes nothing.

Reward settings are an open dictionary. The keys the chosen method reads (its settings model in the
registry, core.domain.rewards.METHODS) are checked; any other key is kept unchecked, so a file written by a
newer studio, or the settings of a method a person switched away from, survive a round trip instead
of vanishing silently.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails
from sqlalchemy.engine import Engine
from sqlmodel import Session, delete, select

from core.domain import datasets, json_input
from core.domain.agent_modes import AGENT_MODES
from core.domain.datasets import SPLITS, SampleRow
from core.domain.personas import TASK_KINDS, Persona, persona_dicts, personas_from_objects
from core.domain.prompts import MAX_WORDING_CHARS
from core.domain.rewards import check_settings, get_method
from core.errors import InvalidInput
from core.records.people.roles import require_role
from core.records.tasks.lookup import ensure_library, get_task
from core.records.tasks.samples import add_samples
from core.settings import get_settings
from storage import queries
from storage.db import session_scope
from storage.tables import AuditEvent, Task
from storage.tables import Persona as PersonaRow

FORMAT = "tfgrpo-task"
VERSION = 1
MAX_NAME_CHARS = 100
MAX_FIELD_CHARS, MAX_FILE_BYTES = datasets.MAX_FIELD_CHARS, datasets.MAX_FILE_BYTES
SAMPLE_KEYS = ("id", "query", "reference", "rubric", "split", "meta")

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_NAME_CHARS)]
ModelName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
Text = Annotated[str, StringConstraints(max_length=MAX_FIELD_CHARS)]
NonBlankText = Annotated[str, StringConstraints(max_length=MAX_FIELD_CHARS, pattern=r"\S")]  # kept as typed
# A line of the library block (core.domain.prompts.LibraryWording): spaces and line breaks read as one space,
# and a blank one is None, the neutral default.
Wording = Annotated[Annotated[str, StringConstraints(max_length=MAX_WORDING_CHARS)] | None,
                    BeforeValidator(lambda value: (" ".join(value.split()) or None) if isinstance(value, str) else value)]


def _default_model() -> str:
    return get_settings().model


class TaskSettings(BaseModel):
    """Everything a person sets about a task (not its data); the unit of editing, export and audit.

    The constraints are declared on the fields: constructing settings checks them and raises InvalidInput
    with one line naming the setting. `from_task` and `draft` build settings without a check (what is
    stored, a blank form); `validate` checks those.
    """

    model_config = ConfigDict(strict=True, extra="forbid")

    name: Name = Field(title="the task name", description=f"must be 1 to {MAX_NAME_CHARS} characters")
    instructions: NonBlankText = Field(title="the instructions (the agent's system prompt)")
    description: Text = Field("", title="description")
    answer_format: Text = Field("", title="answer format")
    agent_mode: Literal[AGENT_MODES] = Field("direct", title="agent mode")  # type: ignore[valid-type]
    policy_model: ModelName = Field(default_factory=_default_model, title="the policy model")
    learner_model: ModelName = Field(default_factory=_default_model, title="the learner model")
    judge_model: ModelName = Field(default_factory=_default_model, title="the judge model")
    simulator_model: str = Field("", title="the user simulator model",
                                 description="conversation tasks; empty means the policy model")
    max_turns: int = Field(4, ge=1, le=20, title="the most agent turns in a conversation")
    reward_method: str = Field("math", title="reward method")
    reward_settings: dict[str, Any] = Field(default_factory=dict, title="reward settings")
    library_header: Wording = Field(None, title="the library header",
                                    description=f"must be at most {MAX_WORDING_CHARS} characters (one line)")
    examples_intro: Wording = Field(None, title="the worked examples' intro",
                                    description=f"must be at most {MAX_WORDING_CHARS} characters (one line)")

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidInput(_task_problem(exc)) from None

    @field_validator("reward_method")
    @classmethod
    def _known_method(cls, name: str) -> str:
        return get_method(name).name

    @model_validator(mode="after")
    def _method_settings(self) -> TaskSettings:
        check_settings(self.reward_method, self.reward_settings)
        return self

    @classmethod
    def draft(cls, **values: Any) -> TaskSettings:
        """Settings without a check (defaults for the rest): a blank form, or a form's first values."""
        return cls.model_construct(**values)

    @classmethod
    def from_task(cls, task: Task) -> TaskSettings:
        """The task's stored settings as they are (not checked: a stored task may predate a rule)."""
        return cls.draft(**{name: getattr(task, name) for name in cls.model_fields} | {
            "reward_settings": dict(task.reward_settings or {})})

    @classmethod
    def from_dict(cls, data: Any) -> TaskSettings:
        """Settings from a file's `task` object; unknown or mistyped fields are refused by name."""
        if not isinstance(data, dict):
            raise InvalidInput("the task settings must be a JSON object")
        return cls(**data)

    def to_dict(self) -> dict:
        return self.model_dump()

    def normalized(self) -> TaskSettings:
        """A copy with the surrounding spaces people type by accident removed from names."""
        return self.model_copy(update={
            name: value.strip() for name in ("name", "policy_model", "learner_model", "judge_model", "simulator_model")
            if isinstance(value := getattr(self, name), str)})

    def validate(self) -> TaskSettings:  # type: ignore[override]
        """The settings checked (and names stripped); InvalidInput names the first setting that a run, the
        judge or the queue could not use."""
        return type(self)(**self.model_dump())


def _task_problem(exc: ValidationError) -> str:
    """One line naming the setting: unknown keys first, then missing ones, then the first broken field."""
    errors = exc.errors()
    unknown = [str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        return (f"unknown task setting(s) {', '.join(map(repr, sorted(unknown)))}; "
                f"known: {', '.join(sorted(TaskSettings.model_fields))}")
    missing = [str(e["loc"][0]) for e in errors if e["type"] == "missing"]
    if missing:
        return f"the task settings lack {' and '.join(missing)}"
    return _field_problem(errors[0])


def _field_problem(error: ErrorDetails) -> str:
    kind, ctx = error["type"], error.get("ctx", {})
    if kind == "value_error":
        return str(ctx["error"])
    field = TaskSettings.model_fields.get(str(error["loc"][0])) if error["loc"] else None
    if field is None:
        return str(error["msg"])
    title = field.title or ""
    if kind in ("string_too_short", "string_too_long") and field.description:
        return f"{title} {field.description}"
    if kind in ("string_too_short", "string_pattern_mismatch"):
        return f"{title} must not be empty"
    if kind == "string_too_long":
        return f"{title} is longer than {ctx['max_length']:,} characters"
    if kind == "string_type":
        return f"{title} must be text"
    if kind == "dict_type":
        return f"{title} must be a JSON object (a dictionary)"
    if kind == "literal_error":
        return f"unknown {title} {error['input']!r}; use one of {', '.join(get_args(field.annotation))}"
    return f"{title}: {error['msg']}"


def json_setting(name: str, text: object) -> list:
    """A list setting typed as JSON; a typo is a message naming the setting, not a traceback."""
    try:
        value = json.loads(str(text) or "[]")
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{name} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(value, list):
        raise InvalidInput(f"{name} must be a JSON list of objects")
    return value


def form_setting(name: str, value: object) -> object:
    """A reward setting as a form's input gives it, as the value TaskSettings checks: phrases one a line, a
    pattern as typed, criteria trimmed, a rubric or rules as a JSON list, a count as int, shares and tolerances
    as float. The Tasks page sends each input through here, so a form and a task file meet one set of rules."""
    if name == "phrases":
        return [line.strip() for line in str(value).splitlines() if line.strip()]
    if name == "pattern":
        return str(value)
    if name == "criteria":
        return str(value).strip()
    if name in ("rubric", "rules"):
        return json_setting(name, value)
    if name == "labels_per_rollout":
        return int(value)
    if name in ("rel_tol", "abs_tol", "spot_check_share"):
        return float(value)
    return value


def save_task(engine: Engine, settings: TaskSettings, actor: str, *, original_name: str | None = None,
              kind: str = "single") -> Task:
    """Create a task of `kind` (with its default library), or update the one named `original_name` (whose
    kind stays: its samples are answers' queries or conversations' scenarios, not both).

    A rename is allowed when the new name is free. Only an admin may do either; the audit event keeps
    the settings before and after.
    """
    settings = settings.validate()
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "editing tasks")
        if original_name is None:
            if queries.task_by_name(session, settings.name) is not None:
                raise InvalidInput(f"a task named {settings.name!r} exists already; choose another name")
            task = Task(**settings.to_dict(), kind=_kind(kind))
            session.add(task)
            session.flush()
            ensure_library(session, task, "default", actor=actor)
            session.add(AuditEvent(actor=actor, action="task.create", object_type="task", object_id=task.id,
                                   after={**settings.to_dict(), "kind": task.kind}))
            return task
        task = get_task(session, original_name)
        before = TaskSettings.from_task(task).to_dict()
        if settings.name != task.name and queries.task_by_name(session, settings.name) is not None:
            raise InvalidInput(f"cannot rename {task.name!r}: a task named {settings.name!r} exists already")
        if before == settings.to_dict():
            return task
        for name, value in settings.to_dict().items():
            setattr(task, name, value)
        session.add(task)
        session.add(AuditEvent(actor=actor, action="task.update", object_type="task", object_id=task.id,
                               before=before, after=settings.to_dict()))
        return task


def export_task(session: Session, task: Task) -> dict:
    """The task's settings, kind, every sample and (when it has any) its personas, in the file format
    import_task reads."""
    exported = {
        "format": FORMAT,
        "version": VERSION,
        "kind": task.kind,
        "task": TaskSettings.from_task(task).to_dict(),
        "samples": [
            {"id": s.external_id, "query": s.query, "reference": s.reference, "rubric": s.rubric,
             "split": s.split, "meta": dict(s.meta or {})}
            for s in queries.samples(session, task.id)
        ],
    }
    personas = task_personas(session, task.id)
    if personas:
        exported["personas"] = persona_dicts(personas)
    return exported


def task_personas(session: Session, task_id: int) -> list[Persona]:
    """A task's personas in the order they were saved (the order of the file they came from)."""
    rows = session.exec(select(PersonaRow).where(PersonaRow.task_id == task_id).order_by(PersonaRow.id))
    return [Persona(name=row.name, description=row.description, segment=row.segment,
                    hidden_facts=list(row.hidden_facts or [])) for row in rows]


def save_personas(engine: Engine, task_name: str, personas: list[Persona], actor: str) -> int:
    """Replace a task's personas with `personas` (admin only), all or nothing; returns how many it has now.

    They are checked again (unique names, the same rules as a file), since a caller may have built them
    by hand; the audit event keeps the personas before and after.
    """
    personas = personas_from_objects(persona_dicts(personas), "the personas")
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "editing personas")
        task = get_task(session, task_name)
        before, after = persona_dicts(task_personas(session, task.id)), persona_dicts(personas)
        if before != after:  # saving the same file twice changes nothing and audits nothing
            _write_personas(session, task, personas)
            session.add(AuditEvent(actor=actor, action="task.personas", object_type="task", object_id=task.id,
                                   before={"personas": before}, after={"personas": after}))
        return len(personas)


def _write_personas(session: Session, task: Task, personas: list[Persona]) -> None:
    """Delete, then insert: the deletion runs first as its own statement, so a kept name does not collide
    with its old row on the (task, name) key (a flush would order the inserts first)."""
    session.exec(delete(PersonaRow).where(PersonaRow.task_id == task.id))  # type: ignore[call-overload]
    for persona in personas:
        session.add(PersonaRow(task_id=task.id, **persona.model_dump()))


def export_task_json(session: Session, task: Task) -> str:
    return json.dumps(export_task(session, task), ensure_ascii=False, indent=2)


def export_filename(name: str) -> str:
    """A file name safe on every system: tfgrpo-task-<slug>.json."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or "task"
    return f"tfgrpo-task-{slug}.json"


@dataclass
class TaskFile:
    """Everything a task file holds, checked: what import_task writes."""

    settings: TaskSettings
    samples: list[SampleRow]
    kind: str = "single"
    personas: list[Persona] = field(default_factory=list)


def read_task_file(text: str | bytes, *, rename: str | None = None) -> tuple[TaskSettings, list[SampleRow]]:
    """Parse and check a whole task file without touching the database; ValueError names the problem."""
    contents = read_task_contents(text, rename=rename)
    return contents.settings, contents.samples


def read_task_contents(text: str | bytes, *, rename: str | None = None) -> TaskFile:
    """read_task_file with the task's kind and personas too; a file without them (older exports) is a
    single task without personas."""
    if isinstance(text, bytes):
        if len(text) > MAX_FILE_BYTES:
            raise InvalidInput(f"the file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MB")
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"the file is not UTF-8 text (byte {exc.start})") from exc
    elif len(text.encode("utf-8")) > MAX_FILE_BYTES:
        raise InvalidInput(f"the file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MB")
    if not text.strip():
        raise InvalidInput("the file is empty")
    try:
        data = json_input.loads(text, "the task file")
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"not valid JSON: line {exc.lineno}: {exc.msg}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InvalidInput(f"not a task file: it must be a JSON object with \"format\": \"{FORMAT}\" "
                         "(export one from the Tasks page)")
    if data.get("version") != VERSION:
        raise InvalidInput(f"unsupported task file version {data.get('version')!r}; this studio reads version {VERSION}")
    task_data = data.get("task")
    if rename is not None and rename.strip() and isinstance(task_data, dict):
        task_data = {**task_data, "name": rename}
    settings = TaskSettings.from_dict(task_data)
    samples = data.get("samples", [])
    if not isinstance(samples, list):
        raise InvalidInput("\"samples\" must be a JSON array")
    return TaskFile(settings, _sample_rows(samples), _kind(data.get("kind", "single")),
                    _personas(data.get("personas", [])))


def _kind(kind: Any) -> str:
    if kind not in TASK_KINDS:
        raise InvalidInput(f"unknown task kind {kind!r}; use one of {', '.join(TASK_KINDS)}")
    return kind


def _personas(items: Any) -> list[Persona]:
    """The file's personas, by the rules and messages of a persona file (core.domain.personas)."""
    if not isinstance(items, list):
        raise InvalidInput("\"personas\" must be a JSON array of persona objects")
    return personas_from_objects(items, "personas")


def _sample_rows(samples: list) -> list[SampleRow]:
    rows: list[SampleRow] = []
    first_seen: dict[str, int] = {}
    for number, item in enumerate(samples, start=1):
        where = f"sample {number}"
        if not isinstance(item, dict):
            raise InvalidInput(f"{where}: expected a JSON object")
        unknown = sorted(set(item) - set(SAMPLE_KEYS))
        if unknown:
            raise InvalidInput(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(SAMPLE_KEYS)}")
        sample_id = item.get("id")
        if isinstance(sample_id, int) and not isinstance(sample_id, bool):
            sample_id = str(sample_id)
        if not isinstance(sample_id, str) or not sample_id.strip():
            raise InvalidInput(f"{where}: id is missing or empty")
        if sample_id in first_seen:
            raise InvalidInput(f"{where}: duplicate id {sample_id!r} (first used by sample {first_seen[sample_id]})")
        first_seen[sample_id] = number
        query = item.get("query")
        if not isinstance(query, str) or not query.strip():
            raise InvalidInput(f"{where} ({sample_id!r}): query is missing or empty")
        for key in ("reference", "rubric"):
            if item.get(key) is not None and not isinstance(item[key], str):
                raise InvalidInput(f"{where} ({sample_id!r}): {key} must be text or null")
        split = item.get("split", "train")
        if split not in SPLITS:
            raise InvalidInput(f"{where} ({sample_id!r}): split must be train, validation or test, got {split!r}")
        meta = item.get("meta") or {}
        if not isinstance(meta, dict):
            raise InvalidInput(f"{where} ({sample_id!r}): meta must be a JSON object")
        sizes = {"id": len(sample_id), "query": len(query), "reference": len(item.get("reference") or ""),
                 "rubric": len(item.get("rubric") or ""), "meta": len(json.dumps(meta, ensure_ascii=False))}
        for key, size in sizes.items():
            if size > MAX_FIELD_CHARS:
                raise InvalidInput(f"{where} ({sample_id!r}): {key} is longer than {MAX_FIELD_CHARS:,} characters")
        for key in ("id", "query", "reference", "rubric"):
            if isinstance(item.get(key), str) and datasets.formula_like(item[key]):
                raise InvalidInput(f"{where} ({sample_id!r}): {key} looks like a spreadsheet formula; remove it or "
                                 "put an apostrophe before it")
        rows.append(SampleRow(external_id=sample_id, query=query, reference=item.get("reference"),
                              rubric=item.get("rubric"), split=split, meta=meta))
    return rows


def import_task(engine: Engine, text: str | bytes, actor: str, *, rename: str | None = None) -> Task:
    """Create a task with its samples and default library from a task file, all or nothing (admin only).

    An existing name is refused rather than merged: importing under `rename` keeps both.
    """
    contents = read_task_contents(text, rename=rename)
    settings, rows = contents.settings, contents.samples
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "importing tasks")
        if queries.task_by_name(session, settings.name) is not None:
            raise InvalidInput(f"a task named {settings.name!r} exists already; import it under another name "
                             "(rename)")
        task = Task(**settings.to_dict(), kind=contents.kind)
        session.add(task)
        session.flush()
        added = add_samples(session, task, rows)
        _write_personas(session, task, contents.personas)
        ensure_library(session, task, "default", actor=actor)
        session.add(AuditEvent(actor=actor, action="task.import", object_type="task", object_id=task.id,
                               after={**settings.to_dict(), "kind": contents.kind, "samples": added,
                                      "personas": len(contents.personas)}))
        return task


def columns_of(data: bytes, filename: str) -> list[str]:
    """The column names of a dataset file, for the mapping form (the keys of the first 50 JSON objects); []
    for anything unreadable, never an error: parse_dataset says what is wrong."""
    return datasets.column_names(data, filename, limit=50)
