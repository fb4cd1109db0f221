import hashlib
import importlib.util
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from core.domain.datasets import (
    MAX_FIELD_CHARS,
    DatasetError,
    SampleRow,
    formula_like,
    parse_dataset,
    parse_mapping,
    read_dataset,
    sample_id,
)
from core.records.tasks.demo_data import demo_rows

NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def jsonl(*records: object) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def test_demo_rows_have_100_train_and_100_test_with_disjoint_ids_and_queries():
    rows = demo_rows()
    train = [r for r in rows if r.split == "train"]
    test = [r for r in rows if r.split == "test"]
    assert len(train) == 100
    assert len(test) == 100
    assert not {r.external_id for r in train} & {r.external_id for r in test}
    assert not {r.query for r in train} & {r.query for r in test}
    for split_rows in (train, test):
        assert Counter(r.meta["source"] for r in split_rows) == {"SVAMP": 50, "MAWPS MultiArith": 50}


def test_demo_answers_are_clean_numeric_strings_and_ids_name_their_source():
    rows = demo_rows()
    for row in rows:
        assert row.reference is not None and NUMBER.match(row.reference), row
        assert not row.reference.endswith(".0")
        prefix = "svamp-" if row.meta["source"] == "SVAMP" else "mawps-"
        assert row.external_id.startswith(prefix)
        assert row.query.strip() == row.query and row.query
        assert row.rubric is None


def test_demo_files_are_reproduced_by_the_script(tmp_path):
    if not (SHARED_DATA / "svamp.jsonl").exists():
        pytest.skip("shared data folder not present")
    spec = importlib.util.spec_from_file_location("make_demo_data", REPO / "scripts" / "make_demo_data.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main([str(SHARED_DATA), "--out", str(tmp_path)])
    for name in ("arithmetic_train.jsonl", "arithmetic_test.jsonl"):
        assert (tmp_path / name).read_bytes() == (REPO / "data" / "demo" / name).read_bytes()


def test_demo_svamp_row_matches_the_shared_source():
    shared = SHARED_DATA / "svamp.jsonl"
    if not shared.exists():
        pytest.skip("shared data folder not present")
    by_id = {}
    for line in shared.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        by_id[f"svamp-{record['ID']}"] = record
    row = next(r for r in demo_rows() if r.external_id.startswith("svamp-"))
    source = by_id[row.external_id]
    assert row.query == f"{source['Body'].strip()} {source['Question'].strip()}"
    assert float(row.reference) == source["Answer"]


def test_jsonl_without_mapping_uses_conventional_columns_and_rest_goes_to_meta(tmp_path):
    path = write(
        tmp_path,
        "data.jsonl",
        jsonl(
            {"id": 7, "query": " What is 2+2? ", "answer": 4.0, "split": "TEST", "level": 1},
            {"id": "b", "query": "Half of 5?", "answer": 2.5, "rubric": "exact"},
        ),
    )
    rows = read_dataset(path)
    assert rows == [
        SampleRow("7", "What is 2+2?", "4", None, "test", {"level": 1}),
        SampleRow("b", "Half of 5?", "2.5", "exact", "train", {}),
    ]


def test_reference_column_is_preferred_over_answer(tmp_path):
    path = write(tmp_path, "d.jsonl", jsonl({"query": "q", "reference": "r", "answer": "a"}))
    [row] = read_dataset(path)
    assert row.reference == "r"
    assert row.meta == {"answer": "a"}


def test_mapping_renames_columns_and_rows_without_ids_are_known_by_query_and_reference(tmp_path):
    path = write(
        tmp_path,
        "mawps.jsonl",
        jsonl(
            {"input": "Tom has 3 apples and eats 1. How many are left?", "target": 2},
            {"input": "1+1?", "target": 2},
        )
        + "\n"
        + jsonl({"input": "3*3?", "target": 9.0}),
    )
    rows = read_dataset(path, {"query": "input", "reference": "target"}, default_split="test")
    assert [r.external_id for r in rows] == [sample_id(r.query, r.reference) for r in rows]
    assert rows[1].external_id == "q-" + hashlib.sha256(b"1+1?\x002").hexdigest()[:16]
    assert [r.line for r in rows] == [1, 2, 4]
    assert [r.reference for r in rows] == ["2", "2", "9"]
    assert {r.split for r in rows} == {"test"}
    assert rows[0].query == "Tom has 3 apples and eats 1. How many are left?"
    assert rows[0].meta == {}


def test_csv_with_mapping_and_meta(tmp_path):
    path = write(
        tmp_path,
        "data.csv",
        'ID,Question,Answer,Type\nq1,"Two, plus two?",4,Addition\nq2,Ten minus three?,7,Subtraction\n',
    )
    rows = read_dataset(path, parse_mapping(["id=ID", "query=Question", "reference=Answer"]))
    assert rows == [
        SampleRow("q1", "Two, plus two?", "4", None, "train", {"Type": "Addition"}),
        SampleRow("q2", "Ten minus three?", "7", None, "train", {"Type": "Subtraction"}),
    ]


def test_partial_mapping_still_finds_conventional_columns(tmp_path):
    path = write(tmp_path, "d.csv", "id,Question,split\na,first?,test\nb,second?,train\n")
    rows = read_dataset(path, {"query": "Question"})
    assert [(r.external_id, r.query, r.split) for r in rows] == [
        ("a", "first?", "test"),
        ("b", "second?", "train"),
    ]


def test_json_array_file_is_accepted(tmp_path):
    path = write(tmp_path, "d.json", json.dumps([{"query": "a?", "answer": 1}, {"query": "b?", "answer": 2}]))
    assert [(r.external_id, r.reference) for r in read_dataset(path)] == [(sample_id("a?", "1"), "1"),
                                                                          (sample_id("b?", "2"), "2")]


def test_utf8_bom_and_non_ascii_text_are_read(tmp_path):
    path = write(tmp_path, "d.csv", "\ufeffquery,answer\nCombien font 2 € + 3 €?,5\n".encode())
    [row] = read_dataset(path)
    assert row.query == "Combien font 2 € + 3 €?"
    assert row.reference == "5"


def test_parse_mapping():
    assert parse_mapping(["query=Question", " Reference = Answer "]) == {
        "query": "Question",
        "reference": "Answer",
    }
    assert parse_mapping([]) == {}


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        ("query", "malformed"),
        ("query=", "malformed"),
        ("=Question", "malformed"),
        ("answer=Answer", "unknown"),
    ],
)
def test_parse_mapping_rejects_malformed_items(item, fragment):
    with pytest.raises(DatasetError, match=fragment):
        parse_mapping([item])


