"""One public name per version (issue 41, item 1): a version is read and typed by its number in its library (#3),
on the pages, in the CLI's output and arguments and in the HTTP API's URLs; its database id stays inside (a JSON
answer may carry both, each named). An id typed where a number is expected is refused with a message naming both.

Every test here runs on a database whose ids and numbers differ: the library "other" is filled first, so the
default library's versions #2 and #3 have the ids 6 and 7, and the number typed is never the id by accident.
"""

from __future__ import annotations

import json
import shlex

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from api.app import create_app
from core.cli import main
from core.errors import InvalidInput, NotFound
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.records.keys.api_keys import create_key
from core.records.library.promotion import preview_promotion
from core.records.library.versions import PRODUCTION, import_library, promote, resolve_version, set_label
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.lookup import get_task
from storage import queries
from storage.db import url_with_password
from storage.tables import Evaluation, LibraryVersion
from tests.ui_support import run_app, scripted_gateway, table_with

OTHER = "other"


def diverging(engine) -> dict[str, LibraryVersion]:
    """Library "other" #1 to #4 (ids 2 to 5) first, then the default library's #2 and #3 (ids 6 and 7); the default
    library's #1 is id 1, the demo task's."""
    for text in ("- Ask for the order number.", "- Quote the policy.", "- Say what happens next."):
        import_library(engine, DEMO_TASK, text, "other.md", library_name=OTHER, actor="system")
    second = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    third = import_library(engine, DEMO_TASK, "- Re-read the question.\n- Check the units.", "b.md", actor="system")
    with Session(engine) as session:
        task = get_task(session, DEMO_TASK)
        other = queries.library_by_name(session, task.id, OTHER)
        other_third = [v for v in queries.versions(session, other.id) if v.number == 3][0]
    assert (second.number, second.id, third.number, third.id) == (2, 6, 3, 7)
    assert (other_third.number, other_third.id) == (3, 4)
    return {"#2": second, "#3": third, "other #3": other_third}


@pytest.fixture
def versions(engine, demo_task) -> dict[str, LibraryVersion]:
    return diverging(engine)


