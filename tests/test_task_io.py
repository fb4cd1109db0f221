"""Task settings, export and import (core/records/tasks/task_io.py): one path for the page and scripts, all or nothing."""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session, func, select

from core.errors import NotFound, PermissionDenied
from core.records.people.users import add_user
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.task_io import (
    FORMAT,
    TaskSettings,
    columns_of,
    export_filename,
    export_task,
    export_task_json,
    import_task,
    save_task,
)
from storage import queries
from storage.tables import AuditEvent, Library, LibraryVersion, Sample, Task


def settings(**overrides) -> TaskSettings:
    base = dict(name="support replies", instructions="Answer the customer kindly.", description="d",
                answer_format="Plain text.", agent_mode="direct", policy_model="p", learner_model="l",
                judge_model="j", reward_method="judge", reward_settings={"criteria": "empathy", "scale": "1-5"})
    return TaskSettings(**{**base, **overrides})


def counts(engine) -> dict[str, int]:
    with Session(engine) as session:
        return {model.__name__: session.exec(select(func.count()).select_from(model)).one()
                for model in (Task, Sample, Library, LibraryVersion, AuditEvent)}


def events(engine, action: str) -> list[AuditEvent]:
    with Session(engine) as session:
        return list(session.exec(select(AuditEvent).where(AuditEvent.action == action).order_by(AuditEvent.id)))


def exported(engine, name: str = DEMO_TASK) -> dict:
    with Session(engine) as session:
        return export_task(session, queries.task_by_name(session, name))


def test_save_creates_a_task_with_its_default_library_and_an_audit_event(engine):
    task = save_task(engine, settings(name="  support replies "), "ann")
    with Session(engine) as session:
        stored = queries.task_by_name(session, "support replies")
        assert stored is not None and stored.id == task.id
        assert TaskSettings.from_task(stored) == settings()
        library = queries.library_by_name(session, task.id, "default")
        assert library is not None and len(queries.versions(session, library.id)) == 1
    [event] = events(engine, "task.create")
    assert event.actor == "ann" and event.object_id == task.id
    assert event.before is None and event.after == {**settings().to_dict(), "kind": "single"}


def test_save_updates_and_renames_with_before_and_after_in_the_audit(engine):
    task = save_task(engine, settings(), "ann")
    changed = settings(name="support v2", reward_method="contains_all",
                       reward_settings={"phrases": ["sorry", "next step"], "partial": True})
    save_task(engine, changed, "ann", original_name="support replies")
    with Session(engine) as session:
        assert queries.task_by_name(session, "support replies") is None
        stored = queries.task_by_name(session, "support v2")
        assert stored.id == task.id
        assert stored.reward_method == "contains_all"
        assert stored.reward_settings == {"phrases": ["sorry", "next step"], "partial": True}
    [event] = events(engine, "task.update")
    assert event.before == settings().to_dict() and event.after == changed.to_dict()


def test_saving_unchanged_settings_writes_no_event(engine):
    save_task(engine, settings(), "ann")
    save_task(engine, settings(), "ann", original_name="support replies")
    assert events(engine, "task.update") == []


def test_rename_onto_an_existing_name_and_create_of_a_taken_name_are_refused(engine, demo_task):
    save_task(engine, settings(), "ann")
    before = counts(engine)
    with pytest.raises(ValueError, match="exists already"):
        save_task(engine, settings(name=DEMO_TASK), "ann", original_name="support replies")
    with pytest.raises(ValueError, match="exists already"):
        save_task(engine, settings(), "ann")
    with pytest.raises(NotFound):
        save_task(engine, settings(name="x"), "ann", original_name="no such task")
    assert counts(engine) == before


