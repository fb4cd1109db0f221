"""`POST /otlp/v1/traces`: OpenTelemetry's OTLP/HTTP traces receiver, so an instrumented agent's exporter sends
its spans here with `OTEL_EXPORTER_OTLP_ENDPOINT=http://host:8502/otlp` (the exporters add /v1/traces; the studio's
own JSON route already holds /v1/traces).

Protobuf or OTLP/JSON, plain or gzip, parsed by opentelemetry-proto's ExportTraceServiceRequest (core/domain/
otlp_spans.py); the answer is an ExportTraceServiceResponse in the request's encoding, with `partial_success`
naming the spans refused. The body's size is checked before it is read (Content-Length), while it is read, and
while it is inflated: a gzip bomb stops at the cap with bounded memory (`read_capped` is the JSON route's too: one
cap, one 413). The API key and the rate limit are the JSON route's (`caller`); what a request and a key may store
is bounded in core/records/production/otlp.py.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool

from core.domain.otlp_spans import JSON, PROTOBUF, media_type
from core.errors import BodyTooLarge, MalformedBody, OutsideTask, UnsupportedMedia
from core.records.keys.api_keys import KeyUse, audit_outside_task
from core.records.production.ingest import Ingested
from core.records.production.otlp import ingest_request

INFLATE_CHUNK = 64 * 1024  # the most one inflate step may produce, so memory stays near the cap


async def read_capped(stream: AsyncIterator[bytes], declared: str | None, cap: int) -> bytes:
    """The body, refused with 413 as soon as it is known to pass `cap`: by its Content-Length before reading,
    else while reading."""
    if declared and declared.isascii() and declared.isdigit() and int(declared) > cap:
        raise BodyTooLarge(f"the request is {int(declared)} bytes; the API reads at most {cap}")
    body = bytearray()
    async for chunk in stream:
        body.extend(chunk)
        if len(body) > cap:
            raise BodyTooLarge(f"the request is over {cap} bytes, the most the API reads")
    return bytes(body)


def inflate(body: bytes, encoding: str | None, cap: int) -> bytes:
    """The body decoded by its Content-Encoding (gzip or none), stopped with 413 the moment the inflated bytes
    pass `cap`: each step inflates at most INFLATE_CHUNK bytes, so a bomb never grows past the cap."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding != "gzip":
        raise UnsupportedMedia(f"Content-Encoding {encoding!r} is not read here; send gzip or none")
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out = bytearray()
    pending = body
    try:
        while pending or not inflater.eof:
            piece = inflater.decompress(pending, INFLATE_CHUNK)
            out.extend(piece)
            if len(out) > cap:
                raise BodyTooLarge(f"the gzip body inflates past {cap} bytes, the most the API reads; "
                                   "inflating stopped there")
            pending = inflater.unconsumed_tail
            if not piece and not pending:
                break
    except zlib.error as exc:
        raise MalformedBody(f"the body is not valid gzip ({exc})") from None
    if not inflater.eof:
        raise MalformedBody("the body is not valid gzip: it ends before its stream does")
    return bytes(out)


def export_response(result: Ingested | None, kind: str) -> Response:
    """ExportTraceServiceResponse in the request's encoding; partial_success when a span was refused, or as a
    warning (rejected 0) when some spans held no model call or were held (core/records/production/otlp_held.py)."""
    answer = ExportTraceServiceResponse()
    if result is not None and (result.refused or result.other or result.held):
        answer.partial_success.rejected_spans = len(result.refused)
        answer.partial_success.error_message = result.message()
    if kind == PROTOBUF:
        return Response(answer.SerializeToString(), media_type=PROTOBUF)
    return Response(json_format.MessageToJson(answer, indent=None), media_type=JSON)


def register_otlp(app: FastAPI, get_engine: Callable[[], Engine], caller: Callable[..., Callable[..., KeyUse]],
                  max_body_bytes: int) -> None:
    """Add the OTLP traces route to the app, keyed and rate-limited by `caller` as the JSON route is."""

    @app.post("/otlp/v1/traces", tags=["OpenTelemetry"], openapi_extra={"requestBody": {"content": {
        PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
        JSON: {"schema": {"type": "object", "description": "OTLP/JSON ExportTraceServiceRequest"}}}}})
    async def otlp_traces(request: Request, key: KeyUse = Depends(caller("ingest", "posting traces"))) -> Response:
        """OTLP/HTTP traces (protobuf or JSON, gzip or not): GenAI spans become production traces
        (docs/traces-otlp.md); the answer's partial_success names every span refused and why."""
        kind = media_type(request.headers.get("content-type"))
        body = await read_capped(request.stream(), request.headers.get("content-length"), max_body_bytes)
        body = inflate(body, request.headers.get("content-encoding"), max_body_bytes)

        def take() -> Ingested:
            return ingest_request(get_engine(), body, kind, key)

        result = await run_in_threadpool(take)
        if isinstance(result.outside_task, OutsideTask):  # spans refused for naming another task: audited as one
            audit_outside_task(get_engine(), result.outside_task, f"{request.method} {request.url.path}")
        return export_response(result, kind)