def test_parse_mapping_rejects_a_target_mapped_twice():
    with pytest.raises(DatasetError, match="mapped twice"):
        parse_mapping(["query=a", "query=b"])


def test_bad_utf8_names_the_line(tmp_path):
    path = write(tmp_path, "d.jsonl", b'{"query": "fine"}\n{"query": "caf\xe9"}\n')
    with pytest.raises(DatasetError, match=r"d\.jsonl: line 2: not valid UTF-8") as info:
        read_dataset(path)
    assert info.value.row == 2


@pytest.mark.parametrize("content", ["", "  \n\n"])
def test_empty_file(tmp_path, content):
    with pytest.raises(DatasetError, match="file is empty"):
        read_dataset(write(tmp_path, "d.jsonl", content))


def test_csv_with_only_a_header_has_no_rows(tmp_path):
    with pytest.raises(DatasetError, match="no data rows"):
        read_dataset(write(tmp_path, "d.csv", "query,answer\n"))


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('["a", "b"]', "expected a JSON object, got an array"),
        ('"text"', "expected a JSON object, got a string"),
        ("{oops", "not valid JSON"),
    ],
)
def test_non_object_json_line(tmp_path, line, fragment):
    path = write(tmp_path, "d.jsonl", jsonl({"query": "ok"}) + line + "\n")
    with pytest.raises(DatasetError, match=rf"line 2: {fragment}") as info:
        read_dataset(path)
    assert info.value.row == 2


def test_missing_query_value(tmp_path):
    path = write(tmp_path, "d.jsonl", jsonl({"query": "ok"}, {"query": "  "}, {"query": "later"}))
    with pytest.raises(DatasetError, match=r"line 2: query \('query'\) is missing or empty"):
        read_dataset(path)


