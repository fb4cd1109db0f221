"""The HTTP API (FastAPI's test client, and one real uvicorn process): a library by label or id with an
ETag and 304, API keys (401/403 with an audit event), traces posted idempotently in batches, the size,
batch and rate limits, A/B arms by user id, and clear JSON errors."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from api.__main__ import main as serve_main
from api.app import create_app
from core.errors import PermissionDenied
from core.records.keys.api_keys import create_key, revoke_key
from core.records.library.versions import import_library, set_label
from core.records.production.serving import set_ab_split
from core.records.tasks.demos import DEMO_TASK
from storage.tables import ApiKey, AuditEvent, Trace

URL = "/v1/tasks/arithmetic word problems/libraries/default"


def bearer(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def keys(engine, demo_task) -> dict[str, str]:
    return {role: create_key(engine, f"agent-{role}", role, "cli", any_task=role == "ingest").secret
            for role in ("read", "ingest")}


@pytest.fixture
def production(engine, demo_task):
    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(version.number), "production", "system")
    return version


@pytest.fixture
def client(engine, keys) -> TestClient:
    return TestClient(create_app(engine), headers=bearer(keys["read"]))


def trace(i: int | str, version_id: int, **extra) -> dict:
    return {"id": f"t-{i}", "task": DEMO_TASK, "version_id": version_id, "input": f"What is {i} + 1?",
            "output": f"{i}", **extra}


def stored(engine) -> list[Trace]:
    with Session(engine) as session:
        return list(session.exec(select(Trace).order_by(Trace.id)))


def test_health_needs_no_key(engine, demo_task):
    response = TestClient(create_app(engine)).get("/v1/health")
    assert response.status_code == 200 and response.json() == {"status": "ok", "database": "reachable"}


def test_the_openapi_document_describes_the_error_body_the_api_sends(engine, client, production):
    """Every 4xx answer is {"error": ...}; the document said FastAPI's {"detail": [...]} for 422."""
    document = client.get("/openapi.json").json()
    declared = document["components"]["schemas"]["HTTPValidationError"]
    assert declared["required"] == ["error"] and "detail" not in declared["properties"]
    assert "ValidationError" not in document["components"]["schemas"]
    refused = client.get(f"/v1/tasks/{DEMO_TASK}/libraries/default", params={"version": "x"})
    assert refused.status_code == 422 and set(refused.json()) == set(declared["required"])


def test_the_openapi_document_declares_the_key_so_docs_offer_authorize(engine, keys, production):
    """/docs draws its Authorize button from the document's security schemes: every keyed route names both ways
    of sending the key, the health and readiness routes none; a key sent through X-API-Key works as Bearer does."""
    bare = TestClient(create_app(engine))
    document = bare.get("/openapi.json").json()
    assert set(document["components"]["securitySchemes"]) == {"HTTPBearer", "APIKeyHeader"}
    assert document["components"]["securitySchemes"]["APIKeyHeader"]["name"] == "X-API-Key"
    routes = {(path, method): operation for path, methods in document["paths"].items()
              for method, operation in methods.items()}
    assert "security" not in routes[("/v1/health", "get")] and "security" not in routes[("/v1/ready", "get")]
    keyed = [operation for (path, _), operation in routes.items() if path not in ("/v1/health", "/v1/ready")]
    assert keyed and all({"HTTPBearer": []} in op["security"] and {"APIKeyHeader": []} in op["security"]
                         for op in keyed)
    path = f"/v1/tasks/{DEMO_TASK}/libraries/default"
    assert bare.get(path, headers={"X-API-Key": keys["read"]}).status_code == 200
    assert bare.get(path, headers={"Authorization": "Basic " + keys["read"]}).status_code == 401


def test_a_library_by_label_with_etag_and_304(engine, client, production):
    response = client.get(URL, params={"label": "production"})
    body, etag = response.json(), response.headers["etag"]
    assert response.status_code == 200
    assert body["version_id"] == production.id and body["label"] == "production" and body["arm"] is None
    assert body["experiences"] == ["Re-read the question."] and "Re-read the question." in body["prompt"]
    assert client.get(URL, headers={"If-None-Match": etag}).status_code == 304  # production is the default label

    second = import_library(engine, DEMO_TASK, "- Check units.", "b.md", actor="system")
    assert client.get(URL, headers={"If-None-Match": etag}).status_code == 304  # the label did not move
    set_label(engine, DEMO_TASK, str(second.number), "production", "system", reason="no comparison needed for this test")
    moved = client.get(URL, headers={"If-None-Match": etag})
    assert moved.status_code == 200 and moved.json()["experiences"] == ["Check units."]
    assert moved.headers["etag"] != etag
    by_id = client.get(URL, params={"version": production.number})
    assert by_id.json()["version_id"] == production.id and by_id.json()["label"] is None


