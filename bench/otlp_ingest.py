"""How fast `POST /otlp/v1/traces` stores GenAI spans, beside a bare FastAPI route that only parses the same bodies.

    PYTHONPATH=. python bench/otlp_ingest.py [--requests 200,40,8] [--postgres URL]

Both run as uvicorn processes on loopback (the real one is `python -m api`, with its key check and rate
limiter, over a fresh SQLite file, and over a fresh PostgreSQL database when --postgres names a server; the
bare one reads the body and parses it into opentelemetry-proto's ExportTraceServiceRequest, nothing else).
One client posts protobuf bodies of 1, 100 and 1,000 spans (each span a chat call by the current GenAI
conventions, ~700 bytes of messages, a fresh trace id, so every span is stored), one request at a time. It
prints spans per second, the ratio to the bare route, and each request's p50/p99 latency. Client and servers
share the machine's cores, so the figures are a floor.

    PYTHONPATH=. python bench/otlp_ingest.py --amplification [--repeat 3]

posts issue 51's request (about 351 KB of OTLP/JSON: 1,000 minimal spans under one resource carrying a
99,000-character attribute) to the route in-process over a fresh SQLite file, and prints the file's size
before and after (WAL checkpointed): what one such request costs the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue  # noqa: E402

from core.records.keys.api_keys import create_key  # noqa: E402
from core.records.library.versions import import_library, set_label  # noqa: E402
from core.records.tasks.demos import DEMO_TASK, ensure_demo_tasks  # noqa: E402
from storage.db import get_engine  # noqa: E402

BATCHES = (1, 100, 1000)
PROTOBUF = {"Content-Type": "application/x-protobuf"}
QUESTION = ("A shop sells apples in bags of 6. Tom buys 4 bags and gives 7 apples to his sister, then eats 2. "
            "How many apples does he have left? Explain each step before the final answer.")
REPLY = "4 bags of 6 is 24 apples. 24 - 7 = 17, and 17 - 2 = 15. So the answer is \\boxed{15}."


def attribute(key: str, value: object) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def body(spans: int) -> bytes:
    """One ExportTraceServiceRequest of `spans` chat spans, each in a trace of its own."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.extend([attribute("service.name", "bench-agent"),
                                               attribute("tfgrpo.task", DEMO_TASK),
                                               attribute("tfgrpo.label", "production")])
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name, scope_spans.scope.version = "bench.agent", "1.0"
    now = time.time_ns()
    messages_in = json.dumps([{"role": "user", "parts": [{"type": "text", "content": QUESTION}]}])
    messages_out = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": REPLY}],
                                "finish_reason": "stop"}])
    for i in range(spans):
        span = scope_spans.spans.add()
        span.trace_id, span.span_id = secrets.token_bytes(16), secrets.token_bytes(8)
        span.name, span.kind = "chat stub", 3
        span.start_time_unix_nano, span.end_time_unix_nano = now - 900_000_000, now - i
        span.attributes.extend([
            attribute("gen_ai.operation.name", "chat"), attribute("gen_ai.provider.name", "openai"),
            attribute("gen_ai.request.model", "stub"), attribute("gen_ai.usage.input_tokens", 42),
            attribute("gen_ai.usage.output_tokens", 30), attribute("gen_ai.input.messages", messages_in),
            attribute("gen_ai.output.messages", messages_out), attribute("gen_ai.conversation.id", f"c{i % 50}")])
    return request.SerializeToString()


def amplifying_body(spans: int = 1000, resource_chars: int = 99_000) -> bytes:
    """Issue 51's request: minimal model-call spans (OpenInference's input.value) under one resource that
    carries a 99,000-character attribute, as compact OTLP/JSON (tests/test_otlp_locks.py posts the same)."""
    def span(i: int) -> dict:
        return {"traceId": secrets.token_hex(16), "spanId": secrets.token_hex(8), "name": "c",
                "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000",
                "attributes": [{"key": "input.value", "value": {"stringValue": f"q{i}"}}]}
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "agent"}},
                                    {"key": "tfgrpo.task", "value": {"stringValue": DEMO_TASK}},
                                    {"key": "padding", "value": {"stringValue": "x" * resource_chars}}]},
        "scopeSpans": [{"scope": {"name": "s"}, "spans": [span(i) for i in range(spans)]}]}]},
        separators=(",", ":")).encode()