def test_missing_query_column(tmp_path):
    path = write(tmp_path, "d.csv", "Text,Answer\nq,1\n")
    with pytest.raises(DatasetError, match="no query column.*Text, Answer"):
        read_dataset(path)


def test_mapped_column_not_in_file(tmp_path):
    path = write(tmp_path, "d.csv", "Question,Answer\nq,1\n")
    with pytest.raises(DatasetError, match="'Body' \\(mapped to query\\) is not in the file"):
        read_dataset(path, {"query": "Body"})


def test_duplicate_id_names_both_rows(tmp_path):
    path = write(tmp_path, "d.csv", "id,query\na,one\nb,two\na,three\n")
    with pytest.raises(
        DatasetError, match=r"data row 3: duplicate id 'a' \(first used on data row 1\) with other content: "
                            r"data row 1 has query 'one', data row 3 query 'three'"
    ) as info:
        read_dataset(path)
    assert info.value.row == 3


def test_a_row_repeated_with_its_id_is_one_row_not_an_error(tmp_path):
    rows = read_dataset(write(tmp_path, "d.csv", "id,query,answer\na,one,1\nb,two,2\na,one,1\n"))
    assert [(r.external_id, r.query) for r in rows] == [("a", "one"), ("b", "two")]


def test_numeric_ids_that_collide_after_conversion(tmp_path):
    path = write(tmp_path, "d.jsonl", jsonl({"id": 1, "query": "a"}, {"id": 1.0, "query": "b"}))
    with pytest.raises(DatasetError, match="line 2: duplicate id '1'"):
        read_dataset(path)


def test_bad_split(tmp_path):
    path = write(tmp_path, "d.jsonl", jsonl({"query": "a", "split": "train"}, {"query": "b", "split": "dev"}))
    with pytest.raises(DatasetError, match="line 2: split must be train, validation or test, got 'dev'"):
        read_dataset(path)


def test_bad_default_split(tmp_path):
    with pytest.raises(DatasetError, match="default split"):
        read_dataset(write(tmp_path, "d.jsonl", jsonl({"query": "a"})), default_split="dev")


def test_a_validation_split_is_accepted_by_row_and_by_default(tmp_path):
    rows = read_dataset(write(tmp_path, "d.jsonl", jsonl({"query": "a", "split": "validation"}, {"query": "b"})),
                        default_split="validation")
    assert [row.split for row in rows] == ["validation", "validation"]


def test_csv_row_with_too_many_values(tmp_path):
    path = write(tmp_path, "d.csv", "query,answer\na,1\nb,2,extra\n")
    with pytest.raises(DatasetError, match="data row 2: has 3 values but the header has 2 columns"):
        read_dataset(path)


def test_unknown_extension_and_unknown_mapping_target(tmp_path):
    with pytest.raises(DatasetError, match="unsupported file type '.xlsx'"):
        read_dataset(write(tmp_path, "d.xlsx", "query\na\n"))
    with pytest.raises(DatasetError, match="unknown mapping target 'answer'"):
        read_dataset(write(tmp_path, "d.csv", "query\na\n"), {"answer": "query"})


def test_missing_file_is_a_dataset_error(tmp_path):
    with pytest.raises(DatasetError, match="cannot read file"):
        read_dataset(tmp_path / "nope.csv")


@pytest.mark.parametrize("cell", ["=SUM(A1)", "@cmd", "+A1", "-A1*2", "- bullet point", "=1+1", " =HYPERLINK(x)",
                                  "\tsomething", "\rsomething", "-", "+", "+1 555 0100"])
def test_formula_like_cells(cell):
    assert formula_like(cell)


@pytest.mark.parametrize("cell", ["-5", "+3.2", "-0.5", "+.5", "-1e3", "-12%", "What is -5 + 3?", "'=SUM(A1)",
                                  "a = b", "email me@home", "", "5-3"])
def test_cells_that_are_not_formulas(cell):
    assert not formula_like(cell)