@pytest.mark.parametrize("path, params, status, words", [
    ("/v1/tasks/nope/libraries/default", {}, 404, "no task"),
    ("/v1/tasks/arithmetic word problems/libraries/nope", {}, 404, "no library 'nope'"),
    (URL, {"label": "staging"}, 404, "no label 'staging'"),
    (URL, {"version": 99999}, 404, "has no version #99999"),
    (URL, {"version": "abc"}, 422, "version"),
    (URL, {"version": 1, "label": "production"}, 422, "not both"),
])
def test_errors_are_json_with_a_message(client, path, params, status, words):
    response = client.get(path, params=params)
    assert response.status_code == status
    assert words in response.json()["error"]


def test_missing_unknown_revoked_and_wrong_role_keys_are_refused_and_audited(engine, keys, production):
    bare = TestClient(create_app(engine))
    assert bare.get(URL).status_code == 401
    assert "no API key" in bare.get(URL).json()["error"]
    assert bare.get(URL, headers=bearer("tfg_made-up")).status_code == 401
    assert bare.get(URL, headers={"X-API-Key": keys["read"]}).status_code == 200  # the other header works too

    refused = bare.post("/v1/traces", headers=bearer(keys["read"]), json={"traces": [trace(1, production.id)]})
    assert refused.status_code == 403 and "needs an ingest key" in refused.json()["error"]
    assert bare.get(URL, headers=bearer(keys["ingest"])).status_code == 200  # ingest includes read

    with Session(engine) as session:
        read_id = session.exec(select(ApiKey.id).where(ApiKey.name == "agent-read")).one()
    revoke_key(engine, read_id, "cli")
    for _ in range(5):  # a revoked key still in use, five times within a minute: one row, counted
        revoked = bare.get(URL, headers=bearer(keys["read"]))
    assert revoked.status_code == 401 and "revoked" in revoked.json()["error"]
    assert stored(engine) == []

    with Session(engine) as session:
        denied = [e.after["reason"] for e in session.exec(select(AuditEvent).where(AuditEvent.action == "api.denied"))]
    # the three refusals without a known key, from one address within a minute, are one row (the first);
    # the refusals naming a key (wrong role, revoked) are one row each
    assert len(denied) == 3 and denied[0].startswith("no API key") and any("revoked" in reason for reason in denied)
    assert any("read key" in reason for reason in denied)


def test_a_flood_of_made_up_keys_is_audited_once_a_minute_per_address_with_its_count(engine, demo_task):
    from core.records.keys.limits import audit_refusal

    bare = TestClient(create_app(engine))
    assert {bare.get(URL, headers=bearer(f"tfg_guess-{i}")).status_code for i in range(30)} == {401}
    start = 1_000_000.0
    assert audit_refusal(engine, "10.0.0.9", "unknown API key", "GET /x", now=start)  # another address: its own row
    assert not audit_refusal(engine, "10.0.0.9", "unknown API key", "GET /x", now=start + 30)
    assert not audit_refusal(engine, "10.0.0.9", "unknown API key", "GET /x", now=start + 59)
    assert audit_refusal(engine, "10.0.0.9", "unknown API key", "GET /x", now=start + 61)
    with Session(engine) as session:
        rows = session.exec(select(AuditEvent).where(AuditEvent.action == "api.denied").order_by(AuditEvent.id)).all()
    assert [(row.after["address"], row.after["refusals"]) for row in rows] == [
        ("testclient", 1), ("10.0.0.9", 1), ("10.0.0.9", 3)]  # 30 requests from the test client: one row so far


def test_keys_are_stored_hashed_and_only_an_admin_makes_them(engine, keys):
    from core.records.people.users import add_user

    with Session(engine) as session:
        rows = list(session.exec(select(ApiKey)))
    assert {row.role for row in rows} == {"read", "ingest"}
    assert all(row.key_hash not in keys.values() and row.key_hash != "" for row in rows)
    assert all(secret.startswith(row.prefix) for row, secret in zip(rows, (keys["read"], keys["ingest"]), strict=True))
    add_user(engine, "boss", "admin", "boss-password")
    add_user(engine, "lab", "labeler", "lab-password", actor="boss")
    with pytest.raises(PermissionDenied):
        create_key(engine, "sneaky", "ingest", "lab", any_task=True)


