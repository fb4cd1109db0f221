"""openlit's spans are kept: what openlit itself exported for one OpenAI chat call against bench/stub_server.py
(recorded once in a venv of its own, tests/data/openlit/README.md) is posted to the studio's OTLP route as the
exporter posted it, and the model call is stored as a trace with its prompt, reply and model. openlit 1.34 writes
the prompt and completion as `gen_ai.prompt` / `gen_ai.completion` strings (and events of the same content);
openlit 1.45 writes the current GenAI conventions."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from sqlmodel import Session, select

from api.app import create_app
from core.records.keys.api_keys import create_key
from core.records.library.versions import import_library, set_label
from core.records.production.otlp_held import held_services
from core.records.tasks.demos import DEMO_TASK
from storage.tables import Trace

RECORDED = Path(__file__).parent / "data" / "openlit"


@pytest.mark.parametrize("version", ["1.34.30", "1.45.0"])
def test_openlits_own_export_is_stored_as_a_trace(engine, demo_task, version):
    library = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(library.number), "production", "system")
    secret = create_key(engine, "openlit-agent", "ingest", "cli", task=DEMO_TASK).secret
    client = TestClient(create_app(engine), headers={"Authorization": f"Bearer {secret}"})
    body = (RECORDED / f"openlit-{version}.pb").read_bytes()
    response = client.post("/otlp/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"})
    assert response.status_code == 200
    answer = ExportTraceServiceResponse()
    answer.ParseFromString(response.content)
    assert answer.partial_success.rejected_spans == 0
    with Session(engine) as session:
        [trace] = session.exec(select(Trace)).all()
        assert held_services(session) == []
    assert trace.input == "What is 2 + 2?"
    assert "\\boxed{" in trace.output
    otlp = trace.meta["otlp"]
    assert otlp["scope"].startswith("openlit.") and (otlp["model"], otlp["service"]) == ("gpt-4o-mini", "openlit-agent")
