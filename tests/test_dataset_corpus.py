"""The corpus of malformed dataset files: each gives its row and problem, and nothing is written.

Every file in tests/data/malformed/ has an entry in expected.json ({"row": int|null, "message":
substring}) and the other way round, so a new file cannot slip in untested.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sqlmodel import Session, func, select

from core.cli import main
from core.domain import datasets
from core.domain.datasets import MAX_FIELD_CHARS, MAX_FILE_BYTES, DatasetError, parse_dataset
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.samples import add_dataset
from storage.tables import AuditEvent, Sample

CORPUS = Path(__file__).resolve().parent / "data" / "malformed"
NOT_CASES = {"expected.json", ".gitattributes"}
EXPECTED: dict[str, dict] = json.loads((CORPUS / "expected.json").read_text(encoding="utf-8"))
FILES = sorted(path.name for path in CORPUS.iterdir() if path.name not in NOT_CASES)
CLI_CASES = ["latin1.csv", "utf16.csv", "formula_equals.csv", "duplicate_ids.jsonl", "oversize_field.jsonl",
             "bad_split.jsonl", "nul_byte.csv"]


def counts(engine) -> tuple[int, int]:
    with Session(engine) as session:
        return (session.exec(select(func.count()).select_from(Sample)).one(),
                session.exec(select(func.count()).select_from(AuditEvent)).one())


def db_url(engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def test_corpus_is_large_and_every_file_has_exactly_one_expectation():
    assert len(FILES) >= 18
    assert set(FILES) == set(EXPECTED), (set(FILES) ^ set(EXPECTED))
    assert {Path(name).suffix for name in FILES} >= {".csv", ".jsonl", ".json"}


@pytest.mark.parametrize("name", FILES)
def test_parse_names_the_row_and_the_problem(name):
    expected = EXPECTED[name]
    with pytest.raises(DatasetError) as info:
        parse_dataset((CORPUS / name).read_bytes(), name)
    assert expected["message"] in str(info.value)
    assert info.value.row == expected["row"]
    assert len(str(info.value).splitlines()) == 1
    assert str(info.value).startswith(name + ":")


@pytest.mark.parametrize("name", FILES)
def test_add_dataset_writes_nothing(engine, demo_task, name):
    before = counts(engine)
    with pytest.raises(DatasetError, match=re.escape(EXPECTED[name]["message"])):
        add_dataset(engine, DEMO_TASK, (CORPUS / name).read_bytes(), name, actor="cli")
    assert counts(engine) == before


@pytest.mark.parametrize("name", CLI_CASES)
def test_cli_exits_2_with_the_row_and_writes_nothing(engine, demo_task, capsys, name):
    before = counts(engine)
    code = main(["--db", db_url(engine), "dataset", "add", "--task", DEMO_TASK, str(CORPUS / name)])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith(f"error: {name}: ") and EXPECTED[name]["message"] in err
    assert len(err.strip().splitlines()) == 1 and out == ""
    assert counts(engine) == before


def test_a_good_file_through_the_cli_is_added_once(engine, demo_task, capsys, tmp_path):
    good = tmp_path / "good.csv"
    good.write_text("id,Question,Answer,level\nn1,What is 2+2?,4,easy\nn2,What is 3+3?,6,easy\n", encoding="utf-8")
    before_samples, _ = counts(engine)
    argv = ["--db", db_url(engine), "dataset", "add", "--task", DEMO_TASK, "--map", "query=Question",
            "--map", "reference=Answer", "--split", "test", str(good)]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == f"added 2 samples to {DEMO_TASK} (0 already present)"
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == f"added 0 samples to {DEMO_TASK} (2 already present)"
    assert counts(engine)[0] == before_samples + 2
    with Session(engine) as session:
        sample = session.exec(select(Sample).where(Sample.external_id == "n1")).one()
    assert (sample.query, sample.reference, sample.split, sample.meta) == ("What is 2+2?", "4", "test", {"level": "easy"})


def test_file_over_the_size_limit_is_refused_before_parsing():
    data = b"query\n" + b"a" * MAX_FILE_BYTES
    with pytest.raises(DatasetError, match=r"^big\.csv: file is 20\.1 MB; the limit is 20 MB$") as info:
        parse_dataset(data, "big.csv")
    assert info.value.row is None
    assert parse_dataset(b"query\n" + b"a" * 100, "small.csv")[0].query == "a" * 100


def test_lowered_size_limit_applies_to_add_dataset_and_the_cli(engine, demo_task, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(datasets, "MAX_FILE_BYTES", 3 * datasets.MB)
    path = tmp_path / "big.jsonl"
    line = json.dumps({"query": "x" * 1000}) + "\n"
    path.write_text(line * 3500, encoding="utf-8")
    before = counts(engine)
    with pytest.raises(DatasetError, match="file is 3.4 MB; the limit is 3 MB"):
        add_dataset(engine, DEMO_TASK, path.read_bytes(), path.name)
    assert main(["--db", db_url(engine), "dataset", "add", "--task", DEMO_TASK, str(path)]) == 2
    assert "error: big.jsonl: file is 3.4 MB; the limit is 3 MB" in capsys.readouterr().err
    assert counts(engine) == before


def test_csv_field_beyond_the_csv_module_limit_is_named_with_its_column():
    data = f"id,query,notes\nq1,short,ok\nq2,short,{'n' * 200_000}\n".encode()
    with pytest.raises(DatasetError, match=r"data row 2: column 'notes' has 200,000 characters") as info:
        parse_dataset(data, "wide.csv")
    assert info.value.row == 2


def test_field_at_the_limit_is_accepted():
    [row] = parse_dataset(f"query\n{'q' * MAX_FIELD_CHARS}\n".encode(), "edge.csv")
    assert len(row.query) == MAX_FIELD_CHARS