@pytest.mark.parametrize(("name", "content", "row", "column"), [
    ("d.csv", "id,query,note\na,fine,-5\nb,fine,=cmd\n", 2, "note"),
    ("d.jsonl", jsonl({"query": "fine"}, {"query": "fine", "meta": {"x": 1}}, {"query": "@SUM(1)"}), 3, "query"),
    ("d.json", json.dumps([{"query": "fine", "reference": "+A1"}]), 1, "reference"),
    ("d.csv", "id,query\n\tq,fine\n", 1, "id"),
])
def test_formula_cells_are_rejected_in_every_format(name, content, row, column):
    with pytest.raises(DatasetError, match=rf"{column!r} looks like a spreadsheet formula; remove it or put an "
                                           "apostrophe before it") as info:
        parse_dataset(content.encode(), name)
    assert info.value.row == row


def test_an_apostrophe_makes_a_formula_cell_text_and_is_kept():
    [row] = parse_dataset(b"query,reference\n'=SUM(A1) means what?,'-A1\n", "d.csv")
    assert (row.query, row.reference) == ("'=SUM(A1) means what?", "'-A1")


def test_numbers_in_json_are_never_formulas():
    [row] = parse_dataset(jsonl({"query": "q", "reference": -5, "score": -0.5}).encode(), "d.jsonl")
    assert row.reference == "-5" and row.meta == {"score": -0.5}


def test_formula_looking_csv_header_is_rejected():
    with pytest.raises(DatasetError, match="header: column name '=cmd' looks like a spreadsheet formula"):
        parse_dataset(b"query,=cmd\na,b\n", "d.csv")


def test_oversize_field_names_row_and_column():
    long = "x" * (MAX_FIELD_CHARS + 1)
    with pytest.raises(DatasetError, match=r"d\.csv: data row 2: column 'notes' has 20,001 characters; "
                                           r"the limit is 20,000 per field") as info:
        parse_dataset(f"query,notes\na,b\nc,{long}\n".encode(), "d.csv")
    assert info.value.row == 2
    with pytest.raises(DatasetError, match="line 1: column 'meta' has"):
        parse_dataset(jsonl({"query": "a", "meta": {"text": long}}).encode(), "d.jsonl")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_utf16_gets_its_own_message(encoding):
    data = "query\nhello\n".encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data
    with pytest.raises(DatasetError, match=r"^d\.csv: file is UTF-16; save it as UTF-8$") as info:
        parse_dataset(data, "d.csv")
    assert info.value.row is None


def test_nul_byte_names_the_line():
    with pytest.raises(DatasetError, match="line 3: contains a NUL byte") as info:
        parse_dataset(b'{"query": "a"}\n{"query": "b"}\n{"query": "c\x00"}\n', "d.jsonl")
    assert info.value.row == 3


def test_repeated_json_key_is_rejected_even_when_nested():
    with pytest.raises(DatasetError, match="line 1: key 'query' appears twice"):
        parse_dataset(b'{"query": "a", "query": "b"}\n', "d.jsonl")
    with pytest.raises(DatasetError, match="item 2: key 'k' appears twice") as info:
        parse_dataset(b'[{"query": "a"}, {"query": "b", "x": [{"k": 1, "k": 2}]}]', "d.json")
    assert info.value.row == 2


def test_json_file_that_is_not_an_array_of_objects():
    with pytest.raises(DatasetError, match="item 2: expected a JSON object, got a number"):
        parse_dataset(b'[{"query": "a"}, 3]', "d.json")


def test_criteria_is_an_alias_of_rubric_as_default_column_and_as_target():
    [row] = parse_dataset(b"query,criteria\nq,be kind\n", "d.csv")
    assert row.rubric == "be kind" and row.meta == {}
    [row] = parse_dataset(b"query,Checks\nq,be kind\n", "d.csv", {"criteria": "Checks"})
    assert row.rubric == "be kind"
    assert parse_mapping(["criteria=Checks"]) == {"rubric": "Checks"}
    with pytest.raises(DatasetError, match="mapped twice"):
        parse_mapping(["rubric=A", "criteria=B"])


