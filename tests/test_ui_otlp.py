"""The Production page over traces received by OTLP: where each came from (client or OTLP and the
instrumentation's scope), "unknown version" shown as such, the span's attributes and resource as text, and the
spans held for services that map to no task, which land in the task when the admin maps the service."""

from __future__ import annotations

from sqlmodel import Session, select

from core.domain.otlp_spans import decode_spans
from core.records.library.versions import import_library, set_label
from core.records.production.otlp import ingest_spans
from core.records.production.traces import TraceIn, ingest_traces
from core.records.tasks.demos import DEMO_TASK
from storage.tables import OtlpService, Trace
from tests.otlp_support import chat_span, sdk_request
from tests.ui_support import run_app, table_with

PAGE = "pages/production.py"


def test_otlp_traces_show_their_source_unknown_version_and_attributes_and_a_service_is_mapped(app_engine):
    engine = app_engine
    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(version.number), "production", "system")
    ingest_traces(engine, [TraceIn(id="client-1", task=DEMO_TASK, version_id=version.id, input="Hi?", output="Hi.")])
    named = sdk_request(lambda tracer: chat_span(tracer, "<b>otel question</b>", "**4**", **{
        "tfgrpo.task": DEMO_TASK, "tfgrpo.score": 0.0, "gen_ai.conversation.id": "conv-<i>9</i>"}),
        scope="acme.agent")
    lost = sdk_request(lambda tracer: chat_span(tracer, "lost"), resource={"service.name": "billing-agent"})
    ingest_spans(engine, decode_spans(named))
    ingest_spans(engine, decode_spans(lost))
    with Session(engine) as session:
        otel = session.exec(select(Trace).where(Trace.client_id.contains(":"))).one()

    at = run_app(page=PAGE, session_state={"production_open": otel.client_id})
    [listed] = [df.value for df in at.dataframe if "source" in df.value.columns and len(df.value) == 2]
    sources = dict(zip(listed["sender id"], listed["source"], strict=True))
    assert sources == {"client-1": "client", otel.client_id: "OTLP · acme.agent"}
    versions = dict(zip(listed["sender id"], listed["version"], strict=True))
    assert versions[otel.client_id] == "unknown version" and versions["client-1"] == f"#{version.number}"
    codes = [code.value for code in at.code]
    assert "<b>otel question</b>" in codes and "**4**" in codes  # as text
    attributes = [code for code in codes if '"scope": "acme.agent"' in code]
    assert attributes and "conv-<i>9</i>" in attributes[0] and '"gen_ai.request.model": "stub"' in attributes[0]
    assert '"service.name": "agent"' in attributes[0]  # the resource, stored once, shown with the span
    held = table_with(at, "held (not mapped)")
    assert held[["service", "held (not mapped)", "dropped past the bound"]].to_dict("records") == [
        {"service": "billing-agent", "held (not mapped)": 1, "dropped past the bound": 0}]

    at.text_input(key="production_map_service").set_value("billing-agent")
    at.button(key="production_map").click()
    at.run()
    assert not at.exception
    with Session(engine) as session:
        mapped = session.get(OtlpService, "billing-agent")
    assert mapped is not None and mapped.library == "default"
    assert table_with(at, "task")["service"].tolist() == ["billing-agent"]
    with Session(engine) as session:
        assert session.exec(select(Trace).where(Trace.input == "lost")).one().task_id == otel.task_id
