"""The OTLP door against a careless or hostile sender (issue 51): a large resource is stored once, not per span;
what one request and one key may store is capped; a key bound to a task writes only there; a message value
nested 5,000 deep or malformed refuses its span, never the request; a model call with no message read is held
and shown. Spans are the real SDK's, encoded by its own OTLP encoder (tests/otlp_support.py)."""

from __future__ import annotations

import json
import os
import secrets
from functools import partial

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from api.app import create_app
from core.errors import BodyTooLarge
from core.records.keys.api_keys import create_key
from core.records.library.versions import import_library, set_label
from core.records.production.otlp_held import held_services, held_spans
from core.records.tasks.demos import DEMO_TASK, ensure_demo_tasks
from core.settings import get_settings
from storage.tables import OtlpResource, Task, Trace
from tests.otlp_support import JSON, PROTOBUF, chat_span, sdk_request, to_json
from tests.test_otlp import answer, stored

ROUTE = "/otlp/v1/traces"


@pytest.fixture
def production(engine, demo_task):
    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(version.number), "production", "system")
    return version


def keyed(engine, **binding) -> TestClient:
    secret = create_key(engine, f"agent-{secrets.token_hex(3)}", "ingest", "cli", **binding).secret
    return TestClient(create_app(engine), headers={"Authorization": f"Bearer {secret}"})


def amplifying_request(spans: int = 1000, resource_chars: int = 99_000) -> bytes:
    """The issue's request: minimal model-call spans (OpenInference's input.value) under one resource that
    carries a 99,000-character attribute, as compact OTLP/JSON (about 351 KB)."""
    def span(i: int) -> dict:
        return {"traceId": secrets.token_hex(16), "spanId": secrets.token_hex(8), "name": "c",
                "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000",
                "attributes": [{"key": "input.value", "value": {"stringValue": f"q{i}"}}]}
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "agent"}},
                                    {"key": "padding", "value": {"stringValue": "x" * resource_chars}}]},
        "scopeSpans": [{"scope": {"name": "s"}, "spans": [span(i) for i in range(spans)]}]}]},
        separators=(",", ":")).encode()


def database_bytes(engine) -> int:
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    path = engine.url.database
    return os.path.getsize(path) + (os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0)


def test_the_351_kb_request_grows_the_database_by_at_most_10_mb(engine, production):
    if engine.dialect.name != "sqlite":
        pytest.skip("the file's size is SQLite's")
    body = amplifying_request()
    assert 330_000 < len(body) < 360_000
    client = keyed(engine, task=DEMO_TASK)
    before = database_bytes(engine)
    response = client.post(ROUTE, content=body, headers=JSON)
    assert response.status_code == 200, response.text
    grown = database_bytes(engine) - before
    assert len(stored(engine)) == 1000
    assert grown <= 10_000_000, f"the database grew by {grown} bytes"
    with Session(engine) as session:
        [resource] = session.exec(select(OtlpResource)).all()
        assert len(resource.attributes["padding"]) == 99_000
        assert {row.meta["otlp"]["resource_hash"] for row in stored(engine)} == {resource.hash}


def test_what_one_request_and_one_key_may_store_is_capped(engine, production, monkeypatch):
    monkeypatch.setenv("TFGRPO_INGEST_KEY_DAILY_BYTES", "20000")
    monkeypatch.setenv("TFGRPO_OTLP_MAX_SPANS", "50")
    get_settings.cache_clear()
    try:
        client = keyed(engine, task=DEMO_TASK)
        too_many = sdk_request(lambda tracer: [chat_span(tracer, f"q{i}") for i in range(51)])
        refused = client.post(ROUTE, content=too_many.SerializeToString(), headers=PROTOBUF)
        assert refused.status_code == 413 and "at most 50" in refused.json()["error"]
        def ten(tracer, n: int) -> None:
            for i in range(10):
                chat_span(tracer, f"day {n}.{i}")
        day = [client.post(ROUTE, content=sdk_request(partial(ten, n=n)).SerializeToString(), headers=PROTOBUF)
               for n in range(4)]
        assert [response.status_code for response in day][:1] == [200]
        assert 429 in [response.status_code for response in day]
        over = next(response for response in day if response.status_code == 429)
        assert "TFGRPO_INGEST_KEY_DAILY_BYTES" in over.json()["error"] and int(over.headers["Retry-After"]) >= 1
        kept = len(stored(engine))
        assert kept == 10 * sum(response.status_code == 200 for response in day)
        other = keyed(engine, task=DEMO_TASK)  # another key's allowance is its own
        assert other.post(ROUTE, content=sdk_request(lambda tracer: chat_span(tracer, "fresh")).SerializeToString(),
                          headers=PROTOBUF).status_code == 200
    finally:
        get_settings.cache_clear()


