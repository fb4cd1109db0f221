"""Throughput of the embedded model: 1 request at a time vs N in parallel slots.

Goes through litellm `acompletion("local/<name>")`, the same path the engine uses, so the figures
include the provider glue and tell whether raising concurrency actually buys tokens per second.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
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
    """The totals of one parallelism setting over all its rounds."""

    parallel: int
    requests: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    latencies: list[float] | None = None

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def mean_latency_s(self) -> float:
        return statistics.mean(self.latencies) if self.latencies else 0.0


async def one_request(model: str, prompt: str, max_tokens: int, seed: int) -> tuple[int, float]:
    """One chat completion; returns (completion tokens, latency in seconds)."""
    import litellm

    started = time.perf_counter()
    response = await litellm.acompletion(
        model=f"local/{model}",
        messages=[{"role": "user", "content": prompt}],
        temperature=0.7,
        max_tokens=max_tokens,
        seed=seed,
    )
    latency = time.perf_counter() - started
    return int(response.usage.completion_tokens or 0), latency


async def run_setting(model: str, parallel: int, batch: int, rounds: int, max_tokens: int) -> Setting:
    """`rounds` rounds of `batch` requests each, issued `parallel` at a time (1 = strictly sequential)."""
    result = Setting(parallel=parallel, latencies=[])
    seed = 1000 * parallel
    for r in range(rounds):
        jobs = []
        for i in range(batch):
            seed += 1
            jobs.append((PROMPTS[(r * batch + i) % len(PROMPTS)], seed))
        started = time.perf_counter()
        if parallel == 1:
            outcomes = [await one_request(model, p, max_tokens, s) for p, s in jobs]
        else:
            outcomes = await asyncio.gather(*(one_request(model, p, max_tokens, s) for p, s in jobs))
        result.wall_s += time.perf_counter() - started
        result.requests += len(outcomes)
        result.tokens += sum(tokens for tokens, _ in outcomes)
        result.latencies.extend(latency for _, latency in outcomes)
    return result


async def measure(model: str, parallel: int, rounds: int, max_tokens: int) -> list[Setting]:
    """Warm up, then 1 vs `parallel`, in one event loop (litellm's logging worker is tied to it)."""
    await one_request(model, "Say hello.", 8, 1)
    return [await run_setting(model, p, parallel, rounds, max_tokens) for p in (1, parallel)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="qwen2.5-coder-0.5b or smollm2-135m")
    parser.add_argument("--parallel", type=int, default=4, help="parallel requests (and model slots)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    # The provider loads the server with get_settings().local_slots; make that N so both settings share it.
    os.environ["TFGRPO_LOCAL_SLOTS"] = str(args.parallel)
    from core.models import gateway  # noqa: F401  (importing the gateway registers local/...)
    from core.models.local_model import get_server
    from core.settings import get_settings

    print(
        f"cpu_count {os.cpu_count()}  n_threads {get_settings().threads}  slots {args.parallel}  "
        f"model {args.model}  max_tokens {args.max_tokens}  rounds {args.rounds}"
    )
    started = time.perf_counter()
    get_server(args.model, args.parallel)
    print(f"model loaded in {time.perf_counter() - started:.1f}s")
    settings = asyncio.run(measure(args.model, args.parallel, args.rounds, args.max_tokens))
    print()
    print(f"{'parallel':>8} {'requests':>8} {'tokens':>7} {'wall s':>8} {'tok/s':>7} {'mean lat s':>10}")
    for s in settings:
        print(
            f"{s.parallel:>8} {s.requests:>8} {s.tokens:>7} {s.wall_s:>8.1f} {s.tok_per_s:>7.1f} "
            f"{s.mean_latency_s:>10.2f}"
        )
    single, multi = settings
    speedup = multi.tok_per_s / single.tok_per_s if single.tok_per_s else 0.0
    print(f"\nspeedup {args.parallel} vs 1: {speedup:.1f}x")


if __name__ == "__main__":
    main()
