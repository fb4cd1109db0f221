"""The gateway's own cost per call (cache lookup, ledger write, semaphore) with a mocked model.

litellm's `mock_response` runs its real request path without a network, so the difference to raw
`litellm.acompletion` is what the engine adds on top of the provider: the figure to compare with
model latency when deciding whether the ledger matters.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODEL = "openai/gpt-4o-mini"  # never contacted: every call is mocked


def messages_for(i: int) -> list[dict]:
    """Distinct messages per index, so the first pass has no cache hits."""
    return [{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}]


async def gateway_pass(gateway, calls: int) -> tuple[float, int]:
    """All calls through the gateway at once (its semaphore bounds them); returns (wall s, cache hits)."""
    started = time.perf_counter()
    results = await asyncio.gather(
        *(
            gateway.complete(stage="rollout", model=MODEL, messages=messages_for(i), max_tokens=16)
            for i in range(calls)
        )
    )
    return time.perf_counter() - started, sum(r.cache_hit for r in results)


async def raw_pass(calls: int, concurrency: int) -> float:
    """The same calls straight into litellm with the same concurrency bound; returns wall s."""
    import litellm

    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with semaphore:
            await litellm.acompletion(
                model=MODEL, messages=messages_for(i), max_tokens=16, mock_response="ok"
            )

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(calls)))
    return time.perf_counter() - started


async def measure(db_url: str, calls: int, concurrency: int) -> tuple[float, float, float, int, int, int]:
    """Warm up, then the three passes in one event loop; returns timings, hit counts and ledger rows."""
    from sqlalchemy import func
    from sqlmodel import Session, select

    from core.models.gateway import Gateway
    from storage.db import make_engine
    from storage.tables import LLMCall

    engine = make_engine(db_url)
    gateway = Gateway(engine, concurrency=concurrency, mock=lambda stage, messages: "ok")
    await raw_pass(10, concurrency)  # imports and first-call setup out of the timings
    fresh_s, fresh_hits = await gateway_pass(gateway, calls)
    cached_s, cached_hits = await gateway_pass(gateway, calls)
    raw_s = await raw_pass(calls, concurrency)
    with Session(engine) as session:
        rows = session.exec(select(func.count()).select_from(LLMCall)).one()
    engine.dispose()
    return fresh_s, cached_s, raw_s, fresh_hits, cached_hits, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        fresh_s, cached_s, raw_s, fresh_hits, cached_hits, rows = asyncio.run(
            measure(url, args.calls, args.concurrency)
        )

    n = args.calls
    per = {
        name: seconds * 1000 / n
        for name, seconds in (("gateway", fresh_s), ("cached", cached_s), ("raw", raw_s))
    }
    print(f"{n} calls per pass, concurrency {args.concurrency}, SQLite file ledger, model mocked")
    print(
        f"gateway, uncached   {per['gateway']:7.2f} ms/call  ({fresh_s:.1f}s total, {fresh_hits} cache hits)"
    )
    print(
        f"gateway, cached     {per['cached']:7.2f} ms/call  ({cached_s:.1f}s total, {cached_hits} cache hits)"
    )
    print(f"raw litellm         {per['raw']:7.2f} ms/call  ({raw_s:.1f}s total)")
    print(f"gateway overhead over raw litellm: {per['gateway'] - per['raw']:.2f} ms/call")
    expected = 2 * n
    status = "ok" if rows == expected else f"MISMATCH, expected {expected}"
    print(f"ledger rows: {rows} ({status})")
    if rows != expected:
        sys.exit(1)


if __name__ == "__main__":
    main()
