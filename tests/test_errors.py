"""Each error class carries its CLI exit code and its HTTP status, and a subclass answers as its parent."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.app import create_app
from core.domain.datasets import DatasetError
from core.errors import (
    AlreadyDecided,
    Conflict,
    InvalidInput,
    ModelCallError,
    NotFound,
    PermissionDenied,
    SignInLocked,
    StaleVersion,
    StudioError,
    Unauthorized,
    exit_code,
)


def test_every_class_declares_or_inherits_its_status():
    assert [c.http_status for c in (StudioError, NotFound, InvalidInput, Conflict, PermissionDenied, Unauthorized)] \
        == [400, 404, 422, 409, 403, 401]
    assert AlreadyDecided.http_status == StaleVersion.http_status == 409  # once 400: found by class name only
    assert SignInLocked.http_status == 403 and DatasetError.http_status == 422
    assert exit_code(ModelCallError("x")) == 1 and exit_code(NotFound("x")) == 2


def test_the_api_answers_a_subclass_with_its_parents_status(engine):
    app: FastAPI = create_app(engine)

    @app.get("/boom/{kind}")
    def boom(kind: str) -> None:
        raise {"stale": StaleVersion("changed meanwhile"), "dataset": DatasetError("bad file"),
               "locked": SignInLocked("wait")}[kind]

    client = TestClient(app)
    assert [client.get(f"/boom/{kind}").status_code for kind in ("stale", "dataset", "locked")] == [409, 422, 403]
    assert client.get("/boom/stale").json() == {"error": "changed meanwhile"}
