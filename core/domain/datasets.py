"""Reading a user's dataset file (JSONL, JSON or CSV) into sample rows.

The whole file is validated before anything is returned, so an import either succeeds completely or
fails with one message that names the file, the offending row and the problem; nothing is ever
half-read. Besides the shape of the file this rejects what would hurt later: files or fields too
big to show or send to a model, text that is not UTF-8, and cells a spreadsheet would run as a
formula when the data is exported again.

A row without an id is known by its content: its id is a hash of its query and reference (sample_id),
so the same row gets the same id from any file, and a row is a duplicate only when its content is one
(DatasetFile.repeats within a file, compare_with_stored against a task's samples).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from core.domain import json_input
from core.domain.personas import Persona, Scenario
from core.errors import InvalidInput

TARGETS = ("id", "query", "reference", "rubric", "split", "meta")
ALIASES = {"criteria": "rubric"}
SPLITS = ("train", "validation", "test")  # validation: the gate's queries (core/grpo/gate.py)
MB = 1024 * 1024
MAX_FILE_BYTES = 20 * MB
MAX_FIELD_CHARS = 20_000
HOLD_OUT_SEED = 0  # the page and the CLI use it, so one file gives one split wherever it is added
SAMPLE_ID_PREFIX = "q"  # a row without an id is stored as q-<16 hex digits of its content's hash>
SAMPLE_ID_CHARS = 16  # 64 bits: rows of different content in one task do not meet (scenarios keep their 10)
MAX_NOTES = 20  # rows named one by one as not added; more are counted in one last note
MAX_QUOTE_CHARS = 120  # a text quoted in a message is cut to this many characters

# The one rule for columns nobody mapped (the CLI and the Tasks page): the first of these names the file
# has, in this order, compared without case. Mapping a synonym is said ("mapped question→query").
SYNONYMS: dict[str, tuple[str, ...]] = {
    "id": ("id",),
    "query": ("query", "question", "prompt", "input"),
    "reference": ("reference", "answer", "target", "solution"),
    "rubric": ("rubric", "criteria"),
    "split": ("split",),
}
_SIGNED_NUMBER = re.compile(r"[+-](\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?%?")
# Fields up to the whole file's size are read, so an oversize field is reported with its column by
# _check_cells instead of as the csv module's own "field larger than field limit".
csv.field_size_limit(max(csv.field_size_limit(), MAX_FILE_BYTES))
_FORMULA = "looks like a spreadsheet formula; remove it or put an apostrophe before it"


@dataclass
class SampleRow:
    external_id: str
    query: str
    reference: str | None
    rubric: str | None
    split: str
    meta: dict = field(default_factory=dict)
    line: int | None = field(default=None, compare=False)  # where in its file (the number messages give)


class StoredSample(Protocol):
    """What compare_with_stored reads of a task's sample (storage.tables.Sample has it)."""

    external_id: str
    query: str
    reference: str | None


@dataclass
class DatasetFile:
    """A checked file: its rows (each content once, splits assigned) and the rows left out as repeats."""

    filename: str
    unit: str  # what its rows are called in messages: "line", "data row" or "item"
    rows: list[SampleRow]
    repeats: list[tuple[SampleRow, SampleRow]] = field(default_factory=list)  # (row, earlier row it repeats)

    def where(self, row: SampleRow) -> str:
        return f"{self.unit} {row.line}"

    def notes(self) -> list[str]:
        """Each repeat as a person reads it: "data row 3 is the same as data row 1"."""
        return _capped([(row.line or 0, f"{self.where(row)} is the same as {self.where(first)}")
                        for row, first in self.repeats])


@dataclass
class Comparison:
    """A file's rows set against a task's samples: the new rows, how many are not added, and why, by row."""

    new: list[SampleRow]
    already: int
    notes: list[str]