def test_traces_are_stored_once_per_id_in_batches(engine, keys, production):
    ingest = TestClient(create_app(engine), headers=bearer(keys["ingest"]))
    batch = [trace(i, production.id, score=i / 10, segment="web") for i in range(10)]
    first = ingest.post("/v1/traces", json={"traces": batch})
    assert first.status_code == 200 and first.json() == {"stored": 10, "duplicates": 0, "outside_experiment": []}
    again = ingest.post("/v1/traces", json={"traces": batch[5:] + [trace("new", production.id, thumbs="down")]})
    assert again.json() == {"stored": 1, "duplicates": 5, "outside_experiment": []}
    by_label = ingest.post("/v1/traces", json={"traces": [{**trace("lbl", None), "version_id": None,
                                                           "label": "production"}]})
    assert by_label.json()["stored"] == 1
    rows = stored(engine)
    assert len(rows) == 12 and len({row.client_id for row in rows}) == 12
    assert {row.version_id for row in rows} == {production.id}
    assert rows[10].thumbs == -1 and rows[0].segment == "web" and rows[11].served_label == "production"


@pytest.mark.parametrize("bad, words", [
    ({"score": 1.5}, "score must be at most 1"),
    ({"thumbs": "meh"}, "thumbs"),
    ({"version_id": None}, "give version_id or label"),
    ({"task": "nope"}, "no task"),
    ({"label": "staging", "version_id": None}, "no label 'staging'"),
    ({"colour": "red"}, "not a known setting"),
])
def test_one_bad_trace_refuses_the_batch_and_nothing_is_stored(engine, keys, production, bad, words):
    ingest = TestClient(create_app(engine), headers=bearer(keys["ingest"]))
    batch = [trace(1, production.id), {**trace(2, production.id), **bad}]
    response = ingest.post("/v1/traces", json={"traces": batch})
    assert response.status_code == 422 and words in response.json()["error"], response.json()
    assert stored(engine) == []


def test_a_trace_naming_another_tasks_version_is_refused(engine, keys, production):
    from core.records.tasks.demos import SUPPORT_TASK, ensure_demo_tasks

    ensure_demo_tasks(engine)
    other = import_library(engine, SUPPORT_TASK, "- Be kind.", "c.md", actor="system")
    ingest = TestClient(create_app(engine), headers=bearer(keys["ingest"]))
    response = ingest.post("/v1/traces", json={"traces": [trace(1, production.id), trace(2, other.id)]})
    assert response.status_code == 422
    assert "trace 2 (id 't-2')" in response.json()["error"] and "nothing was stored" in response.json()["error"]
    assert stored(engine) == []


def test_every_refused_batch_has_one_error_shape_counted_from_1_with_the_senders_id(engine, keys, production):
    """A trace the schema refuses and a trace whose version cannot be found are told the same way: position
    from 1, the sender's id, the reason, and that nothing was stored."""
    ingest = TestClient(create_app(engine), headers=bearer(keys["ingest"]))
    schema = ingest.post("/v1/traces", json={"traces": [trace(1, production.id), {**trace(2, production.id),
                                                                                 "score": 7}]})
    unknown = ingest.post("/v1/traces", json={"traces": [trace(1, production.id), {**trace(2, production.id),
                                                                                  "task": "nope"}]})
    for response in (schema, unknown):
        body = response.json()
        assert response.status_code == 422 and body["stored"] == 0, body
        assert [(p["position"], p["id"]) for p in body["problems"]] == [(2, "t-2")], body
        assert body["error"].startswith("trace 2 (id 't-2'): ") and body["error"].endswith("; nothing was stored")
    assert "score" in schema.json()["problems"][0]["reason"] and "nope" in unknown.json()["problems"][0]["reason"]
    assert stored(engine) == []


