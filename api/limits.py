"""The API's limits: a per-key request rate (429) and a request-size cap (413), in this process's memory.

The rate is a token bucket per key: `per_minute` requests, refilled evenly, so a short burst up to the
whole minute's allowance passes and a steady flood is held to the rate. Several API processes would
each count on their own; one process serves a studio.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RateLimiter:
    per_minute: int
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[int, tuple[float, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, key_id: int) -> float | None:
        """Spend one request of `key_id`'s allowance: None when allowed, else the seconds until one is free."""
        now = self.clock()
        rate = self.per_minute / 60.0
        with self._lock:
            tokens, last = self._buckets.get(key_id, (float(self.per_minute), now))
            tokens = min(float(self.per_minute), tokens + (now - last) * rate)
            if tokens < 1.0:
                self._buckets[key_id] = (tokens, now)
                return (1.0 - tokens) / rate
            self._buckets[key_id] = (tokens - 1.0, now)
            return None