class DatasetError(InvalidInput):
    """A dataset file that cannot be imported; the message names the file, the row and the problem.

    `row` is the 1-based JSONL line, CSV data row or JSON array item, as the message says; for problems
    found before the file is parsed (encoding, NUL bytes) it is the physical line; None for the whole file.
    """

    def __init__(self, message: str, row: int | None = None) -> None:
        super().__init__(message)
        self.row = row


def parse_mapping(items: list[str]) -> dict[str, str]:
    """Turn CLI items like `query=Question` into {target: source column}, rejecting anything ambiguous.

    `criteria` is another name for `rubric`; `meta=a,b` lists the columns kept as metadata.
    """
    mapping: dict[str, str] = {}
    for item in items:
        target, sep, column = item.partition("=")
        target, column = target.strip().lower(), column.strip()
        if not sep or not target or not column:
            raise DatasetError(f"malformed mapping {item!r}: expected TARGET=COLUMN, e.g. query=Question")
        target = ALIASES.get(target, target)
        if target not in TARGETS:
            raise DatasetError(f"unknown mapping target {target!r} in {item!r}: use one of {_target_names()}")
        if target in mapping:
            raise DatasetError(f"target {target!r} is mapped twice ({mapping[target]!r} and {column!r})")
        mapping[target] = column
    return mapping


