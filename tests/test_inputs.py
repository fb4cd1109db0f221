"""Hostile input files and text (issue 12): nesting depth in every JSON reader, spreadsheet-safe cells.

Each reader of a user's file is fed the same deep file; each must refuse it with one line naming the
nesting, never a RecursionError. The display helpers' CSV and table cells are checked here without a
page; the pages' use of them is in the test_ui_* files.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from core.domain import json_input
from core.domain.datasets import DatasetError, parse_dataset, spreadsheet_safe
from core.domain.library_io import LibraryFormatError, parse_library_text
from core.errors import InvalidInput
from core.records.tasks.task_io import columns_of, read_task_file
from ui.display import SHOWN_CHARS, csv_text, safe_frame

DEEP = "[" * 100_000
DEEP_LINE = f"too deep is nested more than {json_input.MAX_DEPTH} levels deep"


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_depth_counts_brackets_outside_strings_only():
    assert json_input.depth(nested(3)) == 3
    assert json_input.depth('{"a": "[[[[[[", "b": [{"c": "\\"]]]{{{"}]}') == 3
    assert json_input.depth('"unterminated [[[[[[') == 0
    assert json_input.depth(DEEP) == json_input.MAX_DEPTH + 1  # counting stops just past the limit


def test_loads_takes_the_limit_and_refuses_one_more():
    assert json_input.loads(nested(json_input.MAX_DEPTH), "f") == json.loads(nested(json_input.MAX_DEPTH))
    with pytest.raises(InvalidInput, match=f"^too deep is nested more than {json_input.MAX_DEPTH} levels deep$"):
        json_input.loads(nested(json_input.MAX_DEPTH + 1), "too deep")


@pytest.mark.parametrize("filename, text, message, row", [
    ("deep.json", DEEP, f"deep.json is nested more than {json_input.MAX_DEPTH} levels deep", None),
    ("deep.jsonl", '{"query": "fine"}\n' + DEEP, f"deep.jsonl: line 2 is nested more than "
                                                 f"{json_input.MAX_DEPTH} levels deep", 2),
    ("deep.json", '[{"query": "q", "meta": ' + nested(200) + "}]",
     f"deep.json is nested more than {json_input.MAX_DEPTH} levels deep", None),
])
def test_a_deep_dataset_is_refused_in_one_line(filename, text, message, row):
    with pytest.raises(DatasetError) as caught:
        parse_dataset(text.encode(), filename)
    assert (str(caught.value), caught.value.row) == (message, row)


def test_a_deep_library_file_is_refused_in_one_line():
    for filename in ("lib.json", "lib.md"):  # a leading [ is read as JSON whatever the name
        with pytest.raises(LibraryFormatError, match=f"^{filename} is nested more than 100 levels deep$"):
            parse_library_text(DEEP, filename)


def test_a_deep_task_file_is_refused_in_one_line():
    deep_task = '{"format": "tfgrpo-task", "version": 1, "task": ' + "{\"a\": " * 5000 + "1" + "}" * 5001
    for text in (DEEP, DEEP.encode(), deep_task):
        with pytest.raises(InvalidInput, match="^the task file is nested more than 100 levels deep$"):
            read_task_file(text)


def test_the_column_reader_of_the_tasks_page_gives_nothing_for_a_deep_file():
    assert columns_of(DEEP.encode(), "deep.json") == []
    assert columns_of(('{"question": "q"}\n' + DEEP).encode(), "deep.jsonl") == ["question"]


@pytest.mark.parametrize("cell", ["=1+2", "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\tx", "\rx", "  =1"])
def test_formula_cells_get_an_apostrophe(cell):
    assert spreadsheet_safe(cell) == "'" + cell


@pytest.mark.parametrize("cell", ["plain text", "-5", "+3.2", "", 12, None, 1.5])
def test_other_cells_are_kept(cell):
    assert spreadsheet_safe(cell) == cell


def test_our_csv_escapes_formula_cells_and_keeps_them_whole():
    long = "x" * (SHOWN_CHARS * 2)
    frame = pd.DataFrame([{"actor": "=HYPERLINK(\"http://evil\")", "n": 1, "text": long},
                          {"actor": "ann", "n": -2, "text": "@me"}])
    lines = csv_text(frame).splitlines()
    assert lines[0] == "actor,n,text"
    assert lines[1] == f"\"'=HYPERLINK(\"\"http://evil\"\")\",1,{long}"
    assert lines[2] == "ann,-2,'@me"


def test_displayed_tables_escape_and_clip_text_cells_only():
    when = pd.Timestamp("2025-01-01 12:00")
    frame = pd.DataFrame([{"who": "-1+1", "score": 0.5, "when": when, "text": "y" * (SHOWN_CHARS + 10)}])
    shown = safe_frame(frame)
    assert shown.loc[0, "who"] == "'-1+1"
    assert shown.loc[0, "score"] == 0.5 and shown.loc[0, "when"] == when
    assert shown.loc[0, "text"] == "y" * SHOWN_CHARS + "…"
    assert frame.loc[0, "who"] == "-1+1"  # the caller's frame is left alone
