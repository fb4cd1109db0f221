"""How fast the HTTP API serves a library and takes traces, on a SQLite file, through a real uvicorn process.

    PYTHONPATH=. python bench/api_throughput.py [--seconds 5] [--threads 4]

Prints library fetches per second uncached (200 with the body) and revalidated (304 on an unchanged
ETag), the client package's in-process cache hits per second (no request at all), and traces stored per
second in batches of 100. The API process and this one share the machine, so the figures are a floor.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "client"))

from core.records.keys.api_keys import create_key  # noqa: E402
from core.records.library.versions import import_library, set_label  # noqa: E402
from core.records.tasks.demos import DEMO_TASK, ensure_demo_tasks  # noqa: E402
from storage.db import get_engine  # noqa: E402

LIBRARY = "\n".join(f"- Experience {i}: check the units and re-read the question before answering." for i in range(20))
PATH = f"/v1/tasks/{DEMO_TASK}/libraries/default"


def rate(call, seconds: float, threads: int) -> tuple[float, int]:
    """Calls per second of `call` over `seconds`, from `threads` threads; and how many calls were made."""
    deadline = time.perf_counter() + seconds

    def loop() -> int:
        count = 0
        while time.perf_counter() < deadline:
            call()
            count += 1
        return count

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(lambda _: loop(), range(threads)))
    return total / (time.perf_counter() - started), total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()

    from tests.api_support import api_server

    with tempfile.TemporaryDirectory() as tmp:
        engine = get_engine(f"sqlite:///{Path(tmp) / 'bench.db'}")
        ensure_demo_tasks(engine)
        version = import_library(engine, DEMO_TASK, LIBRARY, "bench.md", actor="system")
        set_label(engine, DEMO_TASK, str(version.number), "production", "system")
        read = create_key(engine, "bench-read", "read", "cli").secret
        ingest = create_key(engine, "bench-ingest", "ingest", "cli", any_task=True).secret
        with api_server(engine, extra_env={"TFGRPO_API_RATE_PER_MINUTE": "100000000"}) as base:
            headers = {"Authorization": f"Bearer {read}"}
            clients = [httpx.Client(base_url=base, headers=headers, timeout=30) for _ in range(args.threads)]
            etag = clients[0].get(PATH).headers["etag"]
            local = {}

            def client() -> httpx.Client:
                import threading

                return local.setdefault(threading.get_ident(), clients[len(local) % len(clients)])

            def fetch() -> None:
                assert client().get(PATH).status_code == 200

            def revalidate() -> None:
                assert client().get(PATH, headers={"If-None-Match": etag}).status_code == 304

            uncached, n1 = rate(fetch, args.seconds, args.threads)
            revalidated, n2 = rate(revalidate, args.seconds, args.threads)

            from tfgrpo_client import Client

            agent = Client(base_url=base, api_key=read, ttl_s=3600)
            agent.get_library(DEMO_TASK)
            cached, n3 = rate(lambda: agent.get_library(DEMO_TASK), min(args.seconds, 2.0), 1)

            counter = iter(range(10**9))
            ingest_client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ingest}"}, timeout=60)

            def post_batch() -> None:
                batch = [{"id": f"b{next(counter)}", "task": DEMO_TASK, "version_id": version.id,
                          "input": "How many apples are left?", "output": "4", "score": 0.5} for _ in range(100)]
                response = ingest_client.post("/v1/traces", json={"traces": batch})
                assert response.status_code == 200 and response.json()["stored"] == 100, response.text

            batches, n4 = rate(post_batch, args.seconds, 1)
    print(f"library fetch, uncached (200, {len(LIBRARY)} chars of library): {uncached:8.0f} /s  ({n1} calls, "
          f"{args.threads} threads)")
    print(f"library fetch, revalidated (304):                      {revalidated:8.0f} /s  ({n2} calls)")
    print(f"client get_library within its TTL (no request):        {cached:8.0f} /s  ({n3} calls)")
    print(f"traces stored (batches of 100, SQLite):                {batches * 100:8.0f} /s  ({n4} batches)")
    print(f"machine: {os.cpu_count()} cores; API and benchmark share them")


if __name__ == "__main__":
    main()
