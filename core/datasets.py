"""Reading a user's dataset file (JSONL or CSV) into sample rows.

The whole file is validated before anything is returned, so an import either succeeds completely or
fails with one message that names the offending row; nothing is ever half-read.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TARGETS = ("id", "query", "reference", "rubric", "split")
SPLITS = ("train", "test")
DEMO_DIR = Path(__file__).resolve().parent.parent / "data" / "demo"

_DEFAULT_COLUMNS: dict[str, tuple[str, ...]] = {
    "id": ("id",),
    "query": ("query",),
    "reference": ("reference", "answer"),
    "rubric": ("rubric",),
    "split": ("split",),
}


@dataclass
class SampleRow:
    external_id: str
    query: str
    reference: str | None
    rubric: str | None
    split: str
    meta: dict = field(default_factory=dict)


class DatasetError(ValueError):
    """A dataset file that cannot be imported; `row` is the 1-based JSONL line or CSV data row, if any."""

    def __init__(self, message: str, row: int | None = None) -> None:
        super().__init__(message)
        self.row = row


def parse_mapping(items: list[str]) -> dict[str, str]:
    """Turn CLI items like `query=Question` into {target: source column}, rejecting anything ambiguous."""
    mapping: dict[str, str] = {}
    for item in items:
        target, sep, column = item.partition("=")
        target, column = target.strip().lower(), column.strip()
        if not sep or not target or not column:
            raise DatasetError(f"malformed mapping {item!r}: expected TARGET=COLUMN, e.g. query=Question")
        if target not in TARGETS:
            raise DatasetError(
                f"unknown mapping target {target!r} in {item!r}: use one of {', '.join(TARGETS)}"
            )
        if target in mapping:
            raise DatasetError(f"target {target!r} is mapped twice ({mapping[target]!r} and {column!r})")
        mapping[target] = column
    return mapping


def read_dataset(
    path: str | Path, mapping: dict[str, str] | None = None, default_split: str = "train"
) -> list[SampleRow]:
    """Read a .jsonl/.json (JSON lines or one JSON array) or .csv file, raising DatasetError before any row.

    Targets not in `mapping` fall back to a column named like the target (reference also accepts `answer`);
    columns used by no target go into meta unchanged.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path.name}: cannot read file: {exc.strerror or exc}") from exc
    return parse_dataset(data, path.name, mapping, default_split)


def parse_dataset(
    data: bytes, filename: str, mapping: dict[str, str] | None = None, default_split: str = "train"
) -> list[SampleRow]:
    """Same as read_dataset for bytes already in memory (an upload), so a bad file never touches disk."""
    mapping = dict(mapping or {})
    for target in mapping:
        if target not in TARGETS:
            raise DatasetError(f"unknown mapping target {target!r}: use one of {', '.join(TARGETS)}")
    if default_split not in SPLITS:
        raise DatasetError(f"default split must be train or test, got {default_split!r}")

    suffix = Path(filename).suffix.lower()
    if suffix in (".jsonl", ".json"):
        unit = "line"
    elif suffix == ".csv":
        unit = "data row"
    else:
        raise DatasetError(
            f"{filename}: unsupported file type {suffix or '(none)'!r}: use .jsonl, .json or .csv"
        )

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

    resolved = _resolve_columns(columns, mapping, filename)
    rows = [
        _to_row(record, number, resolved, default_split, f"{filename}: {unit} {number}")
        for number, record in records
    ]
    _check_unique_ids(rows, [number for number, _ in records], filename, unit)
    return rows


def demo_rows() -> list[SampleRow]:
    """The shipped arithmetic demo set (SVAMP + MAWPS MultiArith), train rows first, then test rows."""
    return read_dataset(DEMO_DIR / "arithmetic_train.jsonl", default_split="train") + read_dataset(
        DEMO_DIR / "arithmetic_test.jsonl", default_split="test"
    )


