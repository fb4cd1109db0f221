"""Personas and scenarios: the people a `conversation` task's user simulator plays, kept as data.

A persona says how a user talks and what they hide; a scenario says how a conversation opens and what a
good one achieves. They are pydantic models so that a file, a task export and the database all pass
through the same rules, and a misspelt field is an error rather than silently ignored.

This module is pure (no database, no settings) so that prompt-building code may import it; storing a
task's personas is in core/records/tasks/task_io.py (save_personas, task_personas). A file is checked whole before
anything is returned: a bad one fails with one line naming the file, the item or row, and the field.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)
from pydantic_core import ErrorDetails

from core.domain import json_input
from core.errors import InvalidInput

TASK_KINDS = ("single", "conversation")  # single: one answer per query; conversation: played with personas
SEGMENT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,39}$"
MAX_NAME_CHARS = 80
MAX_FIELD_CHARS = 20_000  # as for dataset cells: far beyond a real description, small enough to send a model
MAX_FILE_BYTES = 5 * 1024 * 1024  # a persona file is hand-written; anything larger is the wrong file
LIST_SEPARATOR = ";"  # between hidden facts (or rules) in one CSV cell
Model = TypeVar("Model", bound=BaseModel)


def _segment(value: object) -> object:
    """Segments group results by kind of user, so they must be short, stable tags (`at_risk`); case and
    surrounding spaces are forgiven (`Resistant` is `resistant`), and the error quotes what was written."""
    if not isinstance(value, str):
        return value  # the str type check reports it
    tag = value.strip().lower()
    if not re.fullmatch(SEGMENT_PATTERN, tag):
        raise ValueError(f"segment {value!r} must be a short tag like at_risk")
    return tag


def _no_blank_items(values: list[str]) -> list[str]:
    """A blank fact or rule says nothing and would confuse the simulator; surrounding spaces are dropped."""
    cleaned = [item.strip() for item in values]
    if any(not item for item in cleaned):
        raise ValueError("must not contain empty entries")
    return cleaned


NonEmpty = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_FIELD_CHARS)]
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_NAME_CHARS)]
Segment = Annotated[str, BeforeValidator(_segment)]
TextList = Annotated[list[Annotated[str, StringConstraints(max_length=MAX_FIELD_CHARS)]],
                     AfterValidator(_no_blank_items)]


class Persona(BaseModel):
    """A user the simulator plays: how they talk, what they want, and the facts the agent must find out."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    description: NonEmpty
    segment: Segment
    hidden_facts: TextList = Field(default_factory=list)


class Scenario(BaseModel):
    """One conversation to play: which persona, how it opens, and what a good conversation achieves."""

    model_config = ConfigDict(extra="forbid")

    persona: Name
    opening: NonEmpty
    goal: NonEmpty
    must: TextList = Field(default_factory=list)
    must_not: TextList = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------- files


def parse_personas(text: str | bytes, filename: str) -> list[Persona]:
    """The personas of a .json file (a list of objects, or {"personas": [...]}) or a .csv file (columns
    name, description, segment, hidden_facts with facts separated by `;`); InvalidInput names the problem."""
    records = _records(_text(text, filename), filename, "personas", Persona, ("hidden_facts",))
    return personas_from_objects(records, filename)


def parse_scenarios(text: str | bytes, filename: str, personas: Iterable[Persona]) -> list[Scenario]:
    """The scenarios of a .json or .csv file (must and must_not `;`-separated in CSV); each scenario's
    persona must be one of `personas`, so a typo is caught here rather than mid-conversation."""
    records = _records(_text(text, filename), filename, "scenarios", Scenario, ("must", "must_not"))
    scenarios = _build_all(Scenario, records, filename)
    known = [persona.name for persona in personas]
    for number, scenario in enumerate(scenarios, start=1):
        if scenario.persona not in known:
            raise InvalidInput(f"{filename}: {_item(records, number)}: persona {scenario.persona!r} is not one of "
                               f"the personas ({', '.join(known) or 'there are none'})")
    return scenarios


def personas_from_objects(items: list, where: str) -> list[Persona]:
    """Check a list of persona objects (from a file or a task file's `personas`); names must be unique,
    compared without case, because the simulator and the results find a persona by its name."""
    personas = _build_all(Persona, items, where)
    first_seen: dict[str, int] = {}
    for number, persona in enumerate(personas, start=1):
        key = persona.name.casefold()
        if key in first_seen:
            raise InvalidInput(f"{where}: {_item(items, number)}: name {persona.name!r} is used twice "
                               f"(first by {_item(items, first_seen[key])})")
        first_seen[key] = number
    return personas


def persona_dicts(personas: Iterable[Persona]) -> list[dict]:
    """Personas as plain JSON objects, the form a task file and an audit event hold."""
    return [persona.model_dump() for persona in personas]


def split_list_cell(cell: str) -> list[str]:
    """A CSV cell (or an editor's cell) that holds a list: its items between `;`, trimmed, empty ones dropped."""
    return [part.strip() for part in cell.split(LIST_SEPARATOR) if part.strip()]


def join_list_cell(items: Iterable[str]) -> str:
    """The items as one cell, the form split_list_cell reads back."""
    return f"{LIST_SEPARATOR} ".join(items)


class _Row(dict):
    """A CSV row remembering its data-row number, so messages say "row 3" rather than "item 3"."""

    number: int = 0


def _item(items: list, number: int) -> str:
    """How a message names the number-th record: a CSV data row or a JSON list item."""
    record = items[number - 1] if 0 < number <= len(items) else None
    return f"row {record.number}" if isinstance(record, _Row) else f"item {number}"


