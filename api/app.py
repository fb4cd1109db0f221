"""Routes of the HTTP API, versioned under /v1; every error is JSON with a clear message.

`create_app(engine)` builds the app over a database engine (tests pass their own); the routes call core
and hold no logic of their own. Every route but health and readiness needs an API key (`Authorization: Bearer <key>`,
or `X-API-Key`): a read key fetches libraries, an ingest key also posts traces (core/records/keys/api_keys.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from fastapi import Depends, FastAPI, Header, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from sqlalchemy.engine import Engine
from sqlmodel import Session
from starlette.exceptions import HTTPException as StarletteHTTPException

import core.records.subscribers  # noqa: F401  (a label moved here is heard: core/records/subscribers.py)
from api.otlp import read_capped, register_otlp
from core.errors import BatchRefused, InvalidInput, OutsideTask, QuotaExceeded, StudioError
from core.records.keys.api_keys import KeyUse, audit_outside_task, check_key
from core.records.keys.limits import take_request
from core.records.production.serving import served_evaluation, served_library, served_selection
from core.records.production.traces import (
    MAX_BATCH,
    TraceUpdate,
    ingest_traces,
    parse_batch,
    trace_scores,
    update_trace,
)
from storage.db import schema_revisions, scrub_url, url_with_password

# Declared as security schemes (not plain headers) so the OpenAPI document and /docs offer Authorize for the keyed
# routes; neither refuses by itself (auto_error=False): check_key says what is missing, as JSON.
BEARER = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")
API_KEY_HEADER = APIKeyHeader(name="X-API-Key", auto_error=False, description="the API key, instead of Bearer")


class TooMany(StudioError):
    """A key over its rate; `retry_after` says when it may call again."""

    http_status = 429

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def error_body(exc: StudioError) -> dict:
    """Every error answer has this shape: {"error": one line}; a refused batch adds "problems", each
    {"position" counted from 1, "id" the sender's, "reason"}, and "stored": 0."""
    body: dict = {"error": str(exc)}
    if isinstance(exc, BatchRefused):
        body.update(problems=exc.problems, stored=0)
    return body


def database_problem(get_engine: Callable[[], Engine]) -> str | None:
    """Why the database does not answer `SELECT 1` (one line, its URL and password scrubbed), or None."""
    engine = None
    try:
        engine = get_engine()
        with Session(engine) as session:
            session.connection().exec_driver_sql("SELECT 1")
    except Exception as exc:  # noqa: BLE001  (any failure is the answer)
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return scrub_url(text, url_with_password(engine)) if engine is not None else text
    return None


def create_app(engine: Engine | Callable[[], Engine], *, max_body_bytes: int = 2_000_000,
               rate_per_minute: int = 600) -> FastAPI:
    """The API over `engine` (or a function that gives it, so the process opens its database once)."""
    get_engine = engine if callable(engine) and not isinstance(engine, Engine) else (lambda: engine)
    # FastAPIOffline serves the docs' scripts and styles from its package: /docs works with no network
    app = FastAPIOffline(title="Training-Free GRPO studio", version="1",
                  description="Serve the promoted experience library to live agents and take their traces back. "
                              "Send an API key as `Authorization: Bearer <key>` (People page, or "
                              "`python -m core apikey create`).")

    @app.exception_handler(StudioError)
    async def studio_error(request: Request, exc: StudioError) -> JSONResponse:
        if isinstance(exc, OutsideTask):  # a bound key asked for another task: the Audit page shows it
            audit_outside_task(get_engine(), exc, f"{request.method} {request.url.path}")
        headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else None
        if isinstance(exc, TooMany | QuotaExceeded):
            headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
        return JSONResponse(error_body(exc), status_code=exc.http_status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Starlette's own answers (no such route, a method the route does not take) in the one error shape."""
        path, allow = request.url.path[:200], {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow")
        message = {404: f"no route {path} (the routes are listed at /docs)",
                   405: f"{request.method} is not allowed on {path}; it takes {allow or 'other methods'}"
                   }.get(exc.status_code, str(exc.detail))
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part not in ("query", "path", "body"))
        return JSONResponse({"error": f"{where}: {first.get('msg', 'invalid request')}".strip(": ")},
                            status_code=422)

    def caller(role: str, doing: str) -> Callable[..., KeyUse]:
        def check(request: Request, bearer: HTTPAuthorizationCredentials | None = Security(BEARER),
                  x_api_key: str | None = Security(API_KEY_HEADER)) -> KeyUse:
            secret = x_api_key or (bearer.credentials.strip() if bearer else None)
            key = check_key(get_engine(), secret, role, doing, f"{request.method} {request.url.path}",
                            address=request.client.host if request.client else "unknown")
            wait = take_request(get_engine(), key.id, rate_per_minute)
            if wait is not None:
                raise TooMany(f"API key {key.name!r} is over its limit of {rate_per_minute} requests a minute; "
                              f"retry in {math.ceil(wait)} s", wait)
            return key
        return check

    @app.get("/v1/health")
    def health() -> JSONResponse:
        """Liveness for a load balancer or an orchestrator: 200 {"status": "ok", "database": "reachable"} while
        the database answers, else 503 with "database": "unreachable" and why (no URL, no password)."""
        problem = database_problem(get_engine)
        if problem is None:
            return JSONResponse({"status": "ok", "database": "reachable"})
        return JSONResponse({"status": "unavailable", "database": "unreachable", "error": problem}, status_code=503)

    @app.get("/v1/ready")
    def ready() -> JSONResponse:
        """Readiness: 200 when the database answers and its schema is at the code's newest revision (a process
        started before `python -m core migrate` ran is not ready), else 503 saying which."""
        problem = database_problem(get_engine)
        if problem is not None:
            return JSONResponse({"status": "not ready", "database": "unreachable", "error": problem}, status_code=503)
        have, want = schema_revisions(get_engine())
        body = {"status": "ready" if have == want else "not ready", "database": "reachable", "schema": have,
                "newest_schema": want}
        if have != want:
            body["error"] = f"the schema is at revision {have}, the code needs {want}: run `python -m core migrate`"
        return JSONResponse(body, status_code=200 if have == want else 503)

    @app.get("/v1/tasks/{task}/libraries/{library}")
    def library(task: str, library: str, label: str | None = Query(None, description="default production"),
                version: str | None = Query(None, description="a version's number in the library, as every page shows "
                                                      "it (#12 is version=12), or latest, instead of a label"),
                user: str | None = Query(None, description="a stable user id: picks the A/B arm, if any"),
                if_none_match: str | None = Header(None),
                key: KeyUse = Depends(caller("read", "fetching a library"))) -> Response:
        with Session(get_engine()) as session:
            served = served_library(session, task, library, label=label, version=version, user_id=user, key=key)
        headers = {"ETag": served.etag, "Cache-Control": "no-cache"}
        if if_none_match and served.etag in [tag.strip() for tag in if_none_match.split(",")]:
            return Response(status_code=304, headers=headers)
        return JSONResponse(served.as_dict(), headers=headers)

    @app.get("/v1/tasks/{task}/libraries/{library}/select")
    def select(task: str, library: str,
               query: str = Query(..., min_length=1, description="the query the agent is about to answer"),
               label: str | None = Query(None, description="default production"),
               version: str | None = Query(None, description="a version's number in the library, as every page shows "
                                                      "it (#12 is version=12), or latest, instead of a label"),
               user: str | None = Query(None, description="a stable user id: picks the A/B arm, if any"),
               if_none_match: str | None = Header(None),
               key: KeyUse = Depends(caller("read", "fetching a library"))) -> Response:
        """The entries the library's selection shows for `query` (all of them under `all`, the k most similar
        under `top_k`): the same choice the studio's training and evaluation rollouts of that query were shown."""
        with Session(get_engine()) as session:
            served = served_selection(session, task, library, query=query, label=label, version=version,
                                      user_id=user, key=key)
        headers = {"ETag": served.etag, "Cache-Control": "no-cache"}
        if if_none_match and served.etag in [tag.strip() for tag in if_none_match.split(",")]:
            return Response(status_code=304, headers=headers)
        return JSONResponse(served.as_dict(), headers=headers)

    @app.get("/v1/evaluations/{evaluation_id}")
    def evaluation(evaluation_id: int, key: KeyUse = Depends(caller("read", "reading an evaluation"))) -> dict:
        """An evaluation's status and figures (core.records.evaluation.figures.evaluation_report): Mean@k, Pass@k
        and their intervals are null where no rollout was answered or the evaluation is not finished; `answered`
        and `errors` say what the figures count."""
        return served_evaluation(get_engine(), evaluation_id, key)

    @app.post("/v1/traces", openapi_extra={"requestBody": {"content": {"application/json": {"schema": {
        "type": "object", "required": ["traces"],
        "properties": {"traces": {"type": "array", "maxItems": MAX_BATCH,
                                  "items": {"$ref": "#/components/schemas/TraceIn"}}}}}}}})
    async def traces(request: Request, key: KeyUse = Depends(caller("ingest", "posting traces"))) -> dict:
        body = await read_capped(request.stream(), request.headers.get("content-length"), max_body_bytes)
        try:
            payload = json.loads(body or b"null")
        except ValueError:
            raise InvalidInput("the body is not JSON; send {\"traces\": [...]}") from None
        return ingest_traces(get_engine(), parse_batch(payload), key).as_json()

    @app.patch("/v1/traces/{trace_id}")
    def update(trace_id: str, update: TraceUpdate,
               key: KeyUse = Depends(caller("ingest", "updating traces"))) -> dict:
        """Feedback that came after the trace: score, thumbs or comment, by the sender's id (idempotent)."""
        return {"id": trace_id, "changed": update_trace(get_engine(), trace_id, update, key)}

    @app.get("/v1/traces/{trace_id}")
    def trace_scores_route(trace_id: str, task: str = Query(min_length=1, max_length=200),
                           key: KeyUse = Depends(caller("ingest", "reading traces"))) -> dict:
        """A trace's score and whose it is (`score_by`: person, user or judge), by the sender's id; a key bound to
        a task reads only that task's traces."""
        return trace_scores(get_engine(), task, trace_id, key)

    register_otlp(app, get_engine, caller, max_body_bytes)
    _schema_with_trace(app)
    return app


ERROR_BODY = {"title": "Error", "type": "object", "required": ["error"],
              "properties": {"error": {"type": "string", "description": "what was wrong, in words"}}}


def _schema_with_trace(app: FastAPI) -> None:
    """The trace's JSON schema in /docs, since the route reads its body itself (to cap its size first); and the
    error body every 4xx answer has (`{"error": ...}`) in place of FastAPI's default 422 schema (`{"detail": [...]}`),
    which this API never sends."""
    from core.records.production.traces import TraceIn

    def openapi() -> dict:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            trace_schema = TraceIn.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(trace_schema.pop("$defs", {}))
            components["TraceIn"] = trace_schema
            components["HTTPValidationError"] = ERROR_BODY
            components.pop("ValidationError", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
