"""The manual's "bring your own task" commands (docs/tasks-and-rewards.md), run on the files in examples/."""

from __future__ import annotations

from pathlib import Path

from sqlmodel import Session

from core.cli import main
from storage import queries
from storage.db import get_engine

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MANUAL = Path(__file__).resolve().parent.parent / "docs" / "tasks-and-rewards.md"
MAPPING = ["--map", "id=ticket", "--map", "query=customer_message", "--map", "rubric=must_mention",
           "--map", "meta=channel"]


def test_the_example_task_file_imports_and_its_csv_adds_with_the_documented_mapping(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'byo.db'}"
    assert main(["--db", db, "task", "import", str(EXAMPLES / "bike-shop-task.json")]) == 0
    assert main(["--db", db, "task", "import", str(EXAMPLES / "bike-shop-task.json"), "--name", "bikes 2"]) == 0
    with Session(get_engine(db)) as session:
        task = queries.task_by_name(session, "bike shop replies")
        assert task.reward_method == "judge_human"
        assert queries.count_samples(session, task.id) == {"train": 5, "test": 2}
    # the CSV again, into the copy: every row is already there, so nothing new
    code = main(["--db", db, "dataset", "add", "--task", "bikes 2", str(EXAMPLES / "bike_shop_questions.csv"),
                 *MAPPING])
    out = capsys.readouterr().out
    assert code == 0 and "added 0 samples" in out and "7 already present" in out
    with Session(get_engine(db)) as session:
        sample = queries.samples(session, queries.task_by_name(session, "bikes 2").id, "test")[0]
        assert sample.external_id == "B-106" and sample.meta == {"channel": "email"}
        assert sample.rubric.startswith("Apologises")


def test_the_manual_shows_the_mapping_used_here():
    text = MANUAL.read_text(encoding="utf-8")
    assert " ".join(MAPPING) in text and "examples/bike_shop_questions.csv" in text