def check_file_size(size: int, filename: str) -> None:
    """Refuse a persona file over MAX_FILE_BYTES; a caller holding only a path checks before reading it."""
    if size > MAX_FILE_BYTES:
        raise InvalidInput(f"{filename}: file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MB; "
                           "is this the right file?")


def _text(data: str | bytes, filename: str) -> str:
    """The file as text: size capped, UTF-8 only (a BOM is allowed), never empty."""
    check_file_size(len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass")), filename)
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            raise InvalidInput(f"{filename}: line {line}: not valid UTF-8 (byte 0x{data[exc.start]:02x}); "
                               "save the file as UTF-8") from None
    if "\x00" in data:
        raise InvalidInput(f"{filename}: contains a NUL byte, so this is not a text file; save it as UTF-8 text")
    if not data.strip():
        raise InvalidInput(f"{filename}: the file is empty")
    return data.removeprefix("\ufeff")


def _records(text: str, filename: str, key: str, model: type[BaseModel], list_fields: tuple[str, ...]) -> list:
    """The file's records (dicts) by its suffix, before any field is checked."""
    suffix = Path(filename).suffix.lower()
    if suffix == ".json":
        records = _json_records(text, filename, key)
    elif suffix == ".csv":
        records = _csv_records(text, filename, model, list_fields)
    else:
        raise InvalidInput(f"{filename}: unsupported file type {suffix or '(none)'!r}: use .json or .csv")
    if not records:
        raise InvalidInput(f"{filename}: the file holds no {key}")
    return records


def _json_records(text: str, filename: str, key: str) -> list:
    """A JSON list, or an object whose only key is `key` holding one; the items are checked later."""
    try:
        data = json_input.loads(text, filename)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{filename}: line {exc.lineno}: not valid JSON ({exc.msg})") from None
    if isinstance(data, dict) and set(data) == {key}:
        data = data[key]
    if not isinstance(data, list):
        raise InvalidInput(f"{filename}: expected a JSON list of {key} or {{\"{key}\": [...]}}, "
                           f"got {_json_type(data)}")
    return data


def _csv_records(text: str, filename: str, model: type[BaseModel], list_fields: tuple[str, ...]) -> list[_Row]:
    """CSV rows as dicts with the model's field names; header names compare without case or spaces, and
    a list field's cell is split on `;`. Missing or unknown columns are refused before any row."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [name.strip().lower() for name in next(reader)]
        rows = list(reader)
    except csv.Error as exc:
        raise InvalidInput(f"{filename}: not valid CSV ({exc})") from None
    _check_header(header, filename, model)
    records: list[_Row] = []
    for number, cells in enumerate((cells for cells in rows if any(c.strip() for c in cells)), start=1):
        if len(cells) > len(header):
            raise InvalidInput(f"{filename}: row {number}: has {len(cells)} cells but the header has {len(header)}")
        record = _Row(zip(header, cells, strict=False))
        record.number = number
        for name in list_fields:
            if name in record:
                record[name] = split_list_cell(record[name])
        records.append(record)
    return records


def _check_header(header: list[str], filename: str, model: type[BaseModel]) -> None:
    known = list(model.model_fields)
    required = [name for name, field in model.model_fields.items() if field.is_required()]
    missing = [name for name in required if name not in header]
    unknown = [name for name in header if name not in known]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if missing or unknown or repeated:
        problem = (f"missing column(s) {', '.join(map(repr, missing))}" if missing
                   else f"unknown column(s) {', '.join(map(repr, unknown))}" if unknown
                   else f"column(s) {', '.join(map(repr, repeated))} appear twice")
        raise InvalidInput(f"{filename}: {problem}; the columns are {', '.join(known)}")


def _build_all(model: type[Model], items: list, where: str) -> list[Model]:
    return [_build(model, item, where, _item(items, number)) for number, item in enumerate(items, start=1)]


def _build(model: type[Model], item: Any, where: str, label: str) -> Model:
    """One record as `model`; the first problem becomes "<where>: <label>: <field> <problem>"."""
    if not isinstance(item, dict):
        raise InvalidInput(f"{where}: {label}: expected a JSON object, got {_json_type(item)}")
    try:
        return model(**{str(key): value for key, value in item.items()})
    except ValidationError as exc:
        raise InvalidInput(f"{where}: {label}: {_problem(exc.errors()[0], model)}") from None


_PHRASES: dict[str, Callable[[str, ErrorDetails], str]] = {
    "missing": lambda field, _: f"{field} is missing",
    "string_too_short": lambda field, _: f"{field} must not be empty",
    "string_too_long": lambda field, e: f"{field} is longer than {e.get('ctx', {}).get('max_length', 0):,} characters",
    "string_type": lambda field, _: f"{field} must be text",
    "list_type": lambda field, _: f"{field} must be a list of text",
}


def _problem(error: ErrorDetails, model: type[BaseModel]) -> str:
    """A pydantic error as words naming the field; an unknown field lists the known ones (a typo's fix)."""
    loc = error["loc"]
    field = str(loc[0]) if loc else "the object"
    if len(loc) > 1:
        field = f"{field} entry {int(loc[1]) + 1}" if isinstance(loc[1], int) else field
    if error["type"] == "extra_forbidden":
        return f"unknown field {field!r}; the fields are {', '.join(model.model_fields)}"
    if error["type"] == "value_error":
        message = str(error.get("ctx", {}).get("error", error["msg"]))
        return message if message.startswith(field.split()[0]) else f"{field} {message}"
    phrase = _PHRASES.get(error["type"])
    return phrase(field, error) if phrase else f"{field}: {error['msg']}"


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "true or false", type(None): "null"}
    return names.get(type(value), "a number")