@pytest.mark.parametrize(("overrides", "message"), [
    ({"name": ""}, "name must be 1 to 100"),
    ({"name": "x" * 101}, "name must be 1 to 100"),
    ({"instructions": "  "}, "instructions"),
    ({"agent_mode": "shell"}, "unknown agent mode 'shell'"),
    ({"reward_method": "vibes"}, "unknown reward method 'vibes'"),
    ({"policy_model": " "}, "policy model must not be empty"),
    ({"judge_model": ""}, "judge model must not be empty"),
    ({"reward_settings": []}, "reward settings must be a JSON object"),
    ({"reward_method": "numeric", "reward_settings": {"rel_tol": -1}}, "rel_tol must be a number of 0 or more"),
    ({"reward_method": "numeric", "reward_settings": {"abs_tol": "0.1"}}, "abs_tol must be a number"),
    ({"reward_method": "regex", "reward_settings": {"pattern": "(unclosed"}}, "not a valid regular expression"),
    ({"reward_method": "regex", "reward_settings": {"ignore_case": "yes"}}, "ignore_case must be true or false"),
    ({"reward_method": "contains_all", "reward_settings": {"phrases": ["a", 1]}}, "phrases must be a list"),
    ({"reward_method": "judge", "reward_settings": {"scale": "1-10"}}, "scale must be one of binary, 1-5"),
    ({"reward_method": "judge", "reward_settings": {"criteria": ["a"]}}, "criteria must be text"),
    ({"reward_method": "human", "reward_settings": {"labels_per_rollout": 6}}, "labels_per_rollout must be"),
    ({"reward_method": "human", "reward_settings": {"labels_per_rollout": 0}}, "labels_per_rollout must be"),
    ({"reward_method": "human", "reward_settings": {"labels_per_rollout": 1.5}}, "labels_per_rollout must be"),
    ({"reward_method": "judge_human", "reward_settings": {"spot_check_share": 1.5}}, "spot_check_share must be"),
])
def test_each_invalid_setting_is_refused_with_its_name_and_nothing_is_written(engine, overrides, message):
    before = counts(engine)
    with pytest.raises(ValueError, match=message):
        save_task(engine, settings(**overrides), "ann")
    assert counts(engine) == before


def test_valid_method_settings_pass_and_keys_the_method_does_not_read_are_kept(engine):
    for method, reward_settings in [
        ("numeric", {"rel_tol": 0, "abs_tol": 0.5}),
        ("regex", {"pattern": r"\d+", "ignore_case": False, "full_match": True}),
        ("contains_all", {"phrases": "sorry"}),
        ("judge_human", {"criteria": "c", "scale": "binary", "labels_per_rollout": 2, "spot_check_share": 0}),
    ]:
        settings(reward_method=method, reward_settings=reward_settings).validate()
    kept = settings(reward_method="math", reward_settings={"scale": "nonsense", "future_key": 1})
    kept.validate()
    save_task(engine, kept, "ann")
    with Session(engine) as session:
        assert queries.task_by_name(session, "support replies").reward_settings == {"scale": "nonsense",
                                                                                     "future_key": 1}


def test_export_then_import_under_a_new_name_gives_equal_settings_and_samples(engine, demo_task):
    data = exported(engine)
    assert data["format"] == FORMAT and data["version"] == 1 and len(data["samples"]) == 200
    with Session(engine) as session:
        text = export_task_json(session, queries.task_by_name(session, DEMO_TASK))
    task = import_task(engine, text.encode("utf-8"), "ann", rename="arithmetic copy")
    copy = exported(engine, "arithmetic copy")
    assert copy["task"] == {**data["task"], "name": "arithmetic copy"}
    assert copy["samples"] == data["samples"]
    with Session(engine) as session:
        assert queries.library_by_name(session, task.id, "default") is not None
    [event] = events(engine, "task.import")
    assert event.actor == "ann" and event.object_id == task.id
    assert event.after["name"] == "arithmetic copy" and event.after["samples"] == 200


def test_export_keeps_non_ascii_text_readable(engine):
    save_task(engine, settings(name="Überprüfung", instructions="Antworte höflich."), "ann")
    with Session(engine) as session:
        text = export_task_json(session, queries.task_by_name(session, "Überprüfung"))
    assert "Antworte höflich." in text
    assert export_filename("Überprüfung") == "tfgrpo-task-berpr-fung.json"
    assert export_filename("Support Replies (v2)") == "tfgrpo-task-support-replies-v2.json"
    assert export_filename("!!!") == "tfgrpo-task-task.json"


def test_import_refuses_an_existing_name_and_suggests_a_rename(engine, demo_task):
    before = counts(engine)
    with pytest.raises(ValueError, match="exists already; import it under another name"):
        import_task(engine, json.dumps(exported(engine)), "ann")
    assert counts(engine) == before


def good_file() -> dict:
    return {"format": FORMAT, "version": 1, "task": settings(name="imported").to_dict(),
            "samples": [{"id": "a", "query": "q1", "reference": None, "rubric": "r", "split": "train", "meta": {}},
                        {"id": "b", "query": "q2", "reference": "x", "rubric": None, "split": "test",
                         "meta": {"k": 1}}]}


def broken(change) -> str:
    data = good_file()
    change(data)
    return json.dumps(data)


def _set_sample(index: int, key: str, value):
    def change(data):
        data["samples"][index][key] = value
    return change