def cli(capsys, engine, *argv: str) -> tuple[int, str, str]:
    code = main(["--db", url_with_password(engine), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def evaluated(engine, ref: str, library: str = "default", **kw) -> Evaluation:
    _model, gateway = scripted_gateway(engine)
    evaluation_id = create_evaluation(engine, DEMO_TASK, ref, library_name=library, created_by="system", **kw)
    return execute_evaluation(engine, evaluation_id, gateway=gateway)


# ---------------------------------------------------------------------------------------------- the one resolution


def test_a_typed_number_is_the_version_of_that_number_in_the_chosen_library(engine, versions):
    with Session(engine) as session:
        task = get_task(session, DEMO_TASK)
        for typed in ("3", "#3", " #3 "):
            assert resolve_version(session, task, typed).id == versions["#3"].id
        assert resolve_version(session, task, "3", OTHER).id == versions["other #3"].id
        assert resolve_version(session, task, "latest").id == versions["#3"].id
        assert resolve_version(session, task, "empty") is None


def test_an_id_typed_as_a_number_is_refused_naming_both(engine, versions):
    with Session(engine) as session:
        task = get_task(session, DEMO_TASK)
        with pytest.raises(InvalidInput) as same:
            resolve_version(session, task, "6")  # #2's id
        with pytest.raises(InvalidInput) as elsewhere:
            resolve_version(session, task, "4")  # the id of "other" #3
        with pytest.raises(NotFound, match=r"has no version #99 \(its versions are #1 to #3\)$"):
            resolve_version(session, task, "99")
        with pytest.raises(TypeError):  # Python code holding an id has the version already: never taken as a number
            resolve_version(session, task, versions["#2"].id)
    assert str(same.value) == (f"library 'default' of task '{DEMO_TASK}' has no version #6 (its versions are #1 to "
                               "#3); 6 is the database id of version #2 of library 'default', and a version is named "
                               "by its number in its library: type 2 (or #2)")
    assert "4 is the database id of version #3 of library 'other'" in str(elsewhere.value)
    assert str(elsewhere.value).endswith("type 3 (or #3) with --library other")


# ---------------------------------------------------------------------------------------------- command line


def test_the_cli_takes_and_prints_numbers_and_refuses_an_id(engine, versions, capsys, tmp_path):
    code, out, _ = cli(capsys, engine, "export", "--task", DEMO_TASK, "--version", "2", "--format", "json")
    exported = json.loads(out)
    assert code == 0 and exported["number"] == 2 and exported["version_id"] == versions["#2"].id  # the API's keys
    older = tmp_path / "older.json"  # a file exported before the key was `number`, imported at the end

    code, out, err = cli(capsys, engine, "export", "--task", DEMO_TASK, "--version", "7")  # #3's id
    assert code == 2 and out == "" and "type 3 (or #3)" in err and "7 is the database id of version #3" in err

    code, out, _ = cli(capsys, engine, "label", "--task", DEMO_TASK, "--version", "#2", "candidate")
    assert code == 0 and out.strip() == "candidate -> version #2"
    code, _, err = cli(capsys, engine, "label", "--task", DEMO_TASK, "--version", "6", "candidate")
    assert code == 2 and "6 is the database id of version #2" in err

    code, out, _ = cli(capsys, engine, "versions", "--task", DEMO_TASK, "--library", "default")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "library 'default'" and "(id" not in out
    assert [line.split()[0] for line in lines[1:4]] == ["#1", "#2", "#3"]
    assert lines[4].startswith("  latest #3: ")  # what the newest version's worked examples cover
    assert " from #2 " in lines[3] and "[candidate]" in lines[2]

    code, out, _ = cli(capsys, engine, "eval", "--task", DEMO_TASK, "--library", OTHER, "--version", "3",
                       "--limit", "2", "--queue")
    assert code == 0
    with Session(engine) as session:
        queued = queries.evaluations(session)[0]
    assert queued.version_id == versions["other #3"].id
    code, _, err = cli(capsys, engine, "eval", "--task", DEMO_TASK, "--version", "6", "--queue")
    assert code == 2 and "type 2 (or #2)" in err

    older.write_text(json.dumps({**{k: v for k, v in exported.items() if k != "number"}, "version_number": 2}))
    code, out, err = cli(capsys, engine, "import", "--task", DEMO_TASK, str(older))
    assert code == 0 and "#4" in out, err


def test_the_promotion_refusal_names_a_compare_command_that_compares_what_it_says(engine, versions, capsys):
    set_label(engine, DEMO_TASK, "2", PRODUCTION, "system")  # the first production needs nothing
    code, out, err = cli(capsys, engine, "promote", "--task", DEMO_TASK, "--version", "3")
    assert code == 2
    command = f"python -m core compare --task '{DEMO_TASK}' 2 3"
    assert f"`{command}`" in err and "#3 has no paired comparison with production #2" in err

    a, b = evaluated(engine, "2"), evaluated(engine, "3")  # what the pasted command compares (test split, k=1)
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "core"]
    code, out, _ = cli(capsys, engine, *argv[3:], "--json")
    compared = json.loads(out)
    assert code == 0 and (compared["evaluation_a"], compared["evaluation_b"]) == (a.id, b.id)
    assert (compared["version_a"], compared["version_b"]) == (2, 3)
    assert (compared["version_id_a"], compared["version_id_b"]) == (versions["#2"].id, versions["#3"].id)
    code, out, _ = cli(capsys, engine, *argv[3:])
    assert out.startswith(f"A = evaluation {a.id} (version #2), B = evaluation {b.id} (version #3): ")

    code, out, _ = cli(capsys, engine, "promote", "--task", DEMO_TASK, "--version", "3", "--dry-run")
    assert code == 0 and out.startswith("promote version #3 to production; production now: #2\n") and "(id" not in out


def test_a_refusal_in_another_library_names_it_in_the_command(engine, versions):
    set_label(engine, DEMO_TASK, "2", PRODUCTION, "system", library_name=OTHER)
    with pytest.raises(InvalidInput) as refused:
        promote(engine, versions["other #3"].id, "system")
    assert f"`python -m core compare --task '{DEMO_TASK}' --library other 2 3`" in str(refused.value)
    assert preview_promotion(engine, versions["other #3"].id).compare_command.endswith("--library other 2 3")


def test_runs_and_review_name_the_version_a_run_made_by_its_number(engine, versions, capsys):
    from core.grpo.training import RunSettings, create_run
    from storage.db import session_scope
    from storage.tables import Run

    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2))
    with session_scope(engine) as session:
        session.get(Run, run_id).current_version_id = versions["#3"].id
    code, out, _ = cli(capsys, engine, "runs", "--task", DEMO_TASK)
    header, row = out.splitlines()
    assert code == 0 and header.split()[:2] == ["run", "status"] and row.split()[0] == str(run_id)
    assert " #3 " in row and f" {versions['#3'].id} " not in row


