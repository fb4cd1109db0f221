"""Task settings and task files: create, edit, export and import a task through one code path.

The Tasks page, the CLI and scripts all call these functions, so a setting that one of them accepts
the others accept too, and every change is checked for the admin role and written to the audit log.
An import is validated completely before the first row is written: a bad file changes nothing.

Reward settings are an open dictionary. The keys the chosen method reads (METHOD_SETTINGS) are
checked; any other key is kept unchecked, so a file written by a newer studio, or the settings of a
method a person switched away from, survive a round trip instead of vanishing silently.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core import datasets
from core.agent import AGENT_MODES
from core.datasets import SPLITS, SampleRow
from core.errors import InvalidInput
from core.judge import SCALES
from core.people import require_role
from core.rewards import METHODS
from core.settings import get_settings
from core.tasks import add_samples, get_task
from core.versions import ensure_library
from storage import queries
from storage.db import session_scope
from storage.models import AuditEvent, Task

FORMAT = "tfgrpo-task"
VERSION = 1
MAX_NAME_CHARS = 100
MAX_FIELD_CHARS, MAX_FILE_BYTES = datasets.MAX_FIELD_CHARS, datasets.MAX_FILE_BYTES
MAX_LABELS_PER_ROLLOUT = 5
SAMPLE_KEYS = ("id", "query", "reference", "rubric", "split", "meta")

# The reward_settings keys each method reads (core/rewards.py, core/judge.py, core/labeling.py).
METHOD_SETTINGS: dict[str, tuple[str, ...]] = {
    "math": (),
    "exact": (),
    "numeric": ("rel_tol", "abs_tol"),
    "regex": ("pattern", "ignore_case", "full_match"),
    "contains_all": ("phrases", "partial", "ignore_case"),
    "judge": ("criteria", "scale"),
    "human": ("criteria", "scale", "labels_per_rollout"),
    "judge_human": ("criteria", "scale", "labels_per_rollout", "spot_check_share"),
}
SETTING_KEYS = frozenset(key for keys in METHOD_SETTINGS.values() for key in keys)


@dataclass
class TaskSettings:
    """Everything a person sets about a task (not its data); the unit of editing, export and audit."""

    name: str
    instructions: str
    description: str = ""
    answer_format: str = ""
    agent_mode: str = "direct"
    policy_model: str = field(default_factory=lambda: get_settings().model)
    learner_model: str = field(default_factory=lambda: get_settings().model)
    judge_model: str = field(default_factory=lambda: get_settings().model)
    reward_method: str = "math"
    reward_settings: dict = field(default_factory=dict)

    @classmethod
    def from_task(cls, task: Task) -> TaskSettings:
        return cls(**{f.name: getattr(task, f.name) for f in fields(cls)} | {
            "reward_settings": dict(task.reward_settings or {})})

    @classmethod
    def from_dict(cls, data: Any) -> TaskSettings:
        """Settings from a file's `task` object; unknown or mistyped fields are refused by name."""
        if not isinstance(data, dict):
            raise InvalidInput("the task settings must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidInput(f"unknown task setting(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(sorted(known))}")
        missing = [name for name in ("name", "instructions") if name not in data]
        if missing:
            raise InvalidInput(f"the task settings lack {' and '.join(missing)}")
        settings = cls(**data).normalized()
        settings.validate()
        return settings

    def to_dict(self) -> dict:
        return asdict(self)

    def normalized(self) -> TaskSettings:
        """A copy with the surrounding spaces people type by accident removed from names."""
        def strip(value: Any) -> Any:
            return value.strip() if isinstance(value, str) else value

        return replace(self, name=strip(self.name), policy_model=strip(self.policy_model),
                       learner_model=strip(self.learner_model), judge_model=strip(self.judge_model),
                       reward_settings=dict(self.reward_settings or {}) if isinstance(self.reward_settings, dict)
                       else self.reward_settings)

    def validate(self) -> None:
        """Raise ValueError naming the first setting that a run, the judge or the queue could not use."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "reward_settings":
                if not isinstance(value, dict):
                    raise InvalidInput("reward settings must be a JSON object (a dictionary)")
            elif not isinstance(value, str):
                raise InvalidInput(f"{f.name.replace('_', ' ')} must be text")
        if not self.name.strip() or len(self.name) > MAX_NAME_CHARS:
            raise InvalidInput(f"the task name must be 1 to {MAX_NAME_CHARS} characters")
        if not self.instructions.strip():
            raise InvalidInput("the instructions (the agent's system prompt) must not be empty")
        for name in ("description", "instructions", "answer_format"):
            if len(getattr(self, name)) > MAX_FIELD_CHARS:
                raise InvalidInput(f"{name.replace('_', ' ')} is longer than {MAX_FIELD_CHARS:,} characters")
        if self.agent_mode not in AGENT_MODES:
            raise InvalidInput(f"unknown agent mode {self.agent_mode!r}; use one of {', '.join(AGENT_MODES)}")
        for name in ("policy_model", "learner_model", "judge_model"):
            if not getattr(self, name).strip():
                raise InvalidInput(f"the {name.replace('_', ' ')} must not be empty")
        if self.reward_method not in METHODS:
            raise InvalidInput(f"unknown reward method {self.reward_method!r}; use one of {', '.join(METHODS)}")
        check_reward_settings(self.reward_method, self.reward_settings)


def check_reward_settings(method: str, settings: dict) -> None:
    """Check the keys `method` reads; others are kept as they are (see the module docstring)."""
    used = METHOD_SETTINGS.get(method, ())

    def present(key: str) -> bool:
        return key in used and settings.get(key) is not None

    for key in ("rel_tol", "abs_tol"):
        if present(key):
            value = settings[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise InvalidInput(f"{key} must be a number of 0 or more, got {value!r}")
    for key in ("ignore_case", "full_match", "partial"):
        if present(key) and not isinstance(settings[key], bool):
            raise InvalidInput(f"{key} must be true or false, got {settings[key]!r}")
    if present("pattern"):
        pattern = settings["pattern"]
        if not isinstance(pattern, str):
            raise InvalidInput("pattern must be text (a regular expression)")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidInput(f"pattern is not a valid regular expression: {exc}") from exc
    if present("phrases"):
        phrases = settings["phrases"]
        if not (isinstance(phrases, str) or (isinstance(phrases, list) and all(isinstance(p, str) for p in phrases))):
            raise InvalidInput("phrases must be a list of text phrases (or one phrase)")
    if present("criteria") and not isinstance(settings["criteria"], str):
        raise InvalidInput("criteria must be text")
    if present("criteria") and len(settings["criteria"]) > MAX_FIELD_CHARS:
        raise InvalidInput(f"criteria are longer than {MAX_FIELD_CHARS:,} characters")
    if present("scale") and settings["scale"] not in SCALES:
        raise InvalidInput(f"scale must be one of {', '.join(SCALES)}, got {settings['scale']!r}")
    if present("labels_per_rollout"):
        value = settings["labels_per_rollout"]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LABELS_PER_ROLLOUT:
            raise InvalidInput(f"labels_per_rollout must be a whole number from 1 to {MAX_LABELS_PER_ROLLOUT}, "
                             f"got {value!r}")
    if present("spot_check_share"):
        value = settings["spot_check_share"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise InvalidInput(f"spot_check_share must be a number from 0 to 1, got {value!r}")


def save_task(engine: Engine, settings: TaskSettings, actor: str, *, original_name: str | None = None) -> Task:
    """Create a task (with its default library), or update the one named `original_name`.

    A rename is allowed when the new name is free. Only an admin may do either; the audit event keeps
    the settings before and after.
    """
    settings = settings.normalized()
    settings.validate()
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "editing tasks")
        if original_name is None:
            if queries.task_by_name(session, settings.name) is not None:
                raise InvalidInput(f"a task named {settings.name!r} exists already; choose another name")
            task = Task(**settings.to_dict())
            session.add(task)
            session.flush()
            ensure_library(session, task, "default", actor=actor)
            session.add(AuditEvent(actor=actor, action="task.create", object_type="task", object_id=task.id,
                                   after=settings.to_dict()))
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
    """The task's settings and every sample, in the file format import_task reads."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "task": TaskSettings.from_task(task).to_dict(),
        "samples": [
            {"id": s.external_id, "query": s.query, "reference": s.reference, "rubric": s.rubric,
             "split": s.split, "meta": dict(s.meta or {})}
            for s in queries.samples(session, task.id)
        ],
    }


