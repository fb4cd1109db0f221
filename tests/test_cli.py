"""The CLI's commands that need no model, and its exit codes on bad input."""

from __future__ import annotations

import io
import json
import sys

import pytest
from sqlmodel import Session, select

from core.cli import main
from core.records.people.passwords import check_password
from core.records.tasks.demos import CONVERSATION_TASK, DEMO_TASK, POLICY_TASK, SUPPORT_TASK
from storage import queries
from storage.db import get_engine
from storage.tables import AuditEvent, Evaluation, Run, Sample, User

PASSWORD = "correct horse battery"


@pytest.fixture
def db(database_url):
    """A migrated database of this test's own with the demo tasks the CLI loads: a copy of the session's
    migrated SQLite file, or with TFGRPO_TEST_DATABASE_URL a PostgreSQL clone (its URL holds the escaped
    password: the CLI gets it as a user would type it). Migrating a new file is the test below's alone."""
    assert main(["--db", database_url, "demo"]) == 0
    return database_url


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_new_database_file_is_created_and_migrated_by_the_cli(tmp_path, capsys):
    """A person's first command names a file that does not exist yet: the CLI creates it at the newest
    revision before it writes."""
    from alembic.script import ScriptDirectory

    from storage.db import MIGRATIONS_DIR

    path = tmp_path / "first.db"
    assert not path.exists()
    code, out, _ = run(capsys, "--db", f"sqlite:///{path}", "demo")
    assert code == 0 and out.splitlines() == [DEMO_TASK, SUPPORT_TASK, CONVERSATION_TASK, POLICY_TASK]
    with get_engine(f"sqlite:///{path}").connect() as connection:
        revision = connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    assert revision == ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def test_demo_is_idempotent_and_prints_both_tasks(db, capsys):
    code, out, _ = run(capsys, "--db", db, "demo")
    assert code == 0 and out.splitlines() == [DEMO_TASK, SUPPORT_TASK, CONVERSATION_TASK, POLICY_TASK]
    for task in (DEMO_TASK, SUPPORT_TASK):
        code, out, _ = run(capsys, "--db", db, "versions", "--task", task)
        assert code == 0 and out.count("initial") == 1
    code, out, _ = run(capsys, "--db", db, "dataset", "show", "--task", SUPPORT_TASK)
    assert code == 0 and out.splitlines() == [f"{SUPPORT_TASK}: 40 samples", "  test      10", "  train     30"]


def samples_of(db: str, task_name: str) -> dict[str, Sample]:
    with Session(get_engine(db)) as session:
        return {s.external_id: s for s in queries.samples(session, queries.task_by_name(session, task_name).id)}


def users(db: str) -> dict[str, User]:
    with Session(get_engine(db)) as session:
        return {u.name: u for u in session.exec(select(User)).all()}


def audit(db: str, action: str) -> list[AuditEvent]:
    with Session(get_engine(db)) as session:
        return list(session.exec(select(AuditEvent).where(AuditEvent.action == action)))


def test_dataset_add_with_mapping_criteria_and_meta(db, capsys, tmp_path):
    source = tmp_path / "tickets.csv"
    source.write_text("Ticket,Message,Criteria,Channel,Agent\nt1,My router is dead.,Offer a line check.,email,ann\n"
                      "t2,Thanks for the help!,Thank them.,chat,bob\n", encoding="utf-8")
    code, out, err = run(capsys, "--db", db, "dataset", "add", "--task", SUPPORT_TASK, "--map", "id=Ticket",
                         "--map", "query=Message", "--map", "criteria=Criteria", "--map", "meta=Channel",
                         "--split", "test", str(source))
    assert (code, err) == (0, "")
    assert out.strip() == f"added 2 samples to {SUPPORT_TASK} (0 already present)"
    sample = samples_of(db, SUPPORT_TASK)["t1"]
    assert (sample.query, sample.rubric, sample.split, sample.meta) == (
        "My router is dead.", "Offer a line check.", "test", {"Channel": "email"})
    [event] = audit(db, "task.add_data")
    assert event.actor == "cli" and event.after == {"file": "tickets.csv", "rows": 2, "added": 2}
    code, out, _ = run(capsys, "--db", db, "dataset", "add", "--task", SUPPORT_TASK, "--map", "id=Ticket",
                       "--map", "query=Message", str(source))
    assert code == 0 and out.splitlines() == ["mapped Criteria→rubric",  # not mapped this time: core's rule, said
                                              f"added 0 samples to {SUPPORT_TASK} (2 already present)"]