def test_meta_mapping_keeps_only_the_listed_columns():
    data = b"query,channel,agent,notes\nq,email,ann,private\n"
    mapping = parse_mapping(["meta=channel, agent"])
    assert mapping == {"meta": "channel, agent"}
    [row] = parse_dataset(data, "d.csv", mapping)
    assert row.meta == {"channel": "email", "agent": "ann"}
    [row] = parse_dataset(data, "d.csv")
    assert row.meta == {"channel": "email", "agent": "ann", "notes": "private"}
    [row] = parse_dataset(data, "d.csv", {"meta": ""})
    assert row.meta == {}
    with pytest.raises(DatasetError, match=r"column 'owner' \(mapped to meta\) is not in the file"):
        parse_dataset(data, "d.csv", {"meta": "channel,owner"})


def test_columns_left_out_of_meta_are_not_checked_because_they_are_not_stored():
    data = f"query,channel,junk\nq,email,=cmd {'x' * MAX_FIELD_CHARS}\n".encode()
    with pytest.raises(DatasetError, match="column 'junk'"):
        parse_dataset(data, "d.csv")
    [row] = parse_dataset(data, "d.csv", {"meta": "channel"})
    assert row.meta == {"channel": "email"}
    with pytest.raises(DatasetError, match="column 'junk'"):
        parse_dataset(data, "d.csv", {"meta": "junk"})


def test_every_message_names_the_file():
    with pytest.raises(DatasetError, match=r"^d\.csv: default split"):
        parse_dataset(b"query\na\n", "d.csv", default_split="dev")
    with pytest.raises(DatasetError, match=r"^d\.csv: unknown mapping target 'answer'"):
        parse_dataset(b"query\na\n", "d.csv", {"answer": "x"})


# --- one column rule for the CLI and the Tasks page (issue 12) ------------------------------------------


@pytest.mark.parametrize("csv_text, query, reference", [
    ("question,answer\nWhat is 2+2?,4\n", "What is 2+2?", "4"),
    ("Prompt,Target\nWhat is 2+2?,4\n", "What is 2+2?", "4"),
    ("input,solution\nWhat is 2+2?,4\n", "What is 2+2?", "4"),
    ("question,query,answer,reference\nno,What is 2+2?,no,4\n", "What is 2+2?", "4"),  # own name first
])
def test_usual_column_names_are_mapped_without_asking(tmp_path, csv_text, query, reference):
    [row] = read_dataset(write(tmp_path, "d.csv", csv_text))
    assert (row.query, row.reference) == (query, reference)


def test_the_mapping_is_said_only_for_renamed_columns():
    from core.domain.datasets import mapping_note, resolve_columns

    resolved = resolve_columns(["ID", "question", "answer", "criteria", "split"])
    assert resolved == {"id": "ID", "query": "question", "reference": "answer", "rubric": "criteria",
                        "split": "split"}
    assert mapping_note(resolved) == "mapped question→query, answer→reference, criteria→rubric"
    assert mapping_note(resolve_columns(["query", "reference"])) == ""
    assert resolve_columns(["question", "prompt"], {"query": "prompt"}) == {"query": "prompt"}  # no second query


# --- hold-out shares (issue 14): rows without a split go partly to test and validation --------------------


def numbered_csv(n: int, split_column: dict[int, str] | None = None) -> bytes:
    """A CSV of n rows q1..qn; rows named in `split_column` carry that split, the others an empty cell."""
    given = split_column or {}
    lines = ["id,query,split", *(f"q{i},Question {i}?,{given.get(i, '')}" for i in range(1, n + 1))]
    return ("\n".join(lines) + "\n").encode()


def test_a_test_share_holds_out_that_share_of_the_rows():
    from core.domain.datasets import split_counts, split_summary

    rows = parse_dataset(numbered_csv(100), "d.csv", test_share=0.2)
    assert split_counts(rows) == {"train": 80, "test": 20}
    assert split_summary(rows) == "train 80 · test 20"
    assert [row.external_id for row in rows] == [f"q{i}" for i in range(1, 101)]  # the file's order is kept