def read_dataset(
    path: str | Path, mapping: dict[str, str] | None = None, default_split: str = "train"
) -> list[SampleRow]:
    """Read a .jsonl/.json (JSON lines or one JSON array) or .csv file, raising DatasetError before any row.

    Targets not in `mapping` fall back to a column named like the target or one of its SYNONYMS (query:
    question, prompt, input; reference: answer, target, solution; rubric: criteria); see resolve_columns.
    Without a `meta` mapping, columns used by no target go into meta unchanged; with one (comma-separated
    column names) only those columns do.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path.name}: cannot read file: {exc.strerror or exc}") from exc
    return parse_dataset(data, path.name, mapping, default_split)


def parse_dataset(
    data: bytes, filename: str, mapping: dict[str, str] | None = None, default_split: str = "train", *,
    test_share: float = 0.0, validation_share: float = 0.0, seed: int = HOLD_OUT_SEED,
) -> list[SampleRow]:
    """Same as read_dataset for bytes already in memory (an upload), so a bad file never touches disk: the
    rows of parse_dataset_file, a row repeated in the file once."""
    return parse_dataset_file(data, filename, mapping, default_split, test_share=test_share,
                              validation_share=validation_share, seed=seed).rows


def parse_dataset_file(
    data: bytes, filename: str, mapping: dict[str, str] | None = None, default_split: str = "train", *,
    test_share: float = 0.0, validation_share: float = 0.0, seed: int = HOLD_OUT_SEED,
) -> DatasetFile:
    """Check a whole file and read its rows, raising DatasetError before any row.

    A row without an id gets sample_id of its query and reference. A row with the id and content of an
    earlier row is a repeat: left out and named (DatasetFile.notes); an id used again for other content
    is refused with both texts.

    `test_share` and `validation_share` (0 to 1) of the rows whose split cell is missing or empty are
    held out for those splits (see hold_out); the other rows without one get `default_split`.

    A text cell that a spreadsheet would evaluate (it starts with `=`, `@`, a tab, a carriage return,
    or `+`/`-` not followed by a plain number) is rejected. A leading apostrophe, the spreadsheet way
    of saying "this is text", makes it acceptable and is kept as written: stripping it would give back
    the dangerous cell on the next export, and the same file could not be imported twice. Size and
    formula checks cover the cells that are stored, so a `meta` mapping can leave a junk column out.
    """
    check_size(len(data), filename)
    check_shares(test_share, validation_share)
    mapping = _normalise_mapping(mapping or {}, filename)
    if default_split not in SPLITS:
        raise DatasetError(f"{filename}: default split must be train, validation or test, got {default_split!r}")

    suffix = Path(filename).suffix.lower()
    if suffix in (".jsonl", ".json"):
        unit = "line"
    elif suffix == ".csv":
        unit = "data row"
    else:
        raise DatasetError(f"{filename}: unsupported file type {suffix or '(none)'!r}: use .jsonl, .json or .csv")

    text = _decode(data, filename)
    if not text.strip():
        raise DatasetError(f"{filename}: file is empty")

    if suffix == ".json" and text.lstrip().startswith("["):
        unit = "item"
        records = _json_array_records(text, filename)
        columns = list(dict.fromkeys(key for _, record in records for key in record))
    elif unit == "line":
        records = list(_jsonl_records(text, filename))
        columns = list(dict.fromkeys(key for _, record in records for key in record))
    else:
        columns, records = _csv_records(text, filename)
    if not records:
        raise DatasetError(f"{filename}: file has no data rows")

    resolved, meta_columns = _resolve_columns(columns, mapping, filename)
    rows = [
        _to_row(record, number, resolved, meta_columns, default_split, f"{filename}: {unit} {number}")
        for number, record in records
    ]
    given = {row.line: _split_given(record, resolved) for row, (_, record) in zip(rows, records, strict=True)}
    kept, repeats = _repeats(rows, filename, unit)
    rows = hold_out(kept, test_share, validation_share, seed=seed, keep=[given[row.line] for row in kept])
    return DatasetFile(filename, unit, rows, repeats)


def compare_with_stored(dataset: DatasetFile, stored: Iterable[StoredSample]) -> Comparison:
    """The file's rows a task does not hold yet, and a note for each row that is not added, by row number.

    A row is already stored when a sample has its id and its content (query and reference, compared as
    sample_content does), or, for a row without an id, when any sample has its content: samples stored
    before ids came from content have `row-<n>` ids. A sample with the row's id and other content is a
    conflict: DatasetError naming both texts, so that nothing of the file is written. Rows with their own
    id that are already stored are counted, not named; the file's repeats are named too.
    """
    by_id: dict[str, StoredSample] = {}
    by_content: dict[tuple[str, str], str] = {}
    for sample in stored:
        by_id[sample.external_id] = sample
        by_content.setdefault(sample_content(sample.query, sample.reference), sample.external_id)
    new: list[SampleRow] = []
    notes = [(row.line or 0, f"{dataset.where(row)} is the same as {dataset.where(first)}")
             for row, first in dataset.repeats]
    conflicts: list[tuple[SampleRow, StoredSample]] = []
    for row in dataset.rows:
        content = sample_content(row.query, row.reference)
        by_content_id = row.external_id == sample_id(row.query, row.reference)
        same_id = by_id.get(row.external_id)
        if same_id is not None and sample_content(same_id.query, same_id.reference) != content:
            conflicts.append((row, same_id))
            continue
        if same_id is not None:
            match: str | None = same_id.external_id
        else:
            match = by_content.get(content) if by_content_id else None
        if match is None:
            new.append(row)
        elif by_content_id:
            notes.append((row.line or 0, f"{dataset.where(row)} is the same as sample {match} already stored"))
    if conflicts:
        raise _conflict(dataset, conflicts)
    return Comparison(new, len(dataset.rows) - len(new) + len(dataset.repeats), _capped(notes))


def _conflict(dataset: DatasetFile, conflicts: list[tuple[SampleRow, StoredSample]]) -> DatasetError:
    """The refusal of a file with rows whose id a task holds with other content: the first with both texts."""
    row, sample = conflicts[0]
    others = ", ".join(dataset.where(other) for other, _ in conflicts[1:MAX_NOTES + 1])
    if others:
        others = f". The same holds for {others}{', …' if len(conflicts) > MAX_NOTES + 1 else ''}"
    return DatasetError(
        f"{dataset.filename}: {dataset.where(row)}: id {row.external_id!r} is already stored with other content "
        f"(stored: {_texts(sample.query, sample.reference)}; this file: {_texts(row.query, row.reference)}); "
        f"give the row another id or leave it out; nothing was written{others}",
        row=row.line,
    )


def content_id(prefix: str, *parts: str, chars: int = 10) -> str:
    """An id made of content: `prefix-` and the first `chars` hex digits of the sha256 of the parts joined by
    NUL. The same content always gives the same id (scenarios: persona and opening; sample_id)."""
    return f"{prefix}-{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:chars]}"


def sample_content(query: str, reference: str | None) -> tuple[str, str]:
    """What makes two samples the same: query and reference with runs of white space as one space (no
    reference is the empty one); case, rubric, split and metadata do not count."""
    return " ".join(query.split()), " ".join((reference or "").split())


def sample_id(query: str, reference: str | None) -> str:
    """The id of a row without one: content_id of its sample_content."""
    return content_id(SAMPLE_ID_PREFIX, *sample_content(query, reference), chars=SAMPLE_ID_CHARS)


def check_shares(test_share: float, validation_share: float) -> None:
    """Refuse hold-out shares that are not numbers from 0 to 1 or that add up to more than all the rows."""
    for name, share in (("test", test_share), ("validation", validation_share)):
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
            raise DatasetError(f"the {name} share must be a number from 0 to 1 (a share of the rows), got {share!r}")
    if test_share + validation_share > 1 + 1e-9:  # 0.7 + 0.3 may add up to a hair over 1 in floating point
        raise DatasetError(f"the test and validation shares add up to {test_share + validation_share:g}; "
                           "together they may hold out at most all the rows (1)")


def hold_out(rows: list[SampleRow], test_share: float, validation_share: float, *, seed: int = HOLD_OUT_SEED,
             keep: Sequence[bool] | None = None) -> list[SampleRow]:
    """The rows with a share of them moved to `test` and `validation`; rows marked in `keep` keep their split.

    Which rows move depends only on the seed and each row's id (a hash orders them), so the same file gives
    the same split every time and in any row order (a row without an id has one made of its content). The
    counts are the shares of the open rows, rounded half up ("train 80 · test 20" for 100 rows and a test
    share of 0.2); the rows come back in their order.
    """
    check_shares(test_share, validation_share)
    kept = list(keep) if keep is not None else [False] * len(rows)
    open_rows = sorted((i for i, fixed in enumerate(kept) if not fixed),
                       key=lambda i: _draw(seed, rows[i].external_id))
    n_test = math.floor(len(open_rows) * test_share + 0.5)
    n_validation = min(math.floor(len(open_rows) * validation_share + 0.5), len(open_rows) - n_test)
    moved = {i: "test" for i in open_rows[:n_test]}
    moved |= {i: "validation" for i in open_rows[n_test:n_test + n_validation]}
    return [replace(row, split=moved[i]) if i in moved else row for i, row in enumerate(rows)]


def split_counts(rows: list[SampleRow]) -> dict[str, int]:
    """Rows per split, in SPLITS order, splits without rows left out."""
    counts = Counter(row.split for row in rows)
    return {split: counts[split] for split in SPLITS if counts[split]}


def split_summary(rows: list[SampleRow]) -> str:
    """The rows per split as one line a person reads before adding a file: "train 80 · test 20"."""
    return " · ".join(f"{split} {count}" for split, count in split_counts(rows).items())


def _draw(seed: int, external_id: str) -> str:
    """A row's place in the hold-out order: a hash, the same in every process (unlike Python's hash())."""
    return hashlib.sha256(f"{seed}\x00{external_id}".encode()).hexdigest()


def _split_given(record: dict[str, Any], resolved: dict[str, str]) -> bool:
    """Whether the file names this row's split (a split cell that is not empty): such a row keeps it."""
    column = resolved.get("split")
    cell = record.get(column) if column is not None else None
    return cell is not None and bool(_as_text(cell).strip())