@pytest.mark.parametrize(("text", "message"), [
    ("", "the file is empty"),
    ("{not json", "not valid JSON: line 1"),
    ("[1, 2]", "not a task file"),
    (broken(lambda d: d.update(format="other")), "not a task file"),
    (broken(lambda d: d.update(version=2)), "unsupported task file version 2"),
    (broken(lambda d: d.update(task="x")), "task settings must be a JSON object"),
    (broken(lambda d: d["task"].pop("instructions")), "lack instructions"),
    (broken(lambda d: d["task"].update(colour="red")), "unknown task setting"),
    (broken(lambda d: d["task"].update(reward_method="vibes")), "unknown reward method"),
    (broken(lambda d: d["task"].update(reward_settings={"scale": "1-10"})), "scale must be one of"),
    (broken(lambda d: d.update(samples={})), "\"samples\" must be a JSON array"),
    (broken(lambda d: d["samples"].append("x")), "sample 3: expected a JSON object"),
    (broken(_set_sample(1, "query", " ")), "sample 2 \\('b'\\): query is missing or empty"),
    (broken(_set_sample(1, "id", "a")), "sample 2: duplicate id 'a' \\(first used by sample 1\\)"),
    (broken(_set_sample(0, "id", "")), "sample 1: id is missing or empty"),
    (broken(_set_sample(1, "split", "dev")), "split must be train, validation or test, got 'dev'"),
    (broken(_set_sample(1, "meta", [1])), "meta must be a JSON object"),
    (broken(_set_sample(1, "reference", 5)), "reference must be text or null"),
    (broken(_set_sample(0, "extra", 5)), "unknown field"),
    (broken(_set_sample(0, "query", "x" * 20_001)), "query is longer than 20,000 characters"),
])
def test_each_bad_task_file_is_refused_with_its_problem_and_nothing_is_written(engine, text, message):
    before = counts(engine)
    with pytest.raises(ValueError, match=message):
        import_task(engine, text, "ann")
    assert counts(engine) == before


def test_a_file_that_is_not_utf8_is_refused(engine):
    with pytest.raises(ValueError, match="not UTF-8"):
        import_task(engine, json.dumps(good_file()).encode("utf-8") + b"\xff", "ann")


def test_a_good_file_imports_every_sample_as_written(engine):
    task = import_task(engine, json.dumps(good_file()), "ann")
    with Session(engine) as session:
        rows = [(s.external_id, s.query, s.reference, s.rubric, s.split, s.meta)
                for s in queries.samples(session, task.id)]
    assert rows == [("a", "q1", None, "r", "train", {}), ("b", "q2", "x", None, "test", {"k": 1})]


def test_a_labeller_can_neither_save_nor_import_and_nothing_is_written(engine, demo_task):
    add_user(engine, "lab", "labeler", "password1", actor="cli")
    before = counts(engine)
    with pytest.raises(PermissionDenied, match="lab is a labeler; editing tasks needs the admin role"):
        save_task(engine, settings(), "lab")
    with pytest.raises(PermissionDenied):
        save_task(engine, settings(name="renamed"), "lab", original_name=DEMO_TASK)
    with pytest.raises(PermissionDenied, match="importing tasks needs the admin role"):
        import_task(engine, json.dumps(good_file()), "lab")
    assert counts(engine) == before
    with Session(engine) as session:
        assert queries.task_by_name(session, DEMO_TASK) is not None


def test_an_admin_user_may_edit_once_sign_in_is_on(engine, demo_task):
    add_user(engine, "boss", "admin", "password1", actor="cli")
    save_task(engine, settings(), "boss")
    assert [e.actor for e in events(engine, "task.create")][-1] == "boss"


@pytest.mark.parametrize(("data", "filename", "columns"), [
    (b"Question,Answer,criteria\n1,2,3\n", "x.csv", ["Question", "Answer", "criteria"]),
    ("\ufeffq,a\n".encode(), "x.csv", ["q", "a"]),
    (b'{"q": 1, "a": 2}\nnot json\n{"b": 3, "q": 4}\n', "x.jsonl", ["q", "a", "b"]),
    (b'[{"q": 1}, 5, {"r": 2}]', "x.json", ["q", "r"]),
    (b"\xff\xfe\x00", "x.csv", []),
    (b"", "x.csv", []),
    (b"[broken", "x.json", []),
    (b"a,b\n", "x.txt", []),
])
def test_columns_of_reads_names_and_never_raises(data, filename, columns):
    assert columns_of(data, filename) == columns


def test_a_task_file_with_a_formula_cell_is_refused(engine, demo_task):
    from core.records.tasks.task_io import read_task_file

    data = {"format": "tfgrpo-task", "version": 1,
            "task": {"name": "x", "instructions": "Answer.", "reward_method": "exact"},
            "samples": [{"id": "a", "query": "=HYPERLINK(\"http://x\")", "split": "train"}]}
    with pytest.raises(ValueError, match="sample 1 .*query looks like a spreadsheet formula"):
        read_task_file(json.dumps(data))


