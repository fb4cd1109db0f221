"""Record what openlit itself exports for one OpenAI chat call, as the request body its OTLP/HTTP exporter posts.

openlit pins OpenTelemetry versions that conflict with the studio's, so this runs in a venv of its own
(tests/data/openlit/README.md says how); the studio's tests post the saved body to its OTLP route. The call
goes to bench/stub_server.py (an OpenAI-compatible stub started by the caller, its URL given), the export to a
receiver here on loopback that answers 200 and keeps each body; the trace exports (openlit posts one per span,
and its events as logs) are saved as one ExportTraceServiceRequest (protobuf messages of one type concatenate
into their merge). Every network call has a timeout.

    python record.py --stub http://127.0.0.1:PORT/v1 --out openlit-<version>.pb
"""

from __future__ import annotations

import argparse
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BODIES: list[tuple[str, bytes]] = []  # (path, body) of every export received


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        length = int(self.headers.get("Content-Length") or 0)
        BODIES.append((self.path, self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stub", required=True, help="the stub's OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    import openlit
    from openai import OpenAI
    from opentelemetry import trace

    prices = Path(tempfile.mkdtemp()) / "prices.json"
    prices.write_text("{}")  # openlit fetches a price list from GitHub unless given one
    openlit.init(otlp_endpoint=f"http://127.0.0.1:{server.server_address[1]}", application_name="openlit-agent",
                 environment="test", capture_message_content=True, disable_metrics=True, disable_batch=True,
                 pricing_json=str(prices))
    client = OpenAI(base_url=args.stub, api_key="stub-key", timeout=10, max_retries=0)
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=[
        {"role": "system", "content": "Answer with the number only."},
        {"role": "user", "content": "What is 2 + 2?"}])
    print("reply:", reply.choices[0].message.content)
    trace.get_tracer_provider().force_flush(10_000)
    server.shutdown()
    print(f"received {len(BODIES)} export(s): {[path for path, _ in BODIES]}")
    traces = b"".join(body for path, body in BODIES if path.endswith("/v1/traces"))
    Path(args.out).write_bytes(traces)  # protobuf messages of one type concatenate into one: every span, one body
    print(f"saved {len(traces)} bytes of trace exports to {args.out}")


if __name__ == "__main__":
    main()