def scenario_rows(scenarios: Sequence[Scenario], *, test_personas: frozenset[str] = frozenset(),
                  default_split: str = "train") -> list[SampleRow]:
    """A conversation task's scenarios as sample rows: `query` is the opening, `reference` the goal, `meta`
    the persona and the must / must-not rules. The id is content_id of persona and opening, so adding the
    same file again adds nothing; scenarios of `test_personas` (names compared without case) go to test."""
    rows = []
    for scenario in scenarios:
        split = "test" if scenario.persona.casefold() in test_personas else default_split
        rows.append(SampleRow(external_id=content_id("scenario", scenario.persona, scenario.opening),
                              query=scenario.opening, reference=scenario.goal,
                              rubric=None, split=split,
                              meta={"persona": scenario.persona, "must": list(scenario.must),
                                    "must_not": list(scenario.must_not)}))
    return rows


def held_out_personas(personas: Sequence[Persona]) -> frozenset[str]:
    """The last persona of each segment that has two or more: never trained on, so a test score says how a
    library does with people it has not seen."""
    by_segment: dict[str, list[Persona]] = {}
    for persona in personas:
        by_segment.setdefault(persona.segment, []).append(persona)
    return frozenset(group[-1].name.casefold() for group in by_segment.values() if len(group) > 1)


