"""Throughput of the embedded model: today's model server at 1, 2 and 4 requests in flight, against the
in-process path it replaced (llama.cpp on a thread, one request at a time), on the same requests.

Both paths are the ones the gateway takes: the server through `core.models.openai_http.chat` (the HTTP
client of every OpenAI-compatible server) at the address the model server records, the in-process path
through litellm's `local/` provider (TFGRPO_LOCAL_IN_PROCESS). Every setting sends the same prompts with
the same seeds, so the figures differ only by the path and the concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPTS: tuple[str, ...] = (
    "A baker makes 24 muffins and sells 3/4 of them. How many are left? Solve step by step.",
    "Tom has 15 marbles, gives 4 to Ana and buys 9 more. How many does he have? Solve step by step.",
    "A train travels 180 km in 3 hours. What is its average speed? Solve step by step.",
    "A shirt costs $40 and is 25% off. What is the sale price? Solve step by step.",
    "Sara reads 12 pages a day. How many days does a 156-page book take? Solve step by step.",
    "A rectangle is 7 cm by 12 cm. What are its area and perimeter? Solve step by step.",
    "Five friends share 3 pizzas of 8 slices equally. How many slices each? Solve step by step.",
    "A tank holds 500 L and drains 35 L per minute. When is it below 100 L? Solve step by step.",
)


@dataclass
class Setting:
    """The totals of one path at one concurrency."""

    path: str
    concurrency: int
    requests: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    latencies: list[float] = field(default_factory=list)

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def mean_latency_s(self) -> float:
        return statistics.mean(self.latencies) if self.latencies else 0.0


def requests_of(count: int, max_tokens: int) -> list[dict]:
    """The same `count` requests for every setting: the prompts in turn, one seed each."""
    return [{"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "temperature": 0.7,
             "max_tokens": max_tokens, "seed": 1000 + i} for i in range(count)]


async def via_server(base: str, model: str, body: dict) -> int:
    from core.models import openai_http

    reply = await openai_http.chat(base, {"model": model, **body}, timeout_s=600)
    return reply.tokens_out


async def in_process(model: str, body: dict) -> int:
    import litellm

    response = await litellm.acompletion(model=f"local/{model}", max_retries=0, **body)
    return int(response.usage.completion_tokens or 0)


async def measure(path: str, call, concurrency: int, bodies: list[dict]) -> Setting:
    result = Setting(path, concurrency)
    slots = asyncio.Semaphore(concurrency)

    async def one(body: dict) -> None:
        async with slots:
            started = time.perf_counter()
            tokens = await call(body)  # not `result.tokens += await ...`: that reads the total before awaiting
            result.tokens += tokens
            result.latencies.append(time.perf_counter() - started)
            result.requests += 1

    started = time.perf_counter()
    await asyncio.gather(*(one(body) for body in bodies))
    result.wall_s = time.perf_counter() - started
    return result


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="qwen2.5-coder-0.5b or smollm2-135m")
    parser.add_argument("--concurrency", default="1,2,4", help="requests in flight to the server, comma-separated")
    parser.add_argument("--requests", type=int, default=8, help="requests per setting (the same in each)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--skip-in-process", action="store_true", help="measure the server only")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    os.environ["TFGRPO_LOCAL_SLOTS"] = str(max(levels))
    from core.models import (
        gateway,  # noqa: F401  (registers litellm's local/ provider for the old path)
        model_server,
    )
    from core.models.local_model import get_server
    from core.settings import get_settings

    settings = get_settings()
    print(f"cpu_count {os.cpu_count()}  n_threads {settings.threads}  slots {max(levels)}  model {args.model}  "
          f"requests {args.requests}  max_tokens {args.max_tokens}  load {os.getloadavg()[0]:.2f}")
    bodies = requests_of(args.requests, args.max_tokens)
    results: list[Setting] = []

    model_server.stop(args.model)
    started = time.perf_counter()
    supervisor = model_server.start_detached(args.model)
    try:
        _wait(model_server, args.model)
        base = model_server.address(args.model, start=False)
        record = model_server.read_record(args.model)
        print(f"model server up in {time.perf_counter() - started:.1f}s at {base}")
        asyncio.run(via_server(base + "/v1", args.model, requests_of(1, 8)[0]))  # warm-up
        for level in levels:
            results.append(asyncio.run(measure("server", lambda b: via_server(base + "/v1", args.model, b), level,
                                               bodies)))
        print(f"model server resident memory: {resident_mb(record.server_pid):.0f} MB (server), "
              f"{resident_mb(record.supervisor_pid):.0f} MB (supervisor)")
    finally:
        model_server.stop(args.model)
        supervisor.wait(timeout=60)

    if not args.skip_in_process:
        started = time.perf_counter()
        get_server(args.model, max(levels))
        print(f"in-process model loaded in {time.perf_counter() - started:.1f}s; this process now holds "
              f"{resident_mb(os.getpid()):.0f} MB")
        asyncio.run(in_process(args.model, requests_of(1, 8)[0]))
        # the old path serialized every call (core/models/local_model.py), so its concurrency is 1 in effect
        results.append(asyncio.run(measure("in-process", lambda b: in_process(args.model, b), max(levels), bodies)))

    print()
    print(f"{'path':<11} {'in flight':>9} {'requests':>8} {'tokens':>7} {'wall s':>8} {'tok/s':>7} {'mean lat s':>10}")
    for s in results:
        print(f"{s.path:<11} {s.concurrency:>9} {s.requests:>8} {s.tokens:>7} {s.wall_s:>8.1f} {s.tok_per_s:>7.1f} "
              f"{s.mean_latency_s:>10.2f}")


def _wait(model_server, name: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = model_server.read_record(name)
        if record is not None and record.address:
            return
        time.sleep(0.2)
    raise SystemExit(f"no model server for {name} within {timeout_s:g} s")


if __name__ == "__main__":
    main()
