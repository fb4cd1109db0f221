"""Scores of an evaluation: Mean@k and Pass@k with 95% confidence intervals."""

from __future__ import annotations

import math
from collections.abc import Iterable
from statistics import mean, stdev
from typing import Protocol

SUCCESS = 0.5  # a rollout counts as a success at reward >= 0.5 (binary rewards: correct)
Z95 = 1.959964


class Scored(Protocol):
    error: str | None
    reward: float | None
    reward_source: str | None


def is_answered(rollout: Scored) -> bool:
    """A rollout with a reward to count (storage.queries.answered is the same test in SQL): one whose model
    call failed, or whose reward could not be given (source `error`), is not a wrong answer."""
    return rollout.error is None and rollout.reward is not None and rollout.reward_source != "error"


def attempts_failed(rollouts: Iterable[Scored], of: str = "") -> str:
    """How a group went, as an example made from its reference says it: "every attempt failed", or "1 of 5
    attempts failed" where some were right (a run without learner replies makes that group's example from the
    reference too, on a task whose reward reads stated facts); `of` names the group (" of group 3")."""
    answered = [r for r in rollouts if is_answered(r)]
    failed = sum(1 for r in answered if r.reward < SUCCESS)
    return f"every attempt{of} failed" if failed == len(answered) else f"{failed} of {len(answered)} attempts{of} failed"


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Interval for a proportion that behaves at 0 and 1 and on small n."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def mean_interval(values: list[float], z: float = Z95) -> tuple[float, float]:
    """Normal-approximation interval of a mean over queries, clipped to [0, 1]."""
    if not values:
        return (0.0, 0.0)
    if len(values) == 1:
        return (values[0], values[0])
    half = z * stdev(values) / math.sqrt(len(values))
    m = mean(values)
    return (max(0.0, m - half), min(1.0, m + half))


def mean_interval_of_sums(n: int, total: float, squares: float, z: float = Z95) -> tuple[float, float]:
    """mean_interval from a count, a sum and a sum of squares (what a database aggregates), not the values."""
    if n == 0:
        return (0.0, 0.0)
    m = total / n
    if n == 1:
        return (m, m)
    variance = max(0.0, (squares - total * total / n) / (n - 1))
    half = z * math.sqrt(variance) / math.sqrt(n)
    return (max(0.0, m - half), min(1.0, m + half))


def score_groups(rewards_by_query: dict[int, list[float]]) -> dict:
    """Mean@k (average reward over all k samples, averaged over queries) and Pass@k (share of
    queries with at least one success), each with its interval, plus per-query figures. With no query
    answered there is no figure: Mean@k, Pass@k and their intervals are None, never a 0 nobody scored."""
    per_query = {q: {"mean": mean(r) if r else 0.0, "pass": any(x >= SUCCESS for x in r), "n": len(r)}
                 for q, r in rewards_by_query.items()}
    means = [v["mean"] for v in per_query.values()]
    passes = sum(1 for v in per_query.values() if v["pass"])
    n = len(per_query)
    return {
        "n": n,
        "mean_at_k": mean(means) if n else None,
        "mean_at_k_ci": list(mean_interval(means)) if n else None,
        "pass_at_k": passes / n if n else None,
        "pass_at_k_ci": list(wilson_interval(passes, n)) if n else None,
        "per_query": {str(q): v for q, v in per_query.items()},
    }
