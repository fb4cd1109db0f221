"""Reads inside their task, exactly as writes (issue 61, item 3): every keyed route of the API, walked from its own
/openapi.json, refuses a key bound to another task, names no task but the key's own, and leaves an audit row (one a
minute per key, with the count)."""

from __future__ import annotations

import re
import secrets

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from api.app import create_app
from core.records.keys.api_keys import create_key
from core.records.library.versions import import_library, set_label
from core.records.production.traces import TraceIn, ingest_traces
from core.records.tasks.demos import DEMO_TASK, ensure_demo_tasks
from storage.db import session_scope
from storage.tables import AuditEvent, Evaluation, Task

EXAMPLE_BODY = {"/v1/traces": {"traces": [{"id": "t-x", "task": DEMO_TASK, "label": "production", "input": "q",
                                            "output": "a"}]}}


@pytest.fixture
def two_tasks(engine, demo_task):
    """The demo task (theirs) with a production version, a trace and an evaluation; and another task (ours)."""
    ensure_demo_tasks(engine)
    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(version.number), "production", "system")
    ingest_traces(engine, [TraceIn(id="t-0", task=DEMO_TASK, label="production", input="q", output="a", score=0.7)])
    with session_scope(engine) as session:
        theirs = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        ours = next(task for task in session.exec(select(Task)) if task.name != DEMO_TASK)
        evaluation = Evaluation(task_id=theirs.id, split="test", model="openai/secret-model", status="completed")
        session.add(evaluation)
        session.flush()
        return ours.name, evaluation.id


def requests_for(app, evaluation_id: int):
    """Every route of /openapi.json that takes a key, as a request naming the demo task (theirs)."""
    schema = TestClient(app).get("/openapi.json").json()
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            if not operation.get("security"):
                continue
            url = (path.replace("{task}", DEMO_TASK).replace("{library}", "default")
                   .replace("{evaluation_id}", str(evaluation_id)).replace("{trace_id}", "t-0"))
            params = {"task": DEMO_TASK, "query": "q"} if method == "get" else {}
            body = EXAMPLE_BODY.get(path, {"task": DEMO_TASK, "score": 0.1} if method == "patch" else None)
            if path.startswith("/otlp/"):
                body = {"resourceSpans": [{"resource": {"attributes": [
                    {"key": "service.name", "value": {"stringValue": "agent"}}]}, "scopeSpans": [{"spans": [{
                        "traceId": secrets.token_hex(16), "spanId": secrets.token_hex(8), "name": "chat",
                        "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000",
                        "attributes": [{"key": "tfgrpo.task", "value": {"stringValue": DEMO_TASK}},
                                       {"key": "input.value", "value": {"stringValue": "q"}}]}]}]}]}
            yield method, url, params, body


@pytest.mark.parametrize("role", ["read", "ingest"])
def test_every_keyed_route_refuses_a_key_bound_to_another_task_and_the_refusal_is_audited(engine, two_tasks, role):
    ours, evaluation_id = two_tasks
    secret = create_key(engine, f"team-b-{role}", role, "cli", task=ours).secret
    app = create_app(engine)
    client = TestClient(app, headers={"Authorization": f"Bearer {secret}"})
    walked = []
    with Session(engine) as session:
        other_names = [task.name for task in session.exec(select(Task)) if task.name not in (ours, DEMO_TASK)]
    for method, url, params, body in requests_for(app, evaluation_id):
        response = client.request(method.upper(), url, params=params, json=body)
        walked.append(f"{method.upper()} {url.split('?')[0]}")
        if role == "read" and "is a read key" in response.text:  # the route needs an ingest key: refused first
            assert response.status_code == 403, (url, response.text)
            continue
        text = response.text
        if url.startswith("/otlp/"):  # OTLP answers 200 with the refused span in its partial success
            assert response.status_code == 200 and "rejectedSpans" in text and '"1"' in text.replace(" ", ""), text
        else:
            assert response.status_code == 403, (url, response.status_code, text)
        assert f"only in task {ours!r}" in text
        assert "0.7" not in text and "secret-model" not in text
        assert not any(name in text for name in other_names)
    assert {"GET /v1/tasks/{task}/libraries/{library}", "GET /v1/evaluations/{id}"} <= {
        re.sub(r"/v1/tasks/[^/]+/libraries/[^/]+", "/v1/tasks/{task}/libraries/{library}",
               re.sub(r"/v1/evaluations/\d+", "/v1/evaluations/{id}", route)) for route in walked}
    with Session(engine) as session:
        audited = list(session.exec(select(AuditEvent).where(AuditEvent.action == "api.denied",
                                                             AuditEvent.actor == f"(api key team-b-{role})")))
    outside = [row for row in audited if f"only in task {ours!r}" in row.after["reason"]]
    assert len(outside) == 1 and outside[0].object_type == "apikey"  # throttled: one row a minute per key


def test_an_unknown_task_is_not_answered_with_every_tasks_name(engine, two_tasks):
    secret = create_key(engine, "reader", "read", "cli").secret
    response = TestClient(create_app(engine), headers={"Authorization": f"Bearer {secret}"}).get(
        "/v1/tasks/no-such-task/libraries/default")
    assert response.status_code == 404 and "no task named 'no-such-task'" in response.text
    assert DEMO_TASK not in response.text
