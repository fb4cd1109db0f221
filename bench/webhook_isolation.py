"""How long a healthy webhook receiver waits for its events while another receiver hangs (issue 51, item 8).

A worker's delivery loop (core.jobs.worker.delivering, every 2 s, its small thread pool) sends to two loopback
receivers: one hangs past the timeout at every request, one answers at once. Events are raised every 0.5 s; the
script prints, for the healthy receiver, the time from an event's raising to its arrival (min, median, max).
With deliveries endpoint after endpoint, each pass waited the hanging receiver's timeout first.

    PYTHONPATH=. .venv/bin/python bench/webhook_isolation.py [--events 12] [--timeout 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def receiver(hang_s: float, arrivals: dict[str, float]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802  (http.server's name)
            self.rfile.read(int(self.headers.get("content-length", 0)))
            arrivals.setdefault(self.headers["webhook-id"], time.monotonic())
            if hang_s:
                time.sleep(hang_s)
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=5.0, help="TFGRPO_WEBHOOK_TIMEOUT_S")
    args = parser.parse_args()
    folder = tempfile.mkdtemp()
    os.environ.update({"TFGRPO_WEBHOOK_ALLOWLIST": "127.0.0.1", "TFGRPO_WEBHOOK_TIMEOUT_S": str(args.timeout),
                       "TFGRPO_SECRET_KEY_FILE": f"{folder}/studio.key", "TFGRPO_WEBHOOK_RETRY_SCHEDULE_S": "[1]"})
    from core.jobs.worker import delivering
    from core.records.notifications import webhooks
    from storage.db import make_engine, session_scope

    engine = make_engine(f"sqlite:///{folder}/bench.db")
    hung, healthy = {}, {}
    slow, fast = receiver(args.timeout * 3, hung), receiver(0, healthy)
    webhooks.add_endpoint(engine, "hanging", f"http://127.0.0.1:{slow.server_address[1]}/h", "cli")
    webhooks.add_endpoint(engine, "healthy", f"http://127.0.0.1:{fast.server_address[1]}/h", "cli")
    raised: dict[str, float] = {}
    with delivering(engine, "bench"):
        for i in range(args.events):
            with session_scope(engine) as session:
                webhooks.raise_event(session, "run.failed", f"event {i}", {"i": i}, message_id=f"msg_bench_{i}")
            raised[f"msg_bench_{i}"] = time.monotonic()
            time.sleep(0.5)
        deadline = time.monotonic() + 60
        while len(healthy) < args.events and time.monotonic() < deadline:
            time.sleep(0.1)
    waits = sorted(healthy[key] - raised[key] for key in healthy)
    print(f"healthy receiver: {len(waits)}/{args.events} events, raised to arrival min {waits[0]:.2f} s, median "
          f"{statistics.median(waits):.2f} s, max {waits[-1]:.2f} s (the other receiver hangs {args.timeout * 3:g} s, "
          f"timeout {args.timeout:g} s, delivery loop every 2 s)")


if __name__ == "__main__":
    main()