def test_the_same_file_gives_the_same_split_in_any_row_order_and_another_seed_another_one():
    data = numbered_csv(40)
    first = {r.external_id: r.split for r in parse_dataset(data, "d.csv", test_share=0.25, validation_share=0.1)}
    again = {r.external_id: r.split for r in parse_dataset(data, "d.csv", test_share=0.25, validation_share=0.1)}
    header, *lines = data.decode().splitlines()
    shuffled = ("\n".join([header, *reversed(lines)]) + "\n").encode()
    reordered = {r.external_id: r.split for r in parse_dataset(shuffled, "d.csv", test_share=0.25,
                                                                validation_share=0.1)}
    assert first == again == reordered
    assert sorted(first.values()).count("test") == 10 and sorted(first.values()).count("validation") == 4
    from core.domain.datasets import hold_out

    rows = parse_dataset(data, "d.csv")
    other = {r.external_id: r.split for r in hold_out(rows, 0.25, 0.1, seed=7)}
    assert other != first and list(other.values()).count("test") == 10


def test_rows_that_name_a_split_keep_it_and_only_the_others_are_held_out():
    given = {1: "train", 2: "train", 3: "validation", 4: "test"}
    rows = parse_dataset(numbered_csv(14, given), "d.csv", test_share=0.5)
    by_id = {row.external_id: row.split for row in rows}
    assert [by_id[f"q{i}"] for i in range(1, 5)] == ["train", "train", "validation", "test"]
    rest = [by_id[f"q{i}"] for i in range(5, 15)]
    assert rest.count("test") == 5 and rest.count("train") == 5


def test_the_rest_goes_to_the_default_split_and_no_share_changes_nothing():
    rows = parse_dataset(numbered_csv(10), "d.csv", default_split="validation", test_share=0.3)
    assert sorted(row.split for row in rows) == ["test"] * 3 + ["validation"] * 7
    assert {row.split for row in parse_dataset(numbered_csv(10), "d.csv")} == {"train"}


def test_shares_round_half_up_and_never_hold_out_more_than_the_rows():
    from core.domain.datasets import split_counts

    assert split_counts(parse_dataset(numbered_csv(4), "d.csv", test_share=0.25)) == {"train": 3, "test": 1}
    assert split_counts(parse_dataset(numbered_csv(2), "d.csv", test_share=0.25)) == {"train": 1, "test": 1}
    assert split_counts(parse_dataset(numbered_csv(1), "d.csv", test_share=0.5, validation_share=0.5)) == {"test": 1}
    assert split_counts(parse_dataset(numbered_csv(3), "d.csv", test_share=1)) == {"test": 3}


@pytest.mark.parametrize(("test_share", "validation_share", "message"), [
    (-0.1, 0, "the test share must be a number from 0 to 1"),
    (1.5, 0, "the test share must be a number from 0 to 1"),
    (0, float("nan"), "the validation share must be a number from 0 to 1"),
    (0, True, "the validation share must be a number from 0 to 1"),
    (0.7, 0.4, "the test and validation shares add up to 1.1"),
])
def test_bad_shares_are_refused_before_any_row(test_share, validation_share, message):
    with pytest.raises(DatasetError, match=message):
        parse_dataset(numbered_csv(3), "d.csv", test_share=test_share, validation_share=validation_share)


# --- rows without an id are known by their content (issue 25) ---------------------------------------------


def stored(engine, task_name: str) -> dict[str, tuple[str, str | None]]:
    from sqlmodel import Session

    from storage import queries

    with Session(engine) as session:
        task = queries.task_by_name(session, task_name)
        return {s.external_id: (s.query, s.reference) for s in queries.samples(session, task.id)}


def test_two_files_without_ids_add_every_row(engine, demo_task):
    from core.records.tasks.demos import DEMO_TASK
    from core.records.tasks.samples import add_dataset

    before = stored(engine, DEMO_TASK)
    assert add_dataset(engine, DEMO_TASK, b"question,answer\nWhat is 2+2?,4\nWhat is 3+3?,6\n", "a.csv") == (2, 0)
    assert add_dataset(engine, DEMO_TASK, jsonl({"question": "What is 5+5?", "answer": 10}).encode(),
                       "b.jsonl") == (1, 0)
    new = {key: value for key, value in stored(engine, DEMO_TASK).items() if key not in before}
    assert sorted(new.values()) == [("What is 2+2?", "4"), ("What is 3+3?", "6"), ("What is 5+5?", "10")]