def check_size(size: int, filename: str) -> None:
    """Refuse a file over MAX_FILE_BYTES; callers holding only a path check before reading it."""
    if size > MAX_FILE_BYTES:
        raise DatasetError(f"{filename}: file is {_megabytes(size)} MB; the limit is {MAX_FILE_BYTES / MB:g} MB")


def formula_like(text: str) -> bool:
    """True for a cell a spreadsheet would treat as a formula (CSV injection); `-5` and `+3.2` are numbers."""
    if text[:1] in ("\t", "\r"):
        return True
    head = text.lstrip(" ")
    if head[:1] in ("=", "@"):
        return True
    return head[:1] in ("+", "-") and not _SIGNED_NUMBER.fullmatch(head.rstrip())


def spreadsheet_safe(value: Any) -> Any:
    """A cell for a CSV a person may open in a spreadsheet: text that would run as a formula gets a leading
    apostrophe (the spreadsheet way of saying "text"); everything else is returned unchanged."""
    return f"'{value}" if isinstance(value, str) and formula_like(value) else value


def resolve_columns(columns: list[str], mapping: dict[str, str] | None = None) -> dict[str, str]:
    """Target -> column: the explicit `mapping` first, then for each other target the first of its
    SYNONYMS the file has (exact name first, then any case) that no other target took."""
    resolved = {target: column for target, column in (mapping or {}).items() if target != "meta"}
    used = set(resolved.values())
    lowered = {column.lower(): column for column in reversed(columns)}
    for target, names in SYNONYMS.items():
        if target in resolved:
            continue
        for name in names:
            column = name if name in columns else lowered.get(name)
            if column is not None and column not in used:
                resolved[target] = column
                used.add(column)
                break
    return resolved


def mapping_note(resolved: dict[str, str]) -> str:
    """What a file's columns were taken as, when not named like the target: "mapped question→query"; else ""."""
    renamed = [f"{column}→{target}" for target, column in resolved.items()
               if target != "meta" and column.lower() != target]
    return f"mapped {', '.join(renamed)}" if renamed else ""


def column_names(data: bytes, filename: str, limit: int | None = None) -> list[str]:
    """The column names of a dataset file, in order; [] for anything unreadable, never an error (parse_dataset
    says what is wrong). CSV: the header row. JSON lines or a JSON array: the keys of the objects (the
    first `limit` of them, or all)."""
    try:
        text = data.decode("utf-8-sig")
        suffix = Path(filename).suffix.lower()
        if suffix == ".csv":
            header = next(csv.reader(io.StringIO(text, newline="")), [])
            return list(dict.fromkeys(name.strip() for name in header if name.strip()))
        if suffix not in (".jsonl", ".json"):
            return []
        objects = _json_objects(text, filename, limit)
        return list(dict.fromkeys(str(key) for obj in objects for key in obj))
    except (ValueError, csv.Error):  # InvalidInput and JSON errors are ValueErrors
        return []


