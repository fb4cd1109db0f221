"""Resident memory of the embedded model's server as distinct prompts pile up, per prompt-cache limit.

llama.cpp's server keeps the state of earlier prompts in host memory to reuse them, up to `cache_ram_mib`
(its default: 8192). In the learning benchmark the server grew from 0.9 to 2.0 GB. This starts a server per
limit (TFGRPO_LOCAL_CACHE_MIB), sends it the same `--prompts` distinct prompts of about `--words` words each
(one output token apiece), and prints its resident memory after every `--every` prompts:

    PYTHONPATH=. .venv/bin/python bench/server_cache_memory.py [--model smollm2-135m] [--limits 8192,512]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def prompt(n: int, words: int) -> list[dict]:
    """A prompt no other one shares beyond its first word, so no cached state can be reused for it."""
    body = " ".join(f"w{n}x{i}" for i in range(words))
    return [{"role": "user", "content": f"{n} {body}"}]


async def measure(model: str, limit: int, prompts: int, words: int, every: int) -> list[tuple[int, float]]:
    from bench.local_throughput import resident_mb
    from core.models import model_server, openai_http
    from core.settings import get_settings

    os.environ["TFGRPO_LOCAL_CACHE_MIB"] = str(limit)
    get_settings.cache_clear()
    model_server.stop(model)
    model_server.start_detached(model)
    where = model_server.address(model) + "/v1"
    pid = model_server.read_record(model).server_pid
    points = [(0, resident_mb(pid))]
    try:
        for n in range(1, prompts + 1):
            await openai_http.chat(where, {"model": model, "messages": prompt(n, words), "max_tokens": 1,
                                           "temperature": 0}, 600)
            if n % every == 0:
                points.append((n, resident_mb(pid)))
    finally:
        model_server.stop(model)
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--limits", default="8192,512", help="TFGRPO_LOCAL_CACHE_MIB values, comma-separated")
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--words", type=int, default=600)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    print(f"model {args.model}  {args.prompts} prompts of about {args.words} words  load {os.getloadavg()[0]:.2f}")
    for limit in (int(x) for x in args.limits.split(",")):
        points = asyncio.run(measure(args.model, limit, args.prompts, args.words, args.every))
        print(f"cache {limit:>5} MiB: " + "  ".join(f"{n}: {mb:.0f} MB" for n, mb in points))


if __name__ == "__main__":
    main()
