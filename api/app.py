"""Routes of the HTTP API, versioned under /v1; every error is JSON with a clear message.

`create_app(engine)` builds the app over a database engine (tests pass their own); the routes call core
and hold no logic of their own.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.errors import StudioError
from core.records.serving import served_library

STATUS = {"NotFound": 404, "InvalidInput": 422, "PermissionDenied": 403, "Conflict": 409}


def create_app(engine: Engine | Callable[[], Engine]) -> FastAPI:
    """The API over `engine` (or a function that gives it, so the process opens its database once)."""
    get_engine = engine if callable(engine) and not isinstance(engine, Engine) else (lambda: engine)
    app = FastAPI(title="Training-Free GRPO studio", version="1",
                  description="Fetch a library version by label for a live agent.")

    @app.exception_handler(StudioError)
    async def studio_error(_request: Request, exc: StudioError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=STATUS.get(type(exc).__name__, 400))

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part not in ("query", "path", "body"))
        return JSONResponse({"error": f"{where}: {first.get('msg', 'invalid request')}".strip(": ")},
                            status_code=422)

    @app.get("/v1/health")
    def health() -> dict:
        with Session(get_engine()) as session:
            session.connection().exec_driver_sql("SELECT 1")
        return {"status": "ok", "database": "reachable"}

    @app.get("/v1/tasks/{task}/libraries/{library}")
    def library(task: str, library: str, label: str | None = Query(None, description="default production"),
                version: int | None = Query(None, description="a version id instead of a label"),
                if_none_match: str | None = Header(None)) -> Response:
        with Session(get_engine()) as session:
            served = served_library(session, task, library, label=label, version_id=version)
        headers = {"ETag": served.etag, "Cache-Control": "no-cache"}
        if if_none_match and served.etag in [tag.strip() for tag in if_none_match.split(",")]:
            return Response(status_code=304, headers=headers)
        return JSONResponse(served.as_dict(), headers=headers)

    return app