def _json_objects(text: str, filename: str, limit: int | None) -> list[dict]:
    """The objects of a JSON array, or of the JSON lines that parse, skipping anything else."""
    if text.lstrip().startswith("["):
        values = json_input.loads(text, filename)
        return [item for item in values[:limit] if isinstance(item, dict)] if isinstance(values, list) else []
    objects: list[dict] = []
    for line in text.split("\n"):
        if limit is not None and len(objects) >= limit:
            break
        try:
            value = json_input.loads(line, filename) if line.strip() else None
        except ValueError:
            continue
        if isinstance(value, dict):
            objects.append(value)
    return objects


def _target_names() -> str:
    return ", ".join((*TARGETS, *ALIASES))


def _normalise_mapping(mapping: dict[str, Any], filename: str) -> dict[str, Any]:
    """Targets in canonical form (criteria -> rubric); meta as a list of column names."""
    normal: dict[str, Any] = {}
    for raw_target, column in mapping.items():
        target = ALIASES.get(raw_target.strip().lower(), raw_target.strip().lower())
        if target not in TARGETS:
            raise DatasetError(f"{filename}: unknown mapping target {raw_target!r}: use one of {_target_names()}")
        if target in normal:
            raise DatasetError(f"{filename}: target {target!r} is mapped twice")
        if target == "meta":
            names = column.split(",") if isinstance(column, str) else list(column)
            normal[target] = [name.strip() for name in names if name.strip()]
        else:
            normal[target] = column
    return normal


def _megabytes(size: int) -> str:
    """Rounded up, so a file just over the limit never reads as exactly the limit."""
    return f"{math.ceil(size * 10 / MB) / 10:.1f}"