# ---------------------------------------------------------------------------------------------- HTTP API


def test_the_api_takes_a_number_and_answers_both_names(engine, versions):
    key = create_key(engine, "agent", "read", "cli").secret
    client = TestClient(create_app(engine), headers={"Authorization": f"Bearer {key}"})
    url = f"/v1/tasks/{DEMO_TASK}/libraries/default"
    served = client.get(url, params={"version": 2}).json()
    assert (served["number"], served["version_id"]) == (2, versions["#2"].id)
    assert client.get(url, params={"version": "#3"}).json()["version_id"] == versions["#3"].id
    assert client.get(f"/v1/tasks/{DEMO_TASK}/libraries/{OTHER}", params={"version": 3}).json()["version_id"] == 4
    refused = client.get(url, params={"version": versions["#2"].id})
    assert refused.status_code == 422
    assert "6 is the database id of version #2" in refused.json()["error"] and "type 2" in refused.json()["error"]
    chosen = client.get(url + "/select", params={"version": 3, "query": "apples in bags"}).json()
    assert (chosen["number"], chosen["version_id"]) == (3, versions["#3"].id)


# ---------------------------------------------------------------------------------------------- pages


@pytest.fixture
def page_engine(app_engine):
    return app_engine


def app_versions(engine) -> dict[str, LibraryVersion]:
    """The app's database has more demo tasks than the fast tests': the ids differ from the numbers even more."""
    second = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    import_library(engine, DEMO_TASK, "- Quote the policy.", "o.md", library_name=OTHER, actor="system")
    other_second = import_library(engine, DEMO_TASK, "- Say what happens next.", "p.md", library_name=OTHER,
                                  actor="system")
    assert second.id != second.number and other_second.number == 3 and other_second.id != 3
    return {"#2": second, "other #3": other_second}


def test_the_evaluate_page_offers_numbers_and_queues_the_chosen_librarys_version(page_engine):
    engine = page_engine
    made = app_versions(engine)
    at = run_app(page="pages/evaluate.py", session_state={"ctx_reviewer": "alice", "library": OTHER})
    assert not at.exception, [e.value for e in at.exception]
    with Session(engine) as session:
        task_id, library_id = get_task(session, DEMO_TASK).id, queries.library_by_name(
            session, get_task(session, DEMO_TASK).id, OTHER).id
    box = at.selectbox(key=f"eval_version_{task_id}_{library_id}")
    assert box.options == ["#3", "#2", "#1", "empty (no library)"] and box.value == "3"
    at.button(key="eval_submit").click()
    at.run()
    (queued,) = [e for e in queries_evaluations(engine)]
    assert queued.version_id == made["other #3"].id  # the other library's #3, not the version whose id is 3
    (message,) = [s.value.replace("\\", "") for s in at.success]
    assert f"Evaluation {queued.id} queued: version #3 on the test split" in message, message
    assert table_with(at, "Mean@k").iloc[0]["version"] == "#3"