@pytest.mark.parametrize("argv, reason", [
    (["--task", "no such task"], "no task named 'no such task'"),
    (["--task", DEMO_TASK, "--map", "answer=Answer"], "unknown mapping target 'answer'"),
    (["--task", DEMO_TASK, "--map", "query"], "malformed mapping 'query'"),
    (["--task", DEMO_TASK, "--map", "query=Nope"], "column 'Nope' (mapped to query) is not in the file"),
    (["--task", DEMO_TASK, "--split", "dev"], "invalid choice: 'dev'"),
])
def test_dataset_add_bad_input_exits_2_and_writes_nothing(db, capsys, tmp_path, argv, reason):
    source = tmp_path / "ok.csv"
    source.write_text("id,query\nz1,What is 1+1?\n", encoding="utf-8")
    before = len(samples_of(db, DEMO_TASK))
    code, out, err = run(capsys, "--db", db, "dataset", "add", *argv, str(source))
    assert code == 2 and reason in err and err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert len(samples_of(db, DEMO_TASK)) == before and not audit(db, "task.add_data")


def test_dataset_add_missing_file_and_directory_exit_2(db, capsys, tmp_path):
    code, _, err = run(capsys, "--db", db, "dataset", "add", "--task", DEMO_TASK, str(tmp_path / "nope.csv"))
    assert code == 2 and "nope.csv: cannot read file" in err
    code, _, err = run(capsys, "--db", db, "dataset", "add", "--task", DEMO_TASK, str(tmp_path))
    assert code == 2 and "cannot read file" in err


def test_dataset_show_unknown_task(db, capsys):
    code, _, err = run(capsys, "--db", db, "dataset", "show", "--task", "nope")
    assert code == 2 and "no task named 'nope'" in err


def test_user_add_from_env_stores_a_hash_and_never_prints_the_password(db, capsys, monkeypatch):
    monkeypatch.setenv("NEW_PW", PASSWORD)
    code, out, err = run(capsys, "--db", db, "user", "add", "ann", "--role", "reviewer", "--password-env", "NEW_PW")
    assert code == 0 and "ann" in out and "reviewer" in out
    assert PASSWORD not in out + err
    user = users(db)["ann"]
    assert user.role == "reviewer" and user.active
    assert PASSWORD not in user.password_hash and check_password(PASSWORD, user.password_hash)
    [event] = audit(db, "user.add")
    assert event.actor == "cli" and PASSWORD not in json.dumps(event.after)
    code, out, err = run(capsys, "--db", db, "user", "list")
    assert code == 0 and out.splitlines()[1].split() == ["ann", "reviewer", "yes", "password"]


def test_user_add_for_the_provider_takes_an_email_and_no_password(db, capsys):
    code, out, err = run(capsys, "--db", db, "user", "add", "Ana@Team.example", "--role", "admin", "--provider")
    assert code == 0 and "ana@team.example (admin, signs in through the OpenID Connect provider" in out
    user = users(db)["ana@team.example"]
    assert (user.email, user.password_hash) == ("ana@team.example", "")
    code, out, err = run(capsys, "--db", db, "user", "list")
    assert out.splitlines()[1].split() == ["ana@team.example", "admin", "yes", "provider"]
    code, out, err = run(capsys, "--db", db, "user", "add", "carl", "--role", "labeler", "--provider")
    assert code == 2 and "'carl' is not an email address" in err
    code, out, err = run(capsys, "--db", db, "user", "set", "ana@team.example", "--role", "none")
    assert code == 2 and "last active admin" in err