def export_task_json(session: Session, task: Task) -> str:
    return json.dumps(export_task(session, task), ensure_ascii=False, indent=2)


def export_filename(name: str) -> str:
    """A file name safe on every system: tfgrpo-task-<slug>.json."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or "task"
    return f"tfgrpo-task-{slug}.json"


def read_task_file(text: str | bytes, *, rename: str | None = None) -> tuple[TaskSettings, list[SampleRow]]:
    """Parse and check a whole task file without touching the database; ValueError names the problem."""
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
        data = json.loads(text)
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
    return settings, _sample_rows(samples)


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
            raise InvalidInput(f"{where} ({sample_id!r}): split must be train or test, got {split!r}")
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
    settings, rows = read_task_file(text, rename=rename)
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "importing tasks")
        if queries.task_by_name(session, settings.name) is not None:
            raise InvalidInput(f"a task named {settings.name!r} exists already; import it under another name "
                             "(rename)")
        task = Task(**settings.to_dict())
        session.add(task)
        session.flush()
        added = add_samples(session, task, rows)
        ensure_library(session, task, "default", actor=actor)
        session.add(AuditEvent(actor=actor, action="task.import", object_type="task", object_id=task.id,
                               after={**settings.to_dict(), "samples": added}))
        return task


def columns_of(data: bytes, filename: str) -> list[str]:
    """The column names of a dataset file, for the mapping form; [] for anything unreadable, never an error.

    CSV: the header row. JSON lines or a JSON array: the keys of the first objects, in order.
    """
    try:
        text = data.decode("utf-8-sig")
        suffix = Path(filename).suffix.lower()
        if suffix == ".csv":
            header = next(csv.reader(io.StringIO(text, newline="")), [])
            return list(dict.fromkeys(name.strip() for name in header if name.strip()))
        if suffix not in (".jsonl", ".json"):
            return []
        if text.lstrip().startswith("["):
            objects = [item for item in json.loads(text)[:50] if isinstance(item, dict)]
        else:
            objects = []
            for line in text.split("\n"):
                if len(objects) >= 50:
                    break
                try:
                    value = json.loads(line) if line.strip() else None
                except ValueError:
                    continue
                if isinstance(value, dict):
                    objects.append(value)
        return list(dict.fromkeys(str(key) for obj in objects for key in obj))
    except Exception:  # noqa: BLE001  (a broken file is reported by parse_dataset, not here)
        return []