def test_a_bound_key_cannot_write_into_another_task(engine, production):
    ensure_demo_tasks(engine)
    with Session(engine) as session:
        other = next(task.name for task in session.exec(select(Task)) if task.name != DEMO_TASK)
    client = keyed(engine, task=DEMO_TASK)
    request = sdk_request(lambda tracer: [chat_span(tracer, "mine"), chat_span(tracer, "theirs", **{
        "tfgrpo.task": other})])
    response = client.post(ROUTE, content=request.SerializeToString(), headers=PROTOBUF)
    partial = answer(response).partial_success
    assert response.status_code == 200 and partial.rejected_spans == 1
    assert f"writes only in task {DEMO_TASK!r}" in partial.error_message
    unnamed = sdk_request(lambda tracer: chat_span(tracer, "no task named"), resource={"service.name": "unmapped"})
    assert client.post(ROUTE, content=unnamed.SerializeToString(), headers=PROTOBUF).status_code == 200
    rows = stored(engine)
    assert [row.input for row in rows] == ["mine", "no task named"]
    with Session(engine) as session:
        assert {session.get(Task, row.task_id).name for row in rows} == {DEMO_TASK}
    refused = client.post("/v1/traces", json={"traces": [{"id": "t-1", "task": other, "label": "production",
                                                            "input": "x", "output": "y"}]})
    assert refused.status_code == 403 and f"writes only in task {DEMO_TASK!r}" in json.dumps(refused.json())
    assert len(stored(engine)) == 2
    assert client.patch("/v1/traces/t-0", json={"task": other, "score": 0.1}).status_code == 403


def test_a_bound_key_reads_no_other_tasks_trace(engine, production):
    """GET /v1/traces/{id} let any ingest key read any task's trace by naming the task: a bound key now reads only
    where it may write."""
    ensure_demo_tasks(engine)
    with Session(engine) as session:
        other = next(task.name for task in session.exec(select(Task)) if task.name != DEMO_TASK)
    anywhere = keyed(engine, any_task=True)
    posted = anywhere.post("/v1/traces", json={"traces": [{"id": "t-9", "task": DEMO_TASK, "label": "production",
                                                          "input": "x", "output": "y", "score": 0.7}]})
    assert posted.status_code == 200, posted.text
    assert anywhere.get("/v1/traces/t-9", params={"task": DEMO_TASK}).json()["score"] == 0.7
    elsewhere = keyed(engine, task=other)
    refused = elsewhere.get("/v1/traces/t-9", params={"task": DEMO_TASK})
    assert refused.status_code == 403 and f"reads only in task {other!r}" in refused.text
    assert "0.7" not in refused.text
    assert keyed(engine, task=DEMO_TASK).get("/v1/traces/t-9", params={"task": DEMO_TASK}).json()["score"] == 0.7


def test_an_ingest_key_writes_anywhere_only_when_an_admin_chose_it(engine, demo_task):
    from core.errors import InvalidInput

    with pytest.raises(InvalidInput, match="bound to a task"):
        create_key(engine, "agent", "ingest", "cli")
    with pytest.raises(InvalidInput, match="bound to a task"):
        create_key(engine, "agent", "ingest", "cli", task=DEMO_TASK, any_task=True)
    assert create_key(engine, "agent", "ingest", "cli", any_task=True).role == "ingest"