def test_user_add_reads_one_line_from_piped_stdin(db, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(PASSWORD + "\nignored\n"))
    code, out, err = run(capsys, "--db", db, "user", "add", "bob", "--role", "labeler")
    assert code == 0 and PASSWORD not in out + err
    assert check_password(PASSWORD, users(db)["bob"].password_hash)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_user_add_on_a_terminal_asks_twice(db, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", Terminal())
    typed = iter([PASSWORD, PASSWORD])
    prompts = []
    monkeypatch.setattr("getpass.getpass", lambda prompt="": prompts.append(prompt) or next(typed))
    code, out, err = run(capsys, "--db", db, "user", "add", "cat", "--role", "admin")
    assert code == 0 and len(prompts) == 2 and PASSWORD not in out + err
    assert check_password(PASSWORD, users(db)["cat"].password_hash)


def test_user_add_on_a_terminal_refuses_two_different_passwords(db, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", Terminal())
    typed = iter([PASSWORD, PASSWORD + "x"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(typed))
    code, _, err = run(capsys, "--db", db, "user", "add", "cat", "--role", "admin")
    assert code == 2 and "differ" in err and PASSWORD not in err
    assert users(db) == {}


@pytest.mark.parametrize("argv, env, reason", [
    (["user", "add", "dan", "--role", "boss", "--password-env", "PW"], PASSWORD, "invalid choice: 'boss'"),
    (["user", "add", "dan", "--role", "admin", "--password-env", "PW"], "short", "at least 8 characters"),
    (["user", "add", "dan", "--role", "admin", "--password-env", "UNSET_PW"], PASSWORD, "UNSET_PW is not set"),
    (["user", "add", "cli", "--role", "admin", "--password-env", "PW"], PASSWORD, "reserved"),
    (["user", "add", "--role", "admin", "--password-env", "PW"], PASSWORD, "required: name"),
    (["user", "set", "nobody", "--role", "admin"], PASSWORD, "no user named 'nobody'"),
    (["user", "set", "nobody"], PASSWORD, "nothing to change"),
    (["user", "set", "nobody", "--active", "maybe"], PASSWORD, "invalid choice: 'maybe'"),
])
def test_user_bad_input_exits_2_and_writes_nothing(db, capsys, monkeypatch, argv, env, reason):
    monkeypatch.setenv("PW", env)
    monkeypatch.delenv("UNSET_PW", raising=False)
    code, out, err = run(capsys, "--db", db, *argv)
    assert code == 2 and reason in err and len(err.strip().splitlines()) == 1
    assert env not in out + err
    assert users(db) == {} and not audit(db, "user.add")


def test_user_set_role_active_and_password(db, capsys, monkeypatch):
    monkeypatch.setenv("PW", PASSWORD)
    run(capsys, "--db", db, "user", "add", "eve", "--role", "labeler", "--password-env", "PW")
    monkeypatch.setenv("NEW_PW", "another secret 42")
    code, out, err = run(capsys, "--db", db, "user", "set", "eve", "--role", "reviewer", "--active", "no",
                         "--password-env", "NEW_PW")
    assert code == 0 and "another secret 42" not in out + err
    user = users(db)["eve"]
    assert (user.role, user.active) == ("reviewer", False)
    assert check_password("another secret 42", user.password_hash) and not check_password(PASSWORD, user.password_hash)
    [event] = audit(db, "user.update")
    assert event.actor == "cli" and event.after == {"role": "reviewer", "active": False, "password": "changed"}
    code, out, _ = run(capsys, "--db", db, "user", "list")
    assert out.splitlines()[1].split() == ["eve", "reviewer", "no", "password"]
    code, _, _ = run(capsys, "--db", db, "user", "set", "eve", "--active", "yes")
    assert code == 0 and users(db)["eve"].active


@pytest.mark.parametrize("argv, reason", [
    (["train", "--task", "no such task"], "no task named 'no such task'"),
    (["train", "--task", DEMO_TASK, "--epochs", "0"], "epochs must be at least 1"),
    (["train"], "--task is required"),
    (["train", "--resume", "999"], "no run 999"),
    (["eval", "--task", DEMO_TASK, "--version", "12345"], "has no version #12345"),
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
    assert "[E1] Write down each quantity." in md and "[E2] Check the answer" in md
    code, prompt, _ = run(capsys, "--db", db, "export", "--task", DEMO_TASK, "--version", "latest", "--format", "prompt")
    assert "[E1] Write down each quantity.\n[E2] Check the answer against the question." in prompt
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
    for command in ("demo", "train", "eval", "export", "import", "runs", "run", "versions", "label",
                    "dataset", "dataset add", "dataset show", "user", "user add", "user list", "user set"):
        with pytest.raises(SystemExit) as info:
            main([*command.split(), "--help"])
        assert info.value.code == 0
        assert "usage:" in capsys.readouterr().out


def test_a_task_exports_to_a_file_and_imports_under_a_new_name(db, capsys, tmp_path):
    target = tmp_path / "support.json"
    code, _, err = run(capsys, "--db", db, "task", "export", SUPPORT_TASK, "-o", str(target))
    assert code == 0 and "wrote" in err
    exported = json.loads(target.read_text(encoding="utf-8"))
    assert exported["task"]["reward_method"] == "judge_human" and len(exported["samples"]) == 40
    code, _, err = run(capsys, "--db", db, "task", "import", str(target))
    assert code == 2 and "exists" in err  # the name is taken: nothing written
    code, out, _ = run(capsys, "--db", db, "task", "import", str(target), "--name", "support copy")
    assert code == 0 and "support copy" in out
    with Session(get_engine(db)) as session:
        copy = queries.task_by_name(session, "support copy")
        assert copy.reward_settings == exported["task"]["reward_settings"]
        assert len(queries.samples(session, copy.id)) == 40


def test_a_broken_task_file_exits_2_and_writes_nothing(db, capsys, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "tfgrpo-task", "version": 1, "task": {"name": "x"}', encoding="utf-8")
    with Session(get_engine(db)) as session:
        before = len(queries.list_tasks(session))
    code, _, err = run(capsys, "--db", db, "task", "import", str(broken))
    assert code == 2 and err.startswith("error:")
    with Session(get_engine(db)) as session:
        assert len(queries.list_tasks(session)) == before


def test_queue_shows_what_waits_and_the_agreement(db, capsys):
    code, out, _ = run(capsys, "--db", db, "queue", "--task", SUPPORT_TASK)
    assert code == 0 and out.strip() == f"{SUPPORT_TASK}: 0 waiting, 0 done, 0 disputed"


def test_a_status_line_held_back_by_the_two_second_rule_is_shown_later(monkeypatch):
    import io

    from core.cli.progress import StatusLine

    class Count(StatusLine):
        def line(self, counters: dict) -> str:
            return f"done {counters['n']}"

    clock = {"now": 100.0}
    monkeypatch.setattr("core.cli.progress.time.monotonic", lambda: clock["now"])
    out = io.StringIO()
    status = Count(out)
    status({"n": 1})
    clock["now"] += 0.5
    status({"n": 2})  # too soon: held back
    clock["now"] += 5
    status({"n": 2})  # nothing new since, but "done 2" was never shown
    assert out.getvalue().splitlines() == ["done 1", "done 2"]


# --- hostile files (issue 12) -------------------------------------------------------------------------

DEEP = "[" * 100_000


def versions_of(db: str, task_name: str) -> int:
    with Session(get_engine(db)) as session:
        task = queries.task_by_name(session, task_name)
        return sum(len(queries.versions(session, lib.id)) for lib in queries.libraries(session, task.id))


@pytest.mark.parametrize("command, filename, where", [
    (["dataset", "add", "--task", DEMO_TASK], "deep.json", "deep.json"),
    (["dataset", "add", "--task", DEMO_TASK], "deep.jsonl", "deep.jsonl: line 1"),
    (["import", "--task", DEMO_TASK], "deep.json", "deep.json"),
    (["import", "--task", DEMO_TASK], "deep.md", "deep.md"),
    (["task", "import"], "deep.json", "the task file"),
])
def test_a_deeply_nested_file_exits_2_with_one_line_and_writes_nothing(db, capsys, tmp_path, command, filename,
                                                                          where):
    source = tmp_path / filename
    source.write_text(DEEP, encoding="utf-8")
    before = (len(samples_of(db, DEMO_TASK)), versions_of(db, DEMO_TASK), len(audit(db, "task.import")))
    code, out, err = run(capsys, "--db", db, *command, str(source))
    assert (code, out, err) == (2, "", f"error: {where} is nested more than 100 levels deep\n")
    assert (len(samples_of(db, DEMO_TASK)), versions_of(db, DEMO_TASK), len(audit(db, "task.import"))) == before


def test_a_question_answer_csv_is_added_and_the_mapping_said(db, capsys, tmp_path):
    source = tmp_path / "qa.csv"
    source.write_text("question,answer,topic\nWhat is 6 times 7?,42,times\n", encoding="utf-8")
    code, out, err = run(capsys, "--db", db, "dataset", "add", "--task", DEMO_TASK, str(source))
    assert (code, err) == (0, "")
    assert out.splitlines() == ["mapped question→query, answer→reference",
                                f"added 1 samples to {DEMO_TASK} (0 already present)"]
    [sample] = [s for s in samples_of(db, DEMO_TASK).values() if s.query == "What is 6 times 7?"]
    assert (sample.reference, sample.meta) == ("42", {"topic": "times"})


def test_a_second_file_without_ids_adds_its_rows_and_the_same_file_again_names_each_row(db, capsys, tmp_path):
    first = tmp_path / "qa.csv"
    first.write_text("question,answer\nWhat is 6 times 7?,42\nWhat is 2 plus 2?,4\n", encoding="utf-8")
    second = tmp_path / "more.jsonl"
    second.write_text(json.dumps({"question": "What is 9 minus 3?", "answer": "6"}) + "\n", encoding="utf-8")
    mapped = "mapped question→query, answer→reference"
    code, out, _ = run(capsys, "--db", db, "dataset", "add", "--task", DEMO_TASK, str(first))
    assert code == 0 and out.splitlines() == [mapped, f"added 2 samples to {DEMO_TASK} (0 already present)"]
    code, out, _ = run(capsys, "--db", db, "dataset", "add", "--task", DEMO_TASK, str(second))
    assert code == 0 and out.splitlines() == [mapped, f"added 1 samples to {DEMO_TASK} (0 already present)"]
    ids = {s.query: s.external_id for s in samples_of(db, DEMO_TASK).values()}
    assert "What is 9 minus 3?" in ids
    code, out, err = run(capsys, "--db", db, "dataset", "add", "--task", DEMO_TASK, str(first))
    assert (code, err) == (0, "")
    assert out.splitlines() == [mapped, f"added 0 samples to {DEMO_TASK} (2 already present)",
                                f"data row 1 is the same as sample {ids['What is 6 times 7?']} already stored",
                                f"data row 2 is the same as sample {ids['What is 2 plus 2?']} already stored"]


def test_an_id_stored_with_other_content_exits_2_naming_both_texts_and_writes_nothing(db, capsys, tmp_path):
    source = tmp_path / "ids.jsonl"
    source.write_text(json.dumps({"id": "n1", "query": "What is 2+2?", "answer": "4"}) + "\n", encoding="utf-8")
    assert run(capsys, "--db", db, "dataset", "add", "--task", DEMO_TASK, str(source))[0] == 0
    before = (samples_of(db, DEMO_TASK).keys(), len(audit(db, "task.add_data")))
    source.write_text(json.dumps({"id": "n2", "query": "What is 5+5?"}) + "\n"
                      + json.dumps({"id": "n1", "query": "What is 3+3?", "answer": "6"}) + "\n", encoding="utf-8")
    code, out, err = run(capsys, "--db", db, "dataset", "add", "--task", DEMO_TASK, str(source))
    assert (code, out) == (2, "") and len(err.splitlines()) == 1
    assert err.startswith("error: ids.jsonl: line 2: id 'n1' is already stored with other content")
    assert "query 'What is 2+2?', reference '4'" in err and "query 'What is 3+3?', reference '6'" in err
    assert (samples_of(db, DEMO_TASK).keys(), len(audit(db, "task.add_data"))) == before


def test_prompt_and_solution_columns_are_synonyms_too_and_an_explicit_map_wins(db, capsys, tmp_path):
    source = tmp_path / "ps.jsonl"
    source.write_text(json.dumps({"id": "p1", "prompt": "2+2?", "solution": "4", "input": "ignored"}) + "\n",
                      encoding="utf-8")
    code, out, _ = run(capsys, "--db", db, "dataset", "add", "--task", DEMO_TASK, "--map", "query=input",
                       str(source))
    assert code == 0 and out.splitlines()[0] == "mapped solution→reference"  # query was mapped by hand
    sample = samples_of(db, DEMO_TASK)["p1"]
    assert (sample.query, sample.reference, sample.meta) == ("ignored", "4", {"prompt": "2+2?"})


@pytest.mark.parametrize("filename, content, reason", [
    ("big.md", "- Check the units of every quantity.\n" * 60_000, "big.md: the file is 2.2 MB; the limit for a "
                                                                   "library is 2 MB"),
    ("many.md", "".join(f"- Check the units of quantity {n}.\n" for n in range(31)),
     "many.md: 31 experiences; an import holds at most 30"),
    ("long.json", json.dumps(["word " * 200_000]), "long.json: experience 1 is too long (200,000 words, "
                                                   "999,999 characters; at most 64 words / 500 characters)"),
])
def test_an_oversized_library_import_exits_2_and_writes_nothing(db, capsys, tmp_path, filename, content, reason):
    source = tmp_path / filename
    source.write_text(content, encoding="utf-8")
    before = versions_of(db, DEMO_TASK)
    code, out, err = run(capsys, "--db", db, "import", "--task", DEMO_TASK, str(source))
    assert code == 2 and out == "" and err.startswith(f"error: {reason}") and len(err.splitlines()) == 1
    assert versions_of(db, DEMO_TASK) == before


def test_a_run_whose_every_group_failed_exits_1_with_the_reason_and_can_be_resumed(db, capsys, unreachable_model):
    """A server that is down fails every call: the run must not end `completed` with an unchanged library."""
    model, api_base = unreachable_model
    code, out, _ = run(capsys, "--db", db, "train", "--task", DEMO_TASK, "--model", model, "--learner-model", model,
                       "--api-base", api_base, "--epochs", "1", "--batch-size", "1",
                       "--group-size", "1", "--limit", "1", "--gate", "off")
    assert code == 1
    assert "failed (nothing answered at a model's address, so no more calls were sent there: " in out  # the reason
    assert "connection refused" in out and "StepFailed: epoch 1 batch 1 failed: every group failed (1 of 1)" in out
    assert "resume the run to retry it" in out
    run_id = int(out.split()[1].rstrip(":"))
    code, out, _ = run(capsys, "--db", db, "train", "--resume", str(run_id))
    assert code == 1 and f"run {run_id}: failed" in out  # resumable: it ran again (and failed the same way)


def test_a_model_that_cannot_be_called_is_refused_before_anything_is_queued(db, capsys):
    """The model check sits where runs and evaluations are created, so the CLI meets it as the pages do."""
    code, out, err = run(capsys, "--db", db, "train", "--task", DEMO_TASK, "--model", "nosuchprovider/m", "--queue")
    assert code == 2 and out == "" and "no known provider 'nosuchprovider'" in err
    code, out, err = run(capsys, "--db", db, "eval", "--task", DEMO_TASK, "--version", "empty",
                         "--model", "nosuchprovider/m", "--queue")
    assert code == 2 and "no known provider 'nosuchprovider'" in err
    with Session(get_engine(db)) as session:
        assert session.exec(select(Run)).all() == [] and session.exec(select(Evaluation)).all() == []


@pytest.fixture
def no_provider_keys(monkeypatch):
    from core.models.model_choice import PROVIDERS

    for variable, _models in PROVIDERS.values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("STUDIO_API_BASE", raising=False)


def test_train_says_plainly_that_the_embedded_learner_rarely_writes_a_usable_lesson(db, capsys, no_provider_keys,
                                                                                    monkeypatch):
    code, out, err = run(capsys, "--db", db, "train", "--task", DEMO_TASK, "--limit", "2", "--epochs", "1", "--queue")
    assert code == 0 and "queued" in out
    assert "note: The learner is the embedded model local/qwen2.5-coder-0.5b: it rarely writes a usable lesson." in err
    assert "11 of its 14 operations were invalid" in err and "+0.017 [-0.050, +0.083]" in err
    assert "set a provider's API key" in err and "--learner-model" not in err

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    code, _out, err = run(capsys, "--db", db, "train", "--task", DEMO_TASK, "--limit", "2", "--epochs", "1", "--queue",
                          "--seed", "1")  # another seed: the same run queued again would be refused as a twin
    assert code == 0 and "A hosted learner can be used here: openai/gpt-4o-mini" in err
    assert "Use it with --learner-model openai/gpt-4o-mini." in err

    code, _out, err = run(capsys, "--db", db, "train", "--task", DEMO_TASK, "--limit", "2", "--epochs", "1", "--queue",
                          "--learner-model", "openai/gpt-4o-mini")
    assert code == 0 and "The learner is the embedded model" not in err and "note:" not in err
