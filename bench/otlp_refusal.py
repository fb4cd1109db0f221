"""What a request over the OTLP span cap costs before its 413 (issue 61, item 5).

    PYTHONPATH=. .venv/bin/python bench/otlp_refusal.py [--spans 24434] [--repeat 5]

Issue 61's body: about 2 MB of protobuf, `--spans` minimal spans of one attribute each (over the default cap of
TFGRPO_OTLP_MAX_SPANS=2,000), through the route's own core function on a fresh SQLite file: the time from the body to
the 413, for the studio's path (`ingest_request`: the spans counted on the wire first) beside stop 63's (every span
decoded, then the cap checked). In-process, one core, no HTTP: the work the API does per refused request.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def body_of(spans: int) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for i in range(spans):
        span = scope.spans.add(trace_id=secrets.token_bytes(16), span_id=secrets.token_bytes(8), name="c",
                               start_time_unix_nano=1, end_time_unix_nano=2)
        span.attributes.add(key="input.value").value.string_value = f"q{i}"
    return request.SerializeToString()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=24_434)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from core.domain.otlp_spans import PROTOBUF, decode_spans, parse_request
    from core.errors import BodyTooLarge
    from core.records.production.otlp import ingest_request, ingest_spans
    from storage.db import make_engine

    body = body_of(args.spans)
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{folder}/bench.db")
        paths = {"studio (counted first)": lambda: ingest_request(engine, body, PROTOBUF),
                 "stop 63 (decoded first)": lambda: ingest_spans(engine, decode_spans(parse_request(body, PROTOBUF)))}
        print(f"{len(body) / 1e6:.2f} MB of protobuf, {args.spans} spans, cap 2,000; median of {args.repeat}")
        for name, path in paths.items():
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                try:
                    path()
                except BodyTooLarge:
                    pass
                times.append(time.perf_counter() - started)
            print(f"{name:<26} {statistics.median(times) * 1000:>9.1f} ms to the 413")
        engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
