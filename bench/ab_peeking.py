"""How often an A/B verdict read after every user calls a difference between identical versions, over every split
the studio accepts and every base rate: the studio's anytime-valid verdict beside the rule of stop 63.

    PYTHONPATH=. python bench/ab_peeking.py [--experiments 1500] [--per-day 80] [--days 30] [--scores binary|beta]
                                            [--seed 60]

Each simulated experiment receives `--per-day` users a day for `--days` days; each user lands in the candidate's arm
with the split's share, sends one scored trace (the verdict counts users, each the mean of their traces;
bench/ab_users.py simulates users with several) and the verdict is read after every user, as the worker's guard
reads it every 30 s. A/A: both arms score alike (mean `base`); the share of experiments ever declared different must
stay at or under 0.05 in every cell of the grid: candidate shares 0.05-0.95 (the studio accepts 0.05 to 0.95) and base
rates 0.05-0.97. Power: the candidate's true mean higher by 0.05 or 0.10 at base rates 0.5 and 0.85; the share
declared within the days. Each figure is printed for the studio's verdict (core.domain.sequential.running_bounds, the
very function the Production page, `core ab --status` and the guard call, here on numpy arrays of all experiments at
once) and for stop 63's rule (the same boundary with each arm's own shrunk variance, no pooled floor). Scores are
binary (thumbs, a judge's pass/fail) or, with `--scores beta`, bounded in [0, 1] (Beta-distributed with the same
mean, variance a fifth of binary's). The exit status is 1 if any A/A cell of the studio's verdict is above 0.05.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.domain.sequential import (  # noqa: E402
    ALPHA,
    difference_bounds,
    excludes_zero,
    running_bounds,
    shrunk_variance,
)

SHARES = (0.05, 0.1, 0.25, 0.5, 0.75, 0.95)
BASES = (0.05, 0.3, 0.6, 0.9, 0.97)
POWER_BASES = (0.5, 0.85)
EFFECTS = (0.05, 0.10)


def arrivals(rng: np.random.Generator, share: float, base: float, effect: float, experiments: int, users: int,
             scores: str) -> tuple[np.ndarray, np.ndarray]:
    """Each experiment's users in arrival order: in the candidate's arm or not, and their score; (experiments, users)."""
    candidate = rng.random((experiments, users)) < share
    mean = np.where(candidate, base + effect, base)
    if scores == "binary":
        return candidate, (rng.random((experiments, users)) < mean).astype(float)
    concentration = 4.0  # Beta(a, b) with a + b = 4: variance mean(1 - mean) / 5
    return candidate, rng.beta(mean * concentration, (1 - mean) * concentration)


def stop_63_rule(candidate: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Whether stop 63's verdict (each arm's own shrunk variance, no floor) excluded zero after each user."""
    production = ~candidate
    n_a, n_b = np.cumsum(production, axis=1, dtype=float), np.cumsum(candidate, axis=1, dtype=float)
    s_a, s_b = np.cumsum(values * production, axis=1), np.cumsum(values * candidate, axis=1)
    q_a, q_b = np.cumsum(values ** 2 * production, axis=1), np.cumsum(values ** 2 * candidate, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        _d, low, high = difference_bounds(n_a, s_a / n_a, shrunk_variance(n_a, s_a, q_a), n_b, s_b / n_b,
                                          shrunk_variance(n_b, s_b, q_b))
    return excludes_zero(low, high)


def ever_declared(rng: np.random.Generator, share: float, base: float, effect: float, experiments: int, users: int,
                  scores: str) -> dict[str, float]:
    """Per rule, the share of experiments whose verdict excluded zero at some user."""
    candidate, values = arrivals(rng, share, base, effect, experiments, users, scores)
    _difference, low, high = running_bounds(candidate, values)
    return {"studio": float(excludes_zero(low, high).any(axis=1).mean()),
            "stop 63": float(stop_63_rule(candidate, values).any(axis=1).mean())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", type=int, default=1500, help="simulated experiments per cell")
    parser.add_argument("--per-day", type=int, default=80, help="new users a day, both arms together")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--scores", choices=("binary", "beta"), default="binary")
    parser.add_argument("--seed", type=int, default=60)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    users = args.per_day * args.days
    print(f"{args.experiments} experiments per cell, {args.scores} scores, {args.per_day} users a day for {args.days} "
          f"days ({users} users), the verdict read after every user; seed {args.seed}\n")
    print(f"A/A: share ever declared different (must be <= {ALPHA}); rows: candidate share; columns: base rate")
    print(f"{'share':>6}  {'rule':<8}" + "".join(f"{base:>8}" for base in BASES))
    worst = (0.0, None)
    for share in SHARES:
        cells = {base: ever_declared(rng, share, base, 0.0, args.experiments, users, args.scores) for base in BASES}
        for rule in ("studio", "stop 63"):
            print(f"{share:>6}  {rule:<8}" + "".join(f"{cells[base][rule]:>8.3f}" for base in BASES))
            if rule == "studio":
                worst = max(worst, *((cells[base][rule], (share, base)) for base in BASES),
                            key=lambda cell: cell[0])
    print(f"\nPower: share of A/B experiments declared within {args.days} days (candidate better by the effect)")
    print(f"{'share':>6}  {'rule':<8}" + "".join(f"{f'{base}+{effect:.2f}':>11}" for base in POWER_BASES
                                               for effect in EFFECTS))
    for share in SHARES:
        cells = {(base, effect): ever_declared(rng, share, base, effect, args.experiments, users, args.scores)
                 for base in POWER_BASES for effect in EFFECTS}
        for rule in ("studio", "stop 63"):
            print(f"{share:>6}  {rule:<8}" + "".join(f"{cells[cell][rule]:>11.3f}" for cell in cells))
    print(f"\nlargest A/A share of the studio's verdict: {worst[0]:.3f} (share {worst[1][0]}, base rate {worst[1][1]}); "
          f"{time.perf_counter() - started:.0f} s")
    return 0 if worst[0] <= ALPHA else 1


if __name__ == "__main__":
    raise SystemExit(main())
