"""End to end, as a team would run it: an agent using the `openai` client, instrumented by
opentelemetry-instrumentation-openai-v2 and exported by the SDK's OTLP/HTTP exporter configured only by the
environment variables docs/traces-otlp.md names, talking to bench/stub_server.py and exporting to a running
`python -m api`; then OTLP/JSON to the same process. The traces are then labelled, harvested and counted by
the A/B split through the same functions as the client's."""

from __future__ import annotations

import gzip

import httpx
import openai
import pytest
from sqlmodel import Session, select

from bench.stub_server import StubServer
from core.records.keys.api_keys import create_key
from core.records.library.versions import import_library, set_label
from core.records.production.ab_experiments import NO_USER, served_arm
from core.records.production.ab_verdict import ab_status
from core.records.production.otlp import map_service
from core.records.production.serving import set_ab_split
from core.records.production.traces import harvest, set_rules
from core.records.tasks.demos import DEMO_TASK
from storage.tables import Sample, Trace
from tests.api_support import api_server
from tests.otlp_support import JSON, chat_span, sdk_request, to_json


@pytest.fixture
def production(engine, demo_task):
    version = import_library(engine, DEMO_TASK, "- Re-read the question.\n- Check the units.", "a.md",
                             actor="system")
    set_label(engine, DEMO_TASK, str(version.number), "production", "system")
    return version


def test_an_instrumented_openai_agent_exports_its_calls_to_the_running_api(engine, production, monkeypatch):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    ingest = create_key(engine, "math-agent", "ingest", "cli", any_task=True).secret
    read = create_key(engine, "math-agent-read", "read", "cli").secret
    candidate = import_library(engine, DEMO_TASK, "- Draw the problem first.", "b.md", actor="system")
    set_label(engine, DEMO_TASK, str(candidate.number), "candidate", "system")
    set_ab_split(engine, DEMO_TASK, "default", "candidate", 0.5, "cli")
    set_rules(engine, DEMO_TASK, {"below": 0.5}, "cli")
    map_service(engine, "math-agent", DEMO_TASK, "default", "cli")
    with StubServer() as stub, api_server(engine, command=("api",)) as base:
        # the three lines a team adds (docs/traces-otlp.md), and the instrumentation's content capture
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"{base}/otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer%20{ingest}")
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=math-agent")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "span_only")
        provider = TracerProvider(resource=Resource.create())
        exporter = OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
        instrumentor = OpenAIInstrumentor()
        instrumentor.instrument(tracer_provider=provider)
        try:
            agent = openai.OpenAI(base_url=stub.url, api_key="stub-key", max_retries=0)
            for i, user in enumerate(["alice", "bob", "carol", "dave"]):
                served = httpx.get(f"{base}/v1/tasks/{DEMO_TASK}/libraries/default", params={"user": user},
                                   headers={"Authorization": f"Bearer {read}"}, timeout=10).json()
                agent.chat.completions.create(model="stub", messages=[
                    {"role": "system", "content": f"Solve the word problem.\n\n{served['prompt']}"},
                    {"role": "user", "content": f"Tom has {i} apples and buys 2. How many now?"}])
            assert provider.force_flush(30_000)
        finally:
            instrumentor.uninstrument()
            provider.shutdown()

        # OTLP/JSON (the exporter speaks protobuf only): the SDK's own encoding through json_format, gzip
        candidate_user = next(f"user-{i}" for i in range(100)
                              if served_arm(production.library_id, 0.5, f"user-{i}") == "candidate")
        request = sdk_request(lambda tracer: chat_span(tracer, "JSON question?", "0", **{
            "tfgrpo.task": DEMO_TASK, "tfgrpo.label": "candidate", "tfgrpo.thumbs": "up",
            "tfgrpo.user_id": candidate_user}))
        posted = httpx.post(f"{base}/otlp/v1/traces", content=gzip.compress(to_json(request)), timeout=10,
                            headers={**JSON, "Content-Encoding": "gzip", "Authorization": f"Bearer {ingest}"})
        assert posted.status_code == 200 and posted.json() == {}

    with Session(engine) as session:
        rows = list(session.exec(select(Trace).order_by(Trace.id)))
        by_version = {row.input: row.version_id for row in rows}
    assert [row.input for row in rows[:4]] == [f"Tom has {i} apples and buys 2. How many now?" for i in range(4)]
    for row in rows[:4]:
        otlp = row.meta["otlp"]
        # the instrumentation records through opentelemetry-util-genai, whose scope the spans carry
        assert otlp["scope"] in ("opentelemetry.util.genai.handler", "opentelemetry.instrumentation.openai_v2")
        assert otlp["model"] == "stub" and otlp["provider"] == "openai" and otlp["input_tokens"] is not None
        assert otlp["service"] == "math-agent" and otlp["version_from"] == "system instructions"
        assert row.output and "boxed" in row.output
    assert {by_version[row.input] for row in rows[:4]} <= {production.id, candidate.id}
    assert rows[4].input == "JSON question?" and rows[4].version_id == candidate.id and rows[4].thumbs == 1

    # feedback later, by the OTel trace id an engineer finds in their own tracing tool
    from fastapi.testclient import TestClient

    from api.app import create_app

    client = TestClient(create_app(engine), headers={"Authorization": f"Bearer {ingest}"})
    for row in rows[:4]:
        trace_id = row.meta["otlp"]["trace_id"]
        assert client.patch(f"/v1/traces/{trace_id}", json={"task": DEMO_TASK, "score": 0.1}).json()["changed"]
    with Session(engine) as session:
        rows = list(session.exec(select(Trace).order_by(Trace.id)))
    assert [row.label_status for row in rows[:4]] == ["needed"] * 4
    assert harvest(engine, DEMO_TASK, "cli", max_score=0.5) == (4, 0)
    with Session(engine) as session:
        harvested = session.exec(select(Sample).where(Sample.external_id.startswith("trace-"))).all()
        comparison = ab_status(session, DEMO_TASK)
    assert len(harvested) == 4
    # the instrumentation's spans carry no user id, so the A/B experiment cannot place them; the JSON span's user can
    assert {row["arm"]: row["scored traces"] for row in comparison.arms} == {"production": 0, "candidate": 1}
    assert comparison.excluded == {NO_USER: 4}
