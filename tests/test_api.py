"""The HTTP API (FastAPI's test client): health, a library fetched by label or id with an ETag and 304,
and clear JSON errors for what does not exist or is asked wrongly."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.__main__ import main as serve_main
from api.app import create_app
from core.records.tasks import DEMO_TASK
from core.records.versions import import_library, set_label

URL = "/v1/tasks/arithmetic word problems/libraries/default"


@pytest.fixture
def client(engine, demo_task) -> TestClient:
    return TestClient(create_app(engine))


def test_health(client):
    response = client.get("/v1/health")
    assert response.status_code == 200 and response.json() == {"status": "ok", "database": "reachable"}


def test_a_library_by_label_with_etag_and_304(engine, client):
    first = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, first.id, "production", "system")
    response = client.get(URL, params={"label": "production"})
    body, etag = response.json(), response.headers["etag"]
    assert response.status_code == 200
    assert body["version_id"] == first.id and body["label"] == "production"
    assert body["experiences"] == ["Re-read the question."] and "Re-read the question." in body["prompt"]
    assert client.get(URL, headers={"If-None-Match": etag}).status_code == 304  # production is the default label

    second = import_library(engine, DEMO_TASK, "- Check units.", "b.md", actor="system")
    assert client.get(URL, headers={"If-None-Match": etag}).status_code == 304  # the label did not move
    set_label(engine, DEMO_TASK, second.id, "production", "system")
    moved = client.get(URL, headers={"If-None-Match": etag})
    assert moved.status_code == 200 and moved.json()["experiences"] == ["Check units."]
    assert moved.headers["etag"] != etag
    by_id = client.get(URL, params={"version": first.id})
    assert by_id.json()["version_id"] == first.id and by_id.json()["label"] is None


@pytest.mark.parametrize("path, params, status, words", [
    ("/v1/tasks/nope/libraries/default", {}, 404, "no task"),
    ("/v1/tasks/arithmetic word problems/libraries/nope", {}, 404, "no library 'nope'"),
    (URL, {"label": "staging"}, 404, "no label 'staging'"),
    (URL, {"version": 99999}, 404, "no version 99999"),
    (URL, {"version": "abc"}, 422, "version"),
    (URL, {"version": 1, "label": "production"}, 422, "not both"),
])
def test_errors_are_json_with_a_message(client, path, params, status, words):
    response = client.get(path, params=params)
    assert response.status_code == status
    assert words in response.json()["error"]


def test_the_server_refuses_to_listen_beyond_loopback_without_keys(capsys):
    assert serve_main(["--host", "0.0.0.0"]) == 2
    assert "loopback only" in capsys.readouterr().err


def test_a_real_uvicorn_process_serves_the_library(engine, demo_task, tmp_path):
    """`python -m api` as a user starts it: a uvicorn process on a loopback port, fetched over HTTP."""
    import os
    import socket
    import subprocess
    import sys
    import time

    import httpx

    from storage.db import url_with_password
    from tests.ui_support import ROOT

    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, version.id, "production", "system")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": url_with_password(engine), "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, "-m", "api", "--port", str(port)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, server.stderr.read()
            assert time.monotonic() < deadline, "the API did not come up"
            time.sleep(0.2)
        response = httpx.get(f"{base}{URL}", timeout=10)
        assert response.status_code == 200 and response.json()["version_id"] == version.id
        again = httpx.get(f"{base}{URL}", headers={"If-None-Match": response.headers["etag"]}, timeout=10)
        assert again.status_code == 304
        assert httpx.get(f"{base}/docs", timeout=10).status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=30)
