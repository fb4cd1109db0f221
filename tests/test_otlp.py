"""The OTLP/HTTP traces receiver in-process (FastAPI's TestClient), fed by the real OpenTelemetry SDK's spans
and its own OTLP encoder: the GenAI conventions (current and v1.36) and OpenInference read into traces, the
version by attribute, by the served block in the system instructions, or unknown; tasks by attribute or a
mapped service.name; feedback by span attribute or PATCH by OTel trace id; labelling, harvest and the A/B
split over them; and every bad input answered with a 4xx or a partial success, nothing half-written."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import tracemalloc

import pytest
from fastapi.testclient import TestClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from sqlmodel import Session, select

from api.app import create_app
from api.otlp import read_capped
from core.domain.otlp_spans import decode_spans
from core.errors import BodyTooLarge
from core.records.keys.api_keys import create_key
from core.records.library.versions import import_library, set_label
from core.records.production.ab_experiments import served_arm
from core.records.production.ab_verdict import ab_status
from core.records.production.ingest import IngestLimits
from core.records.production.otlp import ingest_spans, map_service, other_spans, span_detail
from core.records.production.otlp_held import held_services, held_spans
from core.records.production.serving import served_library, set_ab_split
from core.records.production.traces import harvest, set_rules
from core.records.tasks.demos import DEMO_TASK
from storage.tables import ApiCounter, Sample, Trace
from tests.otlp_support import JSON, PROTOBUF, chat_span, sdk_request, to_json

ROUTE = "/otlp/v1/traces"


@pytest.fixture
def production(engine, demo_task):
    version = import_library(engine, DEMO_TASK, "- Re-read the question.\n- Check the units.", "a.md",
                             actor="system")
    set_label(engine, DEMO_TASK, str(version.number), "production", "system")
    return version


@pytest.fixture
def ingest_key(engine, demo_task) -> str:
    return create_key(engine, "otel-collector", "ingest", "cli", any_task=True).secret


@pytest.fixture
def client(engine, ingest_key) -> TestClient:
    return TestClient(create_app(engine), headers={"Authorization": f"Bearer {ingest_key}"})


def stored(engine) -> list[Trace]:
    with Session(engine) as session:
        return list(session.exec(select(Trace).order_by(Trace.id)))


def answer(response) -> ExportTraceServiceResponse:
    parsed = ExportTraceServiceResponse()
    parsed.ParseFromString(response.content)
    return parsed


def test_protobuf_spans_become_traces_with_model_tokens_ids_and_the_named_version(engine, client, production):
    request = sdk_request(lambda tracer: [chat_span(tracer, f"What is {i} + 1?", str(i + 1), **{
        "tfgrpo.task": DEMO_TASK, "tfgrpo.version_id": production.id, "gen_ai.conversation.id": "conv-7",
        "tfgrpo.user_id": "u-1"}) for i in range(3)])
    response = client.post(ROUTE, content=request.SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-protobuf"
    assert not answer(response).HasField("partial_success")
    rows = stored(engine)
    assert [row.input for row in rows] == ["What is 0 + 1?", "What is 1 + 1?", "What is 2 + 1?"]
    assert [row.output for row in rows] == ["1", "2", "3"]
    span = request.resource_spans[0].scope_spans[0].spans[0]
    first = rows[0]
    assert first.client_id == f"{span.trace_id.hex()}:{span.span_id.hex()}"
    assert first.version_id == production.id and first.user_id == "u-1"
    otlp = first.meta["otlp"]
    assert (otlp["model"], otlp["provider"], otlp["input_tokens"], otlp["output_tokens"]) == ("stub", "openai", 12, 3)
    assert otlp["conversation_id"] == "conv-7" and otlp["scope"] == "my.agent" and otlp["version_from"] == "attribute"
    assert otlp["latency_ms"] >= 0 and otlp["trace_id"] == span.trace_id.hex()
    # the exporter retries a batch it is unsure of: nothing is stored twice
    again = client.post(ROUTE, content=request.SerializeToString(), headers=PROTOBUF)
    assert again.status_code == 200 and len(stored(engine)) == 3


def test_otlp_json_gzip_with_the_served_block_in_the_system_instructions_finds_its_version(engine, client,
                                                                                          production):
    with Session(engine) as session:
        block = served_library(session, DEMO_TASK, "default").prompt
    other = import_library(engine, DEMO_TASK, "- Something else entirely.", "b.md", actor="system")
    request = sdk_request(lambda tracer: chat_span(tracer, system=f"You solve word problems.\n\n{block}",
                                                   **{"tfgrpo.task": DEMO_TASK}))
    body = gzip.compress(to_json(request))
    response = client.post(ROUTE, content=body, headers={**JSON, "Content-Encoding": "gzip"})
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    assert response.json() == {}
    [row] = stored(engine)
    assert row.version_id == production.id != other.id
    assert row.meta["otlp"]["version_from"] == "system instructions"


def test_a_span_naming_no_version_is_stored_as_unknown_never_guessed_and_shown_so(engine, client, production,
                                                                                  capsys):
    from core.cli import main
    from storage.db import url_with_password

    request = sdk_request(lambda tracer: chat_span(tracer, system="You are helpful.", **{"tfgrpo.task": DEMO_TASK}))
    assert client.post(ROUTE, content=request.SerializeToString(), headers=PROTOBUF).status_code == 200
    [row] = stored(engine)
    assert row.version_id is None and row.meta["otlp"]["version_from"] == "unknown"
    assert main(["--db", url_with_password(engine), "traces", "--task", DEMO_TASK]) == 0
    out = capsys.readouterr().out
    assert "unknown version" in out and "OTLP · my.agent 1" in out


def test_openinference_and_v1_36_span_events_are_read(engine, client, production):
    def make(tracer):
        with tracer.start_as_current_span("ChatCompletion") as span:  # OpenInference (Phoenix)
            span.set_attribute("openinference.span.kind", "LLM")
            span.set_attribute("llm.model_name", "gpt-x")
            span.set_attribute("llm.input_messages.0.message.role", "system")
            span.set_attribute("llm.input_messages.0.message.content", "Be brief.")
            span.set_attribute("llm.input_messages.1.message.role", "user")
            span.set_attribute("llm.input_messages.1.message.content", "Capital of France?")
            span.set_attribute("llm.output_messages.0.message.role", "assistant")
            span.set_attribute("llm.output_messages.0.message.content", "Paris")
            span.set_attribute("llm.token_count.prompt", 9)
            span.set_attribute("session.id", "s-1")
        with tracer.start_as_current_span("chat gpt-4o") as span:  # v1.36: gen_ai.system and span events
            span.set_attribute("gen_ai.system", "openai")
            span.set_attribute("gen_ai.request.model", "gpt-4o")
            span.set_attribute("gen_ai.usage.input_tokens", 5)
            span.add_event("gen_ai.user.message", {"content": "Capital of Spain?"})
            span.add_event("gen_ai.choice", {"index": 0, "finish_reason": "stop",
                                              "message": json.dumps({"content": "Madrid"})})
        with tracer.start_as_current_span("GET /health"):  # no model call: counted, not a trace
            pass

    request = sdk_request(make, resource={"service.name": "agent", "tfgrpo.task": DEMO_TASK,
                                          "tfgrpo.label": "production"})
    response = client.post(ROUTE, content=request.SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 200
    partial = answer(response).partial_success
    assert partial.rejected_spans == 0 and "1 span(s) held no model call" in partial.error_message
    first, second = stored(engine)
    assert (first.input, first.output, first.meta["otlp"]["model"]) == ("Capital of France?", "Paris", "gpt-x")
    assert first.meta["otlp"]["conversation_id"] == "s-1" and first.meta["otlp"]["input_tokens"] == 9
    assert (second.input, second.output, second.meta["otlp"]["provider"]) == ("Capital of Spain?", "Madrid", "openai")
    assert first.version_id == production.id and first.served_label == "production"
    with Session(engine) as session:
        assert other_spans(session) == 1


def test_a_span_of_an_unmapped_service_is_held_shown_and_lands_once_the_service_is_mapped(engine, client,
                                                                                          production):
    request = sdk_request(lambda tracer: [chat_span(tracer, f"q{i}") for i in range(2)],
                          resource={"service.name": "billing-agent"})
    held = client.post(ROUTE, content=request.SerializeToString(), headers=PROTOBUF)
    assert held.status_code == 200
    partial = answer(held).partial_success
    assert partial.rejected_spans == 0 and "2 span(s) held" in partial.error_message
    assert stored(engine) == []
    with Session(engine) as session:
        [row] = held_services(session)
        assert (row["service"], row["held (not mapped)"], row["dropped past the bound"]) == ("billing-agent", 2, 0)
    mapped = map_service(engine, "billing-agent", DEMO_TASK, "default", "cli")
    assert (mapped.landed, mapped.duplicates, mapped.refused) == (2, 0, [])
    rows = stored(engine)
    assert [row.input for row in rows] == ["q0", "q1"]
    assert rows[0].meta["otlp"]["service"] == "billing-agent"
    with Session(engine) as session:
        assert held_services(session) == []
        assert span_detail(session, rows[0])["resource"]["service.name"] == "billing-agent"
    retried = client.post(ROUTE, content=request.SerializeToString(), headers=PROTOBUF)
    assert retried.status_code == 200 and not answer(retried).HasField("partial_success")
    assert len(stored(engine)) == 2


def test_held_spans_are_bounded_per_service_and_the_dropped_are_counted(engine, production):
    request = sdk_request(lambda tracer: [chat_span(tracer, f"q{i}") for i in range(5)],
                          resource={"service.name": "chatty"})
    limits = IngestLimits(max_spans=100, request_bytes=10**7, key_daily_bytes=10**9, held_per_service=3,
                          held_hours=1)
    result = ingest_spans(engine, decode_spans(request), None, limits)
    assert (result.stored, result.held) == (0, 5)
    with Session(engine) as session:
        [row] = held_services(session)
        assert (row["held (not mapped)"], row["dropped past the bound"]) == (3, 2)
        assert sorted(span.span["input"] for span in held_spans(session)) == ["q2", "q3", "q4"]
    assert map_service(engine, "chatty", DEMO_TASK, "default", "cli").landed == 3


def test_feedback_on_a_span_or_by_otel_trace_id_feeds_labelling_harvest_and_the_ab_split(engine, client,
                                                                                          ingest_key, production):
    candidate = import_library(engine, DEMO_TASK, "- Draw the problem.", "c.md", actor="system")
    set_label(engine, DEMO_TASK, str(candidate.number), "candidate", "system")
    set_ab_split(engine, DEMO_TASK, "default", "candidate", 0.5, "cli")
    set_rules(engine, DEMO_TASK, {"below": 0.5}, "cli")
    # the arm the studio serves each user: a span's claim is checked against it (core/records/production/ab_experiments.py)
    arms = {arm: [f"user-{i}" for i in range(100) if served_arm(production.library_id, 0.5, f"user-{i}") == arm][:4]
            for arm in ("production", "candidate")}

    def make(tracer):
        for i, score in enumerate([0.1, 0.2, 0.3]):
            chat_span(tracer, f"p{i}", **{"tfgrpo.task": DEMO_TASK, "tfgrpo.label": "production",
                                          "tfgrpo.score": score, "tfgrpo.user_id": arms["production"][i]})
        for i in range(3):
            chat_span(tracer, f"c{i}", **{"tfgrpo.task": DEMO_TASK, "tfgrpo.version": candidate.number,
                                          "tfgrpo.thumbs": "up", "tfgrpo.user_id": arms["candidate"][i]})
        chat_span(tracer, "late", **{"tfgrpo.task": DEMO_TASK, "tfgrpo.label": "production",
                                     "tfgrpo.user_id": arms["production"][3]})
        chat_span(tracer, "claims the other arm", **{"tfgrpo.task": DEMO_TASK, "tfgrpo.label": "candidate",
                                                     "tfgrpo.thumbs": "up", "tfgrpo.user_id": arms["production"][0]})

    request = sdk_request(make)
    assert client.post(ROUTE, content=request.SerializeToString(), headers=PROTOBUF).status_code == 200
    rows = {row.input: row for row in stored(engine)}
    assert rows["p0"].score == 0.1 and rows["p0"].label_status == "needed"
    assert rows["c0"].thumbs == 1 and rows["c0"].version_id == candidate.id and rows["c0"].label_status is None
    late_trace_id = rows["late"].meta["otlp"]["trace_id"]
    patched = client.patch(f"/v1/traces/{late_trace_id}", json={"task": DEMO_TASK, "thumbs": "down"})
    assert patched.status_code == 200 and patched.json()["changed"] is True
    late = {row.input: row for row in stored(engine)}["late"]
    assert late.thumbs == -1 and late.label_status == "needed"

    with Session(engine) as session:
        comparison = ab_status(session, DEMO_TASK)
    counts = {row["arm"]: row["scored traces"] for row in comparison.arms}
    assert counts == {"production": 4, "candidate": 3} and comparison.verdict.difference > 0
    assert comparison.excluded == {"names another version than the production arm serves its user": 1}
    assert harvest(engine, DEMO_TASK, "cli", max_score=0.4) == (4, 0)
    with Session(engine) as session:
        queries_ = {s.query for s in session.exec(select(Sample).where(Sample.external_id.startswith("trace-")))}
    assert queries_ == {"p0", "p1", "p2", "late"}


def test_the_json_route_key_header_and_rate_limit_apply(engine, ingest_key, production):
    request = sdk_request(lambda tracer: chat_span(tracer, **{"tfgrpo.task": DEMO_TASK}))
    body = request.SerializeToString()
    app = create_app(engine, rate_per_minute=2)
    assert TestClient(app).post(ROUTE, content=body, headers=PROTOBUF).status_code == 401
    read_key = create_key(engine, "reader", "read", "cli").secret
    assert TestClient(app).post(ROUTE, content=body, headers={**PROTOBUF, "X-API-Key": read_key}).status_code == 403
    limited = TestClient(app, headers={"X-API-Key": ingest_key})
    assert [limited.post(ROUTE, content=body, headers=PROTOBUF).status_code for _ in range(3)] == [200, 200, 429]
    assert len(stored(engine)) == 1


# --- bad input: a clear 4xx or a partial success, nothing half-written, the API still serving ------------


def one_span(**overrides) -> ExportTraceServiceRequest:
    """A valid protobuf request of one GenAI span, its fields then overridden as a test needs."""
    request = sdk_request(lambda tracer: chat_span(tracer, **{"tfgrpo.task": DEMO_TASK}))
    span = request.resource_spans[0].scope_spans[0].spans[0]
    for name, value in overrides.items():
        setattr(span, name, value)
    return request


def add_attribute(request: ExportTraceServiceRequest, key: str, value: AnyValue) -> ExportTraceServiceRequest:
    request.resource_spans[0].scope_spans[0].spans[0].attributes.append(KeyValue(key=key, value=value))
    return request


def nested(depth: int) -> AnyValue:
    value = AnyValue(string_value="leaf")
    for _ in range(depth):
        outer = AnyValue()
        outer.array_value.values.append(value)
        value = outer
    return value


def many(count: int) -> AnyValue:
    value = AnyValue()
    for i in range(count):
        value.array_value.values.append(AnyValue(int_value=i))
    return value


def assert_nothing_written(engine, client) -> None:
    assert stored(engine) == []
    with Session(engine) as session:
        assert [row.name for row in session.exec(select(ApiCounter))
                if row.name.startswith("otlp:")] == []
    assert client.get("/v1/health").status_code == 200  # and the API keeps serving


NOW_NS = time.time_ns()
REFUSED_SPANS = {
    "nested attributes": (lambda: add_attribute(one_span(), "deep", nested(12)), "nested more than 8 levels"),
    "repeated attributes": (lambda: add_attribute(one_span(), "wide", many(300)), "at most 256"),
    "huge string": (lambda: add_attribute(one_span(), "big", AnyValue(string_value="x" * 100_001)),
                    "100001 characters; at most 100000"),
    "short trace id": (lambda: one_span(trace_id=b"\x01" * 8), "trace id is 8 bytes"),
    "zero span id": (lambda: one_span(span_id=b"\x00" * 8), "span id is 8 bytes of zeros"),
    "future time": (lambda: one_span(end_time_unix_nano=NOW_NS + 86_400 * 10**9), "ends in the future"),
    "zero time": (lambda: one_span(start_time_unix_nano=0), "start or end time is zero"),
    "bad score": (lambda: add_attribute(one_span(), "tfgrpo.score", AnyValue(double_value=3.0)),
                  "a score is a number from 0 to 1"),
}


@pytest.mark.parametrize("case", list(REFUSED_SPANS))
def test_a_bad_span_is_refused_in_the_partial_success_and_nothing_is_written(engine, client, production, case):
    make, words = REFUSED_SPANS[case]
    response = client.post(ROUTE, content=make().SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 200
    partial = answer(response).partial_success
    assert partial.rejected_spans == 1 and words in partial.error_message and "span 1" in partial.error_message
    assert_nothing_written(engine, client)


def test_a_bad_span_beside_good_ones_refuses_only_itself(engine, client, production):
    request = sdk_request(lambda tracer: [chat_span(tracer, f"q{i}", **{"tfgrpo.task": DEMO_TASK}) for i in range(3)])
    request.resource_spans[0].scope_spans[0].spans[1].trace_id = b"\x01" * 3
    response = client.post(ROUTE, content=request.SerializeToString(), headers=PROTOBUF)
    partial = answer(response).partial_success
    assert partial.rejected_spans == 1 and partial.error_message.startswith("span 2")
    assert [row.input for row in stored(engine)] == ["q0", "q2"]


BAD_BODIES = {
    "malformed protobuf": (b"\x0a\xff\xff\xff\xff\x0f garbage", PROTOBUF, 400, "not an OTLP ExportTraceServiceRequest"),
    "malformed JSON": (b'{"resourceSpans": [', JSON, 400, "not JSON"),
    "JSON of the wrong shape": (b'{"resourceSpans": 5}', JSON, 400, "not an OTLP/JSON ExportTraceServiceRequest"),
    "ids not hex": (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', JSON, 400,
                    "traceId 'zz' is not hex"),
    "non-UTF-8 JSON": (b'{"resourceSpans": [], "x": "\xff\xfe"}', JSON, 400, "not UTF-8"),
    "wrong content type": (b"{}", {"Content-Type": "text/plain"}, 415, "Content-Type 'text/plain' is not read"),
    "unknown encoding": (b"{}", {**JSON, "Content-Encoding": "br"}, 415, "Content-Encoding 'br'"),
    "broken gzip": (b"\x1f\x8b\x08\x00garbage", {**JSON, "Content-Encoding": "gzip"}, 400, "not valid gzip"),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_a_bad_body_gets_a_clear_4xx_and_nothing_is_written(engine, client, production, case):
    body, headers, status, words = BAD_BODIES[case]
    response = client.post(ROUTE, content=body, headers=headers)
    assert response.status_code == status and words in response.json()["error"]
    assert_nothing_written(engine, client)


def test_non_utf8_text_in_protobuf_is_refused_whole(engine, client, production):
    good = one_span().SerializeToString()
    name = b"chat stub"
    broken = good.replace(name, b"chat \xff\xfeub")  # the span's name, same length, no longer UTF-8
    assert broken != good
    response = client.post(ROUTE, content=broken, headers=PROTOBUF)
    assert response.status_code == 400 and "protobuf" in response.json()["error"]
    assert_nothing_written(engine, client)


def test_a_body_over_the_limit_is_refused_before_it_is_read_whole(engine, ingest_key, production):
    small = TestClient(create_app(engine, max_body_bytes=4096), headers={"X-API-Key": ingest_key})
    declared = small.post(ROUTE, content=b"x" * 5000, headers=PROTOBUF)
    assert declared.status_code == 413 and "5000 bytes; the API reads at most 4096" in declared.json()["error"]
    streamed = small.post(ROUTE, content=iter([b"x" * 1024] * 10), headers=PROTOBUF)  # no Content-Length
    assert streamed.status_code == 413 and "over 4096 bytes" in streamed.json()["error"]
    # the route's reader stops at the first chunk past the cap (TestClient itself sends the whole body first)
    taken = []

    async def endless():
        while True:
            taken.append(1)
            yield b"x" * 1024

    with pytest.raises(BodyTooLarge):
        asyncio.run(read_capped(endless(), None, 4096))
    assert len(taken) == 5
    assert_nothing_written(engine, small)


def test_a_length_in_other_digits_is_no_length_and_the_body_is_read_up_to_the_cap():
    """A declared length that only `isdigit` takes for a number ("²") once broke `int` into a 500."""
    async def body():
        yield b"x" * 10

    assert asyncio.run(read_capped(body(), "\u00b2", 4096)) == b"x" * 10
    with pytest.raises(BodyTooLarge, match="over 4 bytes"):
        asyncio.run(read_capped(body(), "\u0663", 4))


def test_a_gzip_bomb_is_stopped_while_inflating_with_bounded_memory(engine, ingest_key, production):
    cap = 1_000_000
    app = TestClient(create_app(engine, max_body_bytes=cap), headers={"X-API-Key": ingest_key})
    bomb = gzip.compress(b"\0" * 200_000_000, compresslevel=9)  # 200 MB inflated, ~200 KB sent
    assert len(bomb) < cap
    tracemalloc.start()
    try:
        response = app.post(ROUTE, content=bomb, headers={**PROTOBUF, "Content-Encoding": "gzip"})
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 413 and "inflates past 1000000 bytes" in response.json()["error"]
    assert peak < 10 * cap  # a few copies of the cap at most, never the 200 MB
    assert_nothing_written(engine, app)


def test_otlp_json_answers_a_refused_span_in_json(engine, client, production):
    request = one_span(end_time_unix_nano=NOW_NS + 86_400 * 10**9)
    response = client.post(ROUTE, content=to_json(request), headers=JSON)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and "ends in the future" in partial["errorMessage"]
    assert_nothing_written(engine, client)