def queries_evaluations(engine) -> list[Evaluation]:
    with Session(engine) as session:
        return queries.evaluations(session)


def test_pickers_and_tables_name_versions_by_number_only(page_engine):
    engine = page_engine
    made = app_versions(engine)
    a, b = evaluated(engine, "empty", limit=2), evaluated(engine, "2", limit=2)
    at = run_app(page="pages/evaluate.py")
    assert not at.exception, [e.value for e in at.exception]
    compare_b = at.selectbox(key="eval_compare_b")
    assert compare_b.value == b.id
    assert compare_b.format_func(b.id).startswith(f"evaluation {b.id} · #2 · test · k=1")
    assert compare_b.format_func(a.id).startswith(f"evaluation {a.id} · empty · test")
    assert not any("(id" in option for box in at.selectbox for option in box.options)

    at = run_app(page="pages/library.py")
    assert not at.exception, [e.value for e in at.exception]
    shown = {box.key: box.options for box in at.selectbox if box.key and "version" in box.key}  # as drawn
    assert shown["lib_label_version"] == shown["lib_export_version"] == ["#2", "#1"], shown
    assert all(name.startswith("#") and "(id" not in name for names in shown.values() for name in names), shown
    rows = table_with(at, "created by")
    assert "id" not in rows.columns and rows["version"].tolist() == ["#2", "#1"]

    at = run_app(page="pages/rollouts.py", session_state={"rollouts_source": "Evaluation"})
    labels = [option for box in at.selectbox if box.label == "Evaluation" for option in box.options]
    assert any(label.startswith(f"Evaluation {b.id} · version #2 · ") for label in labels), labels
    assert made["#2"].id != 2


def test_an_id_of_another_tasks_version_is_refused_naming_that_task(engine, versions):
    from core.records.tasks.demos import SUPPORT_TASK, ensure_support_task

    ensure_support_task(engine)
    elsewhere = import_library(engine, SUPPORT_TASK, "- Apologise once.", "s.md", actor="system")
    with Session(engine) as session, pytest.raises(InvalidInput) as refused:
        resolve_version(session, get_task(session, DEMO_TASK), str(elsewhere.id))
    assert str(refused.value).endswith(f"{elsewhere.id} is the database id of version #{elsewhere.number} of library "
                                       f"'default' of task '{SUPPORT_TASK}', and a version is named by its number "
                                       "in its library")


def test_an_evaluation_names_its_version_by_number_in_the_api_and_eval_json(engine, versions, capsys):
    """GET /v1/evaluations/{id} and `eval --json` named the version only by its database id."""
    from bench.stub_server import StubServer
    from core.records.models.connections import add_connection

    with StubServer() as stub:
        add_connection(engine, "stubby", "openai", base_url=stub.url, actor="cli")
        code, out, err = cli(capsys, engine, "eval", "--task", DEMO_TASK, "--version", "#2", "--limit", "1",
                             "--model", "stubby/stub", "--json")
    assert code == 0, err
    printed = json.loads(out)
    assert (printed["version_number"], printed["library"], printed["version_id"]) == (2, "default",
                                                                                      versions["#2"].id)
    client = TestClient(create_app(engine), headers={
        "Authorization": f"Bearer {create_key(engine, 'agent', 'read', 'cli').secret}"})
    answered = client.get(f"/v1/evaluations/{printed['evaluation_id']}").json()
    assert (answered["version_number"], answered["library"], answered["version_id"]) == (2, "default",
                                                                                         versions["#2"].id)
    empty = create_evaluation(engine, DEMO_TASK, "empty", limit=1, model="stubby/stub")
    assert {key: client.get(f"/v1/evaluations/{empty}").json()[key] for key in ("version_number", "library")} == {
        "version_number": None, "library": None}