@pytest.mark.parametrize("value", ["[" * 5000 + "]" * 5000, "not json at all", json.dumps({"role": "user"})])
def test_a_deep_or_malformed_message_value_refuses_its_span_not_the_request(engine, production, value):
    client = keyed(engine, task=DEMO_TASK)
    request = sdk_request(lambda tracer: [chat_span(tracer, "good one"), chat_span(tracer, "bad one", **{
        "gen_ai.input.messages": value})])
    response = client.post(ROUTE, content=request.SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 200
    partial = answer(response).partial_success
    assert partial.rejected_spans == 1 and "gen_ai.input.messages" in partial.error_message
    assert [row.input for row in stored(engine)] == ["good one"]


def test_a_model_call_with_no_message_read_is_held_and_shown_never_dropped(engine, production):
    client = keyed(engine, task=DEMO_TASK)

    def opaque(tracer) -> None:
        with tracer.start_as_current_span("chat gpt-x") as span:
            span.set_attribute("gen_ai.request.model", "gpt-x")
            span.set_attribute("gen_ai.usage.input_tokens", 7)
    response = client.post(ROUTE, content=sdk_request(opaque, resource={"service.name": "opaque-agent"})
                           .SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 200 and "1 span(s) held" in answer(response).partial_success.error_message
    assert stored(engine) == []
    with Session(engine) as session:
        [row] = held_services(session)
        assert (row["service"], row["held (unreadable)"]) == ("opaque-agent", 1)
        [span] = held_spans(session)
        assert span.span["attributes"]["gen_ai.request.model"] == "gpt-x"


def test_openlits_prompt_and_completion_events_alone_are_read(engine, production):
    client = keyed(engine, task=DEMO_TASK)

    def openlit_events(tracer) -> None:
        with tracer.start_as_current_span("chat gpt-x") as span:
            span.set_attribute("gen_ai.request.model", "gpt-x")
            span.add_event("gen_ai.content.prompt", {"gen_ai.prompt": "system: Be brief.\nuser: What is 3 + 3?\nThink."})
            span.add_event("gen_ai.content.completion", {"gen_ai.completion": "6"})
    response = client.post(ROUTE, content=sdk_request(openlit_events).SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 200
    [trace] = stored(engine)
    assert (trace.input, trace.output) == ("What is 3 + 3?\nThink.", "6")


def test_migration_0021_moves_the_resource_each_stored_trace_copied_into_one_row(engine, production):
    import importlib.util

    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import delete

    from storage.db import MIGRATIONS_DIR

    client = keyed(engine, task=DEMO_TASK)
    request = sdk_request(lambda tracer: [chat_span(tracer, f"q{i}") for i in range(3)],
                          resource={"service.name": "old-agent", "host.name": "h1"})
    assert client.post(ROUTE, content=request.SerializeToString(), headers=PROTOBUF).status_code == 200
    with Session(engine) as session:  # the rows as the release before stored them: the resource in each
        [resource] = session.exec(select(OtlpResource)).all()
        for trace in session.exec(select(Trace)):
            otlp = {key: value for key, value in trace.meta["otlp"].items() if key != "resource_hash"}
            trace.meta = {**trace.meta, "otlp": {**otlp, "resource": resource.attributes}}
            session.add(trace)
        session.exec(delete(OtlpResource))
        session.commit()
    spec = importlib.util.spec_from_file_location("m0021", MIGRATIONS_DIR / "versions" / "0021_otlp_locks.py")
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    with engine.begin() as connection, Operations.context(MigrationContext.configure(connection)):
        migration._resources_once()
    with Session(engine) as session:
        [moved] = session.exec(select(OtlpResource)).all()
        assert moved.attributes["host.name"] == "h1" and moved.hash == resource.hash
        metas = [trace.meta["otlp"] for trace in session.exec(select(Trace))]
    assert len(metas) == 3 and all("resource" not in otlp and otlp["resource_hash"] == moved.hash for otlp in metas)


def test_the_json_routes_traces_count_against_the_same_caps(engine, production, monkeypatch):
    monkeypatch.setenv("TFGRPO_INGEST_REQUEST_MAX_BYTES", "2000")
    get_settings.cache_clear()
    try:
        client = keyed(engine, task=DEMO_TASK)
        small = {"traces": [{"id": "t-1", "task": DEMO_TASK, "label": "production", "input": "hi", "output": "yo"}]}
        assert client.post("/v1/traces", json=small).status_code == 200
        large = {"traces": [{"id": f"t-{i}", "task": DEMO_TASK, "label": "production", "input": "x" * 500,
                             "output": "y"} for i in range(2, 8)]}
        refused = client.post("/v1/traces", json=large)
        assert refused.status_code == 413 and "TFGRPO_INGEST_REQUEST_MAX_BYTES" in refused.json()["error"]
        assert len(stored(engine)) == 1
    finally:
        get_settings.cache_clear()


def test_a_bound_keys_spans_under_another_teams_service_name_leave_that_teams_held_spans_in_place(
        engine, production, monkeypatch):
    """Issue 61, item 1: the held bound counted per service.name, so one request of a key bound to task A, 1,000
    spans without messages under team C's service name, evicted team C's held model calls and mapping the service
    landed 0 of 5. The bound is per sender (key and service): team C's five stay and land when the service is
    mapped. Held spans are shown to admins and to the people of the task their key is bound to."""
    ensure_demo_tasks(engine)
    with Session(engine) as session:
        team_a = next(task for task in session.exec(select(Task)) if task.name != DEMO_TASK)
        demo_id = session.exec(select(Task.id).where(Task.name == DEMO_TASK)).one()
    monkeypatch.setenv("TFGRPO_OTLP_HELD_PER_SERVICE", "20")
    get_settings.cache_clear()
    team_c = keyed(engine, any_task=True)
    sent = team_c.post(ROUTE, content=sdk_request(lambda tracer: [chat_span(tracer, f"c{i}") for i in range(5)],
                                                  resource={"service.name": "team-c-agent"}).SerializeToString(),
                       headers=PROTOBUF)
    assert sent.status_code == 200 and "5 span(s) held" in answer(sent).partial_success.error_message

    def opaque(tracer) -> None:
        for _ in range(100):
            with tracer.start_as_current_span("chat gpt-x") as span:
                span.set_attribute("gen_ai.request.model", "gpt-x")
    flooding = keyed(engine, task=team_a.name)
    flood = flooding.post(ROUTE, content=sdk_request(opaque, resource={"service.name": "team-c-agent"})
                          .SerializeToString(), headers=PROTOBUF)
    assert flood.status_code == 200
    with Session(engine) as session:
        [row] = held_services(session)
        assert (row["held (not mapped)"], row["held (unreadable)"], row["dropped past the bound"]) == (5, 20, 80)
        assert len(held_spans(session, task_id=team_a.id, admin=False, limit=100)) == 20  # its own task's people
        assert held_spans(session, task_id=demo_id, admin=False) == []  # another task's people see none
    from core.records.production.otlp import map_service
    assert map_service(engine, "team-c-agent", DEMO_TASK, "default", "cli").landed == 5
    get_settings.cache_clear()


def test_held_spans_of_a_service_that_stopped_sending_age_out_in_the_worker(engine, production):
    from datetime import UTC, datetime, timedelta

    from core.records.production.otlp import age_held_spans
    client = keyed(engine, any_task=True)
    client.post(ROUTE, content=sdk_request(lambda tracer: [chat_span(tracer, "q")], resource={
        "service.name": "quiet-agent"}).SerializeToString(), headers=PROTOBUF)
    with Session(engine) as session:
        assert len(held_spans(session)) == 1
    age_held_spans(engine, datetime.now(UTC) + timedelta(hours=get_settings().otlp_held_hours + 1))
    with Session(engine) as session:
        assert held_spans(session) == [] and held_services(session)[0]["dropped past the bound"] == 1


def _ld(field: int, payload: bytes) -> bytes:
    from core.domain.otlp_depth import _encode_varint
    return _encode_varint(field << 3 | 2) + _encode_varint(len(payload)) + payload


def _deep_any_protobuf(levels: int) -> bytes:
    value = _ld(1, b"x")  # AnyValue.string_value
    for _ in range(levels):  # AnyValue.kvlist_value -> KeyValueList.values -> KeyValue{key, value}
        value = _ld(6, _ld(1, _ld(1, b"k") + _ld(2, value)))
    return value


def _span_protobuf(i: int, deep: int = 0) -> bytes:
    attributes = _ld(9, _ld(1, b"input.value") + _ld(2, _ld(1, f"q{i}".encode())))
    if deep:
        attributes += _ld(9, _ld(1, b"deep") + _ld(2, _deep_any_protobuf(deep)))
    fixed = (1700000000000000000).to_bytes(8, "little"), (1700000001000000000).to_bytes(8, "little")
    return (_ld(1, secrets.token_bytes(16)) + _ld(2, secrets.token_bytes(8)) + _ld(5, b"chat")
            + b"\x39" + fixed[0] + b"\x41" + fixed[1] + attributes)


def _deep_any_json(levels: int) -> str:
    return ('{"kvlistValue":{"values":[{"key":"k","value":' * levels + '{"stringValue":"x"}' + "}]}}" * levels)


def _span_json(i: int, deep: int = 0) -> str:
    attributes = [f'{{"key":"input.value","value":{{"stringValue":"q{i}"}}}}']
    if deep:
        attributes.append(f'{{"key":"deep","value":{_deep_any_json(deep)}}}')
    return (f'{{"traceId":"{secrets.token_hex(16)}","spanId":"{secrets.token_hex(8)}","name":"chat",'
            f'"startTimeUnixNano":"1700000000000000000","endTimeUnixNano":"1700000001000000000",'
            f'"attributes":[{",".join(attributes)}]}}')


@pytest.mark.parametrize("levels", [9, 14, 60, 5000])
@pytest.mark.parametrize("kind", ["protobuf", "json"])
def test_an_attribute_nested_at_any_depth_refuses_only_its_span(engine, production, kind, levels):
    """Issue 61, item 2: past 13 levels (JSON) or 59 (protobuf) the decoder's own limit failed the whole request,
    and exporters do not retry a 400: the 9 good spans beside the deep one were lost. Now 9 are stored at any
    depth and the deep span is refused with its reason."""
    client = keyed(engine, task=DEMO_TASK)
    service = {"key": "service.name", "value": {"stringValue": "deep-agent"}}
    if kind == "protobuf":
        spans = b"".join(_ld(2, _span_protobuf(i, levels if i == 4 else 0)) for i in range(10))
        resource = _ld(1, _ld(1, b"service.name") + _ld(2, _ld(1, b"deep-agent")))
        body = _ld(1, _ld(1, resource) + _ld(2, spans))
        response = client.post(ROUTE, content=body, headers=PROTOBUF)
        message = answer(response).partial_success.error_message if response.status_code == 200 else response.text
    else:
        spans = ",".join(_span_json(i, levels if i == 4 else 0) for i in range(10))
        body = (f'{{"resourceSpans":[{{"resource":{{"attributes":[{json.dumps(service)}]}},'
                f'"scopeSpans":[{{"spans":[{spans}]}}]}}]}}').encode()
        response = client.post(ROUTE, content=body, headers=JSON)
        message = response.text
    assert response.status_code == 200, message
    assert "span 5" in message and "nested more than 8 levels deep" in message
    assert sorted(trace.input for trace in stored(engine)) == sorted(f"q{i}" for i in range(10) if i != 4)


@pytest.mark.parametrize("kind", ["protobuf", "json"])
def test_a_request_over_the_span_cap_is_refused_before_any_span_is_decoded(engine, production, monkeypatch, kind):
    """Issue 61, item 5: every span was decoded before the span cap's 413 (3.2-3.5 s for 24,434 spans); the spans
    are now counted on the wire first, and a request under the cap is counted exactly."""
    import core.records.production.otlp as otlp
    from core.domain.otlp_depth import count_spans
    from core.records.production.ingest import IngestLimits

    request = sdk_request(lambda tracer: [chat_span(tracer, f"q{i}") for i in range(30)])
    body = request.SerializeToString() if kind == "protobuf" else to_json(request)
    assert count_spans(body, kind) == 30

    def never(*_args, **_kwargs):
        raise AssertionError("decoded a request over the cap")
    monkeypatch.setattr(otlp, "decode_spans", never)
    limits = IngestLimits(max_spans=20, request_bytes=10**7, key_daily_bytes=10**9, held_per_service=10,
                          held_hours=1)
    with pytest.raises(BodyTooLarge, match="holds 30 spans; one request may hold at most 20"):
        otlp.ingest_request(engine, body, PROTOBUF["Content-Type"] if kind == "protobuf" else JSON["Content-Type"],
                            None, limits)
