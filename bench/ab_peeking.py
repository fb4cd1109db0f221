"""How often an A/B verdict read every day calls a difference: the studio's anytime-valid verdict beside the old rule.

    PYTHONPATH=. python bench/ab_peeking.py [--experiments 4000] [--base 0.5] [--scores binary|beta] [--seed 50]

Simulated experiments, each arm receiving `rate` new users a day (10, 40, 200), each with one scored trace (the verdict
counts users, each the mean of their traces; bench/ab_users.py simulates users with several), looked at once a day. A/A: both
arms score alike (mean `--base`); the share of experiments that ever declared a difference within 1, 7, 14 and 30
days must stay at or under 0.05. Power: the candidate's true mean is higher by 0.05 or 0.10; the share declared
within 30 days. Each figure is printed for the studio's verdict (core.domain.sequential, the very functions the
Production page and `core ab --status` call, here on numpy arrays of all experiments at once) and for the old rule,
a fixed-sample 95% Welch interval recomputed at every look. Scores are binary (thumbs, a judge's pass/fail) or, with
`--scores beta`, bounded in [0, 1] (Beta-distributed with the same mean, variance a fifth of binary's).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.domain.sequential import difference_bounds, excludes_zero, shrunk_variance  # noqa: E402

RATES = (10, 40, 200)
LOOKS = (1, 7, 14, 30)
EFFECTS = (0.05, 0.10)
Z95 = 1.959964


def daily_sums(rng: np.random.Generator, mean: float, rate: int, experiments: int, days: int,
               scores: str) -> tuple[np.ndarray, np.ndarray]:
    """Each experiment's running count-free sums (scores, squares) after each day, shape (experiments, days)."""
    if scores == "binary":
        total = rng.binomial(rate, mean, size=(experiments, days)).astype(float)
        return np.cumsum(total, axis=1), np.cumsum(total, axis=1)
    concentration = 4.0  # Beta(a, b) with a + b = 4: variance mean(1 - mean) / 5
    draws = rng.beta(mean * concentration, (1 - mean) * concentration, size=(experiments, days, rate))
    return np.cumsum(draws.sum(axis=2), axis=1), np.cumsum((draws * draws).sum(axis=2), axis=1)


def declared_days(rng: np.random.Generator, base: float, effect: float, rate: int, experiments: int, days: int,
                  scores: str) -> dict[str, np.ndarray]:
    """Per rule, whether each experiment had declared a difference by each day (cumulative), shape (experiments,
    days)."""
    a_sum, a_sq = daily_sums(rng, base, rate, experiments, days, scores)
    b_sum, b_sq = daily_sums(rng, base + effect, rate, experiments, days, scores)
    n = np.broadcast_to(rate * np.arange(1, days + 1, dtype=float), a_sum.shape)
    mean_a, mean_b = a_sum / n, b_sum / n
    _difference, low, high = difference_bounds(n, mean_a, shrunk_variance(n, a_sum, a_sq), n, mean_b,
                                               shrunk_variance(n, b_sum, b_sq))
    studio = excludes_zero(low, high)
    with np.errstate(divide="ignore", invalid="ignore"):  # the old rule: Welch at 95%, n >= 2 each, every look
        var_a = np.maximum(a_sq - a_sum ** 2 / n, 0.0) / (n - 1)
        var_b = np.maximum(b_sq - b_sum ** 2 / n, 0.0) / (n - 1)
        half = Z95 * np.sqrt(var_a / n + var_b / n)
    difference = mean_b - mean_a
    old = (n >= 2) & ((difference - half > 0) | (difference + half < 0))
    return {"studio": np.logical_or.accumulate(studio, axis=1), "old rule": np.logical_or.accumulate(old, axis=1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", type=int, default=4000, help="simulated experiments per cell")
    parser.add_argument("--base", type=float, default=0.5, help="production's mean score")
    parser.add_argument("--scores", choices=("binary", "beta"), default="binary")
    parser.add_argument("--seed", type=int, default=50)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    days = max(LOOKS)
    print(f"{args.experiments} experiments per cell, {args.scores} scores, production's mean {args.base}, "
          f"looked at daily; seed {args.seed}\n")
    print("A/A: share that ever declared a difference within N days (must be <= 0.05)")
    print(f"{'users/arm/day':>15}  {'rule':<9}" + "".join(f"{f'{d} d':>8}" for d in LOOKS))
    worst = 0.0
    for rate in RATES:
        ever = declared_days(rng, args.base, 0.0, rate, args.experiments, days, args.scores)
        for rule, declared in ever.items():
            shares = [declared[:, look - 1].mean() for look in LOOKS]
            if rule == "studio":
                worst = max(worst, *shares)
            print(f"{rate:>15}  {rule:<9}" + "".join(f"{share:>8.3f}" for share in shares))
    print(f"\nPower: share of A/B experiments declared within {days} days (candidate better by the effect)")
    print(f"{'users/arm/day':>15}  {'rule':<9}" + "".join(f"{f'+{e:.2f}':>8}" for e in EFFECTS))
    for rate in RATES:
        cells = {effect: declared_days(rng, args.base, effect, rate, args.experiments, days, args.scores)
                 for effect in EFFECTS}
        for rule in ("studio", "old rule"):
            print(f"{rate:>15}  {rule:<9}" + "".join(f"{cells[e][rule][:, -1].mean():>8.3f}" for e in EFFECTS))
    print(f"\nlargest A/A share of the studio's verdict: {worst:.3f}; {time.perf_counter() - started:.1f} s")
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    raise SystemExit(main())