def test_rows_without_an_id_get_the_same_id_and_split_in_any_row_order():
    lines = [f"Question {i}?,{i}" for i in range(40)]
    first = parse_dataset(("query,answer\n" + "\n".join(lines)).encode(), "a.csv", test_share=0.25)
    reordered = parse_dataset(("query,answer\n" + "\n".join(reversed(lines))).encode(), "b.csv", test_share=0.25)
    by_query = {row.query: (row.external_id, row.split) for row in first}
    assert {row.query: (row.external_id, row.split) for row in reordered} == by_query
    assert len({external_id for external_id, _ in by_query.values()}) == 40
    assert [split for _, split in by_query.values()].count("test") == 10


def test_the_same_file_added_twice_adds_nothing_and_names_each_row_with_the_sample_it_repeats(engine, demo_task):
    from core.records.tasks.demos import DEMO_TASK
    from core.records.tasks.samples import add_dataset_file

    data = b"query,answer\nWhat is 2+2?,4\nWhat is 3+3?,6\n"
    first = add_dataset_file(engine, DEMO_TASK, data, "a.csv")
    assert (first.added, first.already, first.notes) == (2, 0, [])
    ids = {query: key for key, (query, _) in stored(engine, DEMO_TASK).items()}
    again = add_dataset_file(engine, DEMO_TASK, data, "a.csv")
    assert (again.added, again.already) == (0, 2)
    assert again.notes == [f"data row 1 is the same as sample {ids['What is 2+2?']} already stored",
                           f"data row 2 is the same as sample {ids['What is 3+3?']} already stored"]


def test_a_row_repeated_in_one_file_is_added_once_and_named(engine, demo_task):
    from core.records.tasks.demos import DEMO_TASK
    from core.records.tasks.samples import add_dataset

    before = len(stored(engine, DEMO_TASK))
    data = jsonl({"query": "What is 2+2?", "answer": 4}, {"query": "What is 3+3?", "answer": 6},
                 {"query": " What is  2+2? ", "answer": "4"}).encode()
    [*_, last] = rows = parse_dataset(data, "d.jsonl")
    assert len(rows) == 2 and last.query == "What is 3+3?"
    assert add_dataset(engine, DEMO_TASK, data, "d.jsonl") == (2, 1)
    assert len(stored(engine, DEMO_TASK)) == before + 2


def test_an_id_stored_with_other_content_is_refused_naming_both_texts_and_nothing_is_written(engine, demo_task):
    from sqlmodel import Session, func, select

    from core.records.tasks.demos import DEMO_TASK
    from core.records.tasks.samples import add_dataset
    from storage.tables import AuditEvent

    assert add_dataset(engine, DEMO_TASK, jsonl({"id": "n1", "query": "What is 2+2?", "answer": 4}).encode(),
                       "a.jsonl") == (1, 0)
    before = stored(engine, DEMO_TASK)
    with Session(engine) as session:
        events = session.exec(select(func.count()).select_from(AuditEvent)).one()
    data = jsonl({"id": "n2", "query": "What is 5+5?", "answer": 10},
                 {"id": "n1", "query": "What is 3+3?", "answer": 6}).encode()
    with pytest.raises(DatasetError) as info:
        add_dataset(engine, DEMO_TASK, data, "b.jsonl")
    message = str(info.value)
    assert message.startswith("b.jsonl: line 2: id 'n1' is already stored with other content")
    assert "'What is 2+2?'" in message and "'What is 3+3?'" in message and info.value.row == 2
    assert stored(engine, DEMO_TASK) == before
    with Session(engine) as session:
        assert session.exec(select(func.count()).select_from(AuditEvent)).one() == events


def test_samples_stored_with_row_numbers_as_ids_are_still_recognised(engine, demo_task):
    from core.records.tasks.demos import DEMO_TASK
    from core.records.tasks.samples import add_dataset_file
    from storage.db import session_scope
    from storage.tables import Sample

    with session_scope(engine) as session:  # as adding this file stored it before ids came from content
        session.add(Sample(task_id=demo_task.id, external_id="row-1", query="What is 2+2?", reference="4",
                           split="train", meta={}))
    result = add_dataset_file(engine, DEMO_TASK, b"query,answer\nWhat is 2+2?,4\nWhat is 3+3?,6\n", "a.csv")
    assert (result.added, result.already) == (1, 1)
    assert result.notes == ["data row 1 is the same as sample row-1 already stored"]
