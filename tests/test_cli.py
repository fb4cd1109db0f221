"""The CLI's commands that need no model, and its exit codes on bad input."""

from __future__ import annotations

import json

import pytest

from core.cli import main
from core.tasks import DEMO_TASK


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert main(["--db", url, "demo"]) == 0
    return url


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_demo_is_idempotent_and_prints_the_task(db, capsys):
    code, out, _ = run(capsys, "--db", db, "demo")
    assert code == 0 and out.strip() == DEMO_TASK
    code, out, _ = run(capsys, "--db", db, "versions", "--task", DEMO_TASK)
    assert code == 0 and out.count("initial") == 1


@pytest.mark.parametrize("argv, reason", [
    (["train", "--task", "no such task"], "no task named 'no such task'"),
    (["train", "--task", DEMO_TASK, "--epochs", "0"], "epochs must be at least 1"),
    (["train"], "--task is required"),
    (["train", "--resume", "999"], "no run 999"),
    (["eval", "--task", DEMO_TASK, "--version", "12345"], "no version 12345"),
    (["eval", "--task", DEMO_TASK, "--version", "nolabel"], "no version or label 'nolabel'"),
    (["eval", "--task", DEMO_TASK, "--version", "empty", "--k", "0"], "k must be at least 1"),
    (["export", "--task", DEMO_TASK, "--version", "latest", "--format", "pdf"], "invalid choice"),
    (["import", "--task", DEMO_TASK, "/nonexistent/file.md"], "No such file"),
    (["train", "--epochs", "three"], "invalid int value"),
])
def test_bad_input_exits_2_with_one_line(db, capsys, argv, reason):
    code, out, err = run(capsys, "--db", db, *argv)
    assert code == 2
    assert reason in err and len(err.strip().splitlines()) == 1


def test_import_export_round_trip_in_every_format(db, capsys, tmp_path):
    source = tmp_path / "lib.json"
    source.write_text(json.dumps({"G0": "Write down each quantity.", "G1": "Check the answer against the question."}))
    code, out, _ = run(capsys, "--db", db, "import", "--task", DEMO_TASK, str(source))
    assert code == 0 and "2 experiences" in out
    code, md, _ = run(capsys, "--db", db, "export", "--task", DEMO_TASK, "--version", "latest", "--format", "md")
    assert "[G0] Write down each quantity." in md and "[G1] Check the answer" in md
    code, prompt, _ = run(capsys, "--db", db, "export", "--task", DEMO_TASK, "--version", "latest", "--format", "prompt")
    assert "[G0]. Write down each quantity.\n[G1]. Check the answer against the question." in prompt
    code, js, _ = run(capsys, "--db", db, "export", "--task", DEMO_TASK, "--version", "latest", "--format", "json")
    data = json.loads(js)
    assert [e["id"] for e in data["experiences"]] == ["E1", "E2"] and data["task"] == DEMO_TASK
    again = tmp_path / "again.json"
    again.write_text(js)
    code, out, _ = run(capsys, "--db", db, "import", "--task", DEMO_TASK, str(again))
    assert "[E3] Write down each quantity." in out  # a re-import gets fresh ids, the texts stay


def test_bad_library_file_exits_2_and_writes_nothing(db, capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = run(capsys, "--db", db, "import", "--task", DEMO_TASK, str(bad))
    assert code == 2 and err.startswith("error:")
    code, out, _ = run(capsys, "--db", db, "versions", "--task", DEMO_TASK)
    assert out.count("experiences") == 1


def test_label_then_resolve_by_label(db, capsys, tmp_path):
    source = tmp_path / "lib.md"
    source.write_text("- Write down each quantity.\n- Check the answer against the question.\n")
    run(capsys, "--db", db, "import", "--task", DEMO_TASK, str(source))
    code, out, _ = run(capsys, "--db", db, "label", "--task", DEMO_TASK, "--version", "latest", "production")
    assert code == 0 and out.startswith("production -> version")
    code, md, _ = run(capsys, "--db", db, "export", "--task", DEMO_TASK, "--version", "production")
    assert "Check the answer against the question." in md
    code, out, _ = run(capsys, "--db", db, "versions", "--task", DEMO_TASK)
    assert "[production]" in out


def test_help_of_every_command(capsys):
    for command in ("demo", "train", "eval", "export", "import", "runs", "run", "versions", "label"):
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        assert info.value.code == 0
        assert "usage:" in capsys.readouterr().out
