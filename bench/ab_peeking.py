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
once) and for stop 63's rule (the same boundary with each arm's own shrunk variance, no pooled floor); with
`--bernstein` also for each arm's predictable plug-in empirical-Bernstein confidence sequence at alpha/2 (valid without
asymptotics; Waudby-Smith and Ramdas, JRSS-B 2024), the construction the studio's was chosen over. Scores are
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


def empirical_bernstein(x: np.ndarray, alpha: float, tuned_at: float = 500.0) -> tuple[np.ndarray, np.ndarray]:
    """The running (low, high) of the mean of values in [0, 1] along axis 1: the predictable plug-in
    empirical-Bernstein confidence sequence of Waudby-Smith and Ramdas (JRSS-B 2024, Theorem 2), valid without
    asymptotics, its bets tuned no tighter than at `tuned_at` units; intersected over time."""
    count = x.shape[1]
    i = np.arange(1, count + 1, dtype=float)
    log_term = np.log(2 / alpha)
    mean = (0.5 + np.cumsum(x, axis=1)) / (i + 1)
    previous_mean = np.concatenate([np.full((x.shape[0], 1), 0.5), mean[:, :-1]], axis=1)
    variance = (0.25 + np.cumsum((x - mean) ** 2, axis=1)) / (i + 1)
    previous_variance = np.concatenate([np.full((x.shape[0], 1), 0.25), variance[:, :-1]], axis=1)
    at = np.maximum(i, tuned_at)
    bet = np.minimum(np.sqrt(2 * log_term / (previous_variance * at * np.log(1 + at) / np.log(1 + tuned_at))), 0.5)
    spent = (x - previous_mean) ** 2 * (-np.log1p(-bet) - bet)  # v_i psi_E(lambda_i): 4(x - mu)^2 (...)/4
    total = np.cumsum(bet, axis=1)
    centre = np.cumsum(bet * x, axis=1) / total
    half = (log_term + np.cumsum(spent, axis=1)) / total
    return (np.maximum.accumulate(np.maximum(centre - half, 0), axis=1),
            np.minimum.accumulate(np.minimum(centre + half, 1), axis=1))


def bernstein_rule(candidate: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Whether each arm's empirical-Bernstein sequence (alpha/2 each) excludes the other's at some user: the
    construction valid without asymptotics that the studio's verdict was chosen over (bench/README.md)."""
    experiments = values.shape[0]
    counts = {arm: mask.sum(axis=1) for arm, mask in (("b", candidate), ("a", ~candidate))}
    bounds = {}
    for arm, mask in (("b", candidate), ("a", ~candidate)):
        longest = int(counts[arm].max())
        packed = np.zeros((experiments, max(longest, 1)))
        for row in range(experiments):
            packed[row, :counts[arm][row]] = values[row, mask[row]]
        bounds[arm] = empirical_bernstein(packed, ALPHA / 2)
    seen_b, seen_a = np.cumsum(candidate, axis=1), np.cumsum(~candidate, axis=1)
    both = (seen_b >= 1) & (seen_a >= 1)
    at_b, at_a = np.clip(seen_b - 1, 0, None), np.clip(seen_a - 1, 0, None)
    low_b, high_b = (np.take_along_axis(bound, at_b, axis=1) for bound in bounds["b"])
    low_a, high_a = (np.take_along_axis(bound, at_a, axis=1) for bound in bounds["a"])
    return (both & ((low_b - high_a > 0) | (high_b - low_a < 0))).any(axis=1)


def ever_declared(rng: np.random.Generator, share: float, base: float, effect: float, experiments: int, users: int,
                  scores: str, bernstein: bool = False) -> dict[str, float]:
    """Per rule, the share of experiments whose verdict excluded zero at some user."""
    candidate, values = arrivals(rng, share, base, effect, experiments, users, scores)
    _difference, low, high = running_bounds(candidate, values)
    found = {"studio": float(excludes_zero(low, high).any(axis=1).mean()),
             "stop 63": float(stop_63_rule(candidate, values).any(axis=1).mean())}
    if bernstein:
        found["bernstein"] = float(bernstein_rule(candidate, values).mean())
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", type=int, default=1500, help="simulated experiments per cell")
    parser.add_argument("--per-day", type=int, default=80, help="new users a day, both arms together")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--scores", choices=("binary", "beta"), default="binary")
    parser.add_argument("--seed", type=int, default=60)
    parser.add_argument("--bernstein", action="store_true", help="also each arm's empirical-Bernstein confidence "
                        "sequence (valid without asymptotics): the construction the studio's was chosen over")
    args = parser.parse_args(argv)
    rules = ("studio", "stop 63", *(("bernstein",) if args.bernstein else ()))
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    users = args.per_day * args.days
    print(f"{args.experiments} experiments per cell, {args.scores} scores, {args.per_day} users a day for {args.days} "
          f"days ({users} users), the verdict read after every user; seed {args.seed}\n")
    print(f"A/A: share ever declared different (must be <= {ALPHA}); rows: candidate share; columns: base rate")
    print(f"{'share':>6}  {'rule':<9}" + "".join(f"{base:>8}" for base in BASES))
    worst = (0.0, None)
    for share in SHARES:
        cells = {base: ever_declared(rng, share, base, 0.0, args.experiments, users, args.scores, args.bernstein)
                 for base in BASES}
        for rule in rules:
            print(f"{share:>6}  {rule:<9}" + "".join(f"{cells[base][rule]:>8.3f}" for base in BASES))
            if rule == "studio":
                worst = max(worst, *((cells[base][rule], (share, base)) for base in BASES),
                            key=lambda cell: cell[0])
    print(f"\nPower: share of A/B experiments declared within {args.days} days (candidate better by the effect)")
    print(f"{'share':>6}  {'rule':<9}" + "".join(f"{f'{base}+{effect:.2f}':>11}" for base in POWER_BASES
                                               for effect in EFFECTS))
    for share in SHARES:
        cells = {(base, effect): ever_declared(rng, share, base, effect, args.experiments, users, args.scores,
                                               args.bernstein)
                 for base in POWER_BASES for effect in EFFECTS}
        for rule in rules:
            print(f"{share:>6}  {rule:<9}" + "".join(f"{cells[cell][rule]:>11.3f}" for cell in cells))
    print(f"\nlargest A/A share of the studio's verdict: {worst[0]:.3f} (share {worst[1][0]}, base rate {worst[1][1]}); "
          f"{time.perf_counter() - started:.0f} s")
    return 0 if worst[0] <= ALPHA else 1


if __name__ == "__main__":
    raise SystemExit(main())