def test_a_reference_used_as_the_regex_pattern_is_refused_when_it_can_take_exponential_time(engine):
    from core.domain.datasets import DatasetError
    from core.records.tasks.samples import add_dataset

    save_task(engine, settings(name="codes", reward_method="regex", reward_settings={}), "cli")
    bad = b'{"id": "q1", "query": "Say a", "reference": "^\\\\d+$"}\n{"id": "q2", "query": "Say b", "reference": "(a+)+$"}\n'
    with pytest.raises(DatasetError, match="sample 'q2'.*exponential time"):
        add_dataset(engine, "codes", bad, "codes.jsonl")
    assert add_dataset(engine, "codes", bad.splitlines()[0], "codes.jsonl") == (1, 0)


def test_adding_a_file_with_a_test_share_holds_rows_out_and_the_audit_keeps_the_shares(engine, demo_task):
    from core.domain.datasets import DatasetError
    from core.records.tasks.samples import add_dataset

    data = ("id,query\n" + "".join(f"h{i},Question {i}?\n" for i in range(8))).encode()
    before = counts(engine)
    with pytest.raises(DatasetError, match="add up to 1.2"):
        add_dataset(engine, DEMO_TASK, data, "held.csv", test_share=0.6, validation_share=0.6)
    assert counts(engine) == before
    assert add_dataset(engine, DEMO_TASK, data, "held.csv", test_share=0.25, validation_share=0.125) == (8, 0)
    with Session(engine) as session:
        splits = [s.split for s in queries.samples(session, demo_task.id) if s.external_id.startswith("h")]
    assert sorted(splits) == ["test", "test", "train", "train", "train", "train", "train", "validation"]
    [event] = events(engine, "task.add_data")
    assert event.after == {"file": "held.csv", "rows": 8, "added": 8, "test_share": 0.25, "validation_share": 0.125,
                           "splits": {"train": 5, "validation": 1, "test": 2}}


def test_the_cli_dataset_add_takes_the_same_shares(engine, demo_task, tmp_path, capsys):
    from core.cli import main
    from storage.db import url_with_password

    source = tmp_path / "more.csv"
    source.write_text("id,query\n" + "".join(f"c{i},Question {i}?\n" for i in range(4)), encoding="utf-8")
    url = url_with_password(engine)
    argv = ["--db", url, "dataset", "add", "--task", DEMO_TASK, "--test-share", "0.25", "--validation-share", "0.25"]
    assert main([*argv, str(source)]) == 0
    with Session(engine) as session:
        splits = sorted(s.split for s in queries.samples(session, demo_task.id) if s.external_id.startswith("c"))
    assert splits == ["test", "train", "train", "validation"]
    assert main([*argv[:-1], "0.9", str(source)]) == 2
    assert "the test and validation shares add up to 1.15" in capsys.readouterr().err


def test_kind_and_personas_survive_an_export_and_import(engine, demo_task):
    from core.domain.personas import Persona
    from core.records.tasks.task_io import save_personas, task_personas

    personas = [Persona(name="Ann", description="Terse; hides that she opened the box.", segment="resistant",
                        hidden_facts=["opened the box"]),
                Persona(name="Bob", description="Rambles.", segment="verbose")]
    plain = exported(engine)
    assert plain["kind"] == "single" and "personas" not in plain  # no personas: no key
    save_personas(engine, DEMO_TASK, personas, "ann")
    data = {**exported(engine), "kind": "conversation"}
    assert data["personas"] == [p.model_dump() for p in personas]
    task = import_task(engine, json.dumps(data), "ann", rename="conversation copy")
    with Session(engine) as session:
        copy = queries.task_by_name(session, "conversation copy")
        assert copy.kind == "conversation" and task_personas(session, task.id) == personas
    assert exported(engine, "conversation copy")["personas"] == data["personas"]


@pytest.mark.parametrize(("change", "message"), [
    ({"kind": "chat"}, "unknown task kind 'chat'; use one of single, conversation"),
    ({"personas": {"name": "Ann"}}, "\"personas\" must be a JSON array of persona objects"),
    ({"personas": [{"name": "Ann", "description": "d", "segment": "At Risk!"}]},
     "personas: item 1: segment 'At Risk!' must be a short tag like at_risk"),
    ({"personas": [{"name": "Ann", "description": "d", "segment": "a"},
                   {"name": "Ann", "description": "e", "segment": "b"}]},
     "personas: item 2: name 'Ann' is used twice (first by item 1)"),
])
def test_an_import_with_a_bad_kind_or_persona_changes_nothing(engine, demo_task, change, message):
    before = counts(engine)
    with pytest.raises(ValueError) as refused:
        import_task(engine, json.dumps({**exported(engine), **change}), "ann", rename="copy")
    assert str(refused.value) == message
    assert counts(engine) == before