def test_size_batch_and_rate_limits(engine, keys, production):
    small = TestClient(create_app(engine, max_body_bytes=4096, rate_per_minute=5), headers=bearer(keys["ingest"]))
    too_big = small.post("/v1/traces", json={"traces": [trace(1, production.id, output="x" * 5000)]})
    assert too_big.status_code == 413 and "at most 4096" in too_big.json()["error"]
    chunked = small.post("/v1/traces", content=iter([json.dumps({"traces": [trace(1, production.id)]}).encode(),
                                                      b" " * 5000]), headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413  # no Content-Length: counted while read
    over = small.post("/v1/traces", json={"traces": [trace(i, production.id) for i in range(101)]})
    assert over.status_code in (413, 422)
    # the allowance is the key's, wherever it is spent: another key for the batch checks below
    other_key = create_key(engine, "agent-ingest-2", "ingest", "cli", any_task=True).secret
    roomy = TestClient(create_app(engine, rate_per_minute=1000), headers=bearer(other_key))
    batch = roomy.post("/v1/traces", json={"traces": [trace(i, production.id) for i in range(101)]})
    assert batch.status_code == 422 and "at most 100 traces" in batch.json()["error"]
    not_json = roomy.post("/v1/traces", content=b"{oops", headers={"Content-Type": "application/json"})
    assert not_json.status_code == 422 and "not JSON" in not_json.json()["error"]
    assert stored(engine) == []

    statuses = [small.get(URL).status_code for _ in range(3)]  # 3 more: the limiter allows 5 a minute
    assert statuses == [200, 200, 429]
    limited = small.get(URL)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert "5 requests a minute" in limited.json()["error"]
    other = TestClient(create_app(engine), headers=bearer(keys["read"]))
    assert other.get(URL).status_code == 200  # another app (and key) has its own allowance


def test_ab_split_serves_a_stable_share_of_users_the_candidate(engine, client, production):
    candidate = import_library(engine, DEMO_TASK, "- Check units.", "b.md", actor="system")
    set_label(engine, DEMO_TASK, str(candidate.number), "candidate", "system")
    set_ab_split(engine, DEMO_TASK, "default", "candidate", 0.3, "cli")
    arms = {f"user-{i}": client.get(URL, params={"user": f"user-{i}"}).json() for i in range(200)}
    served = [body["arm"] for body in arms.values()]
    assert 0.2 < served.count("candidate") / 200 < 0.4
    assert all(body["version_id"] == (candidate.id if body["arm"] == "candidate" else production.id)
               for body in arms.values())
    assert all(client.get(URL, params={"user": user}).json()["arm"] == body["arm"] for user, body in
               list(arms.items())[:20])  # the same user always gets the same arm
    assert client.get(URL).json()["arm"] is None  # no user id: production, no arm
    set_ab_split(engine, DEMO_TASK, "default", None, 0.0, "cli")
    assert client.get(URL, params={"user": "user-1"}).json()["arm"] is None


def test_the_server_refuses_to_listen_beyond_loopback_without_sign_in(capsys, engine, monkeypatch):
    from core.settings import get_settings
    from storage.db import url_with_password

    monkeypatch.setenv("DATABASE_URL", url_with_password(engine))
    get_settings.cache_clear()
    try:
        assert serve_main(["--host", "0.0.0.0"]) == 2
    finally:
        get_settings.cache_clear()
    assert "loopback only" in capsys.readouterr().err


def test_a_real_uvicorn_process_serves_the_library_and_takes_traces(engine, keys, production):
    """`python -m core serve` as a user starts it: a uvicorn process on a loopback port, over HTTP."""
    import httpx

    from tests.api_support import api_server

    with api_server(engine) as base:
        response = httpx.get(f"{base}{URL}", headers=bearer(keys["read"]), timeout=10)
        assert response.status_code == 200 and response.json()["version_id"] == production.id
        again = httpx.get(f"{base}{URL}", headers={**bearer(keys["read"]), "If-None-Match": response.headers["etag"]},
                          timeout=10)
        assert again.status_code == 304
        assert httpx.get(f"{base}{URL}", timeout=10).status_code == 401
        posted = httpx.post(f"{base}/v1/traces", headers=bearer(keys["ingest"]),
                            json={"traces": [trace(i, production.id) for i in range(3)]}, timeout=10)
        assert posted.json() == {"stored": 3, "duplicates": 0, "outside_experiment": []}
        assert httpx.get(f"{base}/docs", timeout=10).status_code == 200
        schema = httpx.get(f"{base}/openapi.json", timeout=10).json()
        assert "TraceIn" in schema["components"]["schemas"] and "/v1/traces" in schema["paths"]
    assert len(stored(engine)) == 3


def test_served_entries_carry_their_kind_so_an_agent_can_tell_a_worked_example_from_a_lesson(engine, client):
    text = ("- Re-read the question.\n\n## Worked examples\n\n"
            "- Problem: 3 bags of 4 apples. Steps: 3 x 4 = 12. Answer: 12.\n")
    version = import_library(engine, DEMO_TASK, text, "kinds.md", actor="system")
    served = client.get(URL, params={"version": version.number}).json()
    assert [(e["text"][:9], e["kind"]) for e in served["entries"]] == [("Re-read t", "lesson"), ("Problem: ", "example")]
    assert served["experiences"] == [e["text"] for e in served["entries"]]
    chosen = client.get(URL + "/select", params={"version": version.number, "query": "apples in bags"}).json()
    assert {e["kind"] for e in chosen["entries"]} == {"lesson", "example"}


# --- feedback that comes after the trace ----------------------------------------------------------------


def test_a_late_thumbs_down_updates_the_trace_once_audited_and_seen_by_the_rules_and_harvest(engine, keys,
                                                                                            production):
    from core.records.production.traces import harvest, set_rules

    set_rules(engine, DEMO_TASK, {"below": 0.5}, "cli")
    ingest = TestClient(create_app(engine), headers=bearer(keys["ingest"]))
    assert ingest.post("/v1/traces", json={"traces": [trace(1, production.id)]}).status_code == 200
    assert stored(engine)[0].label_status is None  # no score yet: the rule has nothing to go on

    update = {"task": DEMO_TASK, "thumbs": "down", "comment": "Wrong answer."}
    first = ingest.patch("/v1/traces/t-1", json=update)
    again = ingest.patch("/v1/traces/t-1", json=update)
    assert first.json() == {"id": "t-1", "changed": True} and again.json() == {"id": "t-1", "changed": False}
    row = stored(engine)[0]
    assert (row.thumbs, row.comment, row.score) == (-1, "Wrong answer.", None)  # score left as it was
    assert row.label_status == "needed"  # thumbs down reads as score 0, under the rule's 0.5
    with Session(engine) as session:
        events = session.exec(select(AuditEvent).where(AuditEvent.action == "trace.update")).all()
    assert len(events) == 1 and events[0].actor == "(api key agent-ingest)"  # the repeat wrote nothing
    assert events[0].before == {"thumbs": None, "comment": None} and events[0].after["thumbs"] == -1
    assert harvest(engine, DEMO_TASK, "cli", max_score=0.4) == (1, 0)  # harvest sees the late score

    cleared = ingest.patch("/v1/traces/t-1", json={"task": DEMO_TASK, "thumbs": None})
    assert cleared.json()["changed"] and stored(engine)[0].thumbs is None


def test_an_update_is_refused_with_the_error_shape_and_changes_nothing(engine, keys, production):
    ingest = TestClient(create_app(engine), headers=bearer(keys["ingest"]))
    reader = TestClient(create_app(engine), headers=bearer(keys["read"]))
    ingest.post("/v1/traces", json={"traces": [trace(1, production.id, score=0.9)]})
    missing = ingest.patch("/v1/traces/t-404", json={"task": DEMO_TASK, "score": 0.1})
    assert missing.status_code == 404 and "no trace 't-404'" in missing.json()["error"]
    bad = ingest.patch("/v1/traces/t-1", json={"task": DEMO_TASK, "score": 3})
    assert bad.status_code == 422 and "score" in bad.json()["error"]
    assert reader.patch("/v1/traces/t-1", json={"task": DEMO_TASK, "score": 0.1}).status_code == 403
    assert stored(engine)[0].score == 0.9


def test_two_api_processes_on_one_database_allow_the_configured_rate_in_total(engine, keys, production):
    """The allowance lives in the database: two processes of `python -m core serve` with a limit of 10 a
    minute let one key make 10 requests between them, not 10 each."""
    import time

    import httpx

    from tests.api_support import api_server

    limit = {"TFGRPO_API_RATE_PER_MINUTE": "10"}
    with api_server(engine, extra_env=limit) as first, api_server(engine, extra_env=limit) as second:
        started = time.monotonic()
        statuses = [httpx.get(f"{base}{URL}", headers=bearer(keys["read"]), timeout=10).status_code
                    for _ in range(10) for base in (first, second)]
        elapsed = time.monotonic() - started
    refill = int(elapsed * 10 / 60)  # the bucket refills 10 a minute meanwhile
    assert set(statuses) == {200, 429}
    assert 10 <= statuses.count(200) <= 10 + refill, (statuses, elapsed)


def test_the_prompt_names_each_entry_by_the_id_its_entries_give(client, production):
    """Issue 37: the prompt numbered its entries G0, G1 while `entries` (and every page, the learner and a review)
    call them E1, E2; now the agent reads each entry under the id a person uses for it."""
    body = client.get(URL).json()
    assert body["entries"] and all(f"[{e['id']}] {e['text']}" in body["prompt"] for e in body["entries"])
    assert "[G" not in body["prompt"]
    selected = client.get(f"{URL}/select", params={"query": "How many apples?"}).json()
    assert all(f"[{e['id']}] {e['text']}" in selected["prompt"] for e in selected["entries"])
