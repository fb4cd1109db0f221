"""One version lookup for every face (issue 51, item 11 and the smaller items): the CLI, the HTTP API and OTLP read
a version's name through core.records.library.versions.resolve_version, so `latest` means the same everywhere, a digit
that is not 0-9 is a clear 4xx instead of a 500, and the API's own 404 and 405 answers have its one error shape.

The database is test_names.py's: the default library's versions #2 and #3 have the ids 6 and 7, so a number is
never a database id by accident.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from api.app import create_app
from core.errors import InvalidInput
from core.records.keys.api_keys import create_key
from core.records.library.versions import resolve_version, set_label
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.lookup import get_task
from storage.tables import Trace
from tests.otlp_support import PROTOBUF, chat_span, sdk_request
from tests.test_names import cli, diverging
from tests.test_otlp import ROUTE, answer, stored

URL = f"/v1/tasks/{DEMO_TASK}/libraries/default"


@pytest.fixture
def versions(engine, demo_task):
    made = diverging(engine)
    set_label(engine, DEMO_TASK, "#2", "staging", "system")
    return made


@pytest.fixture
def client(engine, demo_task) -> TestClient:
    secret = create_key(engine, "agent", "read", "cli").secret
    return TestClient(create_app(engine), headers={"Authorization": f"Bearer {secret}"})


def test_version_latest_on_the_api_is_the_newest_version(client, versions):
    """`?version=latest` was refused with 422 though the CLI takes it."""
    newest = versions["#3"]
    fetched = client.get(URL, params={"version": "latest"})
    assert fetched.status_code == 200, fetched.text
    assert (fetched.json()["version_id"], fetched.json()["number"]) == (newest.id, newest.number)
    chosen = client.get(URL + "/select", params={"version": "latest", "query": "units"})
    assert chosen.status_code == 200, chosen.text
    assert chosen.json()["version_id"] == newest.id


@pytest.mark.parametrize("typed", ["²", "#²", "١٢", "3²"])
def test_a_version_in_other_digits_is_a_clear_4xx_on_the_api_and_the_cli(client, engine, capsys, versions, typed):
    """`int("²")` raised inside the lookup (a 500); Arabic-Indic digits were read as a number."""
    answered = client.get(URL, params={"version": typed})
    assert answered.status_code == 422 and "digits 0-9" in answered.json()["error"], answered.text
    code, _out, err = cli(capsys, engine, "export", "--task", DEMO_TASK, "--version", typed)
    assert code == 2 and "digits 0-9" in err


def test_a_number_too_long_for_any_version_is_refused_not_a_database_error(client, versions):
    answered = client.get(URL, params={"version": "9" * 40})
    assert answered.status_code == 422 and "no version has a number that long" in answered.json()["error"]


def test_an_unknown_route_and_a_wrong_method_answer_in_the_error_shape(client):
    missing = client.get("/v1/no-such-route")
    assert missing.status_code == 404 and set(missing.json()) == {"error"}
    assert "/v1/no-such-route" in missing.json()["error"]
    wrong = client.delete("/v1/health")
    assert wrong.status_code == 405 and set(wrong.json()) == {"error"}
    assert wrong.headers["allow"] == "GET" and "DELETE" in wrong.json()["error"]


@pytest.mark.parametrize(("typed", "api_params"), [
    ("#2", {"version": "#2"}),
    ("2", {"version": "2"}),
    ("latest", {"version": "latest"}),
    ("staging", {"label": "staging"}),
])
def test_the_cli_and_the_api_resolve_a_name_to_the_same_version(client, engine, capsys, versions, typed,
                                                                 api_params):
    with Session(engine) as session:
        looked_up = resolve_version(session, get_task(session, DEMO_TASK), typed)
    code, out, err = cli(capsys, engine, "export", "--task", DEMO_TASK, "--version", typed, "--format", "json")
    assert code == 0, err
    answered = client.get(URL, params=api_params)
    assert answered.status_code == 200, answered.text
    assert json.loads(out)["version_id"] == answered.json()["version_id"] == looked_up.id
    assert looked_up.id == (versions["#3"] if typed == "latest" else versions["#2"]).id


def test_otlp_reads_tfgrpo_version_through_the_same_lookup(engine, versions):
    """A span's `tfgrpo.version` is read as the API's version= is: `latest` and `#2` found, `²` refused in the
    partial success (the span alone), never a 500."""
    secret = create_key(engine, "otel-collector", "ingest", "cli", any_task=True).secret
    exporter = TestClient(create_app(engine), headers={"Authorization": f"Bearer {secret}"})
    request = sdk_request(lambda tracer: [chat_span(tracer, typed, **{"tfgrpo.task": DEMO_TASK, "tfgrpo.version": typed})
                                          for typed in ("latest", "#2", "²")])
    response = exporter.post(ROUTE, content=request.SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 200, response.text
    partial = answer(response).partial_success
    assert partial.rejected_spans == 1 and "digits 0-9" in partial.error_message
    rows: list[Trace] = stored(engine)
    assert {row.input: row.version_id for row in rows} == {"latest": versions["#3"].id, "#2": versions["#2"].id}


def test_the_api_version_parameter_takes_no_label_and_the_lookup_says_so(engine, versions):
    """The API names labels with label= (where the A/B split applies); its version= stays a number or latest."""
    with Session(engine) as session, pytest.raises(InvalidInput, match="label="):
        resolve_version(session, get_task(session, DEMO_TASK), "staging", labels=False)


def test_a_version_id_too_large_or_in_other_digits_refuses_its_span_not_the_request(engine, versions):
    """`tfgrpo.version_id` past a database integer (or in another script's digits) is that span's refusal in the
    partial success; the request's other spans are stored (a 10**30 id once could reach the database)."""
    secret = create_key(engine, "otel-collector", "ingest", "cli", any_task=True).secret
    exporter = TestClient(create_app(engine), headers={"Authorization": f"Bearer {secret}"})
    ids = {"huge": str(10**30), "arabic": "١٢", "good": str(versions["#2"].id)}
    request = sdk_request(lambda tracer: [chat_span(tracer, name, **{"tfgrpo.task": DEMO_TASK,
                                                                      "tfgrpo.version_id": value})
                                          for name, value in ids.items()])
    response = exporter.post(ROUTE, content=request.SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 200, response.text
    assert answer(response).partial_success.rejected_spans == 2
    assert {row.input: row.version_id for row in stored(engine)} == {"good": versions["#2"].id}


@pytest.mark.parametrize("name", ["3", "#2", "latest", "Empty", "٣", "#٣", "３", "3²"])
def test_a_label_named_like_a_number_latest_or_empty_is_refused(engine, versions, name):
    """Every lookup reads such a name as a version's number, latest or empty, so the label could never be reached.
    A name in other digits (Arabic-Indic "٣", full-width "３") was refused by the version-number check with "write a
    version's number in the digits 0-9", as if the person had named a version: it is refused as a label name."""
    with pytest.raises(InvalidInput, match="a label cannot be named"):
        set_label(engine, DEMO_TASK, "1", name, "system")
    assert set_label(engine, DEMO_TASK, "1", "candidate", "system").name == "candidate"


@pytest.mark.parametrize("name", ["Ⅲ", "三", "½", "v٣"])
def test_a_label_in_numerals_that_are_not_digits_is_a_label_everywhere(engine, client, versions, name):
    """Names that no lookup reads as a number (no digit characters, or not only digits) are labels: set_label takes
    them, and resolve_version and the API's `label=` reach the version they point at."""
    set_label(engine, DEMO_TASK, "#2", name, "system")
    with Session(engine) as session:
        assert resolve_version(session, get_task(session, DEMO_TASK), name).id == versions["#2"].id
    fetched = client.get(URL, params={"label": name})
    assert fetched.status_code == 200 and fetched.json()["version_id"] == versions["#2"].id, fetched.text
