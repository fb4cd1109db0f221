"""Personas are data (core/domain/personas.py): one set of rules for files, task files and the database, and
every refused file says which file, which item or row, and which field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlmodel import Session, select

from core.cli import main
from core.domain.personas import Persona, Scenario, parse_personas, parse_scenarios
from core.errors import InvalidInput, PermissionDenied
from core.records.people.users import add_user
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.task_io import save_personas, task_personas
from storage import queries
from storage.db import url_with_password
from storage.tables import AuditEvent

CORPUS = Path(__file__).parent / "data" / "personas"
ANN = Persona(name="Ann", description="Short answers; wants her money back.", segment="resistant",
              hidden_facts=["opened the box"])
BOB = Persona(name="Bob", description="Rambles.", segment="verbose")

# file -> words the message must hold: the file name, where, and the field or problem
BAD_FILES = {
    "not_json.json": ("not_json.json", "not valid JSON"),
    "wrong_top_level.json": ("wrong_top_level.json", "expected a JSON list of personas", "got a string"),
    "missing_name.json": ("missing_name.json: item 1", "name is missing"),
    "bad_segment.json": ("bad_segment.json: item 1", "segment 'At Risk!' must be a short tag like at_risk"),
    "bad_segment_row.csv": ("bad_segment_row.csv: row 2", "segment 'At Risk!'"),
    "duplicate_name.json": ("duplicate_name.json: item 2", "name 'ann' is used twice (first by item 1)"),
    "unknown_field.json": ("unknown_field.json: item 1", "unknown field 'hiden_facts'", "hidden_facts"),
    "empty.json": ("empty.json", "the file is empty"),
    "missing_column.csv": ("missing_column.csv", "missing column(s) 'segment'"),
    "not_utf8.csv": ("not_utf8.csv: line 2", "not valid UTF-8 (byte 0xe9)"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_each_malformed_file_is_refused_naming_the_file_the_place_and_the_problem(name):
    with pytest.raises(InvalidInput) as refused:
        parse_personas((CORPUS / name).read_bytes(), name)
    message = str(refused.value)
    assert "\n" not in message
    for words in BAD_FILES[name]:
        assert words in message


def test_the_corpus_has_a_test_for_every_bad_file():
    files = {path.name for path in CORPUS.iterdir()} - {"good.json", "good.csv"}
    assert files == set(BAD_FILES)


@pytest.mark.parametrize("name", ["good.json", "good.csv"])
def test_good_json_and_csv_give_the_same_personas(name):
    personas = parse_personas((CORPUS / name).read_bytes(), name)
    assert [(p.name, p.segment, p.hidden_facts) for p in personas] == [
        ("Ann", "resistant", ["opened the box", "bought it on sale"]), ("Bob", "verbose", [])]


def test_a_plain_json_list_and_text_input_are_read_too():
    text = json.dumps([ANN.model_dump()])
    assert parse_personas(text, "p.json") == [ANN]


def test_a_persona_is_checked_field_by_field():
    assert Persona(name="  Ann ", description=" d ", segment=" At_Risk ").model_dump() == {
        "name": "Ann", "description": "d", "segment": "at_risk", "hidden_facts": []}
    for bad in ({"name": " "}, {"name": "x" * 81}, {"segment": "-lead"}, {"segment": "a" * 41},
                {"description": ""}, {"hidden_facts": ["ok", " "]}, {"nmae": "Ann"}):
        with pytest.raises(ValueError):
            Persona(**{"name": "Ann", "description": "d", "segment": "calm", **bad})


def test_other_file_types_and_items_that_are_not_objects_are_refused():
    with pytest.raises(InvalidInput, match=r"p\.txt: unsupported file type '\.txt'"):
        parse_personas("name\n", "p.txt")
    with pytest.raises(InvalidInput, match=r"p\.json: item 2: expected a JSON object, got a number"):
        parse_personas(json.dumps([ANN.model_dump(), 3]), "p.json")
    with pytest.raises(InvalidInput, match=r"p\.json: the file holds no personas"):
        parse_personas("[]", "p.json")
    with pytest.raises(InvalidInput, match=r"p\.csv: row 1: has 5 cells but the header has 3"):
        parse_personas("name,description,segment\nAnn,d,calm,x,y\n", "p.csv")


def test_scenarios_must_name_a_known_persona():
    text = json.dumps({"scenarios": [{"persona": "Ann", "opening": "My order is late.", "goal": "a refund"},
                                     {"persona": "Carl", "opening": "Hi", "goal": "g"}]})
    with pytest.raises(InvalidInput, match=r"s\.json: item 2: persona 'Carl' is not one of the personas \(Ann, Bob\)"):
        parse_scenarios(text, "s.json", [ANN, BOB])
    scenarios = parse_scenarios("persona,opening,goal,must_not\nAnn,Late order,refund,promise a date;blame\n",
                                "s.csv", [ANN])
    assert scenarios == [Scenario(persona="Ann", opening="Late order", goal="refund",
                                  must_not=["promise a date", "blame"])]
    with pytest.raises(InvalidInput, match=r"s\.json: item 1: goal is missing"):
        parse_scenarios('[{"persona": "Ann", "opening": "o"}]', "s.json", [ANN])


def audit(engine) -> list[AuditEvent]:
    with Session(engine) as session:
        return list(session.exec(select(AuditEvent).where(AuditEvent.action == "task.personas")))


def stored(engine, task: str = DEMO_TASK) -> list[Persona]:
    with Session(engine) as session:
        return task_personas(session, queries.task_by_name(session, task).id)


def test_saving_replaces_a_tasks_personas_and_audits_the_change(engine, demo_task):
    assert save_personas(engine, DEMO_TASK, [ANN, BOB], "ann") == 2
    assert stored(engine) == [ANN, BOB]
    renamed_bob = BOB.model_copy(update={"description": "Rambles more."})
    assert save_personas(engine, DEMO_TASK, [renamed_bob], "ann") == 1  # a kept name reuses the (task, name) key
    assert stored(engine) == [renamed_bob]
    save_personas(engine, DEMO_TASK, [renamed_bob], "ann")  # the same again: nothing to audit
    first, second = audit(engine)
    assert first.actor == "ann" and first.before == {"personas": []}
    assert second.before == first.after and second.after == {"personas": [renamed_bob.model_dump()]}


def test_saving_refuses_duplicates_and_people_who_are_not_admins(engine, demo_task):
    with pytest.raises(InvalidInput, match="name 'Ann' is used twice"):
        save_personas(engine, DEMO_TASK, [ANN, ANN], "ann")
    add_user(engine, "boss", "admin", "correct horse battery", actor="cli")
    add_user(engine, "lab", "labeler", "correct horse battery", actor="boss")
    with pytest.raises(PermissionDenied):
        save_personas(engine, DEMO_TASK, [ANN], "lab")
    assert stored(engine) == [] and audit(engine) == []


def cli(capsys, engine, *argv) -> tuple[int, str, str]:
    code = main(["--db", url_with_password(engine), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_replaces_and_shows_a_tasks_personas(engine, demo_task, capsys):
    code, out, _ = cli(capsys, engine, "task", "personas", DEMO_TASK, str(CORPUS / "good.csv"))
    assert code == 0 and out.strip() == f"{DEMO_TASK}: 2 personas"
    code, out, _ = cli(capsys, engine, "task", "personas", DEMO_TASK, "--show")
    assert code == 0 and json.loads(out) == {"personas": [p.model_dump() for p in stored(engine)]}
    assert [p["name"] for p in json.loads(out)["personas"]] == ["Ann", "Bob"]


def test_the_cli_refuses_a_bad_file_without_changing_anything(engine, demo_task, capsys):
    save_personas(engine, DEMO_TASK, [ANN], "ann")
    code, _, err = cli(capsys, engine, "task", "personas", DEMO_TASK, str(CORPUS / "bad_segment.json"))
    assert code == 2 and "bad_segment.json: item 1: segment 'At Risk!'" in err
    code, _, err = cli(capsys, engine, "task", "personas", DEMO_TASK)
    assert code == 2 and "give a .json or .csv FILE" in err
    code, _, err = cli(capsys, engine, "task", "personas", "no such task", "--show")
    assert code == 2 and "no such task" in err
    assert stored(engine) == [ANN]