def _decode(data: bytes, filename: str) -> str:
    if data.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        raise DatasetError(f"{filename}: file is UTF-32; save it as UTF-8")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise DatasetError(f"{filename}: file is UTF-16; save it as UTF-8")
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data[:nul].count(b"\n") + 1
        raise DatasetError(
            f"{filename}: line {line}: contains a NUL byte, so this is not a text file "
            "(binary, or UTF-16 without a byte order mark); save it as UTF-8 text",
            row=line,
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DatasetError(
            f"{filename}: line {line}: not valid UTF-8 (byte 0x{data[exc.start]:02x}); save the file as UTF-8",
            row=line,
        ) from exc


class _Object(dict):
    """A parsed JSON object remembering the first key repeated in it or in an object inside it."""

    duplicate: str | None = None


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    """json resolves a repeated key silently to its last value; here the record is refused instead."""
    result = _Object()
    for key, value in pairs:
        if result.duplicate is None:
            result.duplicate = key if key in result else _duplicate_in(value)
        result[key] = value
    return result


def _duplicate_in(value: Any) -> str | None:
    if isinstance(value, _Object):
        return value.duplicate
    if isinstance(value, list):
        return next((key for key in map(_duplicate_in, value) if key is not None), None)
    return None


def _loads(text: str, filename: str, line: int | None) -> Any:
    """json.loads keeping track of repeated keys; a syntax error names the line (given, or found by json),
    nesting deeper than json_input.MAX_DEPTH is refused before parsing."""
    try:
        return json_input.loads(text, filename if line is None else f"{filename}: line {line}",
                                object_pairs_hook=_object)
    except json_input.TooDeep as exc:
        raise DatasetError(str(exc), row=line) from None
    except json.JSONDecodeError as exc:
        where = line if line is not None else exc.lineno
        raise DatasetError(f"{filename}: line {where}: not valid JSON ({exc.msg})", row=where) from exc


def _check_record(value: Any, filename: str, where: str, number: int) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DatasetError(f"{filename}: {where}: expected a JSON object, got {_json_type(value)}", row=number)
    if value.duplicate is not None:
        raise DatasetError(f"{filename}: {where}: key {value.duplicate!r} appears twice in one object", row=number)
    return dict(value)


def _json_array_records(text: str, filename: str) -> list[tuple[int, dict[str, Any]]]:
    """A .json file holding one array of objects, which is how many tools export "JSON"."""
    values = _loads(text, filename, None)
    if not isinstance(values, list):
        raise DatasetError(f"{filename}: expected one JSON array of objects, got {_json_type(values)}")
    return [(number, _check_record(value, filename, f"item {number}", number))
            for number, value in enumerate(values, start=1)]


def _jsonl_records(text: str, filename: str) -> Iterator[tuple[int, dict[str, Any]]]:
    # split("\n") rather than splitlines(): JSON strings may hold U+2028 and similar separators verbatim.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        yield number, _check_record(_loads(line, filename, number), filename, f"line {number}", number)


def _csv_rows(text: str, filename: str) -> Iterator[tuple[int, list[str]]]:
    """(data row number, values), the header as row 0; a csv error names the row it happened in."""
    reader = csv.reader(io.StringIO(text, newline=""))
    number = 0
    while True:
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            where = "header" if number == 0 else f"data row {number}"
            raise DatasetError(f"{filename}: {where}: not readable as CSV ({exc})", row=number or None) from exc
        yield number, values
        number += 1


def _csv_records(text: str, filename: str) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    rows = _csv_rows(text, filename)
    _, header = next(rows)
    header = [name.strip() for name in header]
    seen: set[str] = set()
    for name in header:
        if name and name in seen:
            raise DatasetError(f"{filename}: header: column {name!r} appears twice")
        if formula_like(name):
            raise DatasetError(f"{filename}: header: column name {name!r} {_FORMULA}")
        seen.add(name)

    records = []
    for number, values in rows:
        if not any(v.strip() for v in values):
            continue
        if len(values) > len(header):
            raise DatasetError(
                f"{filename}: data row {number}: has {len(values)} values but the header has {len(header)} columns",
                row=number,
            )
        record: dict[str, Any] = {}
        for position, name in enumerate(header):
            value = values[position] if position < len(values) else ""
            if not name:
                if value.strip():
                    raise DatasetError(
                        f"{filename}: data row {number}: column {position + 1} has a value but no header name",
                        row=number,
                    )
                continue
            record[name] = value
        records.append((number, record))
    return [name for name in header if name], records


def _resolve_columns(
    columns: list[str], mapping: dict[str, Any], filename: str
) -> tuple[dict[str, str], list[str] | None]:
    """Explicit mapping first; other targets fall back to a column of the conventional name, if present.

    Returns the target -> column map and the meta columns (None: every column no target uses).
    """
    meta_columns = mapping.pop("meta", None)
    listed = ", ".join(columns) or "(none)"
    for target, column in mapping.items():
        if column not in columns:
            raise DatasetError(f"{filename}: column {column!r} (mapped to {target}) is not in the file; columns: {listed}")
    for column in meta_columns or []:
        if column not in columns:
            raise DatasetError(f"{filename}: column {column!r} (mapped to meta) is not in the file; columns: {listed}")
    resolved = resolve_columns(columns, mapping)
    if "query" not in resolved:
        raise DatasetError(f"{filename}: no query column; map one (e.g. query=Question); columns: {listed}")
    return resolved, meta_columns


def _check_cells(record: dict[str, Any], kept: set[str] | None, number: int, where: str) -> None:
    """Size, formula and number checks on the cells that will be stored (`kept`; None: all of them)."""
    for column, cell in record.items():
        if kept is not None and column not in kept:
            continue
        if isinstance(cell, float) and not math.isfinite(cell):
            raise DatasetError(f"{where}: column {column!r} is NaN or Infinity, which JSON does not allow", row=number)
        text = _as_text(cell)
        if len(text) > MAX_FIELD_CHARS:
            raise DatasetError(
                f"{where}: column {column!r} has {len(text):,} characters; the limit is {MAX_FIELD_CHARS:,} per field",
                row=number,
            )
        if isinstance(cell, str) and formula_like(cell):
            raise DatasetError(f"{where}: column {column!r} {_FORMULA}", row=number)


def _to_row(
    record: dict[str, Any],
    number: int,
    resolved: dict[str, str],
    meta_columns: list[str] | None,
    default_split: str,
    where: str,
) -> SampleRow:
    kept = None if meta_columns is None else set(resolved.values()) | set(meta_columns)
    _check_cells(record, kept, number, where)

    def value(target: str) -> str | None:
        column = resolved.get(target)
        if column is None or record.get(column) is None:
            return None
        text = _as_text(record[column]).strip()
        return text or None

    query = value("query")
    if query is None:
        raise DatasetError(f"{where}: query ({resolved['query']!r}) is missing or empty", row=number)
    reference = value("reference")

    if "id" in resolved:
        external_id = value("id")
        if external_id is None:
            raise DatasetError(f"{where}: id ({resolved['id']!r}) is missing or empty", row=number)
    else:
        external_id = sample_id(query, reference)

    split = (value("split") or default_split).lower()
    if split not in SPLITS:
        raise DatasetError(f"{where}: split must be train, validation or test, got {value('split')!r}", row=number)

    if meta_columns is None:
        used = set(resolved.values())
        meta = {key: item for key, item in record.items() if key not in used}
    else:
        meta = {key: record[key] for key in meta_columns if key in record}
    return SampleRow(
        external_id=external_id,
        query=query,
        reference=reference,
        rubric=value("rubric"),
        split=split,
        meta=meta,
        line=number,
    )


def _repeats(rows: list[SampleRow], filename: str,
             unit: str) -> tuple[list[SampleRow], list[tuple[SampleRow, SampleRow]]]:
    """The rows with each id once, and the left-out rows that repeat an earlier one (same id, same content);
    an id used again for other content is refused with both texts."""
    first_seen: dict[str, SampleRow] = {}
    kept: list[SampleRow] = []
    repeats: list[tuple[SampleRow, SampleRow]] = []
    for row in rows:
        first = first_seen.get(row.external_id)
        if first is None:
            first_seen[row.external_id] = row
            kept.append(row)
        elif sample_content(first.query, first.reference) == sample_content(row.query, row.reference):
            repeats.append((row, first))
        else:
            raise DatasetError(
                f"{filename}: {unit} {row.line}: duplicate id {row.external_id!r} "
                f"(first used on {unit} {first.line}) with other content: "
                f"{unit} {first.line} has {_texts(first.query, first.reference)}, "
                f"{unit} {row.line} {_texts(row.query, row.reference)}",
                row=row.line,
            )
    return kept, repeats


def _texts(query: str, reference: str | None) -> str:
    """A sample's texts for a message: "query 'What is 2+2?', reference '4'", each cut to MAX_QUOTE_CHARS."""
    return f"query {_quote(query)}" + (f", reference {_quote(reference)}" if reference else "")


def _quote(text: str) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= MAX_QUOTE_CHARS else flat[:MAX_QUOTE_CHARS - 1] + "…")


def _capped(notes: list[tuple[int, str]]) -> list[str]:
    """Notes in row order, the first MAX_NOTES of them and then how many more rows were not added."""
    ordered = [text for _, text in sorted(notes, key=lambda note: note[0])]
    if len(ordered) <= MAX_NOTES:
        return ordered
    return [*ordered[:MAX_NOTES], f"and {len(ordered) - MAX_NOTES} more rows not added, for the same reason"]


def _as_text(value: Any) -> str:
    """Numbers read back the way people write them (12.0 -> "12"); structures as compact JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"