def _decode(data: bytes, filename: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DatasetError(
            f"{filename}: line {line}: not valid UTF-8 (byte 0x{data[exc.start]:02x}); "
            "save the file as UTF-8",
            row=line,
        ) from exc


def _json_array_records(text: str, filename: str) -> list[tuple[int, dict[str, Any]]]:
    """A .json file holding one array of objects, which is how many tools export "JSON"."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(
            f"{filename}: line {exc.lineno}: not valid JSON ({exc.msg})", row=exc.lineno
        ) from exc
    records = []
    for number, value in enumerate(values, start=1):
        if not isinstance(value, dict):
            raise DatasetError(
                f"{filename}: item {number}: expected a JSON object, got {_json_type(value)}", row=number
            )
        records.append((number, value))
    return records


def _jsonl_records(text: str, filename: str) -> Iterator[tuple[int, dict[str, Any]]]:
    # split("\n") rather than splitlines(): JSON strings may hold U+2028 and similar separators verbatim.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{filename}: line {number}: not valid JSON ({exc.msg})", row=number) from exc
        if not isinstance(value, dict):
            raise DatasetError(
                f"{filename}: line {number}: expected a JSON object, got {_json_type(value)}", row=number
            )
        yield number, value


def _csv_records(text: str, filename: str) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
        body = [
            (number, values)
            for number, values in enumerate(reader, start=1)
            if any(v.strip() for v in values)
        ]
    except csv.Error as exc:
        raise DatasetError(f"{filename}: not a readable CSV file: {exc}") from exc
    header = [name.strip() for name in header]
    seen: set[str] = set()
    for name in header:
        if name and name in seen:
            raise DatasetError(f"{filename}: header: column {name!r} appears twice")
        seen.add(name)

    records = []
    for number, values in body:
        if len(values) > len(header):
            raise DatasetError(
                f"{filename}: data row {number}: has {len(values)} values "
                f"but the header has {len(header)} columns",
                row=number,
            )
        record: dict[str, Any] = {}
        for position, name in enumerate(header):
            value = values[position] if position < len(values) else ""
            if not name:
                if value.strip():
                    raise DatasetError(
                        f"{filename}: data row {number}: column {position + 1} "
                        "has a value but no header name",
                        row=number,
                    )
                continue
            record[name] = value
        records.append((number, record))
    return [name for name in header if name], records


def _resolve_columns(columns: list[str], mapping: dict[str, str], filename: str) -> dict[str, str]:
    """Explicit mapping first; other targets fall back to a column of the conventional name, if present."""
    for target, column in mapping.items():
        if column not in columns:
            raise DatasetError(
                f"{filename}: column {column!r} (mapped to {target}) is not in the file; "
                f"columns: {', '.join(columns) or '(none)'}"
            )
    resolved = dict(mapping)
    used = set(mapping.values())
    lowered = {column.lower(): column for column in reversed(columns)}
    for target, names in _DEFAULT_COLUMNS.items():
        if target in resolved:
            continue
        for name in names:
            column = name if name in columns else lowered.get(name)
            if column is not None and column not in used:
                resolved[target] = column
                used.add(column)
                break
    if "query" not in resolved:
        raise DatasetError(
            f"{filename}: no query column; map one (e.g. query=Question); columns: {', '.join(columns)}"
        )
    return resolved


def _to_row(
    record: dict[str, Any], number: int, resolved: dict[str, str], default_split: str, where: str
) -> SampleRow:
    def value(target: str) -> str | None:
        column = resolved.get(target)
        if column is None or record.get(column) is None:
            return None
        text = _as_text(record[column]).strip()
        return text or None

    query = value("query")
    if query is None:
        raise DatasetError(f"{where}: query ({resolved['query']!r}) is missing or empty", row=number)

    if "id" in resolved:
        external_id = value("id")
        if external_id is None:
            raise DatasetError(f"{where}: id ({resolved['id']!r}) is missing or empty", row=number)
    else:
        external_id = f"row-{number}"

    split = (value("split") or default_split).lower()
    if split not in SPLITS:
        raise DatasetError(f"{where}: split must be train or test, got {value('split')!r}", row=number)

    used = set(resolved.values())
    meta = {key: item for key, item in record.items() if key not in used}
    return SampleRow(
        external_id=external_id,
        query=query,
        reference=value("reference"),
        rubric=value("rubric"),
        split=split,
        meta=meta,
    )


def _check_unique_ids(rows: list[SampleRow], numbers: list[int], filename: str, unit: str) -> None:
    first_seen: dict[str, int] = {}
    for row, number in zip(rows, numbers, strict=True):
        if row.external_id in first_seen:
            raise DatasetError(
                f"{filename}: {unit} {number}: duplicate id {row.external_id!r} "
                f"(first used on {unit} {first_seen[row.external_id]})",
                row=number,
            )
        first_seen[row.external_id] = number


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
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"