def file_bytes(engine) -> int:
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    path = Path(engine.url.database)
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def amplification(repeat: int) -> None:
    """The SQLite file's growth from `repeat` posts of the amplifying request."""
    from fastapi.testclient import TestClient

    from api.app import create_app

    with tempfile.TemporaryDirectory() as tmp:
        engine, key = prepared(f"sqlite:///{Path(tmp) / 'bench.db'}")
        client = TestClient(create_app(engine), headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        before = file_bytes(engine)
        print(f"database before: {before:,} bytes")
        for n in range(repeat):
            payload = amplifying_body()
            started = time.perf_counter()
            response = client.post("/otlp/v1/traces", content=payload)
            took = time.perf_counter() - started
            print(f"request {n + 1}: {len(payload):,} bytes -> {response.status_code} in {took:.2f} s; database "
                  f"{file_bytes(engine):,} bytes (+{file_bytes(engine) - before:,})")
        engine.dispose()


def bare_app():
    """A FastAPI route that only parses: the floor the real route's storing is measured against."""
    app = FastAPI()

    @app.post("/otlp/v1/traces")
    async def traces(request: Request) -> Response:
        parsed = ExportTraceServiceRequest()
        parsed.ParseFromString(await request.body())
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type=PROTOBUF["Content-Type"])

    return app


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def bare_server():
    port = free_port()
    server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--bare-port", str(port)], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/docs", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and server.poll() is None, "the bare server did not start"
                time.sleep(0.1)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


def measure(base: str, headers: dict, spans: int, requests: int) -> dict:
    """spans/s over `requests` posts of `spans` spans, one at a time, and the p50/p99 latency of a post."""
    bodies = [body(spans) for _ in range(requests + 2)]
    latencies = []
    with httpx.Client(base_url=base, headers={**headers, **PROTOBUF}, timeout=120) as client:
        for warm in bodies[:2]:
            assert client.post("/otlp/v1/traces", content=warm).status_code == 200
        started = time.perf_counter()
        for payload in bodies[2:]:
            sent = time.perf_counter()
            response = client.post("/otlp/v1/traces", content=payload)
            latencies.append(time.perf_counter() - sent)
            assert response.status_code == 200, response.text
            answer = ExportTraceServiceResponse()
            answer.ParseFromString(response.content)
            assert not answer.HasField("partial_success"), answer
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {"spans/s": spans * requests / elapsed, "p50 ms": 1000 * statistics.median(latencies),
            "p99 ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]}


def prepared(url: str) -> tuple[object, str]:
    engine = get_engine(url)
    ensure_demo_tasks(engine)
    version = import_library(engine, DEMO_TASK, "- Re-read the question.\n- Check the units.", "bench.md",
                             actor="system")
    set_label(engine, DEMO_TASK, str(version.number), "production", "system")
    return engine, create_key(engine, "bench-otel", "ingest", "cli", any_task=True).secret


@contextmanager
def postgres_database(server_url: str):
    """A fresh database on the server `server_url` names, dropped afterwards."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(server_url)
    name = f"otlp_bench_{os.getpid()}"
    plain = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(plain, autocommit=True) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def run(database: str, url: str, counts: dict[int, int], bare: dict[int, dict]) -> list[dict]:
    from tests.api_support import api_server

    engine, key = prepared(url)
    rows = []
    env = {"TFGRPO_API_RATE_PER_MINUTE": "100000000", "TFGRPO_API_MAX_BODY_BYTES": "50000000"}
    with api_server(engine, extra_env=env, command=("api",)) as base:
        for spans in BATCHES:
            real = measure(base, {"Authorization": f"Bearer {key}"}, spans, counts[spans])
            rows.append({"database": database, "batch": spans, **real,
                         "ratio": real["spans/s"] / bare[spans]["spans/s"]})
    engine.dispose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="200,40,8", help="posts per batch size of 1, 100 and 1,000 spans")
    parser.add_argument("--postgres", default=os.environ.get("TFGRPO_TEST_DATABASE_URL"),
                        help="a PostgreSQL server URL (default $TFGRPO_TEST_DATABASE_URL); none: SQLite only")
    parser.add_argument("--bare-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--amplification", action="store_true", help="the database's growth from issue 51's "
                        "351 KB request, instead of the throughput")
    parser.add_argument("--repeat", type=int, default=1, help="with --amplification: posts of the request")
    args = parser.parse_args()
    if args.amplification:
        amplification(args.repeat)
        return
    if args.bare_port:
        import uvicorn

        uvicorn.run(bare_app(), host="127.0.0.1", port=args.bare_port, log_level="warning")
        return
    counts = dict(zip(BATCHES, (int(n) for n in args.requests.split(",")), strict=True))
    with bare_server() as base:
        bare = {spans: measure(base, {}, spans, counts[spans]) for spans in BATCHES}
    rows = [{"database": "(bare parse)", "batch": spans, **bare[spans], "ratio": 1.0} for spans in BATCHES]
    with tempfile.TemporaryDirectory() as tmp:
        rows += run("SQLite", f"sqlite:///{Path(tmp) / 'bench.db'}", counts, bare)
    if args.postgres:
        with postgres_database(args.postgres) as url:
            rows += run("PostgreSQL", url, counts, bare)
    print(f"{'route / database':<18}{'batch':>6}{'spans/s':>10}{'of bare':>9}{'p50 ms':>9}{'p99 ms':>9}")
    for row in rows:
        print(f"{row['database']:<18}{row['batch']:>6}{row['spans/s']:>10.0f}{row['ratio']:>8.1%} "
              f"{row['p50 ms']:>8.1f}{row['p99 ms']:>9.1f}")
    print(f"machine: {os.cpu_count()} cores; client and servers share them; requests per size: {args.requests}")


if __name__ == "__main__":
    main()
